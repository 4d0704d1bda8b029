"""An example CTR model: HPS lookup + dense network in one model (DES, CATCOLUMN, ROWINDEX)."""

from hps.ctr.network import DenseNetwork, pool_embeddings
from hps.triton.model.process import ModelProcess, input_array
from hps.triton.model.request import parse_ctr_request


class TritonPythonModel:
    def initialize(self, args):
        self.process = ModelProcess(args, ctr=True)
        model = self.process.model
        # the network runs where L1 answers (the rows stay on its GPU, if it has one)
        l1 = self.process.session.l1_devices.get(self.process.name)
        device = l1.device if l1 else model.hps_cache.device
        self.network = DenseNetwork(model.dense_file, device)
        self.dims = [t.dim for t in model.tables]

    def execute(self, requests):
        return self.process.answer(requests, self.scores)

    def scores(self, request):
        batch = parse_ctr_request(
            input_array(request, "DES"),
            input_array(request, "CATCOLUMN"),
            input_array(request, "ROWINDEX"),
            len(self.dims),
            self.network.num_dense,
            self.process.model.max_batch_size,
        )
        vectors = self.process.session.lookup_request(
            self.process.name, batch.keys, batch.num_keys, on_gpu=True
        )
        pooled = pool_embeddings(vectors, batch.num_keys, batch.offsets, self.dims)
        return self.network(batch.dense, pooled).reshape(1, -1)

    def finalize(self):
        self.process.close()
