"""The verdict of a run: its thresholds and the exceptions raised in its users, the exit code."""

from __future__ import annotations

import json
from pathlib import Path

from hps.loadtest.thresholds import load_thresholds
from hps.loadtest.verdict import EXCEPTIONS, GREENLET, THRESHOLDS, Crash, causes, crashes, judge

TB = """  File "/venv/lib/python3.11/site-packages/locust/user/users.py", line 166, in run
    self.on_start()
  File "/work/main/hps/loadtest/users/kafka.py", line 59, in on_start
    self.publisher.prepare(self.work.name, tables)
  File "/work/main/hps/updates/kafka.py", line 89, in translated
    raise _translate(exc, what) from None
"""


class _Entry:
    method, name = "grpc", "lookup"
    num_requests, num_failures, total_rps = 10, 0, 5.0

    def get_response_time_percentile(self, percent: float) -> float:
        return 10.0


def _raised(count: int = 2) -> dict[int, dict[str, object]]:
    """Locust's runner.exceptions: hash of the traceback -> count, message, traceback."""
    return {hash(TB): {"count": count, "msg": "kafka: no broker", "traceback": TB,
                       "nodes": {"local"}}}  # fmt: skip


def test_exceptions_in_users_fail_a_run_whose_thresholds_hold(tmp_path: Path) -> None:
    crashed = crashes(_raised(), {TB: "BackendUnavailable"}, unhandled=False)
    assert crashed == [
        Crash("BackendUnavailable", "kafka: no broker", 2,
              "hps/loadtest/users/kafka.py:59 in on_start")
    ]  # fmt: skip
    th = load_thresholds(None, ["*:max_fail_ratio=0"])
    verdict = judge(th, [_Entry()], _Entry(), crashed)
    assert not verdict.violations and not verdict.passed and verdict.exit_code == 1
    verdict.write(tmp_path / "verdict.json", stages=[])
    doc = json.loads((tmp_path / "verdict.json").read_text())
    assert doc["passed"] is False and doc["exit_code"] == 1 and doc["stages"] == []
    assert doc["exceptions"] == [
        {"type": "BackendUnavailable", "message": "kafka: no broker", "count": 2,
         "where": "hps/loadtest/users/kafka.py:59 in on_start"}
    ]  # fmt: skip
    assert causes(doc) == [EXCEPTIONS]
    assert str(crashed[0]) == (
        "2 x BackendUnavailable: kafka: no broker (at hps/loadtest/users/kafka.py:59 in on_start)"
    )


def test_an_unhandled_greenlet_exception_keeps_locusts_exit_code_2() -> None:
    th = load_thresholds(None, ["*:max_fail_ratio=0"])
    crashed = crashes({}, {}, unhandled=True)
    assert crashed == [GREENLET]
    assert judge(th, [_Entry()], _Entry(), crashed).exit_code == 2


def test_a_clean_run_passes_and_a_broken_threshold_is_named() -> None:
    assert judge({}, [_Entry()], _Entry(), []).exit_code == 0
    broken = judge(load_thresholds(None, ["grpc lookup:p99_ms=1"]), [_Entry()], _Entry(), [])
    assert broken.exit_code == 1
    assert causes({"violations": ["x"], "exceptions": [{}]}) == [THRESHOLDS, EXCEPTIONS]


def test_an_unknown_type_and_a_traceback_of_locust_only() -> None:
    tb = '  File "/venv/site-packages/locust/user/task.py", line 9, in run\n    x()\n'
    (crash,) = crashes({1: {"count": 1, "msg": "m", "traceback": tb}}, {}, unhandled=False)
    assert (
        crash.type == "Exception"
        and crash.where == "/venv/site-packages/locust/user/task.py:9 in run"
    )
