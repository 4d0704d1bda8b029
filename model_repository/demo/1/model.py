"""HugeCTR's HPS-backend interface over hps.LookupSession (KEYS, NUMKEYS -> OUTPUT0)."""

from functools import partial

from hps.triton.model.process import ModelProcess, input_array
from hps.triton.model.request import RequestLimits, lookup_hps_request


class TritonPythonModel:
    def initialize(self, args):
        self.process = ModelProcess(args)
        # a GPU instance answers on its GPU (OUTPUT0 a GPU tensor), a CPU one on the host
        self.lookup = partial(
            self.process.session.lookup_request, self.process.name, on_gpu=self.process.on_gpu
        )
        self.limits = RequestLimits.of(self.process.model.tables)

    def execute(self, requests):
        return self.process.answer(requests, self.vectors)

    def vectors(self, request):
        keys = input_array(request, "KEYS")
        numkeys = input_array(request, "NUMKEYS")
        return lookup_hps_request(keys, numkeys, self.lookup, self.limits)

    def finalize(self):
        self.process.close()
