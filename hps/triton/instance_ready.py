"""The one line a model instance logs once it is warm, and its parser.

The model process (:mod:`hps.triton.model.process`) logs it; ``hps serve``'s output reader
(:mod:`hps.triton.supervisor.output`) parses it into a per-model warm-up summary. One
format, one module, shared by the two processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceReady:
    """What one model instance reports once it is warm (hps.triton.model.process logs it)."""

    instance: str  # Triton's instance name, e.g. demo_0_0
    model: str  # the Triton model
    hps_model: str  # the ps.json model it serves
    seconds: float
    l1_rows: int  # rows warm in its L1 caches
    tables: int
    l2: str
    l2_loaded: int  # rows this process loaded into L2 (0: none)
    l3: str
    l3_mode: str

    _PATTERN = re.compile(
        r"(?P<instance>\S+) \(model (?P<model>\S+), ps\.json model (?P<hps_model>\S+)\) "
        r"ready in (?P<seconds>[\d.]+)s: L1 (?P<l1_rows>\d+) rows warm \((?P<tables>\d+) "
        r"tables\); L2 (?P<l2>\S+)(?: \((?P<l2_loaded>\d+) rows loaded here\))?; "
        r"L3 (?P<l3>\S+) \((?P<l3_mode>[^)]*)\)"
    )

    def message(self) -> str:
        loaded = f" ({self.l2_loaded} rows loaded here)" if self.l2_loaded else ""
        return (
            f"{self.instance} (model {self.model}, ps.json model {self.hps_model}) ready in "
            f"{self.seconds:.1f}s: L1 {self.l1_rows} rows warm ({self.tables} tables); "
            f"L2 {self.l2}{loaded}; L3 {self.l3} ({self.l3_mode})"
        )

    @classmethod
    def parse(cls, line: str) -> InstanceReady | None:
        found = cls._PATTERN.search(line)
        if found is None:
            return None
        g = found.groupdict()
        return cls(
            instance=g["instance"],
            model=g["model"],
            hps_model=g["hps_model"],
            seconds=float(g["seconds"]),
            l1_rows=int(g["l1_rows"]),
            tables=int(g["tables"]),
            l2=g["l2"],
            l2_loaded=int(g["l2_loaded"] or 0),
            l3=g["l3"],
            l3_mode=g["l3_mode"],
        )
