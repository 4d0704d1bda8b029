"""A separate process for the multi_process_hash_map tests: ``python shm_worker.py ROLE ...``.

Every role opens the store named on the command line, does its part and prints one JSON
line (or ``locked`` / ``attached`` when it is ready for the parent to act on it).
Rows are self-describing so that readers can tell a torn row from a whole one:
``[key, writer, version, check, check, ...]`` with ``check = 7 * key + 3 * writer + version``.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.types import TableSpec

DIM = 8
KEYS = np.arange(1000, dtype=np.int64)


def encode(keys: np.ndarray, writer: int, version: int) -> np.ndarray:
    out = np.empty((keys.size, DIM), dtype=np.float32)
    out[:, 0] = keys
    out[:, 1] = writer
    out[:, 2] = version
    out[:, 3:] = (7 * keys + 3 * writer + version)[:, None]
    return out


def whole(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Mask of rows that are exactly one written row of their key."""
    check = 7 * values[:, 0] + 3 * values[:, 1] + values[:, 2]
    return (values[:, 0] == keys) & (values[:, 3:] == check[:, None]).all(axis=1)


def say(obj: object) -> None:
    print(obj if isinstance(obj, str) else json.dumps(obj), flush=True)


def main(role: str, name: str, size: int, *args: str) -> None:
    store = SharedHashMapStore(
        name,
        size,
        overflow_policy="evict_oldest",
        overflow_margin=int(args[0]) if role == "margin" else 2**64 - 1,
    )
    spec = TableSpec("m", "t", DIM)
    store.open_table(spec)
    if role == "write":  # write KEYS as writer 0, version 1
        store.insert(spec.name, KEYS, encode(KEYS, 0, 1))
        say({"size": store.size(spec.name)})
    elif role == "read":
        values, found = store.fetch(spec.name, KEYS)
        say({"found": int(found.sum()), "whole": int(whole(KEYS, values)[found].sum())})
    elif role in ("churn-write", "churn-read"):
        writer, until = int(args[0]), time.monotonic() + float(args[1])
        rng = np.random.default_rng(writer)
        ops, bad = 0, 0
        while time.monotonic() < until:
            ops += 1
            if role == "churn-write":
                store.insert(spec.name, KEYS, encode(KEYS, writer, ops))
                # removals compact the arena: rows move while readers wait
                store.remove(spec.name, rng.choice(KEYS, 300, replace=False))
            else:
                values, found = store.fetch(spec.name, KEYS)
                bad += int((~whole(KEYS, values) & found).sum())
        say({"ops": ops, "bad": bad})
    elif role == "margin":  # insert 1000 keys over the margin
        keys = np.arange(10_000, 11_000, dtype=np.int64)
        store.insert(spec.name, keys, encode(keys, 1, 1))
        say({"size": store.size(spec.name)})
    elif role == "fill":  # another table, past what the segment holds
        other = TableSpec("m", "u", DIM)
        store.open_table(other)
        keys = np.arange(int(args[0]), dtype=np.int64)
        store.insert(other.name, keys, encode(keys, 2, 1))
        _, found = store.fetch(other.name, keys[-10_000:])
        say({"size": store.size(other.name), "last": int(found.sum())})
    elif role == "hold-read":
        with store._seg.reading():
            say("locked")
            time.sleep(600)
    elif role == "hold-write":
        with store._seg.writing():
            table = store._table(spec.name)
            store._seg.touch(table.entry)  # as every change of a table starts
            table.meta[2] = 123_456  # half-done: a bogus row count
            say("locked")
            time.sleep(600)
    elif role == "attach":  # then: "close" closes cleanly, "exit" leaves without closing
        say("attached")
        if sys.stdin.readline().strip() == "exit":
            sys.exit(0)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
