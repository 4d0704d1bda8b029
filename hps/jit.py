"""Whether compiled CPU/GPU code may be used: the one ``HPS_KERNELS`` switch.

``HPS_KERNELS=numpy`` keeps every kernel on its NumPy path (measurements, debugging): the L1
cache's probe+gather (:mod:`hps.cache.kernels`) and the index's loops (:mod:`hps.index`).
Without numba (or CuPy) the NumPy paths run anyway, and so they do when numba is installed
but cannot compile or cache its loops (no writable cache folder for this user, say): one
warning says why (:func:`not_compiled`).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)
_warned: set[str] = set()


def compiled_allowed() -> bool:
    """False when ``HPS_KERNELS=numpy`` asks for the NumPy paths only."""
    return os.environ.get("HPS_KERNELS", "").lower() != "numpy"


def not_compiled(what: str, exc: BaseException) -> None:
    """Say (once per process, a warning) that numba could not load or compile ``what``'s
    loops and that the NumPy paths run instead; a missing numba is only an info line."""
    if isinstance(exc, ImportError) and exc.name is not None and exc.name.startswith("numba"):
        log.info("numba not installed: %s uses its NumPy path", what)
        return
    first = not _warned
    _warned.add(what)
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "numba could not compile or cache the CPU kernels (%s: %s); %s uses the NumPy paths "
        "(slower); give this user a writable NUMBA_CACHE_DIR to compile them",
        type(exc).__name__,
        exc,
        what,
    )
