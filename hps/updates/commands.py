"""``hps consume`` (the update service), ``hps publish`` (push a whole table to Kafka) and
``hps repair-versions`` (unpin keys that a version from the future froze)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from hps.cli import positive_float, positive_int

if TYPE_CHECKING:
    from hps.config import PSConfig
    from hps.types import Keys, TableSpec, Vectors

log = logging.getLogger(__name__)

DEFAULT_MAX_LOOP_AGE_S = 60.0
"""Longer than any poll (``poll_timeout_ms``) plus a large batch's apply; shorter than a
stall anyone should wait out."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "consume",
        help="apply online updates from Kafka to L2/L3 (SIGTERM: finish the batch, commit, exit)",
    )
    p.add_argument("--config", required=True, help="ps.json (update_source says where from)")
    p.add_argument("--brokers", help="override update_source.brokers")
    p.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on this port (127.0.0.1)"
    )
    p.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="address the metrics port binds (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    p.add_argument(
        "--group-id",
        help="override update_source.hps_group_id (e.g. one group per pod for a pod-local L3)",
    )
    p.add_argument(
        "--heartbeat-file",
        metavar="PATH",
        help="touch this file on every pass of the consumer loop (at most once a second) and "
        "remove it on exit; `hps consume-check` reads it",
    )
    p.add_argument(
        "--max-loop-age-s",
        type=positive_float,
        default=DEFAULT_MAX_LOOP_AGE_S,
        help="/healthz on the metrics port answers 503 once the consumer loop's last pass is "
        f"older than this (default {DEFAULT_MAX_LOOP_AGE_S:g})",
    )
    p.add_argument(
        "--versions-from-l2",
        action="store_true",
        help="for a consumer that feeds a shared Redis L2 with no L3 of its own: route updates "
        "by the model versions the serving nodes publish in Redis (docs/versions.md)",
    )
    p.set_defaults(func=_consume)

    p = sub.add_parser(
        "consume-check",
        help="exit 0 if `hps consume`'s loop is alive (its --heartbeat-file is fresh), else 1",
    )
    p.add_argument("--heartbeat-file", metavar="PATH", required=True)
    p.add_argument(
        "--max-age-s",
        type=positive_float,
        default=DEFAULT_MAX_LOOP_AGE_S,
        help=f"the oldest heartbeat that counts as alive (default {DEFAULT_MAX_LOOP_AGE_S:g})",
    )
    p.set_defaults(func=_consume_check)

    p = sub.add_parser(
        "publish",
        help="publish a whole table as online updates (roll out an offline-trained model)",
    )
    p.add_argument("--table", required=True, help="<model>.<table> (each name of [A-Za-z0-9_-]+)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--sparse", metavar="DIR", help="HugeCTR sparse-model folder")
    src.add_argument("--npy", nargs=2, metavar=("KEYS", "VECTORS"), help=".npy key/vector pair")
    p.add_argument("--config", help="ps.json: brokers, Kafka settings and the table's dim")
    p.add_argument("--brokers", help="bootstrap servers (default: the config's)")
    p.add_argument(
        "--dim", type=int, help="vector size (default: the config's, of the version it goes to)"
    )
    p.add_argument("--version", type=int, help="update version (default: time.time_ns())")
    p.add_argument(
        "--model-version",
        type=int,
        metavar="N",
        help="tag every message with model version N: applied to that version only "
        "(default: untagged, applied to the live version and the ready ones above it)",
    )
    p.add_argument(
        "--partitions", type=positive_int, default=8, help="partitions of new topics (default: 8)"
    )
    p.add_argument(
        "--chunk-rows",
        type=positive_int,
        help="rows read per chunk (default: 32 MiB of vectors, at most 262,144 rows)",
    )
    p.add_argument(
        "--max-message-bytes",
        type=positive_int,
        default=900_000,
        help="the largest message, in bytes (default 900000: under Kafka's 1 MB default)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_publish)

    p = sub.add_parser(
        "repair-versions",
        help="reset a table's stored update versions above a bound to 0 (keys pinned by a "
        "version from the future take their next update again); stop hps consume first",
    )
    p.add_argument("--config", required=True, help="ps.json (where the versions are kept)")
    p.add_argument("--table", required=True, help="<model>.<table>")
    p.add_argument(
        "--model-version",
        type=int,
        metavar="N",
        help="the model version whose rows to repair (default: the live one)",
    )
    p.add_argument(
        "--above",
        type=_uint64,
        help="reset versions above this one (nanoseconds since the epoch, like Publisher's "
        "versions; default: now + update_source.hps_max_version_ahead_s, the consumer's bound)",
    )
    p.set_defaults(func=_repair_versions)


def _uint64(text: str) -> int:
    """A stored update version: an integer from 0 to 2**64 - 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value < 1 << 64:
        raise argparse.ArgumentTypeError(f"must be from 0 to 2**64 - 1, not {value}")
    return value


def _consume(args: argparse.Namespace) -> int:
    from hps.build import build_session
    from hps.config import load_config
    from hps.errors import ConfigError
    from hps.redact import protect
    from hps.updates.consumer import MAX_BACKOFF_S
    from hps.updates.heartbeat import Heartbeat, serve_metrics
    from hps.updates.kafka import check_update_source
    from hps.updates.runtime import build_service, consumed_config, unshared_version_record
    from hps.updates.shared_record import RecordFollower, follow
    from hps.versions import VersionRegistry

    protect()  # from here on no log record holds a registered secret
    config = load_config(args.config)
    protect(config)  # the volatile_db password, the Kafka client's secrets
    follower: RecordFollower | None = None
    if args.versions_from_l2:  # the record read below is the serving nodes' merged
        follower = follow(config)
    elif (unshared := unshared_version_record(config, VersionRegistry(config).path)) is not None:
        log.warning("%s", unshared)
    config = consumed_config(config)  # the models as served: those added at runtime too
    check_update_source(config)  # a bad Kafka setting is a config error before any work
    overrides = {"brokers": args.brokers, "hps_group_id": args.group_id}
    if update := {k: v for k, v in overrides.items() if v}:
        us = config.update_source.model_copy(update=update)
        config = config.model_copy(update={"update_source": us})
    poll_s = config.update_source.poll_timeout_ms / 1000
    if args.max_loop_age_s <= 2 * max(poll_s, MAX_BACKOFF_S):
        raise ConfigError(
            f"--max-loop-age-s {args.max_loop_age_s:g} must exceed twice the longest wait of a "
            f"healthy loop (update_source.poll_timeout_ms {poll_s:g} s, a retry's back-off "
            f"{MAX_BACKOFF_S:g} s): an idle poll or a retry is not a stall"
        )
    session = build_session(config, with_cache=False)
    stop = threading.Event()
    heartbeat = Heartbeat(args.heartbeat_file)
    server = None
    try:
        consumer = build_service(config, session, heartbeat, versions_from_l2=follower is not None)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if args.metrics_port is not None:
            server = serve_metrics(
                args.metrics_port, args.metrics_address, heartbeat, args.max_loop_age_s
            )
        log.info(
            "consuming %d topics from %s as group %r",
            len(consumer.source.topics),
            config.update_source.brokers,
            config.update_source.hps_group_id,
        )
        try:
            consumer.run(stop)
        finally:
            consumer.close()
        log.info(
            "stopped after %d batches, %d rows applied", consumer.batches, consumer.rows_applied
        )
    finally:
        heartbeat.close()
        if follower is not None:
            follower.close()
        if server is not None:
            server.shutdown()
            server.server_close()
        session.close()
    return 0


def _consume_check(args: argparse.Namespace) -> int:
    from hps.updates.heartbeat import check_file

    problem = check_file(args.heartbeat_file, args.max_age_s)
    if problem:
        print(f"hps consume-check: {problem}", file=sys.stderr)
        return 1
    return 0


def _table_at(config: PSConfig, model: str, table: str, version: int | None) -> TableSpec:
    """The table as ``version`` of ``model`` has it (default: the live version's): a
    version has a namespace of its own, and may have other dims than the ps.json's entry
    (docs/versions.md)."""
    from hps.errors import ConfigError, UnknownTableError
    from hps.versions import VersionRegistry

    registry = VersionRegistry(config)
    try:
        at = version if version is not None else registry.live(model)
        entry = registry.model_at(model, at)
    except UnknownTableError as exc:
        raise ConfigError(f"{config.source}: no table {model}.{table}: {exc}") from None
    spec = next((t for t in entry.tables if t.table == table), None)
    if spec is None:
        raise ConfigError(f"{config.source}: model {model!r} version {at} has no table {table!r}")
    return spec


def _publish(args: argparse.Namespace) -> int:
    from hps.errors import ConfigError, RequestError
    from hps.io.npy import npy_rows, read_npy_pair
    from hps.io.progress import Progress
    from hps.io.sparse_model import read_sparse_model, sparse_model_rows
    from hps.updates import codec
    from hps.updates.kafka import client_settings
    from hps.updates.producer import Publisher

    model, sep, table = args.table.partition(".")
    if not sep or not model or not table:
        raise RequestError(f"--table must be <model>.<table>, got {args.table!r}")
    codec.topic_name(model, table)  # refuse a name no consumer reads before any work
    brokers, dim, kafka_conf = args.brokers, args.dim, {}
    if args.config:
        from hps.config import load_config
        from hps.redact import protect
        from hps.updates.kafka import check_settings

        config = load_config(args.config)
        protect(config)
        check_settings(
            config.update_source.kafka_settings, f"{config.source}: update_source.hps_kafka_config"
        )
        spec = _table_at(config, model, table, args.model_version)
        if not brokers and not config.update_source.enabled:  # its brokers are a default
            raise ConfigError(
                f"{args.config}: update_source.type is 'null' (no Kafka): give --brokers, or "
                "set update_source to a Kafka source ('kafka_message_queue')"
            )
        brokers = brokers or config.update_source.brokers
        dim = dim or spec.dim
        kafka_conf = client_settings(config.update_source.kafka_settings)
    if not brokers:
        raise ConfigError("give --brokers or --config")
    chunks: Iterator[tuple[Keys, Vectors]]
    if args.sparse:
        if not dim:
            raise ConfigError("a sparse-model folder needs --dim or --config")
        total = sparse_model_rows(args.sparse, dim)
        chunks = read_sparse_model(args.sparse, dim, args.chunk_rows)
    else:
        if not dim:
            import numpy as np

            dim = int(np.load(args.npy[1], mmap_mode="r").shape[-1])
        total = npy_rows(args.npy[0], args.npy[1], dim)
        chunks = read_npy_pair(args.npy[0], args.npy[1], dim, args.chunk_rows)
    progress = Progress(f"publish {args.table}", total, enabled=not args.quiet)
    with Publisher(
        brokers,
        config=kafka_conf,
        num_partitions=args.partitions,
        max_message_bytes=args.max_message_bytes,
        version=args.model_version,
    ) as pub:
        version = args.version
        for keys, vectors in chunks:
            # One version for the whole table: it is one model snapshot.
            version = pub.publish(model, table, keys, vectors, version=version)
            progress.advance(keys.size)
        pub.flush()
    tag = "" if args.model_version is None else f" for model version {args.model_version}"
    print(
        f"{args.table}: published {total} rows as version {version}{tag} "
        f"({pub.messages_sent} messages)"
    )
    return 0


def _repair_versions(args: argparse.Namespace) -> int:
    import time

    from hps.config import load_config
    from hps.errors import RequestError
    from hps.redact import protect
    from hps.tiers import Tiers
    from hps.updates.runtime import versioned_table

    protect()
    config = load_config(args.config)
    protect(config)
    above = args.above
    if above is None:
        above = time.time_ns() + int(config.update_source.hps_max_version_ahead_s * 1e9)
    from hps.topology import topology

    # An in-process L2 opened here would be new and empty: the versions live in L3.
    own_l2 = topology(config).l2 == "process"
    tiers = Tiers.open(config, l3_mode="read_write", l2=not own_l2)
    try:
        model, sep, table = args.table.partition(".")
        if not sep or not model or not table:
            raise RequestError(f"--table must be <model>.<table>, got {args.table!r}")
        spec = _table_at(config, model, table, args.model_version)
        route = versioned_table(config, tiers, spec)
        reset = route.reset_above(above)
    finally:
        tiers.close()
    print(
        f"{spec.name}: reset {reset} keys whose update version was above {above} "
        f"(in {route.tiers[0].level}); their next update applies"
    )
    return 0
