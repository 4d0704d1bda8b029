"""``hps bench triton``: the hit shares it reads from /metrics (Triton itself:
tests/integration/triton/test_bench_triton.py)."""

from __future__ import annotations

from hps.bench.triton import hit_shares, level_hits, reported_requests

METRICS = """\
# HELP hps_hits_total Unique keys of lookups by the level answering
hps_hits_total{level="l1",model="demo",process="demo_0_0:11",table="C1"} 30
hps_hits_total{level="l1",model="demo",process="demo_0_1:12",table="C2"} 10
hps_hits_total{level="l3",model="demo",process="demo_0_1:12",table="C1"} 10
hps_hits_total{level="l1",model="other",process="other_0_0:13",table="C1"} 99
hps_requests_total{model="demo",process="demo_0_0:11"} 4
hps_requests_total{model="demo",process="demo_0_1:12"} 6
hps_requests_total{model="other",process="other_0_0:13"} 1
"""


def test_hits_and_requests_are_summed_per_level_and_per_instance() -> None:
    assert level_hits(METRICS, "demo") == {"l1": 40.0, "l2": 0.0, "l3": 10.0, "default": 0.0}
    assert reported_requests(METRICS, "demo") == {"demo_0_0:11": 4.0, "demo_0_1:12": 6.0}


def test_shares_are_null_when_nothing_was_counted() -> None:
    hits = {"l1": 40.0, "l2": 0.0, "l3": 10.0, "default": 0.0}
    assert hit_shares(hits) == {
        "l1_share": 0.8, "l2_share": 0.0, "l3_share": 0.2, "default_share": 0.0
    }  # fmt: skip
    assert set(hit_shares(dict.fromkeys(hits, 0.0)).values()) == {None}
