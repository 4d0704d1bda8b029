"""The request-size gate: its limit from a ps.json, its nginx.conf, and nginx started,
probed and stopped by PID (against a plain HTTP upstream; Triton behind it: tests/integration)."""

from __future__ import annotations

import gzip
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from hps.config import PSConfig
from hps.errors import BackendUnavailable, ConfigError
from hps.net import free_port
from hps.triton.supervisor.gate import (
    HEADROOM,
    UNLIMITED_MODEL_BYTES,
    BodyLimit,
    RequestGate,
    find_nginx,
    render_config,
)
from tests.helpers import QuietHandler, loopback_http


def config(**model: object) -> PSConfig:
    doc = {"model": "m", "embedding_vecsize_per_table": [16, 8], "max_batch_size": 100}
    return PSConfig.model_validate({"models": [{**doc, **model}]})


def test_the_limit_is_the_largest_request_the_key_limits_allow() -> None:
    limit = BodyLimit.for_config(
        config(maxnum_catfeature_query_per_table_per_sample=[3, 1], maxnum_des_feature_per_sample=5)
    )
    keys = 100 * (3 + 1)
    counts = 101 * 2  # NUMKEYS, or ROWINDEX of a CTR request: max_batch_size + 1 rows
    dense = 100 * 5
    assert limit.grpc == keys * 8 + counts * 4 + dense * 4 + HEADROOM
    # JSON text with ", ": -9223372036854775808, -2147483648, -1.2345677691440574e-38
    rows = 101 * 3 * 4  # "[", "]", ", " of each row of each tensor as nested arrays
    assert limit.http == keys * 22 + counts * 13 + dense * 25 + rows + HEADROOM


def largest_json_body(rows: int, des: int, tables: int) -> bytes:
    """The JSON body (Python's separators, the longer ones) of a CTR request of ``rows``
    samples with ``des`` dense features each and one key per table and sample, every
    number as long as its dtype prints and every tensor as nested arrays of ``rows`` rows."""
    f32 = np.float32(-1.2345678e-38).item()  # -1.2345677691440574e-38: 23 characters
    inputs = [
        ("DES", "FP32", [[f32] * des] * rows),
        ("CATCOLUMN", "INT64", [[-(2**63)] * tables] * rows),
        ("ROWINDEX", "INT32", [[-(2**31)] * (rows + 1)] * tables),
    ]
    return json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [len(d), len(d[0])], "datatype": t, "data": d}
                for n, t, d in inputs
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
        }
    ).encode()


def many_dense_features() -> PSConfig:
    return config(
        embedding_vecsize_per_table=[8, 8],
        maxnum_catfeature_query_per_table_per_sample=[1, 1],
        maxnum_des_feature_per_sample=256,
        max_batch_size=1024,
    )


def test_the_http_limit_holds_the_json_body_of_a_request_of_many_dense_features() -> None:
    """An fp32 takes 4 bytes in binary but up to 25 characters as JSON: a valid JSON
    request of 256 dense features per sample is more than three times its binary size."""
    limit = BodyLimit.for_config(many_dense_features())
    body = largest_json_body(1024, 256, 2)
    assert len(body) > 3 * limit.grpc  # what a factor of three let through
    assert len(body) <= limit.http
    assert limit.http - len(body) < HEADROOM + 1024 * 3 * 4  # and not much more


def test_a_limit_given_in_bytes_allows_their_json_at_fp32_s_rate() -> None:
    assert BodyLimit.of(1000) == BodyLimit(grpc=1000, http=7250)  # one fp32 per row


def test_a_model_without_key_limits_gets_the_fallback() -> None:
    limit = BodyLimit.for_config(config())
    assert limit.grpc == UNLIMITED_MODEL_BYTES + HEADROOM
    counts, dense = 101 * 2, 100 * 26  # keys fill the rest: int64 at 22 characters
    keys = (UNLIMITED_MODEL_BYTES - 4 * counts - 4 * dense) // 8
    assert limit.http == keys * 22 + counts * 13 + dense * 25 + 101 * 3 * 4 + HEADROOM


