"""Triton calls of the control plane: health, model control, one inference, metrics.

Model control (load, which also reloads) carries header ``hps-admin-key`` with the admin
key (:func:`hps.triton.admin.resolve_key`): ``hps serve`` restricts Triton's admin APIs to it.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections import defaultdict
from typing import Any

import numpy as np

from hps.errors import BackendUnavailable, HPSError

TIMEOUT_S = 5.0
LOAD_TIMEOUT_S = 300.0


class TritonAdmin:
    """One Triton server as the control plane sees it (HTTP)."""

    def __init__(
        self, url: str, metrics_url: str | None = None, admin_key: str | None = None
    ) -> None:
        self.url = url
        self.admin_key = admin_key
        host = url.rsplit(":", 1)[0]
        self.metrics_url = metrics_url or f"http://{host}:8002/metrics"

    def _client(self, timeout: float = TIMEOUT_S) -> Any:
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(
            self.url, connection_timeout=timeout, network_timeout=timeout
        )

    def _call(self, what: str, fn: Any, timeout: float = TIMEOUT_S) -> Any:
        from tritonclient.utils import InferenceServerException

        client = self._client(timeout)
        try:
            return fn(client)
        except InferenceServerException as exc:
            from hps.triton.client import translate

            raise translate(exc) from None
        except (OSError, ConnectionError) as exc:
            raise BackendUnavailable(f"Triton at {self.url}: {what}: {exc}") from None
        except Exception as exc:  # gevent/urllib3 wrappers of socket errors
            raise BackendUnavailable(f"Triton at {self.url}: {what}: {exc}") from None
        finally:
            client.close()

    def server_ready(self) -> bool:
        return bool(self._call("ready", lambda c: c.is_server_ready()))

    def model_ready(self, model: str) -> bool:
        return bool(self._call(f"{model} ready", lambda c: c.is_model_ready(model)))

    def lookup(self, model: str, keys: np.ndarray, numkeys: np.ndarray) -> np.ndarray:
        """One HugeCTR-shaped inference (KEYS, NUMKEYS -> OUTPUT0)."""
        from hps.triton.client import Client

        with Client(self.url, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S) as c:
            try:
                return c.lookup(model, keys, numkeys)
            except HPSError:
                raise
            except Exception as exc:
                raise BackendUnavailable(f"Triton at {self.url}: infer {model}: {exc}") from None

    def hit_counts(self) -> dict[tuple[str, str], dict[str, float]]:
        """``hps_hits_total`` summed over processes: (model, table) -> level -> keys."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=TIMEOUT_S) as resp:
                text = resp.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            raise BackendUnavailable(f"Triton metrics at {self.metrics_url}: {exc}") from None
        return parse_hits(text)


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
