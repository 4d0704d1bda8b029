"""``hps demo``: a small synthetic CTR model on the embedded defaults, made in seconds.

The folder holds what a HugeCTR training job would have handed over: one sparse-model
folder per table (``tables/<name>/key`` + ``emb_vector``), the dense weights
(``dense.npz``, :mod:`hps.ctr.network`) and a ps.json serving them with RocksDB
(``rocksdb/``) as L3, no Redis, no Kafka. Its L2 type is left to the serving default: an
in-process hash map for one instance, the node's ``multi_process_hash_map`` for several
(:func:`hps.triton.serving.serving_config`), in the segment of the demo's own L3 folder
(:func:`hps.config.databases.shared_memory_name_for`, every deployment's default), so that
two demos served at once keep apart. Table ``i`` holds the keys ``0 .. rows_i - 1``;
vector ``k`` of table ``i`` is reproducible from the seed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hps.config import parse_config
from hps.ctr.network import make_weights
from hps.errors import ConfigError
from hps.io.sparse_model import write_sparse_model

DEMO_MODEL = "demo"
NUM_DENSE = 13  # Criteo's integer features


def table_sizes(num_tables: int, max_rows: int, min_rows: int = 1000) -> list[int]:
    """Rows per table, spread geometrically from ``max_rows`` down to ``min_rows``."""
    if num_tables == 1:
        return [max_rows]
    return [int(x) for x in np.geomspace(max_rows, min(min_rows, max_rows), num_tables)]


def demo_config(
    directory: Path,
    sizes: list[int],
    dim: int,
    *,
    model: str = DEMO_MODEL,
    instances: int = 1,
    max_batch_size: int = 1024,
) -> dict[str, Any]:
    """The ps.json of a demo folder (absolute paths, so it works from anywhere)."""
    names = [f"C{i + 1}" for i in range(len(sizes))]
    # the type: serving's default; a shared L2's segment: its L3 folder's (the default)
    volatile: dict[str, Any] = {"initial_cache_rate": 1.0}
    return {
        "supportlonglong": True,
        "models": [
            {
                "model": model,
                "sparse_files": [str(directory / "tables" / n) for n in names],
                "dense_file": str(directory / "dense.npz"),
                "embedding_table_names": names,
                "embedding_vecsize_per_table": [dim] * len(sizes),
                "maxnum_catfeature_query_per_table_per_sample": [4] * len(sizes),
                "maxnum_des_feature_per_sample": NUM_DENSE,
                "default_value_for_each_table": [0.0],
                "max_batch_size": max_batch_size,
                "deployed_device_list": [0],
                "gpucache": True,
                "gpucacheper": 1.0,
                "hit_rate_threshold": 0.9,
                "hps_instances": instances,
            }
        ],
        "volatile_db": volatile,
        "persistent_db": {"type": "rocks_db", "path": str(directory / "rocksdb")},
        "update_source": {"type": "null"},
    }


def check_demo_config(config: dict[str, Any], ps_path: Path) -> None:
    """ConfigError (one line) unless ``config`` passes the parser every later command reads
    the demo's ps.json with: checked before any table is written."""
    try:
        parse_config(config, str(ps_path))
    except ConfigError as exc:
        first = str(exc).splitlines()[0].removeprefix(f"{ps_path}: ")
        raise ConfigError(f"the demo's ps.json would be refused: {first}") from None


def table_vectors(keys: np.ndarray, dim: int, table_index: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, table_index])
    return rng.standard_normal((keys.size, dim), dtype=np.float32) * np.float32(0.05)


OPTIONS_FILE = "demo-options.json"
"""What a demo folder was made with: :data:`DEFAULTS`' keys."""
DEFAULTS = {"tables": 26, "rows": 100_000, "dim": 16, "instances": 1, "seed": 0}
"""``hps demo``'s options (tables, rows of the largest table, dim, Triton instances, seed)."""


def create_demo(
    directory: str | Path,
    *,
    num_tables: int = DEFAULTS["tables"],
    max_rows: int = DEFAULTS["rows"],
    dim: int = DEFAULTS["dim"],
    instances: int = DEFAULTS["instances"],
    seed: int = DEFAULTS["seed"],
    force: bool = False,
) -> Path:
    """Write a demo model into ``directory`` unless its ps.json exists; the ps.json path."""
    directory = Path(directory).resolve()
    ps_path = directory / "ps.json"
    if ps_path.exists() and not force:
        return ps_path
    sizes = table_sizes(num_tables, max_rows)
    config = demo_config(directory, sizes, dim, instances=instances)
    check_demo_config(config, ps_path)
    for i, (rows, path) in enumerate(zip(sizes, config["models"][0]["sparse_files"], strict=True)):
        keys = np.arange(rows, dtype=np.int64)
        write_sparse_model(path, keys, table_vectors(keys, dim, i, seed))
    make_weights(directory / "dense.npz", NUM_DENSE, dim * num_tables, seed=seed)
    made = {"tables": num_tables, "rows": max_rows, "dim": dim, "instances": instances,
            "seed": seed}  # fmt: skip
    (directory / OPTIONS_FILE).write_text(json.dumps(made) + "\n")
    ps_path.write_text(json.dumps(config, indent=2) + "\n")
    return ps_path


def made_with(directory: str | Path) -> dict[str, int]:
    """The options an existing demo folder was made with, as far as they are known (none
    for a folder without its record: a ps.json written by hand)."""
    try:
        made = json.loads((Path(directory) / OPTIONS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(made, dict):
        return {}
    return {k: v for k, v in made.items() if isinstance(v, int) and not isinstance(v, bool)}
