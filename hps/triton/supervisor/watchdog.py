"""The dead-stub watchdog of ``hps serve``: probe every model, reload one whose stub died.

Triton's Python backend does not restart a model's stub process when it dies (OOM killer,
a crash in an extension module, a stray SIGKILL): every request then fails with ``Stub
process '<instance>' is not healthy.`` while the server's and the model's readiness stay
true. The watchdog sends each served model a tiny real inference (one key of its first
table; a CTR model: one sample with key 0 in each table) every ``interval`` seconds and,
when a model answers with that error, or when it is stuck (:class:`Stall`: ``max_timeouts``
probes or more in a row failed, timed out or were refused by its queue, over at least
``max_timeouts x timeout`` seconds in which it executed nothing), reloads it through the
model-control API with the admin key: unload (the model's readiness, and with
``--strict-readiness`` the server's, turns false), then load (new stubs). Other errors (a
model an operator unloaded on purpose, say) are left alone. A probe waits in the model's
queue like any request, so a model that is merely overloaded fails probes too; but it
keeps executing requests, which Triton counts (:func:`executions`), and is left to serve.
Given the server's PID, the watchdog also looks at its stub processes every
:data:`STUB_POLL_S` seconds. A stub that disappears while its model version stays READY
in Triton and fewer stubs than the model's instances are left of that version (no
replacement: :meth:`Watchdog.lost`) died: the model is reloaded at once, without a probe.
A probe is no proof of health with several instances: Triton routes it to any of them,
so it may well land on a healthy one. Stubs that disappear otherwise (a reload, ours or
another's, starts the new stubs first; an unload marks the version UNLOADING first) only
get the model probed at once, so detection takes a fraction of a second rather than up to
``interval``.

Triton 2.51 never finishes unloading the old version once a request has failed on the
dead stub (it stays UNLOADING), so the watchdog does not wait for that: the load starts
as soon as the model is no longer READY, and the stuck version only costs a clean exit
(see docs/security.md, "What stays open").
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path

import numpy as np

from hps.config import PSConfig
from hps.errors import BackendUnavailable, HPSError
from hps.triton.client import Client, ModelControl

log = logging.getLogger(__name__)

UNHEALTHY = "is not healthy"
STUB_POLL_S = 0.5
Inputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class Recovery:
    """One reload of a model: why, and how long from detection until it was ready again."""

    model: str
    reason: str
    seconds: float


def stub_pids(server_pid: int) -> dict[str, dict[int, str]]:
    """Model name -> PID -> model version of its Python stubs, the children of
    ``server_pid`` (Linux /proc).

    A stub's command line is ``triton_python_backend_stub <repo>/<model>/<version>/model.py
    ...``. Reads ``/proc/<pid>/task/*/children``: a few small files, not every process.
    """
    children: set[int] = set()
    for task in Path(f"/proc/{server_pid}/task").glob("*/children"):
        try:
            children.update(int(pid) for pid in task.read_text().split())
        except (OSError, ValueError):
            continue
    stubs: dict[str, dict[int, str]] = {}
    for pid in children:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(args) > 1 and args[0].endswith(b"triton_python_backend_stub"):
            version = Path(args[1].decode(errors="replace")).parent
            stubs.setdefault(version.parent.name, {})[pid] = version.name
    return stubs


def executions(client: Client, model: str) -> int | None:
    """How many batches (one request each: docs/serving.md, "Overload") the instances of
    ``model`` have executed, all versions together, from Triton's statistics API (an HTTP
    ``client``); None when Triton does not say."""
    from tritonclient.utils import InferenceServerException

    try:
        stats = client.client.get_inference_statistics(model)
    except (InferenceServerException, OSError, HTTPException):
        return None
    return sum(int(s.get("execution_count", 0)) for s in stats.get("model_stats", []))


