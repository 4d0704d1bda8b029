"""The admin key (env, file, generated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps.errors import ConfigError
from hps.triton import admin_key


@pytest.fixture(autouse=True)
def no_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(admin_key.KEY_ENV, raising=False)
    monkeypatch.delenv(admin_key.KEY_FILE_ENV, raising=False)


def test_a_fresh_private_key_at_every_start(tmp_path: Path) -> None:
    assert admin_key.resolve_key(tmp_path) is None
    key, path = admin_key.ensure_key(tmp_path)
    assert path == tmp_path / "hps-admin-key" and len(key) >= 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert admin_key.resolve_key(tmp_path) == key  # what the other clients read
    inode = path.stat().st_ino
    key2, path2 = admin_key.ensure_key(tmp_path)  # the next start: never the old key
    assert path2 == path and key2 != key
    assert admin_key.resolve_key(tmp_path) == key2
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hps-admin-key"]  # no temp left


def test_an_old_readable_key_file_is_replaced_private(tmp_path: Path) -> None:
    old = tmp_path / "hps-admin-key"
    old.write_text("old-key-everyone-could-read\n")
    old.chmod(0o644)
    key, path = admin_key.ensure_key(tmp_path)
    assert path == old and key != "old-key-everyone-could-read"
    assert path.read_text() == key + "\n" and path.stat().st_mode & 0o777 == 0o600


def test_resolved_keys_are_registered_for_redaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hps.redact import registered, scrub

    key, _ = admin_key.ensure_key(tmp_path)
    assert key in registered() and key not in scrub(f"--http-restricted-api=x:k={key}")
    monkeypatch.setenv(admin_key.KEY_ENV, "env-key-to-hide-0123")
    admin_key.resolve_key()
    assert "env-key-to-hide-0123" in registered()


def test_env_and_file_come_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    named = tmp_path / "k"
    named.write_text("from-file-0123456789\n")
    monkeypatch.setenv(admin_key.KEY_FILE_ENV, str(named))
    assert admin_key.ensure_key(tmp_path / "state") == ("from-file-0123456789", named)
    monkeypatch.setenv(admin_key.KEY_ENV, "from-env-0123456789")
    assert admin_key.ensure_key(tmp_path / "state") == ("from-env-0123456789", None)
    assert not (tmp_path / "state").exists()


def test_an_unreadable_key_file_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = tmp_path / "k"
    named.write_bytes(b"key\xff")
    monkeypatch.setenv(admin_key.KEY_FILE_ENV, str(named))
    with pytest.raises(ConfigError, match=r"admin key file .*k: not UTF-8 text \(byte 3\)"):
        admin_key.resolve_key()
    monkeypatch.setenv(admin_key.KEY_FILE_ENV, str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="admin key file .*absent: cannot read"):
        admin_key.resolve_key()


@pytest.mark.parametrize("bad", ["", "a b", "a:b", "a,b", "a=b"])
def test_keys_that_would_break_the_option_are_refused(bad: str, monkeypatch) -> None:
    monkeypatch.setenv(admin_key.KEY_ENV, bad)
    with pytest.raises(ConfigError, match="HPS_ADMIN_KEY"):
        admin_key.resolve_key()


def test_a_short_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(admin_key.KEY_ENV, "k3Y9z")
    with pytest.raises(ConfigError, match=r"HPS_ADMIN_KEY: 5 characters; .* at least 16") as err:
        admin_key.resolve_key()
    assert "k3Y9z" not in str(err.value)


def test_restricted_args_and_headers() -> None:
    k1 = "k1-0123456789abcdef"
    http, grpc = admin_key.restricted_args(k1)
    apis = "model-repository,shared-memory,trace,logging"
    assert http == f"--http-restricted-api={apis}:hps-admin-key={k1}"
    assert grpc == f"--grpc-restricted-protocol={apis}:hps-admin-key={k1}"
    assert admin_key.http_headers(k1) == {"hps-admin-key": k1}
    assert admin_key.grpc_headers(k1) == {"triton-grpc-protocol-hps-admin-key": k1}
    assert admin_key.http_headers(None) == {}
