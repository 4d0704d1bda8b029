"""A process on a shared L2 whose files get removed: ``python shm_follow_worker.py ROLE NAME
SIZE L3 SECONDS``.

``writer`` plays ``hps consume``: it owns L3 (RocksDB at ``L3``), writes changing rows to L3
then L2 for ``SECONDS`` and refills a new segment from L3 (``SharedL2Watch``, overwrite).
``reader`` plays a serving instance: it fetches from L2 and only follows (no fill). Each
prints ``ready``, then, when its time is up, a JSON line with the identity of the segment
it holds, and closes once the parent writes a line to its stdin.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.storage.rocks_db import RocksDBStore
from hps.tiers import Tiers
from hps.tiers.shared_l2 import SharedL2Watch
from hps.types import TableSpec

SPEC = TableSpec("m", "t", 8)
ROWS = 15_000
KEYS = np.arange(ROWS, dtype=np.int64)


def rows(keys: np.ndarray, version: int) -> np.ndarray:
    out = np.empty((keys.size, SPEC.dim), dtype=np.float32)
    out[:, 0] = keys
    out[:, 1:] = version
    return out


def say(obj: object) -> None:
    print(obj if isinstance(obj, str) else json.dumps(obj), flush=True)


def main(role: str, name: str, size: int, l3_path: str, seconds: float) -> None:
    store = SharedHashMapStore(name, size, identity_check_s=0.5)
    l3 = RocksDBStore(l3_path) if role == "writer" else None
    tiers = Tiers(store, l3)
    tiers.open_tables([SPEC])
    fill = "overwrite" if role == "writer" else "none"
    watch = SharedL2Watch(store, tiers, [SPEC], fill=fill, interval_s=0.5)
    if role == "writer":
        tiers.write(SPEC.name, KEYS, rows(KEYS, 0))
    say("ready")
    rng = np.random.default_rng(0)
    until, version, fetched = time.monotonic() + seconds, 0, 0
    while time.monotonic() < until:
        if role == "writer":
            version += 1
            keys = np.unique(rng.choice(KEYS, 500))
            tiers.write(SPEC.name, keys, rows(keys, version))
        else:
            fetched += int(store.fetch(SPEC.name, KEYS)[1].sum())
        watch.check()
        time.sleep(0.01)
    watch.check(force=True)
    say(
        {
            "identity": list(store.identity),
            "generation": store.generation,
            "recoveries": watch.recoveries,
            "problem": watch.problem(),
            "versions": version,
        }
    )
    sys.stdin.readline()
    tiers.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
