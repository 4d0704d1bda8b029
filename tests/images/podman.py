"""Podman as the image tests drive it: storage, settings, the local base image, builds.

Facts of the machines the suite runs on (docs/deploy.md): podman runs containers as root
with the ``runc`` runtime and explicit ``nofile``/``nproc`` ulimits; no registry is
reachable, so the base image is a Debian rootfs made by ``mmdebstrap`` and imported; pip
inside a build reaches the package index but needs the host's CA bundle, passed as a build
secret (nothing of it stays in an image); ``--network=host`` keeps podman off the host's
firewall. Podman's storage lives in one fixed folder (``$HPS_PODMAN_DIR``, default
/var/tmp/hps-podman) so that the base image and the build layers are reused by the next
run; the containers each test starts are removed by the test.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

STATE_DIR = Path(os.environ.get("HPS_PODMAN_DIR", "/var/tmp/hps-podman"))
ULIMITS = ("nofile=20000:20000", "nproc=32768:32768")
SUITE = "bookworm"
# The local stand-in for a Python base (and for NVIDIA's image, whose Python the serving
# image uses): python3 with venv and pip, libpython for Triton's Python-backend stub.
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "libpython3.11", "ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
CA_CANDIDATES = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")


class PodmanError(RuntimeError):
    pass


def apt_mirror() -> str:
    """The Debian mirror the host's apt uses (deb822 or one-line sources), else the default."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        text = path.read_text(errors="replace") if path.is_file() else ""
        match = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or re.search(
            r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+/debian)\s+\S+", text, re.M
        )
        if match:
            return match.group(1)
    return DEFAULT_MIRROR


def host_ca_bundle() -> Path | None:
    """The CA bundle the host's pip trusts (its environment's choice first)."""
    names = [os.environ.get(v, "") for v in CA_CANDIDATES]
    for name in [*names, "/etc/ssl/certs/ca-certificates.crt"]:
        if name and Path(name).is_file():
            return Path(name)
    return None


def pip_index_url() -> str:
    """The host's package index if it set an http(s) one, else PyPI."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        done = subprocess.run(
            ["python3", "-m", "pip", "config", "get", "global.index-url"],
            capture_output=True,
            text=True,
        )
        url = done.stdout.strip() if done.returncode == 0 else ""
    return url if url.startswith(("http://", "https://")) else "https://pypi.org/simple"


class Podman:
    """``podman`` with this suite's storage and settings (containers.conf via CONTAINERS_CONF)."""

    def __init__(self, state: Path = STATE_DIR) -> None:
        self.state = state
        state.mkdir(parents=True, exist_ok=True)
        self.conf = state / "containers.conf"
        limits = ", ".join(f'"{u}"' for u in ULIMITS)
        self.conf.write_text(
            "[containers]\n"
            f"default_ulimits = [{limits}]\n"
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
        )
        self.env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def command(self, *args: str) -> list[str]:
        return [
            "podman",
            "--root",
            str(self.state / "root"),
            "--runroot",
            str(self.state / "run"),
            "--storage-driver",
            "overlay",
            *args,
        ]

    def run(
        self, *args: str, timeout: float = 120, check: bool = True, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.command(*args),
            env=self.env,
            input=stdin.decode() if stdin is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise PodmanError(f"podman {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done

    def image_exists(self, tag: str) -> bool:
        return self.run("image", "exists", tag, check=False).returncode == 0

    def image_size(self, tag: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())

    def image_config(self, tag: str) -> dict[str, object]:
        doc = json.loads(self.run("image", "inspect", tag).stdout)[0]
        config = doc.get("Config", {})
        assert isinstance(config, dict)
        return config

    def prune_old(self) -> None:
        """Drop untagged images (old build layers) older than two days: bounded storage."""
        self.run("image", "prune", "--force", "--filter", "until=48h", check=False)

    def ensure_base(self) -> str:
        """The Debian base image (made by mmdebstrap once, then reused); its tag."""
        key = hashlib.sha256(" ".join((SUITE, *BASE_PACKAGES)).encode()).hexdigest()[:12]
        tag = f"localhost/hps-test-base:{SUITE}-{key}"
        if self.image_exists(tag):
            return tag
        with tempfile.TemporaryDirectory(prefix="hps-rootfs-", dir=self.state) as tmp:
            tar = Path(tmp) / "rootfs.tar"
            done = subprocess.run(
                [
                    "mmdebstrap",
                    "--quiet",
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    SUITE,
                    str(tar),
                    apt_mirror(),
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if done.returncode != 0:
                raise PodmanError(f"mmdebstrap failed:\n{done.stdout}\n{done.stderr}")
            with open(tar, "rb") as f:
                imported = subprocess.run(
                    self.command("import", "-", tag),
                    env=self.env,
                    stdin=f,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
            if imported.returncode != 0:
                raise PodmanError(f"podman import failed:\n{imported.stderr}")
        return tag

    def build(
        self,
        dockerfile: Path,
        wheel: Path,
        tag: str,
        build_args: dict[str, str],
        timeout: float = 1500,
    ) -> None:
        """Build ``dockerfile`` with a context holding only ``wheel`` (layers cached)."""
        with tempfile.TemporaryDirectory(prefix="hps-context-") as context:
            shutil.copy2(wheel, Path(context) / wheel.name)
            args = ["build", "--layers", "--network=host", "-f", str(dockerfile), "-t", tag]
            args += [f"--ulimit={u}" for u in ULIMITS]
            for key, value in {"PIP_INDEX_URL": pip_index_url(), **build_args}.items():
                args += ["--build-arg", f"{key}={value}"]
            ca = host_ca_bundle()
            if ca is not None:
                args += ["--secret", f"id=ca,src={ca}"]
            self.run(*args, context, timeout=timeout)

    def container_rm(self, names: Sequence[str]) -> None:
        if names:
            self.run("rm", "--force", "--time", "5", *names, check=False)
