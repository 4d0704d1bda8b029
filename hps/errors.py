"""Typed errors of HPS.

Every error HPS raises on purpose derives from :class:`HPSError`. Driver exceptions
(redis-py, rocksdict, confluent-kafka, tritonclient) are translated at the backend
boundary, so callers never see them::

    HPSError
    ├── ConfigError               ps.json is malformed: names the key and the file
    ├── RequestError              a bad lookup / insert; nothing stored changed
    │   ├── UnknownTableError     model or table not configured
    │   ├── UnknownJobError       no control-plane job of that id
    │   ├── ConflictError         the state of what it names forbids it (a live model version)
    │   ├── DTypeError            keys not int64 / vectors not float32-compatible
    │   ├── ShapeError            counts do not add up, wrong vector dimension, negative counts
    │   ├── BatchTooLargeError    more keys than max_batch_size × maxnum_catfeature_query…
    │   └── InvalidValueError     NaN / inf in vectors
    ├── FormatError               a file or message that cannot be decoded
    │   ├── SparseModelError      truncated / inconsistent HugeCTR sparse-model folder
    │   └── DecodeError           a Kafka payload that cannot be decoded
    │       └── VersionError      an update version too far ahead of the consumer's clock at receipt
    └── BackendError              a storage tier failed
        ├── ClientLost            a Kafka client hit a fatal error: only a new one goes on
        ├── DamagedRowsError      some keys' rows sit in damaged blocks (the rest were read)
        ├── FillError             a fill of L2 from L3 stopped part-way
        ├── AccessRefused         the tier refused this client (credentials, permissions)
        └── BackendUnavailable    the tier cannot be reached right now (retriable)
            ├── CircuitOpenError  skipped without trying: the tier failed moments ago
            └── QueueFullError    the control plane's job queue is full (429, Retry-After)

The one mapping from errors to statuses: each class carries ``status``, the HTTP status
(the control plane answers with :func:`http_status`), and ``code``, the Triton error code
(``pb_utils.TritonError.<code>``: a Triton model answers with :func:`triton_code`):

=====================  ====  ===========
error                  HTTP  Triton
=====================  ====  ===========
RequestError           400   INVALID_ARG
UnknownTableError      404   NOT_FOUND
UnknownJobError        404   NOT_FOUND
ConflictError          409   INVALID_ARG
BatchTooLargeError     413   INVALID_ARG
FormatError            422   INTERNAL
BackendError           502   INTERNAL
BackendUnavailable     503   UNAVAILABLE
QueueFullError         429   UNAVAILABLE
any other              500   INTERNAL
=====================  ====  ===========

``BackendUnavailable`` is the one error for which retrying the same call may succeed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class HPSError(Exception):
    """Base of every error HPS raises on purpose."""

    status: int = 500  # HTTP
    code: str = "INTERNAL"  # Triton (pb_utils.TritonError.<code>)


class ConfigError(HPSError):
    """The configuration is invalid; the message names the key and the file."""


class RequestError(HPSError):
    """A request is malformed; nothing stored was changed."""

    status = 400
    code = "INVALID_ARG"


class UnknownTableError(RequestError):
    status = 404
    code = "NOT_FOUND"


class UnknownJobError(RequestError):
    """No job of the control plane has that id (none submitted, or no longer kept)."""

    status = 404
    code = "NOT_FOUND"


class ConflictError(RequestError):
    """The request is well formed but the state of what it names forbids it (retiring the
    live model version, activating one that is not ready); nothing was changed."""

    status = 409


class DTypeError(RequestError):
    pass


class ShapeError(RequestError):
    pass


class BatchTooLargeError(RequestError):
    status = 413


class InvalidValueError(RequestError):
    pass


class FormatError(HPSError):
    """Data that cannot be decoded."""

    status = 422


class SparseModelError(FormatError):
    pass


class DecodeError(FormatError):
    pass


class VersionError(DecodeError):
    """An update whose version lies beyond the allowed bound (it would pin its keys)."""


class BackendError(HPSError):
    """A storage tier failed."""

    status = 502


class ClientLost(BackendError):
    """A Kafka client hit one of librdkafka's fatal errors: it will fail every call from
    now on, so whoever holds it makes a new one (or, a process of its own, exits)."""


class DamagedRowsError(BackendError):
    """Some keys of a read sit in damaged storage blocks (a checksum mismatch); the others
    were read. ``values``/``found`` hold the read of every key but the ``damaged`` ones
    (a mask over the keys asked for), which are not found."""

    def __init__(
        self,
        message: str,
        values: npt.NDArray[np.generic],
        found: npt.NDArray[np.bool_],
        damaged: npt.NDArray[np.bool_],
    ) -> None:
        super().__init__(message)
        self.values = values
        self.found = found
        self.damaged = damaged


class AccessRefused(BackendError):
    """The tier answered, but refused this client: its credentials (a rotated password, a
    disabled user) or its permissions. Retrying as is will not help; a lookup with an L3
    reads L3 instead (:meth:`hps.tiers.Tiers.fetch`)."""


class FillError(BackendError):
    """A fill of L2 from L3 stopped part-way, after ``rows`` rows."""

    def __init__(self, message: str, rows: int) -> None:
        super().__init__(message)
        self.rows = rows


class BackendUnavailable(BackendError):
    """The tier cannot be reached right now; the same call may succeed later."""

    status = 503
    code = "UNAVAILABLE"


class CircuitOpenError(BackendUnavailable):
    """Not tried: the tier failed moments ago and is skipped for a back-off period."""


class QueueFullError(BackendUnavailable):
    """Too much work is pending (the control plane's jobs); retry after ``retry_after_s``."""

    status = 429

    def __init__(self, message: str, retry_after_s: int = 30) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def http_status(exc: BaseException) -> int:
    """The HTTP status an edge answers ``exc`` with (500 for anything not ours)."""
    return exc.status if isinstance(exc, HPSError) else 500


def triton_code(exc: BaseException) -> str:
    """The Triton error code a model answers ``exc`` with (``INTERNAL`` for anything not ours)."""
    return exc.code if isinstance(exc, HPSError) else "INTERNAL"
