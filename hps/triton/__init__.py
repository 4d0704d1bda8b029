"""Triton serving, split by the process each part runs in.

- :mod:`hps.triton.model`: runs inside Triton, in each model instance's Python-backend stub
  (the model.py templates in ``model/templates/``, the model process, request parsing,
  metrics). The only place that imports ``triton_python_backend_utils``.
- :mod:`hps.triton.supervisor`: what ``hps serve`` runs: tritonserver, the request-size gate
  (nginx), the dead-stub watchdog, the output reader, the run from start to drain.
- :mod:`hps.triton.client`: the one Triton client (inference, model control, metrics),
  run by whoever talks to a Triton server: ``hps query``/``hps reload``, the supervisor, the
  control plane, benchmarks, the load test.
- :mod:`hps.triton.repository`: the model-repository writer (templates -> a Triton model
  repository for a ps.json), run by ``hps serve`` and ``hps repository``.
- Shared by these processes: :mod:`hps.triton.serving` (a ps.json as served, its tables
  imported, a process's L2 filled), :mod:`hps.triton.admin_key` (the admin key that guards
  Triton's admin APIs), :mod:`hps.triton.instance_ready` (the line a warm instance logs).
- :mod:`hps.triton.commands`: the CLI (``hps demo``, ``serve``, ``repository``, ``reload``,
  ``query``, ``install-triton``).

The model package and the supervisor import nothing of each other
(``tests/unit/test_layers.py``); ``import hps`` and the ``hps serve`` / ``hps query``
commands work without Triton's Python backend.
"""
