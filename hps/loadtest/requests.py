"""The requests of the load-test users, and the checks of Triton's answers to them.

An HPS lookup (KEYS + NUMKEYS -> OUTPUT0) carries known keys at random positions of every
table, and its answer must hold their vectors there; a CTR request's known samples must get
the scores that the tables and the dense weights give. Anything else is a
:class:`WrongAnswer`: a failure, not just an error status. A malformed request must be
refused as one (:func:`check_refused`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class WrongAnswer(AssertionError):
    """Triton answered, but not what the tables hold."""


@dataclass
class LookupRequest:
    keys: np.ndarray
    numkeys: np.ndarray
    dims: list[int]
    checks: list[tuple[np.ndarray, np.ndarray]]  # per table: (positions, expected vectors)

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        return {"KEYS": self.keys[None], "NUMKEYS": self.numkeys[None]}

    def check(self, output: np.ndarray) -> None:
        """Raise :class:`WrongAnswer` unless every planted key got its vector."""
        flat = np.asarray(output, dtype=np.float32).reshape(-1)
        expected_size = int(np.dot(self.numkeys, self.dims))
        if flat.size != expected_size:
            raise WrongAnswer(f"OUTPUT0 has {flat.size} values, expected {expected_size}")
        counts = np.array([pos.size for pos, _ in self.checks], dtype=np.int64)
        if not counts.sum():
            return
        # Every planted row of every table at once: one comparison, not one per table.
        table = np.repeat(np.arange(counts.size), counts)
        dims = np.asarray(self.dims, dtype=np.int64)
        starts = np.cumsum(self.numkeys * dims) - self.numkeys * dims
        width = dims[table]
        base = starts[table] + np.concatenate([pos for pos, _ in self.checks]) * width
        want = np.concatenate([w.reshape(-1) for _, w in self.checks])
        at = np.repeat(base - (np.cumsum(width) - width), width) + np.arange(want.size)
        bad = ~np.isclose(flat[at], want, rtol=1e-5, atol=1e-6)
        if bad.any():
            rows = np.unique(np.repeat(np.arange(table.size), width)[bad])
            t = int(table[rows[0]])
            raise WrongAnswer(
                f"table {t}: {int((table[rows] == t).sum())}/{int(counts[t])} known keys got "
                "wrong vectors"
            )


@dataclass
class CTRRequest:
    dense: np.ndarray
    catcolumn: np.ndarray
    rowindex: np.ndarray
    known: int
    expected: np.ndarray | None  # scores of the first ``known`` samples

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        return {"DES": self.dense[None], "CATCOLUMN": self.catcolumn[None],
                "ROWINDEX": self.rowindex[None]}  # fmt: skip

    def check(self, output: np.ndarray) -> None:
        """Raise :class:`WrongAnswer` unless the scores are probabilities, and the known
        samples' scores are what the tables and the dense weights give."""
        scores = np.asarray(output, dtype=np.float32).reshape(-1)
        if not np.isfinite(scores).all() or ((scores < 0) | (scores > 1)).any():
            raise WrongAnswer("CTR scores are not probabilities")
        if self.expected is not None:
            got = scores[: self.known]
            if not np.allclose(got, self.expected, rtol=1e-3, atol=1e-5):
                raise WrongAnswer(f"CTR scores {got.tolist()} != expected {self.expected.tolist()}")


REFUSED = ("StatusCode.INVALID_ARGUMENT", "400")
"""How Triton refuses a malformed request: gRPC ``INVALID_ARGUMENT`` or HTTP 400 (the status
as tritonclient's ``InferenceServerException.status()`` gives it)."""


def check_refused(what: str, status: str, message: str) -> None:
    """Raise :class:`WrongAnswer` unless a malformed request (``what``) got a client error:
    a server error (``INTERNAL``, 500, ``UNKNOWN``, ``DEADLINE_EXCEEDED``,
    ``RESOURCE_EXHAUSTED``, ``UNAVAILABLE``) or an unknown model is no refusal of it."""
    if status not in REFUSED:
        raise WrongAnswer(
            f"{what}: refused with {status or 'no status'}, not as a malformed request "
            f"(INVALID_ARGUMENT / HTTP 400): {message[:200]}"
        )
