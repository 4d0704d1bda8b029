"""Online updates: apply throughput against raw consume+decode, and publish-to-lookup freshness.

Apply phase: ``--rows`` updates of ``--dim`` floats are published as ``--publish-rows``-key
calls (as a training job would, over ``--key-space`` keys), then read twice from the broker:

- baseline: the same messages consumed and decoded (``codec.decode``), nothing applied;
- ours: the consumer path (decode, per-key versions, L3 rocks_db durably then L2 hash_map).

Both are timed from the first message to the last; ``ratio = apply_per_s / baseline_per_s``.
The denominator that matters is the **L3 ceiling**: ``l3_ceiling_per_s`` writes the same rows,
the same bytes (key, vector and version: what L3 stores), straight into a fresh RocksDB with
rocksdict's WriteBatch, one synced write per ``update_source.max_batch_size`` rows, each
batch put in stored key order as our store puts it, bytes prepared before the clock starts
(the median of :data:`CEILING_RUNS` such writes): what RocksDB alone costs on this machine,
which no durable apply path can beat.
``apply_vs_l3_ceiling`` is our share of it. ``l3_arrival_order_per_s`` is the same write with
each batch put in arrival order: what the stored key order saves. ``stages_s`` sums the
apply's timed stages over its batches (as ``hps_update_stage_seconds`` times them);
``l3_write_vs_l3_ceiling`` is the ceiling's time over the apply's L3 write alone: the share
the apply would reach if every other stage took no time.

Freshness phase, default ``update_source`` settings: ``--samples`` times, new vectors for
``--sample-keys`` keys (half resident in L1) are published and a lookup is repeated until it
returns them; the time from ``publish()`` returning to that lookup is the sample. Mode
``embedded``: a serving session with L1 + hash_map L2 + rocks_db L3 runs the applier itself;
``shared``: ``hps consume`` (a thread) writes L3 and the serving session (L3 secondary + L1)
runs the L1 listener. Without ``--brokers`` a throwaway Tansu broker is started.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hps.bench.options import listed, one_of
from hps.cli import positive_int
from hps.config import PSConfig, parse_config
from hps.types import JSON, UpdateBatch
from hps.updates.source import MessageSource

if TYPE_CHECKING:
    from confluent_kafka import Message


MODES = ("embedded", "shared")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--brokers", help="a running Kafka (default: start Tansu)")
    parser.add_argument(
        "--rows", type=positive_int, default=400_000, help="updates in the apply phase"
    )
    parser.add_argument("--dim", type=positive_int, default=32)
    parser.add_argument(
        "--publish-rows", type=positive_int, default=4096, help="keys per publish()"
    )
    parser.add_argument(
        "--key-space", type=positive_int, default=1_000_000,
        help="keys drawn from (distinct within a publish(): at least --publish-rows)",
    )  # fmt: skip
    parser.add_argument(
        "--samples", type=positive_int, default=100, help="freshness samples per mode"
    )
    parser.add_argument("--sample-keys", type=positive_int, default=64)
    parser.add_argument(
        "--modes", type=listed(one_of(*MODES), empty=True), default=",".join(MODES),
        help='freshness modes to run (embedded, shared; "": none, the apply phase only)',
    )  # fmt: skip
    parser.add_argument("--dir", help="folder for RocksDB (a temporary one otherwise)")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Each publish() draws its keys without repeats from ``--key-space`` keys."""
    per_publish = min(args.publish_rows, args.rows)
    if args.key_space < per_publish:
        parser.error(
            f"--key-space {args.key_space} is smaller than the {per_publish} distinct keys of "
            f"one publish() (--publish-rows, or --rows if fewer)"
        )


def run(args: argparse.Namespace) -> Iterator[JSON]:
    with contextlib.ExitStack() as stack:
        brokers = args.brokers
        if not brokers:
            from hps.testing.kafka import TansuBroker

            brokers = stack.enter_context(TansuBroker()).bootstrap
        workdir = Path(args.dir or stack.enter_context(tempfile.TemporaryDirectory()))
        apply_row = _apply_phase(args, brokers, workdir)
        yield apply_row
        summary: JSON = dict(apply_row, phase="summary")
        for mode in args.modes:
            row = _freshness_phase(args, brokers, workdir, mode)
            yield row
            summary.setdefault("freshness_p50_ms", row["freshness_p50_ms"])
            summary.setdefault("freshness_p99_ms", row["freshness_p99_ms"])
            summary[f"freshness_{mode}_p99_ms"] = row["freshness_p99_ms"]
        yield summary


