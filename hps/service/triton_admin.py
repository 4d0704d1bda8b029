"""The control plane's view of its Triton server: health, reloads, one inference, hit counts.

A thin user of :mod:`hps.triton.client`, the one Triton client: it makes no call of its own
and only chooses the control plane's timeouts, the metrics address and the admin key. A
reload carries header ``hps-admin-key`` with the admin key
(:func:`hps.triton.admin_key.resolve_key`): ``hps serve`` restricts Triton's admin APIs to it.
The key may be given as a function, asked at every reload: ``hps serve`` writes a fresh key
file at every start, and the control plane must follow it without a restart.

Reloads of one Triton model never overlap, and concurrent ones coalesce
(:class:`ReloadQueue`): a reload asked while none runs starts at once; one asked while a
reload runs waits for it and then runs once for all the requests that arrived meanwhile
(their data changes may have landed after the running one began). Forty concurrent
reloads are thus two loads, not forty in a row. Callers that need the model served (a
warm-up, an inference) call :meth:`TritonAdmin.wait_loaded` first: it waits out a reload
in progress instead of failing on a model that is, for a moment, not loaded.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hps.errors import BackendUnavailable, HPSError
from hps.triton.client import Client, ModelControl, parse_hits
from hps.triton.client.address import triton_address
from hps.updates.metrics import Buckets, histograms

TIMEOUT_S = 5.0
LOAD_TIMEOUT_S = 300.0
WAIT_POLL_S = 0.1

Parameters = dict[str, str] | None


@dataclass
class _Reload:
    """One load of a model, shared by every request that joined it before it started."""

    parameters: Parameters
    started: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    joined: int = 1

    def takes(self, parameters: Parameters) -> bool:
        """Whether a request with ``parameters`` can share this load (not started yet; a plain
        reload joins any, a load with parameters joins one with none or the same)."""
        if self.started:
            return False
        if parameters is None or parameters == self.parameters:
            return True
        if self.parameters is None:
            self.parameters = dict(parameters)  # the plain reload now carries them too
            return True
        return False


class ReloadQueue:
    """Per model: one load at a time; requests arriving while one is queued share it."""

    def __init__(self, load: Callable[[str, Parameters], None]) -> None:
        self._load = load
        self._lock = threading.Condition()
        self._queues: dict[str, list[_Reload]] = {}
        self.loads = 0  # loads run (a test and the metrics read it)

    def busy(self, model: str) -> bool:
        """Whether a reload of ``model`` is running or queued."""
        with self._lock:
            return bool(self._queues.get(model))

    def wait_idle(self, model: str, timeout: float) -> bool:
        """Wait until no reload of ``model`` is running or queued; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queues.get(model):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def reload(self, model: str, parameters: Parameters) -> None:
        with self._lock:
            queue = self._queues.setdefault(model, [])
            mine = next((r for r in queue if r.takes(parameters)), None)
            if mine is not None:
                mine.joined += 1
            else:
                mine = _Reload(dict(parameters) if parameters is not None else None)
                queue.append(mine)
            owner = mine.joined == 1
            if owner:
                while queue[0] is not mine:  # the loads queued before it run first
                    self._lock.wait()
                mine.started = True
        if not owner:
            mine.done.wait()
            if mine.error is not None:
                raise mine.error
            return
        try:
            self._load(model, mine.parameters)
        except BaseException as exc:
            mine.error = exc
            raise
        finally:
            with self._lock:
                self.loads += 1
                queue.remove(mine)
                if not queue:
                    del self._queues[model]
                mine.done.set()
                self._lock.notify_all()


