"""Triton serving: the tritonserver process, model repositories, request parsing, metrics.

Only :mod:`hps.triton.backend` imports ``triton_python_backend_utils``, and only the
model.py templates under model_repository/ (package data) import it, inside Triton's Python
stub; ``import hps`` and the ``hps serve`` / ``hps query`` commands work without it.
"""
