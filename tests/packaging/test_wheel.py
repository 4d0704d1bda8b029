"""The wheel, installed into a fresh virtual environment (not editable), serves the demo.

As a user would: ``pip install 'hps-….whl[serve]'`` then ``hps install-triton``, then
``hps demo`` + ``hps serve`` + ``hps query`` run from a folder outside the checkout, with
the templates read from the installed package and NumPy 2 left in place.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hps.ctr.demo import table_vectors
from hps.net import free_port
from tests.fixtures.wheel import REPO
from tests.helpers import wait_for_banner

pytestmark = pytest.mark.integration

ROWS = 1000


def clean_env() -> dict[str, str]:
    """This process's environment without anything pointing at the checkout or its venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    return {**env, "PYTHONUNBUFFERED": "1"}


def run(cmd: list[str], cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel_venv(hps_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel with its `serve` extra and tritonserver; its bin/."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    work = venv.parent
    run([sys.executable, "-m", "venv", str(venv)], work)
    run([str(venv / "bin" / "pip"), "install", "-q", f"{hps_wheel}[serve]"], work, 600)
    run([str(venv / "bin" / "hps"), "install-triton", "--", "-q"], work, 600)
    return venv / "bin"


def test_installed_package_is_the_wheel_with_numpy_2(wheel_venv: Path, tmp_path: Path) -> None:
    code = (
        "import json, numpy, hps, hps.triton.repository as r;"
        "print(json.dumps([hps.__file__, str(r.templates_dir()), numpy.__version__]))"
    )
    module, templates, numpy_version = json.loads(
        run([str(wheel_venv / "python"), "-c", code], tmp_path)
    )
    site = wheel_venv.parent / "lib"
    assert Path(module).is_relative_to(site) and not Path(module).is_relative_to(REPO)
    assert Path(templates).is_relative_to(site)
    assert sorted(p.name for p in Path(templates).iterdir()) == [
        "hps_ctr",
        "hps_embedding",
        "hps_floor",
    ]
    assert int(numpy_version.split(".")[0]) >= 2, numpy_version


def test_demo_serve_query(wheel_venv: Path, tmp_path: Path) -> None:
    hps = str(wheel_venv / "hps")
    run([hps, "demo", "--dir", "demo", "--tables", "2", "--rows", str(ROWS)], tmp_path)
    http = free_port()
    ports = ["--http-port", str(http), "--grpc-port", str(free_port())]
    proc = subprocess.Popen(
        [hps, "serve", "--config", "demo/ps.json", *ports, "--metrics-port", str(free_port())],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_for_banner(proc, timeout=180)
        query = [hps, "query", "--url", f"127.0.0.1:{http}", "--model", "demo", "--keys", "1,2,3"]
        rows = [json.loads(line) for line in run(query, tmp_path).splitlines()]
        assert [r["key"] for r in rows] == [1, 2, 3]
        want = table_vectors(np.arange(ROWS), 16, 0)[[1, 2, 3]]
        # `hps query` prints rounded floats; exact vectors are checked over gRPC in tests/images
        np.testing.assert_allclose([r["vector"] for r in rows], want, atol=1e-6)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