@dataclass
class Stall:
    """A model's failed probes in a row, and whether it is stuck rather than overloaded.

    Stuck: at least ``probes`` probes in a row have failed, for at least ``window`` seconds
    (from the start of the first), and the model executed nothing meanwhile. Progress, or
    a change of the count (a reload resets it), starts a stall afresh; a count Triton did
    not give (None) shows no progress.
    """

    window: float
    probes: int
    failures: int = 0
    since: float | None = None  # when the first failed probe of the stall was sent
    executions: int | None = None  # the model's execution count at the last failed probe

    def failed(self, sent: float, now: float, executions: int | None) -> bool:
        """Record a probe sent at ``sent`` that failed at ``now``, the model's execution
        count then being ``executions``; whether the model is stuck."""
        moved = executions is not None and executions != self.executions
        if self.since is None or (moved and self.executions is not None):
            self.since, self.failures = sent, 0
        self.failures += 1
        if executions is not None:
            self.executions = executions
        return self.failures >= self.probes and now - self.since >= self.window

    def answered(self) -> None:
        """A probe was answered: the model is not stuck."""
        self.failures, self.since, self.executions = 0, None, None


def watched(config: PSConfig) -> tuple[dict[str, Inputs], dict[str, int]]:
    """What the watchdog watches of ``config``: a tiny valid request for every Triton model
    ``hps serve`` makes of it, and each one's instances."""
    from hps.triton.repository import served_models

    instances = {m.triton_name: m.instances for m in served_models(config)}
    return probe_inputs(config), instances


def probe_inputs(config: PSConfig) -> dict[str, Inputs]:
    """A tiny valid request for every Triton model ``hps serve`` makes of ``config``."""
    from hps.triton.repository import served_models

    probes: dict[str, Inputs] = {}
    for served in served_models(config):
        model = config.model(served.hps_model)
        tables = len(model.tables)
        if served.template == "hps_ctr":
            num_dense = model.maxnum_des_feature_per_sample  # the network's, checked at start
            probes[served.triton_name] = {
                "DES": np.zeros((1, num_dense), np.float32),
                "CATCOLUMN": np.zeros((1, tables), np.int64),
                "ROWINDEX": np.tile(np.array([0, 1], np.int32), tables).reshape(1, -1),
            }
        else:
            numkeys = np.zeros((1, tables), np.int32)
            numkeys[0, 0] = 1
            probes[served.triton_name] = {"KEYS": np.zeros((1, 1), np.int64), "NUMKEYS": numkeys}
    return probes


