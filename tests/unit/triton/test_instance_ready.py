"""The line a warm model instance logs, and its parser (hps.triton.instance_ready)."""

from __future__ import annotations

from hps.triton.instance_ready import InstanceReady


def report(instance: str, model: str = "demo", rows: int = 100) -> InstanceReady:
    return InstanceReady(instance, model, "demo", 3.5, rows, 26, "hash_map", rows, "rocks_db", "ro")


def test_the_ready_report_round_trips() -> None:
    r = report("demo_0_0")
    assert InstanceReady.parse(f"INFO hps.triton.model.process: {r.message()}") == r
    no_l2 = InstanceReady("x_0_0", "x", "x", 1.0, 5, 1, "disabled", 0, "disabled", "-")
    assert InstanceReady.parse(no_l2.message()) == no_l2
    assert InstanceReady.parse("INFO hps.startup: L1 demo.C1: warmed up 5 rows") is None
