"""An example CTR model: HPS lookup + dense network in one model (DES, CATCOLUMN, ROWINDEX)."""

import time

import triton_python_backend_utils as pb_utils

from hps.triton.backend import ModelProcess, error_response, input_array, output_tensor
from hps.triton.ctr import DenseNetwork, pool_embeddings
from hps.triton.request import error_reply, parse_ctr_request


class TritonPythonModel:
    def initialize(self, args):
        self.process = ModelProcess(args)
        model = self.process.model
        self.network = DenseNetwork(model.dense_file, model.hps_cache.device)
        self.dims = [t.dim for t in model.tables]

    def execute(self, requests):
        responses = []
        session, name = self.process.session, self.process.name
        for request in requests:  # each request succeeds or fails on its own
            start = time.perf_counter()
            try:
                batch = parse_ctr_request(
                    input_array(request, "DES"),
                    input_array(request, "CATCOLUMN"),
                    input_array(request, "ROWINDEX"),
                    len(self.dims),
                    self.network.num_dense,
                )
                vectors = session.lookup_request(name, batch.keys, batch.num_keys)
                pooled = pool_embeddings(vectors, batch.num_keys, batch.offsets, self.dims)
                scores = self.network(batch.dense, pooled).reshape(1, -1)
                responses.append(pb_utils.InferenceResponse([output_tensor("OUTPUT0", scores)]))
                self.process.metrics.observe(time.perf_counter() - start)
            except Exception as exc:
                responses.append(error_response(exc))
                self.process.metrics.error(error_reply(exc)[1])
        self.process.metrics.maybe_flush()
        return responses

    def finalize(self):
        self.process.close()
