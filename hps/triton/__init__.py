"""Triton serving: the tritonserver process, model repositories, request parsing, metrics.

Nothing here imports ``triton_python_backend_utils`` at module level except the modules
that only run inside a model process (:mod:`hps.triton.metrics`), so ``import hps`` and the
``hps serve`` command work without Triton's Python backend.
"""
