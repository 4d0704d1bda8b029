"""Bad bench options are usage errors naming the option (status 2), refused before the bench
starts: sizes are positive, list options parse, names are known, options agree."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from hps.bench import BENCHES
from hps.cli import main


@pytest.mark.parametrize(
    "args",
    [
        ["storage", "--rows", "0"],
        ["storage", "--repeats", "0"],
        ["storage", "--batch", "0"],
        ["memory", "--rows", "0"],
        ["triton", "--tables", "0"],
        ["triton", "--requests", "0"],
        ["triton", "--concurrency", "1,0"],
        ["freshness", "--run-time", "0"],
        ["cache", "--keys", "0"],
        ["cache", "--rows", "0"],
        ["cache", "--dim", "0"],
        ["cache", "--tables", "0"],
        ["cache", "--repeats", "0"],
    ],
)
def test_a_size_of_zero_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", *args])
    assert exc.value.code == 2
    assert f"argument {args[1]}: must be a positive integer, not 0" in capsys.readouterr().err


def test_the_cache_bench_warmup_is_a_share(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "cache", "--warmup", "1.5"])
    assert exc.value.code == 2
    assert "argument --warmup: must be from 0 to 1, not 1.5" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["shm", "--rows", "-5"], "argument --rows: must be a positive integer, not -5"),
        (["shm", "--dim", "0"], "argument --dim: must be a positive integer, not 0"),
        (["shm", "--batch", "0"], "argument --batch: must be a positive integer, not 0"),
        (["shm", "--repeats", "0"], "argument --repeats: must be a positive integer, not 0"),
        (["shm", "--readers", "-1"], "argument --readers: must be a positive integer, not -1"),
        (["shm", "--readers", "0"], "argument --readers: must be a positive integer, not 0"),
        (["shm", "--seconds", "0"], "argument --seconds: must be a finite number above 0"),
        (["updates", "--rows", "0"], "argument --rows: must be a positive integer, not 0"),
        (["updates", "--samples", "0"], "argument --samples: must be a positive integer"),
        (["updates", "--key-space", "100", "--publish-rows", "200"],
         "--key-space 100 is smaller than the 200 distinct keys of one publish()"),
        (["updates", "--modes", "embedded,bogus"],
         "argument --modes: unknown 'bogus'; known: embedded, shared"),
        (["updates", "--modes", ","], "argument --modes: expected a comma-separated list"),
        (["cache", "--mode", "throughput", "--rows", "64", "--tables", "1",
          "--batch-per-table", "128"], "--tables 1 x --batch-per-table 128 = 128 keys per "
         "batch exceeds --rows 64"),
        (["cache", "--mode", "throughput", "--key-alpha", "-1"],
         "argument --key-alpha: must be a finite number, 0 or more, not -1"),
        (["cache", "--alphas", "abc"], "argument --alphas: not a number: 'abc'"),
        (["cache", "--alphas", "1.1,nan"], "argument --alphas: must be a finite number"),
        (["cache", "--ratios", "x"], "argument --ratios: not a number: 'x'"),
        (["cache", "--ratios", "-0.5"], "argument --ratios: must be above 0 and at most 1"),
        (["cache", "--ratios", "0.0001", "--keys", "1000"],
         "--ratios 0.0001 x --keys 1000 leaves the cache no row"),
        (["cache", "--streams", "nope"], "argument --streams: unknown 'nope'; known: zipf"),
        (["cache", "--policies", "lru,bogus"], "argument --policies: unknown 'bogus'"),
        (["triton", "--alpha", "1"], "argument --alpha: a Zipf exponent must be above 1"),
        (["gate", "--alpha", "0.5"], "argument --alpha: a Zipf exponent must be above 1"),
        (["gate", "--tables", "0"], "argument --tables: must be a positive integer, not 0"),
        (["gate", "--requests", "-3"], "argument --requests: must be a positive integer"),
        (["gate", "--paths", "gate,bogus"], "argument --paths: unknown 'bogus'"),
        (["gate", "--flood-protocols", "udp"], "argument --flood-protocols: unknown 'udp'"),
        (["gate", "--flood-mb", "0"], "argument --flood-mb: must be a finite number above 0"),
        (["rollout", "--tables", "0"], "argument --tables: must be a positive integer, not 0"),
        (["rollout", "--readers", "-2"], "argument --readers: must be a positive integer"),
        (["rollout", "--settle", "0"], "argument --settle: must be a finite number above 0"),
        (["cache", "--mode", "hitrate", "--warmup", "1"], "--warmup 1 leaves nothing to measure"),
        (["cache", "--mode", "hitrate", "--phases", "1"], "--phases 1: the drifting stream's"),
    ],
)  # fmt: skip
def test_bad_options_are_refused_before_the_bench_starts(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    message: str,
) -> None:
    def started(_: object) -> None:
        raise AssertionError("the bench started")

    monkeypatch.setattr(f"{BENCHES[args[0]]}.run", started)
    with pytest.raises(SystemExit) as exc:
        main(["bench", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"hps bench {args[0]}: error: " in err and message in err, err


def test_list_options_reach_the_bench_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> Iterator[object]:
        seen.append(args)
        yield from ()

    monkeypatch.setattr("hps.bench.cache.run", run)
    assert main(["bench", "cache", "--alphas", "0, 1.1", "--ratios", "0.5,1"]) == 0
    assert seen[0].alphas == [0.0, 1.1] and seen[0].ratios == [0.5, 1.0]
    assert seen[0].streams == ["zipf", "drift"] and seen[0].policies == ["lru", "lfu", "frequency"]
    monkeypatch.setattr("hps.bench.updates.run", run)
    assert main(["bench", "updates", "--modes", ""]) == 0  # the apply phase only
    assert main(["bench", "updates", "--modes", "shared"]) == 0
    assert seen[1].modes == [] and seen[2].modes == ["shared"]


@pytest.mark.parametrize(
    ("args", "protocol"),
    [
        (["--flood-mb", "2", "--protocols", "grpc", "--flood-protocols", "http"], "http"),
        (["--flood-mb", "2", "--flood-protocols", "grpc"], "http"),  # --protocols: both
        (["--flood-mb", "0.5", "--protocols", "grpc"], "grpc"),
    ],
)
def test_a_flood_within_a_protocols_gate_limit_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], args: list[str], protocol: str
) -> None:
    """26 tables: the gate lets through 1.03 MiB over gRPC, 2.96 MiB of HTTP."""
    with pytest.raises(SystemExit) as exc:
        main(["bench", "gate", *args])
    assert exc.value.code == 2
    assert f"--flood-mb {args[1]} is within the gate's {protocol} limit" in capsys.readouterr().err


def test_a_flood_over_every_protocols_limit_passes_the_check() -> None:
    import argparse

    from hps.bench import gate

    parser = argparse.ArgumentParser()
    gate.add_arguments(parser)
    gate.check_arguments(parser, parser.parse_args(["--flood-mb", "2", "--protocols", "grpc"]))
    gate.check_arguments(parser, parser.parse_args(["--flood-mb", "3"]))


def test_a_flood_answer_through_the_gate_other_than_its_refusal_fails_the_bench() -> None:
    from hps.bench.gate import _check_refused_by_gate

    _check_refused_by_gate({"grpc StatusCode.RESOURCE_EXHAUSTED": 5, "http 413": 3})
    with pytest.raises(RuntimeError, match="'http 400': 2"):
        _check_refused_by_gate({"http 413": 3, "http 400": 2})
    with pytest.raises(RuntimeError, match="'grpc OK': 1"):
        _check_refused_by_gate({"grpc OK": 1})
