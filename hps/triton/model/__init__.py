"""What runs inside Triton: each model instance's Python-backend stub.

- ``templates/``: the model.py + config.pbtxt of each Triton model (package data; the
  repository writer, :mod:`hps.triton.repository`, copies them): thin adapters over
- :mod:`hps.triton.model.process`: one model instance (its session, warm-up, updates,
  metrics) and the tensors in and out of the stub;
- :mod:`hps.triton.model.session`: how an instance opens its tiers (the L3 writer or a
  follower, as :mod:`hps.topology` places it) and the node's change journal;
- :mod:`hps.triton.model.request`: the requests as NumPy arrays, limits checked, errors as
  Triton error codes;
- :mod:`hps.triton.model.metrics`: HPS counters in Triton's own /metrics.

The only package of hps that imports ``triton_python_backend_utils``, which exists only
inside the stub (:mod:`hps.triton.model.process` and the templates); it imports nothing of
the supervisor (``tests/unit/test_layers.py``).
"""
