"""``hps loadtest``: start what a ps.json needs, run Locust headless, stop it all, summarise."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hps.cli import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    sigterm_interrupts,
)

if TYPE_CHECKING:
    from hps.loadtest.resources import ResourceSampler
    from hps.loadtest.stack import Stack


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "loadtest",
        help="load-test a deployment with Locust (needs the 'load' extra)",
        description="Without --triton-grpc: start on this machine what the ps.json needs "
        "(redis-server / Redis Cluster, the Tansu broker, hps serve, hps consume, hps admin), "
        "run Locust headless, stop everything by PID and print a summary. With --triton-grpc "
        "and --triton-http: only run Locust against that deployment. Exit status 1 when a "
        "threshold is broken or a user raised an exception, 2 for a bad option (thresholds "
        "and mix are checked before anything starts). See docs/loadtest.md.",
    )
    p.add_argument("--config", required=True, help="ps.json of the deployment")
    p.add_argument("--model", default="", help="ps.json model to load (default: the first)")
    p.add_argument("--report-dir", help="reports go here (default: loadtest-reports/<time>)")
    g = p.add_argument_group("load")
    g.add_argument("--users", type=positive_int, default=8,
                   help="reader users (the shape's peak)")  # fmt: skip
    g.add_argument("--spawn-rate", type=positive_float, default=8.0,
                   help="users started per second")  # fmt: skip
    g.add_argument("--run-time", type=positive_int, default=60, help="seconds (default: 60)")
    g.add_argument("--shape", choices=("steady", "ramp", "spike"), default="steady")
    g.add_argument("--ramp-steps", type=positive_int, default=8)
    g.add_argument(
        "--knee-p99-ms", type=positive_float, default=500.0, help="p99 bound of the knee"
    )
    g.add_argument("--mix", default="grpc=4,http=2,ctr=1,bad=1", help="reader weights")
    g.add_argument("--zipf", type=non_negative_float, default=1.1,
                   help="Zipf exponent of the keys (0: uniform)")  # fmt: skip
    g.add_argument("--samples", type=_samples, default="",
                   help="samples per request: N or LO-HI")  # fmt: skip
    g.add_argument("--keys-per-sample", type=positive_int, default=1)
    g.add_argument(
        "--verify-keys", type=non_negative_int, default=4, help="known keys checked per table"
    )
    g.add_argument("--updates", type=float, default=None, metavar="ROWS_PER_S",
                   help="bulk update rows per second (default 1000 when Kafka is configured); "
                   "starting a stack, any --updates, 0 too, gives a ps.json without Kafka "
                   "one (0: the broker and the freshness prober, no bulk updates)")  # fmt: skip
    g.add_argument("--update-batch-rows", type=positive_int, default=500)
    g.add_argument("--update-phases", type=non_negative_int, default=0,
                   help="N: cut the run in N phases, bulk updates in every second one, and "
                   "compare reads with and without them")  # fmt: skip
    g.add_argument(
        "--freshness-interval", type=positive_float, default=1.0, help="s between probes"
    )
    g.add_argument(
        "--freshness-keys", type=positive_int, default=8, help="keys per freshness probe"
    )
    g.add_argument("--freshness-timeout", type=positive_float, default=10.0,
                   help="s after which a probe whose update is not served fails")  # fmt: skip
    g.add_argument("--thresholds", default="", help="JSON file of limits per request type")
    g.add_argument("--threshold", action="append", default=[], help="TYPE:limit=value,...")
    g.add_argument("--seed", type=int, default=0)
    s = p.add_argument_group("stack (started unless --triton-grpc is given)")
    s.add_argument(
        "--l2",
        choices=("hash_map", "multi_process_hash_map", "redis", "redis_cluster"),
        help="override volatile_db.type (redis: one redis-server; redis_cluster: 3 nodes)",
    )
    s.add_argument("--instances", type=positive_int, help="override hps_instances of every model")
    s.add_argument("--no-admin", action="store_true", help="do not start the control plane")
    s.add_argument(
        "--partitions",
        type=positive_int,
        default=1,
        help="partitions of each update topic on the broker the load test starts (default 1: "
        "the test broker's work per fetch grows with them, on the cores the stack shares)",
    )
    s.add_argument(
        "--l1-refresh",
        choices=("listener", "journal"),
        help="update_source.hps_l1_refresh of the stack (default: the ps.json's, else journal: "
        "the stack is one node, whose hps consume writes its L2 and L3 and tells its serving "
        "processes through the node's change journal)",
    )
    s.add_argument(
        "--sample-interval",
        type=positive_float,
        default=5.0,
        help="s between samples of the serving processes' memory (resources.csv) and of the "
        "stack's CPU by process (cpu.json)",
    )
    s.add_argument(
        "--warmup",
        type=non_negative_float,
        help="s before memory growth, CPU count and freshness figures (default: 20%%)",
    )
    s.add_argument(
        "--max-growth-mb",
        type=non_negative_float,
        help="fail when RSS or /dev/shm grow more than this after warm-up (soak)",
    )
    r = p.add_argument_group("an existing deployment")
    r.add_argument("--triton-grpc", help="Triton gRPC address host:port")
    r.add_argument("--triton-http", help="Triton HTTP address host:port")
    r.add_argument("--admin-url", default="", help="control plane URL (hps admin)")
    r.add_argument("--brokers", default="", help="Kafka bootstrap servers (publisher users)")
    r.add_argument("--triton-metrics", default="",
                   help="Triton's metrics URL, for hps_update_freshness_seconds (default: "
                   "http://<--triton-http host>:8002/metrics)")  # fmt: skip
    r.add_argument("--ctr", action="store_true",
                   help="load <model>_ctr too (default: when Triton says it is ready)")  # fmt: skip
    p.set_defaults(func=_loadtest)


def _samples(text: str) -> str:
    """``--samples``: N or LO-HI with 1 <= LO <= HI (empty: the model's max_batch_size)."""
    from hps.errors import ConfigError
    from hps.loadtest.options import sample_range

    try:
        sample_range(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
    return text


def _loadtest(args: argparse.Namespace) -> int:
    # SIGTERM unwinds like Ctrl-C, so that the finally clauses stop Locust and the stack.
    with sigterm_interrupts():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from hps.config import load_config
    from hps.errors import ConfigError
    from hps.loadtest import freshness
    from hps.loadtest.options import reader_mix
    from hps.loadtest.resources import check_growth_options, growth_failure
    from hps.loadtest.runner import LocustRun, run_locust
    from hps.loadtest.summary import format_summary
    from hps.loadtest.thresholds import load_thresholds

    # Locust runs in its own process: importing it here would monkey-patch this one for gevent.
    if importlib.util.find_spec("locust") is None:
        raise ConfigError("Locust is missing: pip install 'hps[load]'")
    report = Path(args.report_dir or f"loadtest-reports/{time.strftime('%Y%m%d-%H%M%S')}")
    remote = bool(args.triton_grpc)
    if remote != bool(args.triton_http):
        raise ConfigError("give both --triton-grpc and --triton-http, or neither")
    stack = None
    sampler = None
    warmup = args.warmup if args.warmup is not None else 0.2 * args.run_time
    # Whatever Locust would refuse, refused here, before a stack starts.
    load_thresholds(args.thresholds, args.threshold)
    reader_mix(args.mix, ctr=True)
    _check_samples(args)
    check_growth_options(args.max_growth_mb, remote=remote, run_time_s=args.run_time,
                         warmup_s=warmup, interval_s=args.sample_interval)  # fmt: skip
    report.mkdir(parents=True, exist_ok=True)
    if not remote:
        from hps.loadtest.stack import start_stack

        print(f"starting the stack for {args.config} (logs in {report})", flush=True)
        stack = start_stack(
            args.config, report, l2=args.l2, instances=args.instances,
            updates=args.updates is not None, admin=not args.no_admin,
            partitions=args.partitions,
            l1_refresh=args.l1_refresh,
        )  # fmt: skip
    try:
        config = stack.config_path if stack else Path(args.config)
        brokers = stack.brokers if stack else args.brokers
        ctr = stack.ctr if stack else args.ctr or _ctr_served(args)
        mix = reader_mix(args.mix, ctr)
        rate = args.updates if args.updates is not None else (1000.0 if brokers else 0.0)
        run = LocustRun(
            config=config, report_dir=report,
            triton_grpc=stack.triton_grpc if stack else args.triton_grpc,
            triton_http=stack.triton_http if stack else args.triton_http,
            users=args.users, spawn_rate=args.spawn_rate, run_time_s=args.run_time,
            shape=args.shape, ramp_steps=args.ramp_steps, model=args.model,
            admin_url=stack.admin_url if stack else args.admin_url, brokers=brokers,
            update_rows_per_s=rate, update_batch_rows=args.update_batch_rows,
            update_phases=args.update_phases,
            freshness_interval=args.freshness_interval, freshness_keys=args.freshness_keys,
            freshness_timeout_s=args.freshness_timeout, freshness_warmup_s=warmup,
            mix=mix, zipf=args.zipf,
            samples=args.samples, keys_per_sample=args.keys_per_sample,
            verify_keys=args.verify_keys, thresholds=args.thresholds,
            threshold=tuple(args.threshold), seed=args.seed,
        )  # fmt: skip
        print(f"running Locust for {args.run_time}s ({args.shape}, {args.users} readers)",
              flush=True)  # fmt: skip
        sampler = _sampler(stack, report, args.sample_interval)
        metrics_url = _metrics_url(stack, args) if brokers else ""
        consumer_url = stack.consumer_metrics_url if stack else ""
        baseline = freshness.Baseline(metrics_url, consumer_url, warmup) if metrics_url else None
        try:
            code = run_locust(run)
        finally:
            if sampler is not None:
                sampler.stop()
        if baseline is not None:  # before the stack stops: the run's observations
            fresh_before = baseline.stop()
            model = args.model or load_config(config).models[0].model
            after = freshness.snapshot(metrics_url, consumer_url)
            freshness.write(
                report,
                freshness.window(fresh_before, after, model),
                freshness.stage_windows(fresh_before, after, model),
            )
    finally:
        if stack is not None:
            stack.stop()
    knee = args.knee_p99_ms if args.shape == "ramp" else None
    started = stack.started if stack else None
    print(format_summary(report, code, started=started, knee_p99_ms=knee))
    if sampler is not None:
        growth = sampler.growth_mb(warmup)
        last = sampler.samples[-1]
        print(f"memory of hps serve + tritonserver + stubs ({last[1]} processes): RSS "
              f"{last[2] / 2**20:.0f} MB, /dev/shm {last[3] / 2**20:.0f} MB" + (
              f"; growth after {warmup:.0f}s warm-up: RSS {growth[0]:+.1f} MB, /dev/shm "
              f"{growth[1]:+.1f} MB" if growth else ""))  # fmt: skip
        failure = growth_failure(growth, args.max_growth_mb)
        if failure:
            print(f"FAILED: {failure}")
            code = code or 1
        used = sampler.cpu_cores(warmup)
        if used:
            from hps.loadtest.cpu import REPORT, format_cores

            (report / REPORT).write_text(json.dumps({"after_warmup_s": warmup, "cores": used}))
            print(f"CPU after warm-up, cores of {os.cpu_count()}: {format_cores(used)}")
    return code


def _check_samples(args: argparse.Namespace) -> None:
    """``--samples`` x ``--keys-per-sample`` within the model's limit of the ps.json, checked
    before a stack starts (the Locust process checks it again against the live version)."""
    from hps.config import load_config
    from hps.errors import ConfigError
    from hps.loadtest.options import sample_range
    from hps.loadtest.workload import check_samples

    if not args.samples and args.keys_per_sample == 1:
        return  # max_batch_size samples of one key: within the limit by definition
    config = load_config(args.config)
    names = [m.model for m in config.models]
    if args.model and args.model not in names:
        raise ConfigError(f"--model {args.model}: not in {args.config} (models: {names})")
    model = config.models[names.index(args.model) if args.model else 0]
    check_samples(model, sample_range(args.samples), args.keys_per_sample)


def _metrics_url(stack: Stack | None, args: argparse.Namespace) -> str:
    """Where Triton's /metrics of the deployment under test are."""
    if stack is not None:
        return stack.metrics_url
    if args.triton_metrics:
        return str(args.triton_metrics)
    host = str(args.triton_http).rsplit(":", 1)[0]
    return f"http://{host}:8002/metrics"


def _ctr_served(args: argparse.Namespace) -> bool:
    """Whether the running Triton serves the model's CTR model (``<model>_ctr``)."""
    import urllib.error
    import urllib.request

    from hps.config import load_config

    config = load_config(args.config)
    model = args.model or config.models[0].model
    url = f"http://{args.triton_http}/v2/models/{model}_ctr/ready"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _sampler(stack: Stack | None, report: Path, interval_s: float) -> ResourceSampler | None:
    """Memory sampling of the serving processes this command started."""
    if stack is None or stack.serve_pid is None:
        return None
    from hps.config import load_config
    from hps.loadtest.resources import ResourceSampler

    shm = load_config(stack.config_path).volatile_db.shared_memory_name
    out = report / "resources.csv"
    return ResourceSampler(
        stack.serve_pid, out, interval_s=interval_s, extra_shm=(shm,), cpu_root=os.getpid()
    ).start()
