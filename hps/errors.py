"""Typed errors of HPS.

Every error HPS raises on purpose derives from :class:`HPSError`. Driver exceptions
(redis-py, rocksdict, confluent-kafka, tritonclient) are translated at the backend
boundary, so callers never see them::

    HPSError
    ├── ConfigError               ps.json is malformed: names the key and the file
    ├── RequestError              a bad lookup / insert; nothing stored changed
    │   ├── UnknownTableError     model or table not configured
    │   ├── DTypeError            keys not int64 / vectors not float32-compatible
    │   ├── ShapeError            counts do not add up, wrong vector dimension, negative counts
    │   ├── BatchTooLargeError    more keys than max_batch_size × maxnum_catfeature_query…
    │   └── InvalidValueError     NaN / inf in vectors
    ├── FormatError               a file or message that cannot be decoded
    │   ├── SparseModelError      truncated / inconsistent HugeCTR sparse-model folder
    │   └── DecodeError           a Kafka payload that cannot be decoded
    └── BackendError              a storage tier failed
        └── BackendUnavailable    the tier cannot be reached right now (retriable)

Each class carries ``status``, the HTTP status an HTTP edge answers with (the control plane
maps errors to responses with it, in one place). ``BackendUnavailable`` is the one error for
which retrying the same call may succeed.
"""

from __future__ import annotations


class HPSError(Exception):
    """Base of every error HPS raises on purpose."""

    status: int = 500


class ConfigError(HPSError):
    """The configuration is invalid; the message names the key and the file."""


class RequestError(HPSError):
    """A request is malformed; nothing stored was changed."""

    status = 400


class UnknownTableError(RequestError):
    status = 404


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


class BackendError(HPSError):
    """A storage tier failed."""

    status = 502


class BackendUnavailable(BackendError):
    """The tier cannot be reached right now; the same call may succeed later."""

    status = 503
