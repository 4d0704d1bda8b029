"""The request-size gate (nginx) in front of a real tritonserver: requests within the
models' limits pass unchanged; a bigger body is refused before Triton reads any of it
(Triton's request counters stay still and no byte of it reaches Triton's port), with a
clear error over gRPC and HTTP; and a neighbour beside a client flooding such requests
gets every answer right. What a refusal costs and what the flood does to a neighbour's
latency are figures of ``hps bench gate`` (docs/security.md), not bounds of a test."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.http
from tritonclient.utils import InferenceServerException

from hps.bench.flood import Flood
from hps.net import free_port
from hps.triton.client import Client
from hps.triton.supervisor.gate import BodyLimit, RequestGate

pytestmark = pytest.mark.integration

I64, I32 = np.int64, np.int32
REFUSED = "refused by the request-size gate"
HUGE = {"KEYS": np.zeros((1, 1_000_000), I64), "NUMKEYS": np.array([[1_000_000, 0, 0]], I32)}
HUGE_BYTES = sum(a.nbytes for a in HUGE.values())
# What a refusal looks like to a tritonclient, per protocol.
GATE_STATUS = {"grpc": "StatusCode.RESOURCE_EXHAUSTED", "http": "413"}
COMPRESSED_STATUS = {"grpc": "StatusCode.UNIMPLEMENTED", "http": "415"}
MODEL_STATUS = {"grpc": "StatusCode.INVALID_ARGUMENT", "http": "400"}


def url(gate: RequestGate, protocol: str) -> str:
    return f"127.0.0.1:{gate.grpc_port if protocol == 'grpc' else gate.http_port}"


class CountingRelay:
    """A TCP relay from a free loopback port to ``upstream`` (one of Triton's ports) that
    counts the bytes it passes towards Triton: what of a request reaches Triton's port."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = int(self.listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            up = socket.create_connection(("127.0.0.1", self.upstream))
            self._socks += [conn, up]
            for src, dst, count in ((conn, up, True), (up, conn, False)):
                threading.Thread(target=self._pump, args=(src, dst, count), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                if count:
                    with self._lock:
                        self.sent += len(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.listener.close()
        for s in self._socks:
            s.close()


@dataclass
class Counted:
    """A gate whose upstreams are :class:`CountingRelay`s in front of Triton's ports."""

    gate: RequestGate
    relays: dict[str, CountingRelay]  # protocol -> relay


@pytest.fixture(scope="module")
def counted(triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Counted]:
    relays = {
        "http": CountingRelay(triton.server.http_port),
        "grpc": CountingRelay(triton.server.grpc_port),
    }
    try:
        with RequestGate(
            BodyLimit.for_config(triton.config),
            tmp_path_factory.mktemp("counted-gate"),
            upstream_http=relays["http"].port,
            upstream_grpc=relays["grpc"].port,
            http_port=free_port(),
            grpc_port=free_port(),
            log_file=triton.root / "counted-gate.log",
        ) as gate:
            yield Counted(gate, relays)
    finally:
        for relay in relays.values():
            relay.close()


def triton_counts(triton, model: str = "emb") -> dict[str, float]:
    """Triton's own counts of the requests to ``model``: its statistics API and /metrics."""
    stats_url = f"http://{triton.server.http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(stats_url, timeout=10) as resp:
        stats = json.loads(resp.read())["model_stats"][0]
    with urllib.request.urlopen(triton.server.metrics_url, timeout=10) as resp:
        text = resp.read().decode()

    def metric(name: str) -> float:  # summed over its labels (the failures' reasons)
        found = re.findall(rf'^{name}{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.M)
        return sum(map(float, found))

    infer = stats["inference_stats"]
    return {
        "inference_count": float(stats["inference_count"]),
        "execution_count": float(stats["execution_count"]),
        "success": float(infer["success"]["count"]),
        "fail": float(infer["fail"]["count"]),
        "compute_input": float(infer["compute_input"]["count"]),
        "nv_inference_request_success": metric("nv_inference_request_success"),
        "nv_inference_request_failure": metric("nv_inference_request_failure"),
        "nv_inference_count": metric("nv_inference_count"),
        "nv_inference_exec_count": metric("nv_inference_exec_count"),
    }


def moved(triton, before: dict[str, float], requests: int) -> dict[str, float]:
    """What Triton's counts moved by since ``before``, once they show ``requests`` more
    (Triton updates them just after the answer leaves: the client may be faster)."""
    deadline = time.monotonic() + 30  # hang guard: they move within milliseconds
    while True:
        now = triton_counts(triton)
        delta = {k: now[k] - before[k] for k in now}
        if delta["inference_count"] >= requests or time.monotonic() > deadline:
            return delta


def one_request(n: int = 1) -> dict[str, float]:
    """The counts that ``n`` successful requests of one execution each add."""
    return {
        "inference_count": n,
        "execution_count": n,
        "success": n,
        "fail": 0,
        "compute_input": n,
        "nv_inference_request_success": n,
        "nv_inference_request_failure": 0,
        "nv_inference_count": n,
        "nv_inference_exec_count": n,
    }


def raw_client(protocol: str, address: str) -> Any:
    module = tritonclient.grpc if protocol == "grpc" else tritonclient.http
    return module.InferenceServerClient(address)


def send_huge(protocol: str, address: str) -> InferenceServerException:
    """HUGE sent with tritonclient itself (the status it reports is what a user sees)."""
    module = tritonclient.grpc if protocol == "grpc" else tritonclient.http
    inputs = []
    for name, array in HUGE.items():
        tensor = module.InferInput(name, list(array.shape), "INT64" if name == "KEYS" else "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client = raw_client(protocol, address)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("emb", inputs)
    finally:
        client.close()
    return info.value


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_within_the_limits_pass_unchanged(triton, gate, protocol: str) -> None:
    keys = triton.data["emb.a"][0][:256]  # the table's limit: 64 samples x 4 keys
    numkeys = np.array([256, 0, 0], I32)
    with Client(url(gate, protocol), grpc=protocol == "grpc") as client:
        out = client.lookup("emb", keys, numkeys)
    np.testing.assert_array_equal(out.reshape(256, 4), triton.data["emb.a"][1][:256])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_oversized_body_is_refused_before_triton_reads_it(
    triton, counted: Counted, protocol: str
) -> None:
    """An 8 MB request through the gate: the clear error, and Triton never sees it (no byte
    reaches its port, none of its counts moves). The same request straight to Triton's
    port shows that both would have seen it: 8 MB pass and its counts move by one."""
    gate, relay = counted.gate, counted.relays[protocol]
    limit = gate.limit.grpc if protocol == "grpc" else gate.limit.http
    before, sent = triton_counts(triton), relay.sent
    refused = send_huge(protocol, url(gate, protocol))
    assert str(refused.status()) == GATE_STATUS[protocol]
    assert f"request of more than {limit:,} bytes {REFUSED}" in str(refused.message())
    assert relay.sent == sent, "bytes of the refused request reached Triton's port"
    assert triton_counts(triton) == before, "Triton counted the refused request"
    # A request within the limits, through the same gate, is answered, and it is the only
    # request Triton counts since `before`: the refused one was never one of Triton's.
    keys = triton.data["emb.b"][0][:8]
    with Client(url(gate, protocol), grpc=protocol == "grpc") as client:
        out = client.lookup("emb", keys, np.array([0, 8, 0], I32))
    np.testing.assert_array_equal(out.reshape(8, 8), triton.data["emb.b"][1][:8])
    assert moved(triton, before, 1) == one_request()
    # Straight to Triton's port (the relay), the model itself has to refuse it.
    before, sent = triton_counts(triton), relay.sent
    direct = send_huge(protocol, f"127.0.0.1:{relay.port}")
    assert str(direct.status()) == MODEL_STATUS[protocol]
    assert "BatchTooLargeError" in str(direct.message())
    assert relay.sent - sent >= HUGE_BYTES
    delta = moved(triton, before, 1)
    assert delta["inference_count"] == 1
    assert delta["nv_inference_request_success"] + delta["nv_inference_request_failure"] == 1


def infer_compressed(protocol: str, address: str, keys: np.ndarray) -> Any:
    """``keys`` from emb's table a, the request compressed with gzip by tritonclient."""
    module = tritonclient.grpc if protocol == "grpc" else tritonclient.http
    inputs = []
    for name, array in (("KEYS", keys[None]), ("NUMKEYS", np.array([[keys.size, 0, 0]], I32))):
        tensor = module.InferInput(name, list(array.shape), "INT64" if name == "KEYS" else "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    option = "compression_algorithm" if protocol == "grpc" else "request_compression_algorithm"
    client = raw_client(protocol, address)
    try:
        return client.infer("emb", inputs, **{option: "gzip"})
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_compressed_request_is_refused_before_triton_reads_it(
    triton, counted: Counted, protocol: str
) -> None:
    """nginx measures a body as sent and Triton inflates a compressed one (a 194 KB gzip
    request made it inflate 200 MB): the gate refuses every compressed request, one within
    the limits too, and no byte of it reaches Triton; sent plain, the same keys are answered.
    Straight to Triton the compressed request is answered: it was Triton that inflated it."""
    gate, relay = counted.gate, counted.relays[protocol]
    keys, vectors = triton.data["emb.a"][0][:16], triton.data["emb.a"][1][:16]
    before, sent = triton_counts(triton), relay.sent
    with pytest.raises(InferenceServerException) as refused:
        infer_compressed(protocol, url(gate, protocol), keys)
    assert str(refused.value.status()) == COMPRESSED_STATUS[protocol]
    assert "compressed request refused by the request-size gate" in str(refused.value.message())
    assert relay.sent == sent, "bytes of the compressed request reached Triton's port"
    assert triton_counts(triton) == before, "Triton counted the compressed request"
    with Client(url(gate, protocol), grpc=protocol == "grpc") as client:
        out = client.lookup("emb", keys, np.array([16, 0, 0], I32))
    np.testing.assert_array_equal(out.reshape(16, 4), vectors)
    direct = infer_compressed(protocol, f"127.0.0.1:{relay.port}", keys)
    np.testing.assert_array_equal(direct.as_numpy("OUTPUT0").reshape(16, 4), vectors)


def test_http_refuses_a_declared_length_before_reading_the_body(triton, counted: Counted) -> None:
    """A JSON request announcing too much is refused from its headers alone."""
    gate, relay = counted.gate, counted.relays["http"]
    before, sent = triton_counts(triton), relay.sent
    conn = urllib.request.Request(
        f"http://{url(gate, 'http')}/v2/models/emb/infer",
        data=b"{",
        headers={"Content-Length": str(gate.limit.http + 1), "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(conn, timeout=30)
    assert err.value.code == 413
    assert REFUSED in json.loads(err.value.read())["error"]
    assert relay.sent == sent
    assert triton_counts(triton) == before


def test_admin_apis_pass_only_with_the_key(triton, gate) -> None:
    """The gate forwards the admin-key header; without it Triton still refuses."""
    base = f"http://{url(gate, 'http')}/v2/repository/index"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(base, data=b"{}"), timeout=5)
    assert err.value.code in (400, 403)
    keyed = urllib.request.Request(
        base, data=b"{}", headers={"hps-admin-key": triton.server.admin_key}
    )
    with urllib.request.urlopen(keyed, timeout=5) as resp:
        assert "emb" in {m["name"] for m in json.loads(resp.read())}


def test_a_neighbour_gets_every_answer_right_beside_a_flood(triton, gate) -> None:
    """A client loops 1M-key (8 MB) requests over gRPC and HTTP through the gate while a
    neighbour sends lookups over both: every one of the neighbour's requests is answered
    with the right vectors, every flood request gets the gate's refusal, and Triton counts
    the neighbour's requests and nothing else. The neighbour goes on until at least 100 of
    its requests and 10 of the flood's have been answered side by side."""
    keys, vectors = triton.data["emb.b"]
    rng = np.random.default_rng(9)
    # At nice 0: nothing is timed here, and the flood may take its full share of the CPU.
    flood = Flood(
        url(gate, "grpc"), url(gate, "http"), "emb", 3, 1_000_000, ("grpc", "http"), nice=0
    )
    with (
        flood,
        Client(url(gate, "grpc"), grpc=True) as via_grpc,
        Client(url(gate, "http")) as via_http,
    ):
        before, first = triton_counts(triton), len(flood.answers)
        answered = 0
        deadline = time.monotonic() + 120  # hang guard: 2-3 s when nothing is wrong
        while answered < 100 or len(flood.answers) - first < 10:
            assert time.monotonic() < deadline, f"{answered} answers, {flood.statuses(first)}"
            pick = rng.choice(keys.size, 16, replace=False)
            client = via_grpc if answered % 2 == 0 else via_http
            out = client.lookup("emb", keys[pick], np.array([0, 16, 0], I32))
            np.testing.assert_array_equal(out.reshape(16, 8), vectors[pick])
            answered += 1
        during = flood.statuses(first)
    print(f"neighbour: {answered} requests, all answered right; flood answers: {during}")
    assert set(during) <= {f"{p} {s}" for p, s in GATE_STATUS.items()}, during
    assert moved(triton, before, answered) == one_request(answered)
