"""The benchmark's floor: reads KEYS and NUMKEYS, answers zeros of HPS's output size."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from hps.triton.model.process import error_response, input_array, output_tensor


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.dims = np.array(params["dims"]["string_value"].split(","), dtype=np.int64)
        self.zeros = np.zeros(1 << 20, dtype=np.float32)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                input_array(request, "KEYS")
                numkeys = input_array(request, "NUMKEYS")
                size = int((numkeys[0].astype(np.int64) * self.dims).sum())
                if size > self.zeros.size:
                    self.zeros = np.zeros(size, dtype=np.float32)
                out = self.zeros[:size].reshape(1, -1)
                responses.append(pb_utils.InferenceResponse([output_tensor("OUTPUT0", out)]))
            except Exception as exc:
                responses.append(error_response(exc))
        return responses
