"""`helm test`: one real inference per served model through the release's Service.

Each model gets keys 1, 2, 3 of every table plus one key no table holds (2**62): the answer
must have the model's shape, be finite, and give the absent key the table's default vector.
With --demo-seed (modelSource.type demo) the vectors must equal the demo's exactly.
Exit status 0: every check passed; 1: the first failure is printed.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from hps.config import load_config
from hps.ctr.demo import table_vectors
from hps.triton.client import Client

KEYS = np.array([1, 2, 3, 2**62], dtype=np.int64)


def check(url: str, config_path: str, demo_seed: int | None) -> list[str]:
    config = load_config(config_path)
    failures = []
    with Client(url) as client:
        for model in config.models:
            tables = model.tables
            out = client.lookup(
                model.model, np.tile(KEYS, len(tables)), np.full(len(tables), KEYS.size)
            ).reshape(-1)
            start = 0
            for i, spec in enumerate(tables):
                got = out[start : start + KEYS.size * spec.dim].reshape(KEYS.size, spec.dim)
                start += KEYS.size * spec.dim
                want_default = np.full(spec.dim, spec.default_value, dtype=np.float32)
                if not np.isfinite(got).all():
                    failures.append(f"{spec.name}: non-finite values")
                elif not np.array_equal(got[-1], want_default):
                    failures.append(f"{spec.name}: absent key did not get the default vector")
                elif demo_seed is not None:
                    # The demo's row k is the k-th row drawn for its table (keys 0 .. rows-1).
                    drawn = table_vectors(np.arange(KEYS[-2] + 1), spec.dim, i, demo_seed)
                    want = drawn[KEYS[:-1]]
                    if not np.array_equal(got[:-1], want):
                        failures.append(f"{spec.name}: vectors differ from the demo's")
            if start != out.size:
                failures.append(f"{model.model}: {out.size} values, expected {start}")
            print(f"{model.model}: {len(tables)} tables checked", flush=True)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="Triton HTTP host:port")
    parser.add_argument("--config", required=True, help="a ps.json naming the served models")
    parser.add_argument("--demo-seed", type=int, help="compare with the demo's exact vectors")
    args = parser.parse_args()
    failures = check(args.url, args.config, args.demo_seed)
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