class Watchdog:
    """Probes ``probes`` on a Triton server every ``interval`` s in a daemon thread; reloads
    a model whose stub is dead, or which is stuck (:class:`Stall`: ``max_timeouts`` probes
    in a row failing, each waiting at most ``timeout``, over ``max_timeouts x timeout``
    seconds in which nothing executed). ``instances``: each model's instances (stubs of a
    version; 1 when not named), to tell a dead stub from a replaced one."""

    def __init__(
        self,
        http_url: str,
        admin_key: str,
        probes: dict[str, Inputs],
        *,
        interval: float = 2.0,
        timeout: float = 10.0,
        max_timeouts: int = 3,
        server_pid: int | None = None,
        instances: dict[str, int] | None = None,
    ) -> None:
        self.http_url = http_url
        self.control = ModelControl(http_url, admin_key, timeout=120.0)
        self.probes = probes
        self.interval = interval
        self.timeout = timeout
        self.max_timeouts = max_timeouts
        self.server_pid = server_pid
        self.instances = dict(instances or {})
        self.recoveries: list[Recovery] = []
        self._stalls = {model: Stall(timeout * max_timeouts, max_timeouts) for model in probes}
        self._suspect: set[str] = set()  # a stub died, the reload failed: reload again
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hps-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout + 130.0)

    def _run(self) -> None:
        tick = STUB_POLL_S if self.server_pid else self.interval
        with Client(self.http_url, network_timeout=self.timeout) as client:
            known = self._stubs()
            next_probe = time.monotonic() + self.interval
            while not self._stop.wait(tick):
                try:
                    due = time.monotonic() >= next_probe
                    if due:
                        next_probe = time.monotonic() + self.interval
                    known = self.round(client, known, due)
                except Exception:  # noqa: BLE001 - the watchdog outlives any one round
                    log.exception("watchdog: a round of probes failed; probing again later")

    def round(
        self, client: Client, known: dict[str, dict[int, str]], due: bool
    ) -> dict[str, dict[int, str]]:
        """One look at the stubs (``known`` at the last look): reload a model whose stub
        died, probe the others that lost a stub and, when ``due``, every model. The stubs
        now, after any reload of ours (its own new stubs are no loss)."""
        now = self._stubs()
        gone = {m for m, pids in known.items() if pids.keys() - now.get(m, {}).keys()}
        dead = self.lost(known, now)
        known = now
        for model in [m for m in self.probes if due or m in gone]:
            if self._stop.is_set():
                break
            if model in dead or model in self._suspect:  # a failed reload: again when due
                recovery = self.reload(model, "a stub process disappeared")
                if recovery is None:
                    self._suspect.add(model)
            else:
                recovery = self.check(client, model)
            if recovery is not None:
                self._suspect.discard(model)
                known = self._stubs()
        return known

    def lost(self, before: dict[str, dict[int, str]], now: dict[str, dict[int, str]]) -> set[str]:
        """The models a stub of which died between two looks at the stubs (PID -> version
        of each model's stubs, ``before`` and ``now``): one disappeared, fewer than the
        model's instances are left of its version, and Triton still calls that version
        READY. A reload starts all its new stubs before the old ones go (they are then
        replaced, whoever reloads); an unload marks the version UNLOADING first."""
        dead = set()
        for model, pids in before.items():
            if model not in self.probes:
                continue
            left = now.get(model, {})
            for version in {pids[pid] for pid in pids.keys() - left.keys()}:
                remaining = sum(1 for v in left.values() if v == version)
                if remaining < self.instances.get(model, 1) and self._ready(model, version):
                    dead.add(model)
        return dead

    def _ready(self, model: str, version: str) -> bool:
        if not version.isdigit():
            return False
        try:
            return self.control.version_states(model).get(int(version)) == "READY"
        except HPSError as exc:  # Triton did not say: the probe decides, as for any loss
            log.debug("watchdog: no state of %s version %s: %s", model, version, exc)
            return False

    def _stubs(self) -> dict[str, dict[int, str]]:
        return stub_pids(self.server_pid) if self.server_pid else {}

    def check(self, client: Client, model: str) -> Recovery | None:
        """Probe ``model`` once; reload it if its stub is dead or it is stuck. The reload,
        if any."""
        stall = self._stalls[model]
        sent = time.monotonic()
        try:
            client.infer(model, self.probes[model])
            stall.answered()
            return None
        except BackendUnavailable as exc:  # timed out, refused by the queue, unreachable
            if UNHEALTHY in str(exc):
                return self.reload(model, str(exc))
            if not stall.failed(sent, time.monotonic(), executions(client, model)):
                log.debug("watchdog: probe of %s failed, the model is executing: %s", model, exc)
                return None
            return self.reload(
                model, f"probes failed for {stall.window:.0f}s, nothing executed: {exc}"
            )
        except HPSError as exc:
            if UNHEALTHY in str(exc):
                return self.reload(model, str(exc))
            return None  # e.g. unloaded by an operator: not ours to bring back

    def reload(self, model: str, reason: str) -> Recovery | None:
        """Unload and load ``model``; None if Triton refused (logged, retried next probe)."""
        start = time.monotonic()
        log.warning("model %s is unhealthy (%s); reloading it", model, reason)
        try:
            self.control.unload(model)  # readiness false from here on
            deadline = start + 5.0
            while self.control.states().get(model) == "READY" and time.monotonic() < deadline:
                time.sleep(0.05)
            self.control.load(model)
        except HPSError as exc:
            log.error("reloading %s failed: %s", model, exc)
            return None
        recovery = Recovery(model, reason, time.monotonic() - start)
        self._stalls[model].answered()
        self.recoveries.append(recovery)
        log.warning("model %s reloaded in %.1fs", model, recovery.seconds)
        return recovery