def test_without_nginx_the_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda _: None)
    monkeypatch.setattr("hps.triton.supervisor.gate.NGINX_PATHS", ())
    with pytest.raises(ConfigError, match=r"apt-get install nginx-light.*--max-request-mb 0"):
        find_nginx()


class Echo(QuietHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms wait

    def do_POST(self) -> None:  # noqa: N802
        self.reply(self.rfile.read(int(self.headers["Content-Length"])))


@pytest.fixture
def upstream() -> Iterator[int]:
    with loopback_http(Echo) as port:
        yield port


def post(port: int, body: bytes) -> bytes:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/m/infer", data=body)
    with urllib.request.urlopen(req, timeout=5) as resp:
        return bytes(resp.read())


def test_nginx_forwards_refuses_and_stops(tmp_path: Path, upstream: int) -> None:
    gate = RequestGate(
        BodyLimit.of(1000), tmp_path, upstream, free_port(), free_port(), free_port()
    )
    with gate:
        assert gate.proc is not None and gate.proc.poll() is None
        assert post(gate.http_port, b"x" * 7250) == b"x" * 7250  # HTTP: 7.25 x 1000 bytes
        with pytest.raises(urllib.error.HTTPError) as err:
            post(gate.http_port, b"x" * 7251)
        assert err.value.code == 413
        assert b"more than 7,250 bytes refused by the request-size gate" in err.value.read()
        pid = gate.proc.pid
    assert gate.proc is None
    assert not Path(f"/proc/{pid}").exists()


def test_nginx_lets_the_largest_json_request_of_a_model_through(
    tmp_path: Path, upstream: int
) -> None:
    """The JSON body of a request within the model's limits reaches Triton whole."""
    limit = BodyLimit.for_config(many_dense_features())
    with RequestGate(limit, tmp_path, upstream, free_port(), free_port(), free_port()) as gate:
        body = largest_json_body(1024, 256, 2)
        assert post(gate.http_port, body) == body


def test_a_port_in_use_is_a_clear_start_up_error(tmp_path: Path, upstream: int) -> None:
    first = RequestGate(BodyLimit.of(1000), tmp_path / "a", upstream, 1, free_port(), free_port())
    with first:
        second = RequestGate(
            BodyLimit.of(1000), tmp_path / "b", upstream, 1, first.http_port, free_port()
        )
        with pytest.raises(
            ConfigError, match=f"HTTP port {first.http_port} on 127.0.0.1 is in use"
        ):
            second.start()
        assert second.proc is None


def test_a_client_connection_outlives_a_thousand_requests(tmp_path: Path, upstream: int) -> None:
    """nginx ends a client connection after 1,000 requests by default (HTTP/2: a GOAWAY,
    which failed a gRPC request in flight under load); the gate keeps it open."""
    import http.client

    gate = RequestGate(
        BodyLimit.of(1000), tmp_path, upstream, free_port(), free_port(), free_port()
    )
    with gate:
        conn = http.client.HTTPConnection("127.0.0.1", gate.http_port, timeout=5)
        try:
            for i in range(1100):
                conn.request("POST", "/v2/models/m/infer", body=b"ping")
                resp = conn.getresponse()
                assert resp.read() == b"ping"
                assert resp.getheader("Connection", "").lower() != "close", f"closed after {i + 1}"
        finally:
            conn.close()


def test_summarized_no_client_writes_a_line_to_the_console(
    tmp_path: Path, upstream: int, capfd: pytest.CaptureFixture[str]
) -> None:
    """``hps serve`` without --verbose: nginx's line per refused request goes to a file in
    the gate's folder, and the console gets their count (at stop, at the latest)."""
    gate = RequestGate(BodyLimit.of(1000), tmp_path, upstream, free_port(), free_port(),
                       free_port(), summarize=True)  # fmt: skip
    with gate:
        for _ in range(3):
            with pytest.raises(urllib.error.HTTPError):
                post(gate.http_port, b"x" * 7251)
        assert capfd.readouterr().err == ""
        assert "too large body" in (tmp_path / "error.log").read_text()
    err = capfd.readouterr().err
    assert "3 x client intended to send too large body: N bytes" in err
    assert "/v2/models" not in err and err.count("\n") == 1


def test_a_summarized_gate_that_cannot_start_says_why(
    tmp_path: Path, upstream: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its log file goes with its folder: the error carries nginx's last lines."""
    monkeypatch.setattr("hps.triton.supervisor.gate.render_config", lambda gate: "bogus on;\n")
    gate = RequestGate(BodyLimit.of(1000), tmp_path, upstream, free_port(), free_port(),
                       free_port(), summarize=True)  # fmt: skip
    with pytest.raises(BackendUnavailable, match='exited with status 1 at start-up\n.*"bogus"'):
        gate.start()


def test_a_wildcard_ipv6_gate_listens_ipv6_only_and_is_probed_at_ipv6_loopback(
    tmp_path: Path,
) -> None:
    """nginx's ``listen [::]:port`` is IPv6-only: a gate on ``::`` is up when ::1 answers
    (probing 127.0.0.1 it never was)."""
    with socket.socket(socket.AF_INET6) as listener:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        listener.bind(("::1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        gate = RequestGate(BodyLimit.of(1000), tmp_path, 1, 2, port, port, host="::")
        assert f"listen [::]:{port};" in render_config(gate)
        assert gate._accepts(port)
    named = RequestGate(BodyLimit.of(1000), tmp_path, 1, 2, 3, 4, host="localhost")
    assert "listen 127.0.0.1:3;" in render_config(named)  # resolved once, as Triton's


def post_encoded(port: int, body: bytes, encoding: str) -> bytes:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/m/infer",
        data=body,
        headers={"Content-Encoding": encoding},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return bytes(resp.read())


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "GZIP", "br", "identity, gzip"])
def test_http_refuses_a_compressed_body(tmp_path: Path, upstream: int, encoding: str) -> None:
    """nginx measures a body as sent; Triton inflates a compressed one past the limit."""
    body = gzip.compress(b"\0" * 100_000)  # 100 KB inflated, 7,250 bytes the limit
    with RequestGate(
        BodyLimit.of(1000), tmp_path, upstream, free_port(), free_port(), free_port()
    ) as gate:
        with pytest.raises(urllib.error.HTTPError) as err:
            post_encoded(gate.http_port, body, encoding)
        assert err.value.code == 415
        assert err.value.headers["Accept-Encoding"] == "identity"
        message = json.loads(err.value.read())["error"]
        assert "compressed request refused by the request-size gate" in message
        assert post_encoded(gate.http_port, b"plain", "identity") == b"plain"
        assert post_encoded(gate.http_port, b"plain", "IDENTITY") == b"plain"
        assert post(gate.http_port, b"plain") == b"plain"


def grpc_call(
    port: int, compression: grpc.Compression, metadata: tuple[tuple[str, str], ...] = ()
) -> grpc.RpcError:
    """A 100-byte unary call through the gate's gRPC port, where no gRPC server is behind
    it: the error it ends with."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as err:
            call(b"\0" * 100, timeout=5, compression=compression, metadata=metadata)
    assert isinstance(err.value, grpc.RpcError)
    return err.value


def test_grpc_refuses_a_compressed_message(tmp_path: Path, upstream: int) -> None:
    """gRPC's own status for a compression it will not take; an uncompressed call passes
    the gate (to an upstream that is not there: UNAVAILABLE)."""
    with RequestGate(
        BodyLimit.of(1000), tmp_path, upstream, free_port(), free_port(), free_port()
    ) as gate:
        for compression in (grpc.Compression.Gzip, grpc.Compression.Deflate):
            refused = grpc_call(gate.grpc_port, compression)
            assert refused.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "compressed request refused by the request-size gate" in refused.details()
        plain = grpc.Compression.NoCompression
        stream = grpc_call(gate.grpc_port, plain, (("content-encoding", "gzip"),))
        assert stream.code() == grpc.StatusCode.UNIMPLEMENTED
        assert grpc_call(gate.grpc_port, plain).code() == grpc.StatusCode.UNAVAILABLE
