"""Whether compiled CPU/GPU code may be used: the one ``HPS_KERNELS`` switch.

``HPS_KERNELS=numpy`` keeps every kernel on its NumPy path (measurements, debugging): the L1
cache's probe+gather (:mod:`hps.cache.kernels`) and the index's loops (:mod:`hps.index`).
Without numba (or CuPy) the NumPy paths run anyway.
"""

from __future__ import annotations

import os


def compiled_allowed() -> bool:
    """False when ``HPS_KERNELS=numpy`` asks for the NumPy paths only."""
    return os.environ.get("HPS_KERNELS", "").lower() != "numpy"