def _config(brokers: str, workdir: Path, dim: int, **update_source: object) -> PSConfig:
    model = f"bench{uuid.uuid4().hex[:8]}"
    source: JSON = {"type": "kafka_message_queue", "brokers": brokers, **update_source}
    return parse_config(
        {
            "models": [
                {
                    "model": model,
                    "embedding_table_names": ["t"],
                    "embedding_vecsize_per_table": [dim],
                    "hps_cache": {"capacity": 100_000, "device": "numpy"},
                }
            ],
            "volatile_db": {"type": "hash_map"},
            "persistent_db": {"type": "rocks_db", "path": str(workdir / model)},
            "update_source": source,
        },
        "bench-updates",
    )


def _apply_phase(args: argparse.Namespace, brokers: str, workdir: Path) -> JSON:
    from hps.build import build_session
    from hps.updates.applier import Applier
    from hps.updates.consumer import UpdateConsumer, decode_message
    from hps.updates.producer import Publisher
    from hps.updates.runtime import topics_of

    cfg = _config(brokers, workdir, args.dim)
    model = cfg.models[0].model
    rng = np.random.default_rng(0)
    with Publisher(brokers) as pub:
        for lo in range(0, args.rows, args.publish_rows):
            n = min(args.publish_rows, args.rows - lo)
            keys = rng.choice(args.key_space, size=n, replace=False)
            pub.publish(model, "t", keys, rng.standard_normal((n, args.dim), np.float32))
        pub.flush()
        messages = pub.messages_sent
    session = build_session(cfg, with_cache=False)
    topics = topics_of(session.tables)
    us = cfg.update_source

    def source() -> MessageSource:
        return MessageSource(brokers, topics, mode="replay", group_id="bench", config={})

    # Baseline: consume and decode the same messages, nothing else.
    raw = source()
    seen, rows, start = 0, 0, 0.0
    decoded = []
    while seen < messages:
        first = raw.poll(1.0)
        if first is None:
            continue
        start = start or time.perf_counter()
        for m in [first, *raw.drain(256)]:
            decoded.append(decode_message(m, session.tables))
            rows += decoded[-1].keys.size
            seen += 1
    baseline_s = time.perf_counter() - start
    raw.close()
    ceiling_s = _l3_ceiling(decoded, workdir / "l3-ceiling", us.max_batch_size, sort=True)
    arrival_s = _l3_ceiling(decoded, workdir / "l3-arrival", us.max_batch_size, sort=False)

    stages = _StageSums()
    applier = Applier(session.tables, session.tiers, recorder=stages)
    timed = _FirstMessageClock(brokers, topics, mode="replay", group_id="bench", config={})
    consumer = UpdateConsumer(timed, applier, us, recorder=stages)
    stop = threading.Event()
    seen = 0
    while seen < messages:
        seen += consumer.run_once(stop)
    apply_s = time.perf_counter() - timed.first
    consumer.close()
    l3 = session.tiers.persistent
    stored = l3.size(f"{model}.t") if l3 is not None else 0
    session.close()
    apply_per_s, baseline_per_s, ceiling_per_s = rows / apply_s, rows / baseline_s, rows / ceiling_s
    spent = stages.seconds
    return {
        "bench": "updates",
        "phase": "apply",
        "rows": rows,
        "messages": messages,
        "dim": args.dim,
        "l2": "hash_map",
        "l3": "rocks_db (synced per batch)",
        "rows_in_l3": stored,
        "apply_per_s": round(apply_per_s),
        "baseline_per_s": round(baseline_per_s),
        "ratio": round(apply_per_s / baseline_per_s, 3),
        "l3_ceiling_per_s": round(ceiling_per_s),
        "apply_vs_l3_ceiling": round(apply_per_s / ceiling_per_s, 3),
        "l3_arrival_order_per_s": round(rows / arrival_s),
        "stages_s": {name: round(s, 4) for name, s in spent.items()},
        "l3_write_vs_l3_ceiling": round(ceiling_s / spent["l3_write"], 3),
    }


