"""Triton's /metrics read back: HPS's hit counts summed over processes."""

from __future__ import annotations

from hps.triton.client import parse_hits


def test_parse_hits_sums_processes() -> None:
    text = "\n".join(
        [
            "# HELP hps_hits_total x",
            'hps_hits_total{model="m",process="1:10",table="t",level="l1"} 3',
            'hps_hits_total{model="m",process="2:11",table="t",level="l1"} 4',
            'hps_hits_total{model="m",process="2:11",table="t",level="l2"} 1',
            'hps_keys_total{model="m",process="2:11",table="t"} 9',
        ]
    )
    assert parse_hits(text) == {("m", "t"): {"l1": 7.0, "l2": 1.0}}
