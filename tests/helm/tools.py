"""Command-line tools the chart's tests run from an environment of their own (.venv-tools).

checkov pins older versions of packages the project's environment holds (packaging, boto3,
networkx), so it is installed apart, once, from checkov-requirements.txt; a changed
requirements file rebuilds the environment. A lock keeps parallel runs from building it twice.
`make test-tools` (part of `make test`) builds it before the suite runs.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".venv-tools"
REQUIREMENTS = Path(__file__).with_name("checkov-requirements.txt")
INSTALL_TIMEOUT_S = 900  # about a minute from the package index; a generous safety net


def checkov() -> Path:
    """The checkov executable of .venv-tools, installed first when missing or outdated."""
    TOOLS.mkdir(exist_ok=True)
    (TOOLS / ".gitignore").write_text("*\n")  # nothing of it belongs in the repository
    exe = TOOLS / "bin" / "checkov"
    stamp = TOOLS / "requirements.installed"
    wanted = REQUIREMENTS.read_text()
    with open(TOOLS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if exe.exists() and stamp.exists() and stamp.read_text() == wanted:
            return exe
        for stale in ("bin", "lib", "include", "pyvenv.cfg", "lib64", "share"):
            path = TOOLS / stale
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        # the interpreter behind the project's environment (venv builds on the base one)
        subprocess.run([sys.executable, "-m", "venv", str(TOOLS)], check=True)
        subprocess.run(
            [str(TOOLS / "bin" / "pip"), "install", "-q", "-r", str(REQUIREMENTS)],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        stamp.write_text(wanted)
    return exe
