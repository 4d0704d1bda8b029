"""Memory sampling of a process tree: RSS of every descendant and its /dev/shm files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hps.loadtest.resources import SHM, ResourceSampler, descendants

CHILD = "import sys, time; x = bytearray(40 << 20); x[::4096] = b'1' * len(x[::4096]); " \
        "print('ready', flush=True); time.sleep(30)"  # fmt: skip


def test_sampler_sums_the_tree_and_its_shm(tmp_path: Path) -> None:
    name = f"hps-test-{uuid.uuid4().hex[:8]}"
    (SHM / name).write_bytes(b"\1" * (3 << 20))
    # A parent whose child holds 40 MB and names the shm file on its command line.
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1], "
         "sys.argv[2]]); p.wait()", CHILD, name],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == b"ready"
        assert len(descendants(parent.pid)) == 2
        sampler = ResourceSampler(parent.pid, tmp_path / "r.csv", interval_s=0.1).start()
        (SHM / name).write_bytes(b"\1" * (5 << 20))
        _, procs, rss, shm = sampler.sample()
        sampler.stop()
        assert procs == 2 and rss > 40 << 20
        assert shm == 5 << 20
        growth = sampler.growth_mb(0.0)
        assert growth is not None and growth[1] == pytest.approx(2.0)
        assert (tmp_path / "r.csv").read_text().startswith("seconds,processes,rss_bytes")
    finally:
        for pid in reversed(descendants(parent.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        parent.wait()
        (SHM / name).unlink()


def test_a_memory_bound_that_could_not_be_checked_fails() -> None:
    from hps.loadtest.resources import growth_failure

    assert growth_failure(None, None) is None and growth_failure((1.0, 0.0), 10) is None
    assert growth_failure((12.0, 0.0), 10) == "memory grew more than 10 MB after warm-up"
    assert "fewer than two memory samples after the warm-up" in str(growth_failure(None, 10))


def test_memory_bound_options_that_cannot_be_checked_are_refused() -> None:
    from hps.errors import ConfigError
    from hps.loadtest.resources import check_growth_options

    kw = {"run_time_s": 60.0, "warmup_s": 12.0, "interval_s": 5.0}
    check_growth_options(None, remote=True, **kw)
    check_growth_options(100.0, remote=False, **kw)
    with pytest.raises(ConfigError, match="not with --triton-grpc"):
        check_growth_options(100.0, remote=True, **kw)
    with pytest.raises(ConfigError, match="--warmup 55 s \\+ 2 x --sample-interval 5 s exceed"):
        check_growth_options(100.0, remote=False, **{**kw, "warmup_s": 55.0})
