"""`hps serve` under faults (docs/security.md, rows 3 and 6), on a two-table demo model.

- a SIGKILLed stub is found by the watchdog and its model reloaded (the time it took is
  printed; docs/security.md row 3);
- SIGTERM under load drains and leaves no shared-memory region or temporary folder;
- SIGKILL of `hps serve` takes tritonserver, the stubs and the gate (nginx) with it; the
  next `hps serve` refuses a port in use before printing anything and cleans what its
  predecessor left.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hps.ctr.demo import table_vectors
from hps.errors import HPSError
from hps.net import free_port
from hps.triton.client import Client
from hps.triton.supervisor.lifecycle import pid_alive, regions
from tests.integration.triton.test_serve_cli import HPS, run_hps, wait_for_banner

pytestmark = pytest.mark.integration

ROWS = 300


@pytest.fixture
def site(tmp_path: Path) -> Path:
    run_hps("demo", "--dir", "demo", "--tables", "2", "--rows", str(ROWS), cwd=tmp_path)
    (tmp_path / "tmp").mkdir()
    return tmp_path


def serve(
    site: Path, http: int, err: list[str] | None = None, *flags: str
) -> subprocess.Popen[str]:
    """`hps serve` of the demo; its stderr (with --verbose, Triton's log too) is drained
    into ``err``."""
    ports = ["--http-port", str(http), "--grpc-port", str(free_port()), *flags]
    proc = subprocess.Popen(
        [*HPS, "serve", "--config", "demo/ps.json", *ports, "--metrics-port", str(free_port())],
        cwd=site,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(site / "tmp")},
    )
    if err is not None:
        threading.Thread(target=lambda: err.extend(proc.stderr or []), daemon=True).start()
    return proc


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def described(pids: list[int]) -> list[str]:
    """The processes of ``pids`` that exist (zombies too): PID, parent, state, command."""
    out = []
    for pid in pids:
        try:
            fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out.append(f"{pid} (parent {fields[1]}) {fields[0]} {cmdline(pid)[:100]}")
    return out


def triton_of(serve_pid: int) -> int:
    return next(p for p in children(serve_pid) if "tritonserver" in cmdline(p))


def expected(keys: list[int]) -> np.ndarray:
    return table_vectors(np.arange(ROWS), 16, 0)[keys]


def lookup_ok(url: str) -> bool:
    try:
        with Client(url) as client:
            out = client.lookup("demo", [1, 2], [2, 0]).reshape(2, 16)
    except HPSError:
        return False
    np.testing.assert_allclose(out, expected([1, 2]), atol=1e-6)
    return True


def ready(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{url}/v2/models/demo/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sigterm_under_load_drains_and_leaves_nothing(site: Path) -> None:
    http = free_port()
    proc = serve(site, http)
    try:
        banner = "".join(wait_for_banner(proc))
        key_file = site / "demo" / "hps-admin-key"
        assert f"hps-admin-key: the key in {key_file}" in banner
        assert key_file.stat().st_mode & 0o777 == 0o600
        url = f"127.0.0.1:{http}"
        reload = run_hps(
            "reload", "--url", url, "--model", "demo", "--config", "demo/ps.json", cwd=site
        )
        assert reload == ["reloaded demo"]
        outcomes: Counter[str] = Counter()
        done = threading.Event()

        def client_loop(grpc: bool) -> None:
            with Client(f"127.0.0.1:{http}" if not grpc else url, grpc=False) as client:
                while not done.is_set():
                    try:
                        out = client.lookup("demo", [3, 4, 5], [3, 0]).reshape(3, 16)
                    except HPSError:
                        outcomes["error"] += 1
                        time.sleep(0.01)
                        continue
                    same = np.allclose(out, expected([3, 4, 5]), atol=1e-6)
                    outcomes["ok" if same else "wrong"] += 1

        threads = [threading.Thread(target=client_loop, args=(i % 2 == 0,)) for i in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60  # hang guard: the clients are served at once
        while outcomes["ok"] < 4 * len(threads):  # under load when the SIGTERM comes
            assert time.monotonic() < deadline, outcomes
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)
        done.set()
        for t in threads:
            t.join()
        stderr = proc.stderr.read() if proc.stderr else ""
        assert status == 0, stderr[-3000:]
    finally:
        done_ = locals().get("done")
        if done_ is not None:
            done_.set()
        stop(proc)
    assert outcomes["wrong"] == 0, outcomes
    assert "Signal (11)" not in stderr and "Signal (6)" not in stderr
    assert regions(f"hpspb_{proc.pid}_") == []
    assert list((site / "tmp").iterdir()) == []
    print(f"requests during the SIGTERM test: {dict(outcomes)}")


def test_dead_stub_reload_then_sigkill_and_successor(site: Path) -> None:
    http = free_port()
    url = f"127.0.0.1:{http}"
    err: list[str] = []
    proc = serve(site, http, err, "--verbose")  # Triton's log: when the model loaded
    try:
        wait_for_banner(proc)
        triton = triton_of(proc.pid)
        stub = next(p for p in children(triton) if "/demo/1/model.py" in cmdline(p))
        assert lookup_ok(url)
        os.kill(stub, signal.SIGKILL)
        killed = time.monotonic()
        seen_unready = False
        recovered = None
        # Hang guard: serving again takes 6-9 s (a stub start under load: up to 10 s alone).
        while time.monotonic() - killed < 90:
            seen_unready |= not ready(url)
            if seen_unready and lookup_ok(url):
                recovered = time.monotonic() - killed
                break
            time.sleep(0.1)
        assert seen_unready, "the model's readiness never turned false"
        assert recovered is not None, "not serving again 90 s after the SIGKILL"
        print(f"dead stub: serving again {recovered:.1f} s after the SIGKILL; watchdog:")
        print([e for e in err if "watchdog" in e])
        assert all(lookup_ok(url) for _ in range(5))
        stubs = [p for p in children(triton) if "triton_python_backend_stub" in cmdline(p)]
        nginx = [p for p in children(proc.pid) if "nginx" in cmdline(p)]
        assert len(nginx) == 1, "the request-size gate runs beside Triton"
        gate = [*nginx, *children(nginx[0])]
        guard = [p for p in children(proc.pid) if "orphan_guard" in cmdline(p)]
        assert len(guard) == 1, "a guard ends Triton and the gate should they outlive us"
        proc.kill()  # SIGKILL of hps serve: Triton, its stubs and the gate must follow
        proc.wait()
        ours = [triton, *stubs, *gate, *guard]
        orphaned = time.monotonic()
        # Hang guard: Triton's own shutdown takes up to 6-7 s (docs/security.md, Shutdown).
        while time.monotonic() - orphaned < 60 and any(map(pid_alive, ours)):
            time.sleep(0.2)
        print(f"Triton, its stubs, the gate and the guard gone {time.monotonic() - orphaned:.1f} s")
        assert not any(map(pid_alive, ours)), f"orphans outlived hps serve: {described(ours)}"
    finally:
        stop(proc)
    left = [p for p in (site / "tmp").iterdir()]
    assert left, "a SIGKILLed hps serve leaves its temporary folders"
    with socket.socket() as busy:  # a port in use: refused before anything is printed
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", http))
        busy.listen()
        refused = serve(site, http)
        out, err = refused.communicate(timeout=60)
        assert refused.returncode == 2 and out == ""
        assert f"HTTP port {http} on 127.0.0.1 is in use" in err
    successor = serve(site, http)
    try:
        wait_for_banner(successor)
        assert successor.stderr is not None
        assert lookup_ok(url)
        assert not any(p.exists() for p in left)
        assert regions(f"hpspb_{proc.pid}_") == []
        successor.send_signal(signal.SIGTERM)
        assert successor.wait(timeout=60) == 0
        assert "left by an hps process that has ended" in successor.stderr.read()
    finally:
        stop(successor)


def test_a_dead_gate_stops_hps_serve_and_triton(site: Path) -> None:
    """nginx (the request-size gate) SIGKILLed: nothing would answer on the ports any more,
    so `hps serve` says so, stops Triton and exits 1, leaving nothing behind."""
    http = free_port()
    err: list[str] = []
    proc = serve(site, http, err)
    try:
        wait_for_banner(proc)
        triton = triton_of(proc.pid)
        nginx = next(p for p in children(proc.pid) if "nginx" in cmdline(p))
        assert lookup_ok(f"127.0.0.1:{http}")
        os.kill(nginx, signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
    finally:
        stop(proc)
    deadline = time.monotonic() + 60  # hang guard: Triton's shutdown takes up to 6-7 s
    while time.monotonic() < deadline and pid_alive(triton):
        time.sleep(0.2)
    assert not pid_alive(triton), "tritonserver outlived hps serve"
    assert any("nginx (the request-size gate) exited by itself" in line for line in err), err[-5:]
    assert regions(f"hpspb_{proc.pid}_") == []
    assert list((site / "tmp").iterdir()) == []
