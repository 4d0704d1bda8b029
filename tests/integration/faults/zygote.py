"""Fork ``hps`` commands from a parent that imported everything already.

Starting ``hps consume`` costs seconds of imports on a loaded machine; the kill tests start
it twenty times. This parent imports once, then for each JSON line on stdin:
``{"run": [argv...], "log": path}`` forks a child that runs ``hps.cli.main(argv)`` (the
code path of the ``hps`` console script) with stdout/stderr in ``log`` and prints its PID;
``{"wait": pid}`` waits for that child and prints its exit status the way ``Popen`` reports
it (``-signal`` when killed by a signal). The parent holds no Kafka, Redis or RocksDB
handle, so forking it is safe.
"""

from __future__ import annotations

import json
import os
import sys

import confluent_kafka  # noqa: F401  (imported once, here)
import numpy  # noqa: F401
import prometheus_client  # noqa: F401
import redis  # noqa: F401
import rocksdict  # noqa: F401

import hps.build  # noqa: F401
import hps.cli
import hps.updates.runtime  # noqa: F401


def _status(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def main() -> None:
    hps.cli.build_parser()  # imports every command module
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if "wait" in cmd:
            print(_status(int(cmd["wait"])), flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                fd = os.open(cmd["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.setsid()
                code = hps.cli.main(cmd["run"])
            finally:
                os._exit(code)
        print(pid, flush=True)


if __name__ == "__main__":
    main()
