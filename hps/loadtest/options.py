"""The HPS options of the Locust process, shared by the locustfile and ``hps loadtest``."""

from __future__ import annotations

import argparse

from hps.errors import ConfigError

USER_KINDS = ("grpc", "http", "ctr", "bad", "updates", "freshness", "admin")
DEFAULT_MIX = "grpc=4,http=2,ctr=1,bad=1"


def add_locust_options(parser: argparse.ArgumentParser) -> None:
    """Add the ``--hps-*`` and friends to Locust's parser (``include_in_web_ui`` aside)."""
    g = parser.add_argument_group("HPS")
    add = g.add_argument
    add("--hps-config", default="", help="ps.json of the deployment (tables, keys, limits)")
    add("--hps-model", default="", help="ps.json model to load (default: the first)")
    add("--triton-grpc", default="127.0.0.1:8001", help="Triton gRPC address")
    add("--triton-http", default="127.0.0.1:8000", help="Triton HTTP address")
    add("--admin-url", default="", help="control plane base URL (hps admin)")
    add("--brokers", default="", help="Kafka bootstrap servers for the publisher users")
    add("--zipf", type=float, default=1.1, help="Zipf exponent of the keys (0: uniform)")
    add("--samples", default="", help="samples per request, N or LO-HI (default: max_batch_size)")
    add("--keys-per-sample", type=int, default=1, help="keys per table per sample")
    add("--verify-keys", type=int, default=4, help="known keys checked per table per request")
    add("--mix", default=DEFAULT_MIX, help="reader weights, e.g. grpc=4,http=2,ctr=1,bad=1")
    add("--update-rows-per-s", type=float, default=1000.0, help="bulk update rate (rows/s)")
    add("--update-batch-rows", type=int, default=500, help="rows per bulk publish()")
    add("--update-phases", type=int, default=0,
        help="N > 0: cut the run in N phases, bulk updates in every second one")  # fmt: skip
    add("--freshness-interval", type=float, default=1.0, help="seconds between probes")
    add("--freshness-keys", type=int, default=8, help="keys per freshness probe")
    add("--freshness-timeout", type=float, default=10.0, help="a probe fails after this")
    add("--freshness-warmup", type=float, default=0.0,
        help="s from the start whose probes are reported apart, as '... (warm-up)'")  # fmt: skip
    add("--hps-shape", default="steady", choices=("steady", "ramp", "spike"))
    add("--ramp-steps", type=int, default=8, help="stages of the ramp")
    add("--thresholds", default="", help="JSON file of limits per request type")
    add("--threshold", action="append", help="TYPE:limit=value[,...] (repeatable)")
    add("--hps-report-dir", default="", help="where stages.csv and verdict.json go")
    add("--hps-seed", type=int, default=0, help="seed of the key sampling")


def sample_range(text: str) -> tuple[int, int] | None:
    """``"N"`` or ``"LO-HI"`` -> (lo, hi); empty -> None (the model's max_batch_size)."""
    if not text:
        return None
    lo, _, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise ConfigError(f"--samples {text!r}: expected N or LO-HI") from None
    if not 1 <= a <= b:
        raise ConfigError(f"--samples {text!r}: need 1 <= LO <= HI")
    return a, b


def weights(mix: str) -> dict[str, int]:
    """``"grpc=4,http=2"`` -> {"grpc": 4, "http": 2}; kinds must be known readers."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in mix.split(",") if p.strip()):
        kind, _, w = part.partition("=")
        if kind not in USER_KINDS[:4]:
            raise ConfigError(
                f"--mix {mix!r}: unknown reader {kind!r}; known: grpc, http, ctr, bad"
            )
        try:
            out[kind] = int(w or 1)
        except ValueError:
            raise ConfigError(f"--mix {mix!r}: weight of {kind} must be an integer") from None
        if out[kind] < 0:
            raise ConfigError(f"--mix {mix!r}: negative weight for {kind}")
    return out


def reader_mix(mix: str, ctr: bool) -> str:
    """``mix`` without the CTR reader when ``<model>_ctr`` is not served (``ctr`` False);
    a mix that leaves no reader of positive weight is refused (Locust, given no user
    class, would run all seven)."""
    kept = weights(mix)
    if not ctr:
        kept.pop("ctr", None)
    if not any(w > 0 for w in kept.values()):
        dropped = "" if ctr or "ctr" not in weights(mix) else " (ctr dropped: no <model>_ctr)"
        raise ConfigError(
            f"--mix {mix!r} leaves no reader{dropped}; give at least one of grpc, http, "
            f"{'ctr, ' if ctr else ''}bad a positive weight"
        )
    return ",".join(f"{k}={w}" for k, w in kept.items())
