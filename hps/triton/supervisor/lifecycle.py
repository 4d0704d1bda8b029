"""What a Triton server of ours leaves on the machine, and how a successor cleans it up.

- The server dies with the process that started it: :func:`die_with_parent` runs in the
  child before ``exec`` and asks the kernel (``prctl(PR_SET_PDEATHSIG)``) to send it
  SIGTERM when its parent goes, SIGKILL included. Triton then exits, and its Python
  stubs, which watch their parent, follow; should that shutdown hang, the guard of
  :mod:`hps.triton.supervisor.orphan_guard` kills them. (The kernel's "parent" is the thread that
  forked: start servers from a thread that lives as long as they should.)
- The Python backend's shared-memory regions are named with a prefix of our own,
  ``hpspb_<pid>_<token>_`` (:func:`shm_prefix`, passed as ``shm-region-prefix-name``),
  ``<pid>`` being the process that started the server; temporary folders carry an
  ``hps-owner.pid`` file. :func:`clean_stale` removes regions and folders whose owner
  is dead and that no live process maps: what a SIGKILLed predecessor left.
- :func:`check_ports` refuses ports in use, or given twice, before anything starts or prints.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import IO

from hps.errors import ConfigError
from hps.tempdirs import TEMP_PREFIXES, owner
from hps.triton.supervisor.address import is_ipv6, resolve_host

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
_SHM_NAME = re.compile(r"^hpspb_(\d+)_[0-9a-f]+_")
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: the kernel sends this process SIGTERM when its parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def spawn_child(
    cmd: list[str],
    log_file: Path | None = None,
    env: dict[str, str] | None = None,
    *,
    pipe: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a server child of ours: its own session (a terminal's Ctrl-C reaches us only,
    and we stop it in order), dying with us (:func:`die_with_parent`), output appended to
    ``log_file``, else into a pipe (``proc.stdout``) with ``pipe``, else into ours."""
    out = open(log_file, "ab") if log_file else None  # noqa: SIM115
    target: IO[bytes] | int | None = out or (subprocess.PIPE if pipe else None)
    try:
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=target,
            stderr=subprocess.STDOUT if target is not None else None,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    finally:
        if out:
            out.close()


def shm_prefix() -> str:
    """A region-name prefix for one server: this process's PID and a random token."""
    return f"hpspb_{os.getpid()}_{secrets.token_hex(4)}_"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie (ended, not yet reaped by its parent or by
    init, however slow that is) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc to tell: it exists
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] not in (["Z"], ["X"])


def mapped_shm() -> set[str]:
    """Names of /dev/shm files some process we can inspect has mapped."""
    names: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        names.update(m.group(1) for m in re.finditer(r"/dev/shm/(\S+)", text))
    return names


def regions(prefix: str) -> list[Path]:
    """Shared-memory regions whose name starts with ``prefix``."""
    return sorted(SHM_DIR.glob(prefix + "*")) if SHM_DIR.is_dir() else []


def clean_stale(tmp: str | Path | None = None) -> list[Path]:
    """Remove the regions and temporary folders of dead HPS servers; what was removed."""
    removed: list[Path] = []
    candidates = [
        p
        for p in regions("hpspb_")
        if (m := _SHM_NAME.match(p.name)) and not pid_alive(int(m.group(1)))
    ]
    if candidates:
        in_use = mapped_shm()
        for region in candidates:
            if region.name not in in_use:
                region.unlink(missing_ok=True)
                removed.append(region)
    root = Path(tmp or tempfile.gettempdir())
    for prefix in TEMP_PREFIXES:
        for folder in root.glob(prefix + "*"):
            pid = owner(folder)
            if folder.is_dir() and pid is not None and not pid_alive(pid):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    for path in removed:
        log.info("removed %s, left by an hps process that has ended", path)
    return removed


def check_ports(host: str, ports: dict[str, int]) -> None:
    """Raise a ConfigError naming a port of ``ports`` given twice (0: any free one), a
    ``host`` that does not resolve or cannot be served
    (:func:`hps.triton.supervisor.address.resolve_host`, whose address is checked), or the
    first port that something listens on."""
    named: dict[int, str] = {}
    for name, port in ports.items():
        if port and port in named:
            raise ConfigError(
                f"the {named[port]} and {name} ports are both {port}: each needs its own"
            )
        named[port] = name
    address = resolve_host(host)
    for name, port in ports.items():
        with socket.socket(socket.AF_INET6 if is_ipv6(address) else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if is_ipv6(address):  # as Triton and nginx bind it (hps.triton.supervisor.address)
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((address, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise ConfigError(
                        f"cannot listen on {address} port {port} ({name}): {exc.strerror or exc}"
                    ) from None
                raise ConfigError(
                    f"{name} port {port} on {address} is in use: another server (an earlier "
                    "hps serve, hps admin or tritonserver?) listens there; stop it or choose "
                    "another port"
                ) from None


def reap_group(pgid: int) -> None:
    """Kill stubs left behind in the server's process group once Triton itself is gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
