"""L1 cache: each policy's hit rate against the oracle, and query/insert throughput vs. a raw take.

``--mode hitrate`` replays synthetic key streams through the cache in batches (dedup, query,
insert the misses) and compares the hit rate with the oracle:

- ``zipf``: independent draws from a Zipf law over ``--keys`` distinct keys; the oracle is the
  exact sum of the probabilities of the cache-sized most popular keys (the best static cache).
- ``drift``: the same law, but every phase moves the hot set: the ranks slide down by
  ``--drift-shift`` keys and as many cold keys become the hottest. The oracle is the best
  static choice per phase.

The first ``--warmup`` fraction of each stream (one phase of the drifting one) fills the cache
and is left out of ``hit_rate``; ``hit_rate_all`` counts every access.

``--mode throughput`` times all-hit queries of ``--tables`` x ``--batch-per-table`` keys at
``--dim`` against a raw ``take`` of the same rows with precomputed indices on the same array
module, and inserts against a raw scatter of the same rows. ``query`` is what a lookup runs
(``EmbeddingCache.query_into``: the compiled probe+gather when numba / CuPy is there, rows
in request order); ``query_numpy`` is the NumPy reference path (dedup with
``hps.dedup.unique_inverse``, query, expansion to request order); ``kernel`` names which
ran as ``query``. ``insert`` puts that many new keys into a full cache as a lookup's fill
does (``force=False``: ``frequency`` admits by its estimates); for ``frequency`` also
``insert_forced``, as warm-up and prefetch do (``force=True``), on a twin cache timed in
turn; ``admitted`` is the share of the keys offered that were stored. With ``--tables`` > 1
on NumPy (the compiled kernel there), ``query_tables`` times the many-table call a lookup
makes (:func:`hps.cache.many.query_tables_into`) against one ``query_into`` per table on
the same keys, in turn (``ratio`` > 1: the one call is faster): ``--tables`` caches of
``--rows`` / ``--tables`` rows each, ``--batch-per-table`` keys from each.

``--row-dtype`` (``float32``, ``float16``, ``int8`` or ``all``) stores the rows in that format
(:mod:`hps.rowformat`; the arena holds stored rows, ``query_into`` dequantizes as it
gathers). Every format other than float32 is also compared with a float32 cache of the same
rows in the same run: ``op`` ``query_vs_float32`` gives both caches' all-hit ``query_into``
speeds, timed in turn, and their ratio (``ratio``: float32's time / this format's; 1.0 is
as fast as float32). With ``--tables`` > 1, ``query_tables_vs_float32`` does the same for
the many-table call a lookup makes (:func:`hps.cache.many.query_tables_into`): ``--tables``
caches of ``--rows`` / ``--tables`` rows each, ``--batch-per-table`` keys from each.

With ``--device cupy`` (or ``auto`` on a GPU) the same run also prints the GPU's own rows
(:mod:`hps.bench.cache_gpu`): the kernel alone against a raw take on the device
(``query_device``), ``query_into`` against its host-path floor (``query_host_floor``) and
into an ordinary buffer (``query_host_pinned``), against the CPU kernel on the same batch
(``query_vs_cpu``), and the many-table call against one call per table (``query_tables``).
Every row names the device it ran on (``device_name``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from hps.bench.options import cache_share, listed, one_of
from hps.cache.policies import POLICIES
from hps.cli import fraction, non_negative_float, non_negative_int, positive_int
from hps.rowformat import ROW_DTYPES
from hps.types import JSON

STREAMS = ("zipf", "drift")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=("hitrate", "throughput"), default="hitrate")
    parser.add_argument("--device", choices=("auto", "numpy", "cupy"), default="numpy")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--policies", type=listed(one_of(*POLICIES)), default=",".join(POLICIES),
        help=f"cache policies to run ({', '.join(POLICIES)})",
    )  # fmt: skip
    h = parser.add_argument_group("hitrate")
    h.add_argument("--keys", type=positive_int, default=1_000_000, help="distinct keys")
    h.add_argument(
        "--accesses",
        type=non_negative_int,
        default=0,
        help="stream length (0: max(4M, 60 x cache rows))",
    )
    h.add_argument("--batch", type=positive_int, default=8192, help="accesses per lookup batch")
    h.add_argument(
        "--alphas", type=listed(non_negative_float), default="0.9,1.1,1.3",
        help="Zipf exponents of the key streams (0: uniform)",
    )  # fmt: skip
    h.add_argument(
        "--ratios", type=listed(cache_share), default="0.01,0.05,0.2",
        help="cache rows / distinct keys (above 0, at most 1)",
    )  # fmt: skip
    h.add_argument("--streams", type=listed(one_of(*STREAMS)), default=",".join(STREAMS),
                   help="key streams (zipf, drift)")  # fmt: skip
    h.add_argument("--phases", type=positive_int, default=4, help="phases of the drifting stream")
    h.add_argument("--drift-shift", type=fraction, default=0.01, help="hot-set move, x keys (0-1)")
    h.add_argument(
        "--warmup", type=fraction, default=0.25, help="fraction left out of hit_rate (0-1)"
    )
    t = parser.add_argument_group("throughput")
    t.add_argument("--tables", type=positive_int, default=26)
    t.add_argument("--batch-per-table", type=positive_int, default=1024)
    t.add_argument("--dim", type=positive_int, default=128)
    t.add_argument("--rows", type=positive_int, default=1 << 18, help="resident rows")
    t.add_argument(
        "--key-alpha", type=non_negative_float, default=0.0, help="0: uniform keys, else Zipf"
    )
    t.add_argument("--repeats", type=positive_int, default=30)
    t.add_argument(
        "--row-dtype",
        choices=(*ROW_DTYPES, "all"),
        default="float32",
        help="row format of the cache (all: each); others are compared with float32",
    )


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Throughput: the insert op puts ``--tables`` x ``--batch-per-table`` new keys into a
    full cache of ``--rows`` rows, each evicting a distinct row. Hit rate: each ratio leaves
    the cache at least one row of ``--keys``."""
    if args.mode == "throughput":
        n = args.tables * args.batch_per_table
        if n > args.rows:
            parser.error(
                f"--tables {args.tables} x --batch-per-table {args.batch_per_table} = {n} "
                f"keys per batch exceeds --rows {args.rows} (the insert op evicts that many "
                f"distinct rows of a full cache): lower them or raise --rows"
            )
    else:
        if args.warmup >= 1.0:
            parser.error("--warmup 1 leaves nothing to measure hit_rate on: use less than 1")
        if "drift" in args.streams and args.phases < 2:
            parser.error(
                f"--phases {args.phases}: the drifting stream's first phase warms the cache, "
                "so it needs 2 or more to measure hit_rate (or leave drift out of --streams)"
            )
        for ratio in args.ratios:
            if int(ratio * args.keys) < 1:
                parser.error(
                    f"--ratios {ratio:g} x --keys {args.keys} leaves the cache no row "
                    f"(ratio x keys must be 1 or more)"
                )


def run(args: argparse.Namespace) -> Iterator[JSON]:
    if args.mode == "throughput":
        from hps.bench.cache_throughput import throughput

        yield from throughput(args)
    else:
        from hps.bench.cache_hitrate import hitrate

        yield from hitrate(args)
