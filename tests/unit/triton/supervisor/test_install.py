"""Finding tritonserver, its backends folder and its environment."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from hps.triton.supervisor.install import TritonInstall, find_triton, prepare_backends, server_env


def test_find_triton_in_the_wheel() -> None:
    install = find_triton()
    assert install.binary.is_file() and os.access(install.binary, os.X_OK)
    assert (install.backends / "python" / "libtriton_python.so").is_file()
    if install.stub is not None:  # the wheel: a stub for this Python
        assert f"{sys.version_info.major}.{sys.version_info.minor}" in str(install.stub)


def test_prepare_backends_places_the_stub(tmp_path: Path) -> None:
    install = find_triton()
    backends = prepare_backends(install, tmp_path / "backends")
    if install.stub is not None:
        assert (backends / "python" / "triton_python_backend_stub").is_file()
        assert (backends / "python" / "libtriton_python.so").is_file()


def test_environment_puts_this_python_first() -> None:
    install = TritonInstall(Path("/x/tritonserver"), Path("/x"), None, (Path("/libs"),))
    env = server_env(install, {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/old", "PYTHONHOME": "/h"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    libdir = sysconfig.get_config_var("LIBDIR")
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [libdir, "/libs", "/old"]
    assert "PYTHONHOME" not in env
