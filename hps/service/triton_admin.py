"""The control plane's view of its Triton server: health, reloads, one inference, hit counts.

A thin user of :mod:`hps.triton.client`, the one Triton client: it makes no call of its own
and only chooses the control plane's timeouts, the metrics address and the admin key. A
reload carries header ``hps-admin-key`` with the admin key
(:func:`hps.triton.admin_key.resolve_key`): ``hps serve`` restricts Triton's admin APIs to it.
The key may be given as a function, asked at every reload: ``hps serve`` writes a fresh key
file at every start, and the control plane must follow it without a restart.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hps.errors import BackendUnavailable, HPSError
from hps.triton.client import Client, ModelControl, hit_counts

TIMEOUT_S = 5.0
LOAD_TIMEOUT_S = 300.0


class TritonAdmin:
    """One Triton server as the control plane sees it (HTTP)."""

    def __init__(
        self,
        url: str,
        metrics_url: str | None = None,
        admin_key: str | Callable[[], str | None] | None = None,
    ) -> None:
        self.url = url
        self._admin_key = admin_key
        host = url.rsplit(":", 1)[0]
        self.metrics_url = metrics_url or f"http://{host}:8002/metrics"
        self.control = ModelControl(url, None, timeout=TIMEOUT_S)  # health needs no key

    @property
    def admin_key(self) -> str | None:
        """The admin key now (a function given for it is asked each time)."""
        return self._admin_key() if callable(self._admin_key) else self._admin_key

    def server_ready(self) -> bool:
        return self.control.server_ready()

    def model_ready(self, model: str) -> bool:
        return self.control.model_ready(model)

    def reload(self, model: str, parameters: dict[str, str] | None = None) -> None:
        """Load Triton model ``model`` again with new instances (see ``ModelControl.reload``)."""
        ModelControl(self.url, self.admin_key, timeout=LOAD_TIMEOUT_S).reload(model, parameters)

    def lookup(self, model: str, keys: np.ndarray, numkeys: np.ndarray) -> np.ndarray:
        """One HugeCTR-shaped inference (KEYS, NUMKEYS -> OUTPUT0)."""
        with Client(self.url, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S) as c:
            try:
                return c.lookup(model, keys, numkeys)
            except HPSError:
                raise
            except Exception as exc:
                raise BackendUnavailable(f"Triton at {self.url}: infer {model}: {exc}") from None

    def hit_counts(self) -> dict[tuple[str, str], dict[str, float]]:
        """``hps_hits_total`` summed over processes: (model, table) -> level -> keys."""
        return hit_counts(self.metrics_url, TIMEOUT_S)
