"""Where tritonserver comes from, and ``hps install-triton``, which puts it into this
environment without touching NumPy.

:func:`find_triton` takes the binary from PATH, else from the ``nvidia-pytriton`` wheel
(which ships Triton with its Python backend and a backend stub per Python version). The
wheel's backends folder is copied into a directory of our own with the stub of the running
Python placed in ``python/`` (:func:`prepare_backends`), and the environment is built so
that the stub embeds the same libpython and sees the same packages as this interpreter
(:func:`server_env`; see docs/serving.md).

``pip install 'hps[serve]'`` installs everything ``hps serve`` imports, but not tritonserver
itself: the only wheel that ships it, ``nvidia-pytriton``, declares ``numpy<2`` (and a dozen
other requirements) for its own Python API, which HPS never imports. An extra cannot ask pip
for ``--no-deps``, so this step installs the pinned wheel without its requirements, then
checks that :func:`find_triton` finds the binary and the Python backend stub of the running
interpreter. Where ``tritonserver`` is already on PATH (NVIDIA's image) it does nothing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from hps.errors import ConfigError

# The tritonserver tested with this release of HPS (Triton 2.51, Python stubs 3.8-3.12).
PYTRITON_REQUIREMENT = "nvidia-pytriton==0.7.0"


def pip_command(requirement: str, pip_args: list[str]) -> list[str]:
    """The pip call installing ``requirement`` into this interpreter, requirements skipped."""
    return [sys.executable, "-m", "pip", "install", "--no-deps", *pip_args, requirement]


def install_triton(pip_args: list[str] | None = None, *, force: bool = False) -> str:
    """Install the pinned nvidia-pytriton wheel ``--no-deps`` unless Triton is found; a summary."""
    if not force and shutil.which("tritonserver"):
        return f"tritonserver already on PATH: {shutil.which('tritonserver')}"
    cmd = pip_command(PYTRITON_REQUIREMENT, list(pip_args or []))
    if subprocess.run(cmd, check=False).returncode != 0:
        raise ConfigError(f"installing {PYTRITON_REQUIREMENT} failed: {' '.join(cmd)}")
    install = find_triton()  # raises ConfigError naming what is missing
    if not install.binary.is_file():
        raise ConfigError(f"{PYTRITON_REQUIREMENT} installed but {install.binary} is missing")
    return f"tritonserver: {install.binary}"


@dataclass(frozen=True)
class TritonInstall:
    """Where a Triton installation keeps its parts."""

    binary: Path
    backends: Path  # folder holding ``python/`` (libtriton_python.so)
    stub: Path | None  # stub to place in our backends copy; None: the install has its own
    libs: tuple[Path, ...] = ()  # extra folders for LD_LIBRARY_PATH


def _pytriton_root() -> Path | None:
    # find_spec does not run pytriton/__init__.py, whose own requirements we do not install.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_triton() -> TritonInstall:
    """Locate ``tritonserver``: on PATH first, else inside the nvidia-pytriton wheel."""
    on_path = shutil.which("tritonserver")
    if on_path:
        binary = Path(on_path).resolve()
        return TritonInstall(binary=binary, backends=binary.parent.parent / "backends", stub=None)
    root = _pytriton_root()
    if root is None:
        raise ConfigError(
            "tritonserver not found: put it on PATH or run `hps install-triton` "
            "(pip install --no-deps nvidia-pytriton)"
        )
    server = root / "tritonserver"
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "python_backend_stubs" / pyver / "triton_python_backend_stub"
    if not stub.exists():
        raise ConfigError(f"nvidia-pytriton has no Python backend stub for Python {pyver}")
    libs = root.parent / "nvidia_pytriton.libs"
    return TritonInstall(
        binary=server / "bin" / "tritonserver",
        backends=server / "backends",
        stub=stub,
        libs=(libs,) if libs.is_dir() else (),
    )


def prepare_backends(install: TritonInstall, dest: Path) -> Path:
    """A backends folder of our own: the install's, with the stub of this Python in python/."""
    if install.stub is None:
        return install.backends
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(install.backends, dest, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(install.stub, dest / "python" / "triton_python_backend_stub")
    return dest


def server_env(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver and its Python stubs.

    The stub loads the first ``libpython3.x.so`` the loader finds and the packages of the
    first ``python3`` on PATH: both must be this interpreter's, else extension modules
    fail inside models (``undefined symbol``).
    """
    env = dict(os.environ if base is None else base)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")]).rstrip(os.pathsep)
    libdirs = [sysconfig.get_config_var("LIBDIR") or "", *map(str, install.libs)]
    old = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = os.pathsep.join([d for d in [*libdirs, old] if d])
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    env.pop("PYTHONHOME", None)
    return env
