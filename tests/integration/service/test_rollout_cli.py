"""`hps versions rollout` over two pods (two `hps serve` + `hps admin` pairs), pod by pod.

Version 2 is imported on each pod through its control plane (a job) and activated, one pod
after the other, one JSON line per pod; a client pinned to version 1 is answered by version 1
on both pods throughout. The rollback (version 1, kept everywhere) imports nothing. A pod
that cannot be reached stops the rollout: the pods after it are not touched, exit 1.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from hps.net import free_port
from tests.helpers import wait_for_banner
from tests.integration.service.test_versions_api import (
    ROWS,
    TOKEN,
    Node,
    expected,
    start_admin,
    write_version,
)
from tests.integration.triton.test_serve_cli import HPS, run_hps
from tests.integration.triton.test_serve_lifecycle import serve, stop

pytestmark = pytest.mark.integration


@contextmanager
def pod(site: Path, shared: Path) -> Iterator[Node]:
    """One pod: the demo served and its control plane, whose path roots include ``shared``."""
    site.mkdir()
    run_hps("demo", "--dir", "demo", "--tables", "2", "--rows", str(ROWS), cwd=site)
    write_version(site / "demo" / "tables", 1)
    ps = site / "demo" / "ps.json"
    doc = json.loads(ps.read_text())
    doc["hps_admin"] = {"path_roots": [str(site / "demo"), str(shared)]}
    ps.write_text(json.dumps(doc))
    (site / "tmp").mkdir()
    http = free_port()
    served = serve(site, http)
    admin = None
    try:
        wait_for_banner(served, timeout=180)
        admin, url = start_admin(site, f"127.0.0.1:{http}", site / "admin.log")
        yield Node(site, f"127.0.0.1:{http}", url)
    finally:
        for proc in (admin, served):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    stop(proc)  # type: ignore[arg-type]


def rollout(tmp_path: Path, *args: str) -> tuple[int, list[dict[str, object]]]:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    done = subprocess.run(
        [*HPS, "versions", "rollout", "--model", "demo", "--token-file", str(token), *args],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


@contextmanager
def pinned_client(pods: list[Node]) -> Iterator[list[str]]:
    """A client pinned to version 1 asking every pod in turn while the block runs; yields
    the problems it met (a failure, another version, wrong vectors), after its last call."""
    problems: list[str] = []
    stop = threading.Event()
    answers = [0]

    def ask() -> None:
        while not stop.is_set() or answers[0] < 2 * len(pods):
            for p in pods:
                try:
                    version, vectors = p.infer("1")
                except Exception as exc:  # noqa: BLE001 - every failure is a finding
                    problems.append(f"{p.triton}: {exc}")
                    continue
                answers[0] += 1
                if version != "1" or not (vectors == expected(1)).all():
                    problems.append(f"{p.triton}: version {version}, vectors {vectors[0]}")

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    try:
        yield problems
    finally:
        stop.set()
        thread.join(60)


def test_a_version_rolled_out_and_back_pod_by_pod(tmp_path: Path) -> None:
    v2 = write_version(tmp_path / "v2", 2)
    with ExitStack() as stack:
        pods = [stack.enter_context(pod(tmp_path / f"pod{i}", tmp_path)) for i in range(2)]
        admins = [a for p in pods for a in ("--admin", p.admin)]
        with pinned_client(pods) as problems:  # pinned to version 1 throughout the rollout
            code, rows = rollout(tmp_path, *admins, "2", "--sparse-files", *v2)
        assert code == 0, rows
        assert problems == []
        assert [(r["pod"], r["imported"], r["served"], r["rows_left"]) for r in rows] == [
            (p.admin, True, [1, 2], []) for p in pods
        ]
        for p in pods:
            version, vectors = p.infer()
            assert version == "2" and (vectors == expected(2)).all()
            version, vectors = p.infer("1")  # a client pinned to version 1
            assert version == "1" and (vectors == expected(1)).all()
        code, rows = rollout(tmp_path, *admins, "1")
        assert code == 0 and [r["imported"] for r in rows] == [False, False]
        assert all(p.infer()[0] == "1" for p in pods)
        # the second pod is unreachable: the rollout stops there, the third is not touched
        dead = f"http://127.0.0.1:{free_port()}"
        code, rows = rollout(tmp_path, "--admin", pods[0].admin, "--admin", dead,
                             "--admin", pods[1].admin, "2")  # fmt: skip
        assert code == 1 and rows[0]["ok"] and not rows[1]["ok"]
        assert rows[1]["not_started"] == [pods[1].admin]
        assert pods[0].infer()[0] == "2" and pods[1].infer()[0] == "1"
