"""argparse types of the benches' own options, beside the shared ones of :mod:`hps.cli`.

A value out of range, or an unknown name in a list, is a usage error that names the option
(``hps bench NAME: error: argument --x: ...``, status 2) before any work starts.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

__all__ = ["cache_share", "listed", "one_of", "zipf_exponent"]

T = TypeVar("T")


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value


def zipf_exponent(text: str) -> float:
    """The exponent of NumPy's Zipf sampler (``Generator.zipf``): above 1."""
    value = _float(text)
    if value <= 1:
        raise argparse.ArgumentTypeError(f"a Zipf exponent must be above 1, not {value:g}")
    return value


def cache_share(text: str) -> float:
    """Cache rows / distinct keys: above 0, at most 1."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, not {value:g}")
    return value


def listed(item: Callable[[str], T], *, empty: bool = False) -> Callable[[str], list[T]]:
    """Comma-separated values, each parsed by ``item``: ``listed(positive_float)``; ``""``
    (none) only where ``empty`` says so."""

    def parse(text: str) -> list[T]:
        values = [item(part.strip()) for part in text.split(",") if part.strip()]
        if not values and not (empty and not text.strip()):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return values

    return parse


def one_of(*names: str) -> Callable[[str], str]:
    """A name out of ``names`` (for :func:`listed`: argparse's ``choices`` sees the list)."""

    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"unknown {text!r}; known: {', '.join(names)}")
        return text

    return parse
