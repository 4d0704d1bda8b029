"""Triton's ``/metrics`` read back: the HPS families that :mod:`hps.triton.model.metrics` writes."""

from __future__ import annotations

from collections import defaultdict


def parse_hits(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """Sum ``hps_hits_total{model,table,level,process}`` over ``process``."""
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for line in text.splitlines():
        if not line.startswith("hps_hits_total{"):
            continue
        labels_text, _, value = line[len("hps_hits_total{") :].rpartition("} ")
        labels = dict(part.split("=", 1) for part in labels_text.split(",") if "=" in part)
        labels = {k: v.strip('"') for k, v in labels.items()}
        key = (labels.get("model", ""), labels.get("table", ""))
        level = labels.get("level", "")
        out[key][level] = out[key].get(level, 0.0) + float(value)
    return dict(out)
