"""The verdict of a load test: its thresholds, and the exceptions raised inside its users.

The locustfile's ``quitting`` listener sets the Locust process's exit code, which replaces
Locust's own: that one is 1 when a user raised an exception (in ``on_start``, a task or
``on_stop``; ``runner.exceptions``) and 2 after an unhandled exception in a greenlet
(``locust.log.unhandled_greenlet_exception``). :func:`judge` keeps both: a run fails on a
broken threshold, on any exception in a user and on an unhandled greenlet exception, and
``verdict.json`` lists the exceptions (:class:`Crash`) beside the broken thresholds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hps.loadtest.thresholds import Entry, Thresholds, Violation, evaluate

THRESHOLDS = "thresholds"
EXCEPTIONS = "exceptions in users"
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


@dataclass(frozen=True)
class Crash:
    """Exceptions of one kind raised inside the users: how often, and where."""

    type: str
    message: str
    count: int
    where: str  # the user's hook or task that raised ("path:line in function")

    def __str__(self) -> str:
        at = f" (at {self.where})" if self.where else ""
        return f"{self.count} x {self.type}: {self.message}{at}"


GREENLET = Crash("unhandled greenlet exception", "its traceback is in locust.log", 1, "")


def where(traceback: str) -> str:
    """The frame of ``traceback`` (``traceback.format_tb``'s text) where Locust called the
    user (its first frame outside Locust: the hook or task that raised, e.g.
    ``hps/loadtest/users/kafka.py:64 in on_start``), else its innermost; "" without one."""
    frames = _FRAME.findall(traceback)
    users = [f for f in frames if "/locust/" not in f[0]]
    if not frames:
        return ""
    path, line, func = users[0] if users else frames[-1]
    path = "hps/" + path.rsplit("/hps/", 1)[1] if "/hps/" in path else path
    return f"{path}:{line} in {func}"


def crashes(
    exceptions: Mapping[Any, Mapping[str, Any]], types: Mapping[str, str], unhandled: bool
) -> list[Crash]:
    """The users' exceptions from Locust's ``runner.exceptions`` (rows of ``count``,
    ``msg`` and ``traceback``), each named by its type (``types``: traceback -> type name,
    from the ``user_error`` event), and :data:`GREENLET` when ``unhandled``."""
    out = [
        Crash(types.get(str(row["traceback"]), "Exception"), str(row["msg"]), int(row["count"]),
              where(str(row["traceback"])))
        for row in exceptions.values()
    ]  # fmt: skip
    out.sort(key=lambda c: -c.count)
    return [*out, GREENLET] if unhandled else out


@dataclass(frozen=True)
class Verdict:
    violations: list[Violation]
    crashes: list[Crash]

    @property
    def passed(self) -> bool:
        return not self.violations and not self.crashes

    @property
    def exit_code(self) -> int:
        """Locust's: 2 after an unhandled greenlet exception, 1 when the run failed else."""
        if GREENLET in self.crashes:
            return 2
        return 0 if self.passed else 1

    def write(self, path: Path, **extra: object) -> None:
        """``verdict.json``: passed, the exit code, the broken limits, the exceptions, and
        ``extra`` (the thresholds, the stages ...)."""
        doc = {
            "passed": self.passed,
            "exit_code": self.exit_code,
            "violations": [str(v) for v in self.violations],
            "exceptions": [asdict(c) for c in self.crashes],
            **extra,
        }
        path.write_text(json.dumps(doc, indent=1) + "\n")


def judge(
    thresholds: Thresholds, entries: Iterable[Entry], total: Entry, crashed: list[Crash]
) -> Verdict:
    return Verdict(evaluate(thresholds, entries, total), crashed)


def causes(doc: Mapping[str, Any]) -> list[str]:
    """Why a ``verdict.json`` failed its run: :data:`THRESHOLDS`, :data:`EXCEPTIONS`."""
    named = ((THRESHOLDS, "violations"), (EXCEPTIONS, "exceptions"))
    return [cause for cause, key in named if doc.get(key)]
