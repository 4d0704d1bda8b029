"""TLS to a real redis-server: CA, client certificate and SNI (tls_server_name_identification)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.config import VolatileDBConfig
from hps.errors import BackendError, BackendUnavailable, ConfigError
from hps.storage import open_store
from hps.storage.redis_cluster import RedisStore
from hps.testing.redis import RedisClusterServers, RedisServer
from hps.types import TableSpec
from tests.helpers import rows, unique_name

pytestmark = pytest.mark.integration

SERVER_NAME = "redis.test"  # the only name in the server certificate


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(cwd: Path, name: str, subject: str, san: str | None) -> None:
    """A P-256 key and a certificate for it signed by ca.key."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=cwd)  # fmt: skip
    ext = []
    if san:
        (cwd / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        ext = ["-extfile", f"{name}.ext"]
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", *ext, cwd=cwd)  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificates")
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=hps test CA", cwd=d)  # fmt: skip
    _issue(d, "server", f"/CN={SERVER_NAME}", f"DNS:{SERVER_NAME}")
    _issue(d, "client", "/CN=hps client", None)
    return d


@pytest.fixture(scope="module")
def tls_server(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-tls"), extra_args=_server_args(certs))
    server.start()
    yield server
    server.stop()


def _server_args(certs: Path) -> list[str]:
    return [
        "--port", "0", "--tls-port", "{port}",
        "--tls-cert-file", str(certs / "server.crt"),
        "--tls-key-file", str(certs / "server.key"),
        "--tls-ca-cert-file", str(certs / "ca.crt"),
        "--tls-auth-clients", "yes",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def tls_cluster(
    certs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterServers]:
    admin = {
        "ssl": True,
        "ssl_ca_certs": str(certs / "ca.crt"),
        "ssl_certfile": str(certs / "client.crt"),
        "ssl_keyfile": str(certs / "client.key"),
        "ssl_check_hostname": False,
    }
    cluster = RedisClusterServers(
        tmp_path_factory.mktemp("redis-tls-cluster"),
        extra_args=[*_server_args(certs), "--tls-cluster", "yes"],
        client_kwargs=admin,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def tls_config(
    server: RedisServer | RedisClusterServers, certs: Path, **extra: object
) -> VolatileDBConfig:
    return VolatileDBConfig.model_validate(
        {
            "type": "redis",
            "address": server.address,
            "enable_tls": True,
            "tls_ca_certificate": str(certs / "ca.crt"),
            "tls_client_certificate": str(certs / "client.crt"),
            "tls_client_key": str(certs / "client.key"),
            **extra,
        }
    )


def test_round_trip_over_tls_with_sni(tls_server: RedisServer, certs: Path) -> None:
    store = open_store(tls_config(tls_server, certs, tls_server_name_identification=SERVER_NAME))
    assert store is not None
    spec = TableSpec(model=unique_name(), table="t", dim=4)
    store.open_table(spec)
    keys = np.arange(300, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, 4))
    values, found = store.fetch(spec.name, keys)
    assert found.all()
    np.testing.assert_array_equal(values, rows(keys, 4))
    store.close()


def test_round_trip_over_a_tls_cluster(tls_cluster: RedisClusterServers, certs: Path) -> None:
    store = open_store(tls_config(tls_cluster, certs, tls_server_name_identification=SERVER_NAME))
    assert isinstance(store, RedisStore) and store.cluster
    spec = TableSpec(model=unique_name(), table="t", dim=4)
    store.open_table(spec)
    keys = np.arange(2000, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, 4))
    values, found = store.fetch(spec.name, keys)
    assert found.all()
    np.testing.assert_array_equal(values, rows(keys, 4))
    per_node = [len(n.client().keys("hps_et*")) for n in tls_cluster.nodes]
    assert all(per_node), per_node  # the partitions spread over the TLS nodes
    store.close()


def test_certificate_name_is_checked(tls_server: RedisServer, certs: Path) -> None:
    # Without an explicit SNI the address (127.0.0.1) must match the certificate: it does not.
    for cfg in (
        tls_config(tls_server, certs),
        tls_config(tls_server, certs, tls_server_name_identification="other.test"),
    ):
        with pytest.raises(BackendError, match="certificate refused") as info:
            open_store(cfg)
        assert not isinstance(info.value, BackendUnavailable)


def test_client_certificate_is_required_by_this_server(
    tls_server: RedisServer, certs: Path
) -> None:
    cfg = VolatileDBConfig.model_validate(
        {
            "type": "redis",
            "address": tls_server.address,
            "enable_tls": True,
            "tls_ca_certificate": str(certs / "ca.crt"),
            "tls_server_name_identification": SERVER_NAME,
        }
    )
    with pytest.raises(BackendError):
        open_store(cfg)


def test_a_configured_certificate_file_must_exist(tls_server: RedisServer, certs: Path) -> None:
    with pytest.raises(ConfigError, match="tls_ca_certificate"):
        open_store(tls_config(tls_server, certs, tls_ca_certificate=str(certs / "missing.crt")))