class TritonAdmin:
    """One Triton server as the control plane sees it (HTTP)."""

    def __init__(
        self,
        url: str,
        metrics_url: str | None = None,
        admin_key: str | Callable[[], str | None] | None = None,
    ) -> None:
        self.url = triton_address(url)  # host:port, a scheme given stripped
        self._admin_key = admin_key
        host = self.url.rsplit(":", 1)[0]
        self.metrics_url = metrics_url or f"http://{host}:8002/metrics"
        self.control = ModelControl(url, None, timeout=TIMEOUT_S)  # health needs no key
        self.reloads = ReloadQueue(self._load)

    @property
    def admin_key(self) -> str | None:
        """The admin key now (a function given for it is asked each time)."""
        return self._admin_key() if callable(self._admin_key) else self._admin_key

    def server_ready(self) -> bool:
        return self.control.server_ready()

    def model_ready(self, model: str) -> bool:
        return self.control.model_ready(model)

    def reload(self, model: str, parameters: dict[str, str] | None = None) -> None:
        """Load Triton model ``model`` again with new instances (see ``ModelControl.reload``);
        concurrent reloads of one model coalesce (:class:`ReloadQueue`)."""
        self.reloads.reload(model, parameters)

    def _load(self, model: str, parameters: Parameters) -> None:
        self.wait_loaded(model, LOAD_TIMEOUT_S, ours=False)  # e.g. `hps reload` loading it
        ModelControl(self.url, self.admin_key, timeout=LOAD_TIMEOUT_S).reload(model, parameters)

    def wait_loaded(self, model: str, timeout: float = LOAD_TIMEOUT_S, ours: bool = True) -> None:
        """Return once ``model`` is neither being reloaded by this control plane (``ours``)
        nor loading in Triton (whoever asked); BackendUnavailable after ``timeout``. A model
        Triton does not know at all returns at once (the caller's own call reports it)."""
        deadline = time.monotonic() + timeout
        if ours and not self.reloads.wait_idle(model, timeout):
            raise BackendUnavailable(f"model {model} is still being reloaded after {timeout:.0f} s")
        while True:
            try:
                control = ModelControl(self.url, self.admin_key, timeout=TIMEOUT_S)
                state = control.states().get(model)  # the repository index needs the key
            except HPSError:
                return  # Triton unreachable or refusing: the caller's own call says so
            if state not in ("LOADING", "UNLOADING"):
                return
            if time.monotonic() > deadline:
                raise BackendUnavailable(f"model {model} is still {state} after {timeout:.0f} s")
            time.sleep(WAIT_POLL_S)

    def lookup(self, model: str, keys: np.ndarray, numkeys: np.ndarray) -> np.ndarray:
        """One HugeCTR-shaped inference (KEYS, NUMKEYS -> OUTPUT0)."""
        with Client(self.url, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S) as c:
            try:
                return c.lookup(model, keys, numkeys)
            except HPSError:
                raise
            except Exception as exc:
                raise BackendUnavailable(f"Triton at {self.url}: infer {model}: {exc}") from None

    def hits_and_freshness(
        self,
    ) -> tuple[dict[tuple[str, str], dict[str, float]], dict[tuple[str, str], Buckets]]:
        """``hps_hits_total`` summed over processes ((model, table) -> level -> keys) and
        ``hps_update_freshness_seconds`` ((Triton model, table) -> cumulative buckets, since
        the serving processes started), from one read of Triton's /metrics."""
        text = metrics_text(self.metrics_url, TIMEOUT_S)
        return parse_hits(text), parse_freshness(text)


FRESHNESS = "hps_update_freshness_seconds"


def metrics_text(metrics_url: str, timeout: float) -> str:
    """Triton's /metrics as text; BackendUnavailable when it cannot be read."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError) as exc:
        raise BackendUnavailable(f"Triton metrics at {metrics_url}: {exc}") from None


def parse_freshness(text: str) -> dict[tuple[str, str], Buckets]:
    """``hps_update_freshness_seconds`` in a /metrics text, summed over processes."""
    found = histograms(text, FRESHNESS, ("model", "table"))
    return {(model, table): buckets for (model, table), buckets in found.items()}
