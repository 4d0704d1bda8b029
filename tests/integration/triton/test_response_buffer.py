"""The device's response buffer (``hps.cache.device.Device.response``) in Triton's real stub.

A host answer of caches on a GPU is written into one pinned buffer per device, handed to
Triton as a DLPack tensor (``hps.triton.model.process.output_tensor``) and copied out by the
stub after ``execute`` returns. No GPU here, so the model below answers from the response
buffer of a device over host memory, as the pipeline does; what the stub must give is the
same: every answer intact when two requests share one ``execute`` (the second goes to other
memory), and the buffer free again by the next ``execute`` (so serving keeps using it).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from hps.triton.client import Client
from hps.triton.supervisor.server import TritonServer

pytestmark = pytest.mark.integration

MODEL = '''
import numpy as np

from hps.cache.device import Device, address
from hps.triton.model.process import input_array, output_tensor
import triton_python_backend_utils as pb_utils


class HostDevice(Device):
    """A device over host memory: only its response buffer is used here."""

    xp = np

    def _alloc_pinned(self, nbytes):
        return np.empty(nbytes, np.uint8)

    def _alloc_device(self, nbytes):
        return np.empty(nbytes, np.uint8)

    def to_device(self, dst, src):
        np.copyto(dst, src)

    def to_host(self, dst, src):
        np.copyto(dst, src)

    def zero(self, dst):
        dst.fill(0)

    def launch(self, name, blocks, threads, args, *, own_stream=True):
        raise RuntimeError("no kernels in this model")

    def synchronize(self):
        pass


class TritonPythonModel:
    def initialize(self, args):
        self.device = HostDevice()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = input_array(request, "X")
            y = self.device.response(x.size).reshape(x.shape)
            y[...] = 2 * x
            in_buffer = address(y) == address(self.device._response)
            flags = np.array([[len(requests), int(in_buffer)]] * x.shape[0], dtype=np.int32)
            tensors = [output_tensor("Y", y), output_tensor("SEEN", flags)]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
'''

CONFIG = """
name: "leased"
backend: "python"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [
  { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "SEEN", data_type: TYPE_INT32, dims: [ 2 ] }
]
dynamic_batching { preferred_batch_size: [ 2 ], max_queue_delay_microseconds: 5000000 }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def _ask(url: str, x: np.ndarray) -> tuple[np.ndarray, list[int]]:
    with Client(url) as client:
        got = client.infer_outputs("leased", {"X": x}, ("Y", "SEEN"))
    return got["Y"], got["SEEN"][0].tolist()


def test_answers_from_the_response_buffer_survive_the_stub(tmp_path: Path) -> None:
    model = tmp_path / "repository" / "leased"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(MODEL)
    (model / "config.pbtxt").write_text(CONFIG)
    server = TritonServer(tmp_path / "repository", explicit=True, load_models=["leased"])
    server.start()
    try:
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal((1, 5000)).astype(np.float32) for _ in range(2)]
        answers: dict[int, tuple[np.ndarray, list[int]]] = {}

        def ask(i: int) -> None:
            answers[i] = _ask(server.http_url, xs[i])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(2):  # one execute held both: each answer its own, intact
            np.testing.assert_array_equal(answers[i][0], 2 * xs[i])
        assert sorted(seen for _, seen in answers.values()) == [[2, 0], [2, 1]]

        for x in xs:  # one request an execute: the buffer was free again each time
            y, seen = _ask(server.http_url, x)
            np.testing.assert_array_equal(y, 2 * x)
            assert seen == [1, 1]
    finally:
        assert not server.stop()
