"""What `hps serve` shows of tritonserver's output (hps.triton.supervisor.output), fed line
by line."""

from __future__ import annotations

import io

from hps.redact import REDACTED, register
from hps.triton.instance_ready import InstanceReady
from hps.triton.supervisor.output import TritonOutput, warm_up_summary

STARTUP = [
    'W1124 23:55:54.613411 5108 pinned_memory_manager.cc:273] "Unable to allocate pinned memory"',
    'E1124 23:55:54.613564 5108 server.cc:241] "CudaDriverHelper has not been initialized."',
    'I1124 23:55:54.614741 5108 model_lifecycle.cc:472] "loading: demo:1"',
    "INFO hps.startup: L1 demo.C1: warmed up 100000 of 100000 planned rows",
]


def report(instance: str, model: str = "demo", rows: int = 100) -> InstanceReady:
    return InstanceReady(instance, model, "demo", 3.5, rows, 26, "hash_map", rows, "rocks_db", "ro")


def quiet(instances: dict[str, int]) -> tuple[TritonOutput, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return TritonOutput(instances=instances, out=out, err=err), out, err


def test_quiet_start_shows_one_line_per_model_and_nothing_of_triton() -> None:
    output, out, err = quiet({"demo": 2, "demo_ctr": 1})
    for line in STARTUP:
        output.feed(line)
    output.feed(f"INFO hps.triton.model.process: {report('demo_0_0').message()}")
    output.feed(f"INFO hps.triton.model.process: {report('demo_ctr_0_0', 'demo_ctr').message()}")
    output.feed(f"INFO hps.triton.model.process: {report('demo_0_1', rows=90).message()}")
    output.ready(timeout=1)
    assert err.getvalue() == ""
    assert out.getvalue().splitlines() == [
        "demo_ctr: warm in 3.5s, 1 instance: L1 100 rows (26 tables), L2 hash_map, "
        "L3 rocks_db (ro)",
        "demo: warm in 3.5s, 2 instances: L1 90-100 rows each (26 tables), L2 hash_map, "
        "L3 rocks_db (ro)",
    ]
    # what a failed start shows: all but information
    assert output.tail() == STARTUP[:2]


def test_quiet_shows_our_warnings_at_once_and_triton_s_only_once_ready() -> None:
    output, _, err = quiet({})
    output.feed("WARNING hps.triton.model.process: L3 writer lock held elsewhere")
    output.feed("Traceback (most recent call last):")
    output.feed('  File "model.py", line 1')
    output.feed("ValueError: bad")
    output.feed('W1124 23:55:54.613411 5108 x.cc:1] "start-up notice"')
    output.feed("  its continuation")
    output.ready(timeout=0)
    output.feed('E1124 23:56:54.613411 5108 x.cc:1] "after ready"')
    output.feed("INFO hps.x: information")
    output.feed("Signal (15) received.")
    output.feed("Signal (11) received.")
    assert err.getvalue().splitlines() == [
        "WARNING hps.triton.model.process: L3 writer lock held elsewhere",
        "Traceback (most recent call last):",
        '  File "model.py", line 1',
        "ValueError: bad",
        'E1124 23:56:54.613411 5108 x.cc:1] "after ready"',
        "Signal (11) received.",
    ]


def test_verbose_relays_everything_and_secrets_never() -> None:
    register("s3cret-admin-key")
    err = io.StringIO()
    output = TritonOutput(verbose=True, out=io.StringIO(), err=err)
    assert output.triton_args() == []
    for line in [*STARTUP, "I1124 x --http-restricted-api=logging:hps-admin-key=s3cret-admin-key"]:
        output.feed(line)
    shown = err.getvalue().splitlines()
    assert shown[:4] == STARTUP
    assert "s3cret-admin-key" not in err.getvalue() and REDACTED in shown[4]
    assert TritonOutput().triton_args() == ["--log-info=false"]


def test_summary_without_l2_and_l3() -> None:
    r = InstanceReady("m_0_0", "m", "m", 0.25, 7, 1, "disabled", 0, "disabled", "-")
    want = "m: warm in 0.2s, 1 instance: L1 7 rows (1 table), no L2, no L3"
    assert warm_up_summary("m", [r]) == want


class _Gone(io.StringIO):
    """A stderr whose reader died."""

    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_relay_that_cannot_write_keeps_draining_the_pipe() -> None:
    """Otherwise tritonserver blocks on its next log line once the pipe buffer is full."""
    import subprocess
    import sys

    output = TritonOutput(instances={"demo": 1}, out=io.StringIO(), err=_Gone(), verbose=True)
    lines = 20_000  # about 1.3 MB: far past a pipe's buffer
    script = f"print('E1 x.cc:1] first')\nfor _ in range({lines}): print('W1 x.cc:1]', 'y' * 60)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    output.attach(child)
    assert child.wait(timeout=30) == 0  # hang guard: drained to the end
    assert output._thread is not None
    output._thread.join(timeout=30)
    assert not output._thread.is_alive()


def test_the_models_triton_failed_to_load_are_noted_once_each() -> None:
    """What ``hps serve``'s shutdown names as the cause of Triton's status 1."""
    output, _, err = quiet({})
    output.ready(timeout=0)
    for _ in range(2):
        output.feed('E1129 01:47:49.746011 15233 model_lifecycle.cc:642] "failed to load '
                    "'emb' version 1: Internal: ConfigError: bad ps.json\"")  # fmt: skip
    output.feed("I1129 01:47:49.746031 15233 model_lifecycle.cc:777] \"failed to load 'emb'\"")
    output.feed("I1129 01:47:50.1 15233 model_lifecycle.cc:1 \"loaded 'ctr' version 1\"")
    assert output.failed_loads == ["emb"]
    assert "failed to load 'emb' version 1" in err.getvalue()  # relayed as before
