"""HugeCTR's HPS-backend interface over hps.LookupSession (KEYS, NUMKEYS -> OUTPUT0)."""

import time
from functools import partial

import triton_python_backend_utils as pb_utils

from hps.triton.backend import ModelProcess, error_response, input_array, output_tensor
from hps.triton.request import error_reply, lookup_hps_request


class TritonPythonModel:
    def initialize(self, args):
        self.process = ModelProcess(args)
        self.lookup = partial(self.process.session.lookup_request, self.process.name)

    def execute(self, requests):
        responses = []
        for request in requests:  # each request succeeds or fails on its own
            start = time.perf_counter()
            try:
                keys = input_array(request, "KEYS")
                numkeys = input_array(request, "NUMKEYS")
                out = lookup_hps_request(keys, numkeys, self.lookup)
                responses.append(pb_utils.InferenceResponse([output_tensor("OUTPUT0", out)]))
                self.process.metrics.observe(time.perf_counter() - start)
            except Exception as exc:
                responses.append(error_response(exc))
                self.process.metrics.error(error_reply(exc)[1])
        self.process.metrics.maybe_flush()
        return responses

    def finalize(self):
        self.process.close()
