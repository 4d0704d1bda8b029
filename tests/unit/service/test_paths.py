"""Server-side paths a client names are confined to the path roots (hps.service.paths):
resolved before the check, one message for outside, missing and wrong kind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hps.config import load_config
from hps.errors import ConfigError, RequestError
from hps.service.paths import ServerPaths, default_roots, register_secret_file

FILE = "a readable file under the path roots"
FOLDER = "a folder under the path roots holding key and emb_vector"


def _message(given: str, what: str = FILE) -> str:
    return f"path not allowed or not found: {given!r} ({what})"


def _refused(paths: ServerPaths, given: str) -> str:
    with pytest.raises(RequestError) as info:
        paths.file(given)
    assert info.value.status == 400
    return str(info.value)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """(root, outside): a root with a data file and links; a sibling folder outside it."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "data").mkdir(parents=True)
    outside.mkdir()
    (root / "data" / "keys.bin").write_bytes(np.arange(4, dtype=np.int64).tobytes())
    (outside / "secret.bin").write_bytes(b"x" * 13)
    (root / "out-link").symlink_to(outside / "secret.bin")
    (root / "out-dir").symlink_to(outside)
    (root / "in-link").symlink_to(root / "data" / "keys.bin")
    return root, outside


def test_files_under_a_root_resolve(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    paths = ServerPaths([root])
    target = (root / "data" / "keys.bin").resolve()
    assert paths.file(str(root / "data" / "keys.bin")) == target
    assert paths.file(str(root / "in-link")) == target  # a link that stays inside
    assert paths.file(str(root / "data" / ".." / "data" / "keys.bin")) == target
    # a root that is itself a link: compared resolved
    link_root = root.parent / "root-link"
    link_root.symlink_to(root)
    assert ServerPaths([link_root]).file(str(link_root / "data" / "keys.bin")) == target


def test_one_message_for_outside_missing_and_wrong_kind(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    paths = ServerPaths([root])
    os.mkfifo(root / "fifo")
    refused = [
        str(outside / "secret.bin"),  # exists, outside
        str(outside / "missing.bin"),  # missing, outside
        str(root / "missing.bin"),  # missing, inside
        str(root / "out-link"),  # a link inside pointing outside
        str(root / "out-dir" / "secret.bin"),  # through a linked folder
        str(root / "data" / ".." / ".." / "outside" / "secret.bin"),  # `..` escapes
        str(root / "data"),  # a folder where a file is asked for
        str(root / "fifo"),  # not a regular file
        "/etc/passwd",
        "/proc/self/environ",
        "data/keys.bin",  # relative
        "",
        str(root / "data" / "keys.bin") + "\x00",
    ]
    for given in refused:
        assert _refused(paths, given) == _message(given), given


def test_long_paths_are_shown_cut(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    paths = ServerPaths([root])
    for given in ("/" + "b" * 3000, str(root / "data" / "keys.bin") + "/" * 5000):
        assert _refused(paths, given) == _message(given[:256] + "...")


def test_folders_and_the_files_they_hold(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    names = ("key", "emb_vector")
    good = root / "model"
    good.mkdir()
    for n in names:
        (good / n).write_bytes(b"")
    assert ServerPaths([root]).folder(str(good), names) == good.resolve()
    leaky = root / "leaky"
    leaky.mkdir()
    (leaky / "key").write_bytes(b"")
    (leaky / "emb_vector").symlink_to(outside / "secret.bin")  # one file leads outside
    half = root / "half"
    half.mkdir()
    (half / "key").write_bytes(b"")
    (outside / "key").write_bytes(b"")
    (outside / "emb_vector").write_bytes(b"")
    for given in (leaky, half, outside, root / "data" / "keys.bin", root / "nope"):
        with pytest.raises(RequestError) as info:
            ServerPaths([root]).folder(str(given), names)
        assert str(info.value) == _message(str(given), FOLDER)


def test_secrets_in_a_root_are_refused(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = tree
    (root / "hps-admin-key").write_text("k" * 48)  # Triton's admin key beside the ps.json
    token = root / "data" / "admin.token"
    token.write_text("t" * 47 + "\n")
    monkeypatch.setenv("HPS_ADMIN_TOKEN_FILE", str(token))
    paths = ServerPaths([root])
    for given in (str(root / "hps-admin-key"), str(token)):
        assert _refused(paths, given) == _message(given)
    monkeypatch.delenv("HPS_ADMIN_TOKEN_FILE")
    assert paths.file(str(token)) == token.resolve()
    # any *_FILE (a mounted secret: the Redis password's, the Kafka client's), and the
    # token file `hps admin --token-file` names
    redis_password = root / "data" / "redis.password"
    redis_password.write_text("p" * 20)
    monkeypatch.setenv("HPS_REDIS_PASSWORD_FILE", str(redis_password))
    monkeypatch.setattr("hps.service.paths._REGISTERED", set())
    register_secret_file(token)
    for given in (str(redis_password), str(token)):
        assert _refused(paths, given) == _message(given)


def test_roots_from_the_config(tmp_path: Path) -> None:
    doc = {
        "models": [
            {
                "model": "m",
                "embedding_table_names": ["t"],
                "embedding_vecsize_per_table": [4],
                "maxnum_catfeature_query_per_table_per_sample": [1],
                "default_value_for_each_table": [0.0],
            }
        ]
    }
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    state_dir = tmp_path / "state"
    config = load_config(tmp_path / "ps.json")
    assert config.hps_admin.path_roots is None
    assert default_roots(config, state_dir) == [tmp_path.resolve(), state_dir]
    doc["hps_admin"] = {"path_roots": ["/data/tables", "/srv/warmup"]}
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    config = load_config(tmp_path / "ps.json")
    assert default_roots(config, state_dir) == [Path("/data/tables"), Path("/srv/warmup")]
    doc["hps_admin"] = {"path_roots": []}  # uploads only
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    empty = ServerPaths(default_roots(load_config(tmp_path / "ps.json"), state_dir))
    (tmp_path / "f").write_bytes(b"")
    assert _refused(empty, str(tmp_path / "f")) == _message(str(tmp_path / "f"))
    doc["hps_admin"] = {"path_roots": ["relative/dir"]}
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"hps_admin\.path_roots.*absolute"):
        load_config(tmp_path / "ps.json")
