"""What the images hold and weigh: the installed wheel and nothing of the build (no wheel
file, no pip cache, no compiler, no source tree, no CA bundle of the build host), and sizes
within their aims (HPS image < 500 MB; the serving image adds <= 400 MB to its base)."""

from __future__ import annotations

import json

import pytest

from tests.images.conftest import SIZES, UID
from tests.images.podman import Podman, host_ca_bundle

pytestmark = pytest.mark.integration

MB = 1_000_000
PROBE = """
import json, os, shutil
leftovers = []
for top in ("/opt", "/usr", "/root", "/home", "/tmp", "/var", "/etc", "/run", "/srv"):
    for root, dirs, files in os.walk(top):  # symlinks not followed
        here = set(dirs) | set(files)
        leftovers += [os.path.join(root, f) for f in files if f.startswith("hps-")
                      and f.endswith(".whl")]
        if root == "/run/secrets":
            leftovers += [os.path.join(root, n) for n in here]
        if os.path.basename(root) == ".cache" and "pip" in here:
            leftovers.append(os.path.join(root, "pip"))
        if "hps" in dirs and ({"pyproject.toml", "tests", ".git"} & here):
            leftovers.append(root)  # a source tree: an hps package beside its project files
        if root == "/tmp":
            leftovers += [os.path.join(root, n) for n in here]
bundle = "/etc/ssl/certs/ca-certificates.crt"
try:
    import hps
    where = hps.__file__
except ImportError:
    where = ""
print(json.dumps({
    "leftovers": leftovers,
    "compilers": [c for c in ("gcc", "cc", "g++", "clang", "make") if shutil.which(c)],
    "bundle": open(bundle).read() if os.path.exists(bundle) else "",
    "hps": where,
}))
"""


def pem_blocks(text: str) -> set[str]:
    parts = text.split("-----BEGIN CERTIFICATE-----")[1:]
    return {p.split("-----END CERTIFICATE-----")[0].strip() for p in parts}


def probe(podman: Podman, image: str) -> dict[str, object]:
    done = podman.run(
        "run", "--rm", "--network=host", "--entrypoint", "python3", image,
        "-c", PROBE,
        timeout=300,
    )  # fmt: skip
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("which", ["hps", "serving"])
def test_images_hold_the_installed_wheel_and_nothing_of_the_build(
    which: str, podman: Podman, request: pytest.FixtureRequest
) -> None:
    image = request.getfixturevalue(f"{which}_image")
    doc = probe(podman, image)
    assert doc["leftovers"] == [] and doc["compilers"] == [], doc
    assert str(doc["hps"]).startswith("/opt/hps/"), doc["hps"]
    host = host_ca_bundle()
    if host is not None:
        base_image = request.getfixturevalue("base_image")
        base_blocks = pem_blocks(str(probe(podman, base_image)["bundle"]))
        added_by_host = pem_blocks(host.read_text()) - base_blocks
        assert not added_by_host & pem_blocks(str(doc["bundle"]))  # the build's CA stayed out


def test_image_sizes_within_their_aims(
    hps_image: str, serving_image: str, image_sizes: dict[str, int]
) -> None:
    """Sizes as podman reports them; printed at the end of the run (docs/deploy.md)."""
    assert image_sizes is SIZES and {"base", "hps", "serving"} <= set(SIZES)
    assert image_sizes["hps"] < 500 * MB, image_sizes
    assert image_sizes["serving"] - image_sizes["base"] <= 400 * MB, image_sizes


@pytest.mark.parametrize("which", ["hps", "serving"])
def test_images_run_as_their_own_user(
    which: str, podman: Podman, request: pytest.FixtureRequest
) -> None:
    """USER 10001:10001 (no --user given), and the working directory is that user's."""
    image = request.getfixturevalue(f"{which}_image")
    show = "import os; s = os.stat('.'); print(os.getuid(), os.getgid(), s.st_uid, s.st_gid)"
    done = podman.run(
        "run", "--rm", "--network=host", "--entrypoint", "python3", image, "-c", show,
        timeout=300,
    )  # fmt: skip
    assert done.stdout.split() == [str(UID)] * 4, done.stdout
    user = podman.run("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == f"{UID}:{UID}"
