"""``hps install-triton``: put tritonserver into this environment without touching NumPy.

``pip install 'hps[serve]'`` installs everything ``hps serve`` imports, but not tritonserver
itself: the only wheel that ships it, ``nvidia-pytriton``, declares ``numpy<2`` (and a dozen
other requirements) for its own Python API, which HPS never imports. An extra cannot ask pip
for ``--no-deps``, so this step installs the pinned wheel without its requirements, then
checks that :func:`hps.triton.server.find_triton` finds the binary and the Python backend
stub of the running interpreter. Where ``tritonserver`` is already on PATH (NVIDIA's image)
it does nothing.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

from hps.errors import ConfigError

# The tritonserver tested with this release of HPS (Triton 2.51, Python stubs 3.8-3.12).
PYTRITON_REQUIREMENT = "nvidia-pytriton==0.7.0"


def pip_command(requirement: str, pip_args: list[str]) -> list[str]:
    """The pip call installing ``requirement`` into this interpreter, requirements skipped."""
    return [sys.executable, "-m", "pip", "install", "--no-deps", *pip_args, requirement]


def install_triton(pip_args: list[str] | None = None, *, force: bool = False) -> str:
    """Install the pinned nvidia-pytriton wheel ``--no-deps`` unless Triton is found; a summary."""
    from hps.triton.server import find_triton

    if not force and shutil.which("tritonserver"):
        return f"tritonserver already on PATH: {shutil.which('tritonserver')}"
    cmd = pip_command(PYTRITON_REQUIREMENT, list(pip_args or []))
    if subprocess.run(cmd, check=False).returncode != 0:
        raise ConfigError(f"installing {PYTRITON_REQUIREMENT} failed: {' '.join(cmd)}")
    install = find_triton()  # raises ConfigError naming what is missing
    if not install.binary.is_file():
        raise ConfigError(f"{PYTRITON_REQUIREMENT} installed but {install.binary} is missing")
    return f"tritonserver: {install.binary}"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "install-triton",
        help=f"install tritonserver ({PYTRITON_REQUIREMENT}, --no-deps) into this environment",
        description="pip-install the nvidia-pytriton wheel without its requirements (it pins "
        "numpy<2 for an API HPS does not use), then check that tritonserver is found.",
    )
    p.add_argument("--force", action="store_true", help="install even if tritonserver is on PATH")
    p.add_argument("pip_args", nargs="*", metavar="PIP_ARG", help="extra pip options, after `--`")
    p.set_defaults(func=_install)


def _install(args: argparse.Namespace) -> int:
    print(install_triton(args.pip_args, force=args.force))
    return 0
