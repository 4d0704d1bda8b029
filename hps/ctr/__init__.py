"""The example CTR model that HPS serves next to its embedding models.

- :mod:`hps.ctr.network`: sum-pooled embeddings + dense features through a small MLP
  (NumPy or CuPy), its weights in one ``.npz``;
- :mod:`hps.ctr.demo`: ``hps demo``'s synthetic model: its tables, weights and ps.json.

Not Triton-specific: the ``hps_ctr`` Triton model (:mod:`hps.triton.model`), the watchdog's
probes, ``hps query`` and the load test use it.
"""