class _StageSums:
    """A :class:`hps.updates.metrics.Recorder` that sums the timed stages of the consumer
    and the applier over all batches (the ages of messages are not stages: left out)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(("batch", "decode", "l3_write", "l2_write", "sync"), 0.0)

    def stage(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def age(self, name: str, since_ns: int, now_ns: int | None = None) -> None:
        pass

    def fresh(self, table: str, since_ns: int, now_ns: int | None = None) -> None:
        pass


CEILING_RUNS = 3
"""Writes the ceiling is the median of: one run of a second or less is at the mercy of
whatever else the machine does in it."""


def _l3_ceiling(batches: list[UpdateBatch], path: Path, batch_rows: int, *, sort: bool) -> float:
    """Median seconds over :data:`CEILING_RUNS` writes of :func:`_l3_write_once`, each into
    a fresh database."""
    runs = [
        _l3_write_once(batches, path / str(i), batch_rows, sort=sort) for i in range(CEILING_RUNS)
    ]
    return float(np.median(runs))


def _l3_write_once(batches: list[UpdateBatch], path: Path, batch_rows: int, *, sort: bool) -> float:
    """Seconds rocksdict alone takes to write the same rows into a fresh RocksDB column
    family (WriteBatch, one synced write per ``batch_rows`` rows, each in stored key order
    if ``sort``), bytes prepared ahead."""
    import rocksdict as rd

    from hps.dedup import stored_order
    from hps.storage.keybytes import key_bytes
    from hps.storage.rocks_rows import encode

    keys = np.concatenate([b.keys for b in batches]).astype("<i8")
    values = np.concatenate([b.values for b in batches])
    versions = np.concatenate([np.full(b.keys.size, b.version, np.uint64) for b in batches])
    if sort:
        for lo in range(0, keys.size, batch_rows):
            chunk = slice(lo, lo + batch_rows)
            order = lo + stored_order(keys[chunk])
            for a in (keys, values, versions):
                a[chunk] = a[order]
    key_rows = key_bytes(keys)
    row_bytes = encode(values, versions)
    opts = rd.Options(raw_mode=True)
    opts.create_if_missing(True)
    path.mkdir(parents=True)
    db = rd.Rdict(str(path), opts)
    handle = db.create_column_family("t", rd.Options(raw_mode=True)).get_column_family_handle("t")
    sync = rd.WriteOptions()
    sync.sync = True
    start = time.perf_counter()
    for lo in range(0, keys.size, batch_rows):
        batch = rd.WriteBatch(raw_mode=True)
        batch.set_default_column_family(handle)
        chunk = slice(lo, lo + batch_rows)
        for k, v in zip(key_rows[chunk], row_bytes[chunk], strict=True):
            batch.put(k, v)
        db.write(batch, sync)
    elapsed = time.perf_counter() - start
    db.close()
    shutil.rmtree(path)
    return elapsed


class _FirstMessageClock(MessageSource):
    """A MessageSource that notes when it first hands out a message."""

    first = 0.0

    def poll(self, timeout_s: float) -> Message | None:
        msg = super().poll(timeout_s)
        if msg is not None and not self.first:
            self.first = time.perf_counter()
        return msg


def _freshness_phase(args: argparse.Namespace, brokers: str, workdir: Path, mode: str) -> JSON:
    from hps.build import build_session
    from hps.updates.producer import Publisher
    from hps.updates.runtime import build_service, start_updates

    cfg = _config(brokers, workdir, args.dim)
    if mode == "shared":
        cfg = cfg.model_copy(
            update={"volatile_db": cfg.volatile_db.model_copy(update={"type": "disabled"})}
        )
    model = cfg.models[0].model
    table = f"{model}.t"
    rng = np.random.default_rng(1)
    base = np.arange(args.sample_keys * (args.samples + 1), dtype=np.int64)
    writer = service = stop = thread = None
    if mode == "shared":
        writer = build_session(cfg, with_cache=False)
        writer.insert(table, base, np.zeros((base.size, args.dim), np.float32), durable=True)
        service = build_service(cfg, writer)
        stop = threading.Event()
        thread = threading.Thread(target=service.run, args=(stop,), daemon=True)
        thread.start()
        session = build_session(cfg, l3_mode="secondary")
    elif mode == "embedded":
        session = build_session(cfg)
    else:
        raise ValueError(f"unknown freshness mode {mode!r}; use embedded or shared")
    handle = start_updates(session, cfg)
    latencies: list[float] = []
    try:
        with Publisher(brokers) as pub:
            for i in range(args.samples + 1):  # sample 0 warms up (first fetch, assignment)
                keys = base[i * args.sample_keys : (i + 1) * args.sample_keys]
                session.lookup(table, keys[: keys.size // 2])  # half of them resident in L1
                vectors = rng.standard_normal((keys.size, args.dim), np.float32)
                pub.publish(model, "t", keys, vectors)
                t0 = time.perf_counter()
                deadline = t0 + 30
                while not np.array_equal(session.lookup(table, keys), vectors):
                    if time.perf_counter() > deadline:
                        raise TimeoutError(f"{mode}: update not visible after 30 s")
                    time.sleep(0.001)
                if i:
                    latencies.append((time.perf_counter() - t0) * 1000)
    finally:
        if handle is not None:
            handle.stop()
        session.close()
        if thread is not None and stop is not None and service is not None and writer:
            stop.set()
            thread.join(30)
            service.close()
            writer.close()
    lat = np.array(latencies)
    return {
        "bench": "updates",
        "phase": "freshness",
        "mode": mode,
        "samples": lat.size,
        "keys_per_sample": args.sample_keys,
        "freshness_p50_ms": round(float(np.percentile(lat, 50)), 1),
        "freshness_p99_ms": round(float(np.percentile(lat, 99)), 1),
        "freshness_max_ms": round(float(lat.max()), 1),
    }
