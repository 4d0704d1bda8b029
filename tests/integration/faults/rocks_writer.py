"""A process that applies a deterministic update stream to RocksDB (the L3 writer).

``python rocks_writer.py DB START`` applies batches START, START+1, ... through the real
:class:`hps.updates.applier.Applier` into a read-write :class:`RocksDBStore`, and prints
``applied <i>`` after each ``apply`` returned (= durably applied). The test SIGKILLs it.
"""

from __future__ import annotations

import sys

import numpy as np

from hps.storage.rocks_db import RocksDBStore
from hps.tiers import Tiers
from hps.types import TableSpec, UpdateBatch
from hps.updates.applier import Applier

SPEC = TableSpec("w", "t", 4)
KEYS = 2000
ROWS = 200
PARTITIONS = 4


def batch(i: int) -> UpdateBatch:
    """Batch ``i``: 200 keys of 2000, in one of 4 partitions, version i + 1; every 5th deletes."""
    rng = np.random.default_rng(i)
    part = i % PARTITIONS
    keys = np.sort(rng.choice(KEYS // PARTITIONS, ROWS, replace=False)) * PARTITIONS + part
    extras = {"partition": str(part)}
    if i % 5 == 4:
        return UpdateBatch(SPEC.name, keys[:50], None, i + 1, True, extras)
    values = (keys[:, None] * 0.5 + i + np.arange(4)[None, :]).astype(np.float32)
    return UpdateBatch(SPEC.name, keys, values, i + 1, False, extras)


def expected(upto: int) -> dict[int, np.ndarray]:
    """Each key's row after batches 0 .. upto-1."""
    state: dict[int, np.ndarray] = {}
    for i in range(upto):
        b = batch(i)
        for j, k in enumerate(b.keys.tolist()):
            if b.delete:
                state.pop(k, None)
            else:
                assert b.values is not None
                state[k] = b.values[j]
    return state


def main() -> None:
    path, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = RocksDBStore(path, mode="read_write")
    applier = Applier({SPEC.name: SPEC}, Tiers(None, store))
    print("ready", flush=True)
    for i in range(start, end):
        applier.apply([batch(i)])
        print(f"applied {i}", flush=True)
    store.close()


if __name__ == "__main__":
    main()
