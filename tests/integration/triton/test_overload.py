"""Overload (docs/serving.md, "Overload"): Triton's queue of a model is bounded in size and
in time, and a request whose client gave up while it waited is not looked up.

The model ``held`` is ``hps_embedding`` as ``hps serve`` writes it from a ps.json with
``hps_max_queue_size: 2`` and a long ``hps_queue_timeout_s``, one instance, except that a
request whose first key is ``HOLD_KEY`` holds that instance until the test releases it:
what comes meanwhile waits in Triton's queue, deterministically, with no timing involved
but the hang guards (a stopped stub would do, but Triton's Python backend declares a stub
it cannot reach for a second dead and then crashes the server).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from hps.errors import BackendUnavailable
from hps.triton.client import Client
from hps.triton.repository import prepare_repository
from hps.triton.serving import prepare_tables, serving_config
from hps.triton.supervisor.server import TritonServer
from tests.fixtures.triton import write_tables

pytestmark = pytest.mark.integration

HOLD_KEY = -7  # not a key of the table: answered with its default
GUARD_S = 60.0  # hang guard: far beyond what any step takes

HELD_MODEL = '''"""hps_embedding, but a request whose first key is {hold} holds its instance until
{release} exists (at most {guard} s); it marks {held} once it holds."""

import importlib.util
import os
import time

from hps.triton.model.process import input_array
from hps.triton.repository import packaged_templates

_path = packaged_templates() / "hps_embedding" / "1" / "model.py"
_spec = importlib.util.spec_from_file_location("hps_embedding_model", _path)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


class TritonPythonModel(_base.TritonPythonModel):
    def vectors(self, request):
        keys = input_array(request, "KEYS")
        if keys.size and keys[0, 0] == {hold}:
            open({held!r}, "w").close()
            deadline = time.monotonic() + {guard}
            while not os.path.exists({release!r}) and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().vectors(request)
'''


@dataclass
class Held:
    server: TritonServer
    root: Path

    def inputs(self, first: int) -> dict[str, np.ndarray]:
        return {"KEYS": np.array([[first, 2]], np.int64), "NUMKEYS": np.array([[2]], np.int32)}

    def metric(self, family: str, **labels: str) -> float:
        """The sum of ``family``'s series of model ``held`` with ``labels``."""
        with urllib.request.urlopen(self.server.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        want = {"model": "held", **labels}
        total = 0.0
        for found, value in re.findall(rf"^{family}\{{([^}}]*)\}} (\S+)$", text, re.M):
            have = dict(re.findall(r'(\w+)="([^"]*)"', found))
            if all(have.get(k) == v for k, v in want.items()):
                total += float(value)
        return total


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Held]:
    root = tmp_path_factory.mktemp("overload")
    write_tables(root / "tables", {"held": [("t", 4, 50)]}, seed_base=300)
    doc = {
        "models": [
            {
                "model": "held",
                "sparse_files": [str(root / "tables" / "held" / "t")],
                "embedding_table_names": ["t"],
                "embedding_vecsize_per_table": [4],
                "hps_max_queue_size": 2,
                "hps_queue_timeout_s": GUARD_S,
            }
        ],
        "persistent_db": {"type": "rocks_db", "path": str(root / "rocksdb")},
    }
    (root / "ps.json").write_text(json.dumps(doc))
    config = serving_config(root / "ps.json")
    prepare_repository(config, root / "repository", metrics_interval_s=0.0)
    (root / "repository" / "held" / "1" / "model.py").write_text(
        HELD_MODEL.format(
            hold=HOLD_KEY, held=str(root / "held"), release=str(root / "release"), guard=GUARD_S
        )
    )
    prepare_tables(config)
    log = root / "triton.log"
    server = TritonServer(root / "repository", explicit=True, load_models=["held"], log_file=log)
    server.start()
    try:
        yield Held(server, root)
    finally:
        problems = server.stop()
        assert not problems, f"unclean stop: {problems}; see {log}"


def wait_for(what: str, done: Callable[[], bool], guard: float = GUARD_S) -> None:
    deadline = time.monotonic() + guard
    while not done():
        assert time.monotonic() < deadline, f"hang guard: {what}"
        time.sleep(0.01)


def test_a_full_queue_refuses_and_a_request_given_up_on_is_not_looked_up(held: Held) -> None:
    answers: dict[str, str] = {}

    def ask(name: str, first: int) -> None:
        with Client(held.server.http_url, network_timeout=GUARD_S) as client:
            try:
                client.infer("held", held.inputs(first))
                answers[name] = "ok"
            except BackendUnavailable as exc:
                answers[name] = str(exc)

    looked_up = held.metric("hps_requests_total")
    cancelled = held.metric("hps_request_errors_total", code="CANCELLED")
    canceled_by_triton = held.metric("nv_inference_request_failure", reason="CANCELED")

    holder = threading.Thread(target=ask, args=("holder", HOLD_KEY))
    holder.start()
    wait_for("the holding request reached the instance", (held.root / "held").exists)

    # a client whose deadline passes while its request waits in the queue
    with grpcclient.InferenceServerClient(held.server.grpc_url) as grpc:
        tensors = []
        for name, array in held.inputs(3).items():
            tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
            grpc.infer("held", tensors, client_timeout=0.5)

    # three more than the queue's two places can hold (the abandoned request may take one)
    others = [threading.Thread(target=ask, args=(f"other{i}", 4 + i)) for i in range(3)]
    for t in others:
        t.start()
    full = "Exceeds maximum queue size"
    wait_for("a request refused by the full queue", lambda: full in "".join(answers.values()))
    (held.root / "release").touch()
    for t in [holder, *others]:
        t.join(GUARD_S)
        assert not t.is_alive(), "hang guard: a request was never answered"

    ok = sorted(name for name, answer in answers.items() if answer == "ok")
    refused = [answer for answer in answers.values() if answer != "ok"]
    assert "holder" in ok and 1 <= len(refused) <= 2
    assert all(full in answer for answer in refused), refused
    # the abandoned request was not looked up: Triton dropped it from its queue, or (when
    # it was already on its way to the instance) the instance answered it CANCELLED
    assert held.metric("hps_requests_total") - looked_up == len(ok)
    assert held.metric("nv_inference_request_failure", reason="CANCELED") - canceled_by_triton == 1
    assert held.metric("hps_request_errors_total", code="CANCELLED") - cancelled in (0, 1)


def test_a_request_waits_no_longer_than_its_timeout(held: Held) -> None:
    """The queue's timeout (here the client's shorter one, which the policy allows): a
    request that waited that long is refused, unlooked-up; the queue is empty after."""
    (held.root / "held").unlink(missing_ok=True)
    (held.root / "release").unlink(missing_ok=True)
    looked_up = held.metric("hps_requests_total")
    answers: list[str] = []

    def hold() -> None:
        with Client(held.server.http_url, network_timeout=GUARD_S) as client:
            client.infer("held", held.inputs(HOLD_KEY))
            answers.append("holder ok")

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        wait_for("the holding request reached the instance", (held.root / "held").exists)
        with Client(held.server.http_url, network_timeout=GUARD_S) as client:
            request = [client._input(k, v) for k, v in held.inputs(5).items()]
            with pytest.raises(InferenceServerException, match="Request timeout expired"):
                client.client.infer("held", request, timeout=100_000)  # microseconds
    finally:
        (held.root / "release").touch()
        holder.join(GUARD_S)
    assert answers == ["holder ok"]
    assert held.metric("hps_requests_total") - looked_up == 1
    assert held.metric("nv_inference_pending_request_count") == 0
