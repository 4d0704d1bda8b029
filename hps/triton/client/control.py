"""Triton's model-control API over HTTP, with the admin key (docs/security.md).

Plain ``urllib`` (no tritonclient), so the supervisor can drain without the client extra.
Used by ``hps reload``, the dead-stub watchdog, the shutdown drain and the control plane
(its health checks and reloads, :mod:`hps.service.triton_admin`).
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from hps.errors import BackendUnavailable, RequestError
from hps.triton.admin_key import http_headers
from hps.triton.client.address import triton_address

log = logging.getLogger(__name__)

RELOAD_STAMP = "hps_reload_stamp"
RELOAD_ONLY = {RELOAD_STAMP, "hps_warmup_keysets"}  # parameters a reload does not keep
FAILED_LOAD_COST = (
    "Triton 2.51 counts a model whose load failed as live until it exits: the next shutdown "
    "of this tritonserver waits out its exit timeout and exits 1 (docs/security.md)"
)


class ModelControl:
    """Load, unload and list the models of one Triton server (HTTP ``host:port``, with or
    without ``http://``: :func:`hps.triton.client.address.triton_address`), and ask
    whether it and its models are ready."""

    def __init__(self, http_url: str, key: str | None, timeout: float = 60.0) -> None:
        self.base = f"http://{triton_address(http_url)}"
        self.key = key
        self.timeout = timeout

    def _call(
        self, method: str, path: str, body: Mapping[str, object] | None = None
    ) -> Any:  # Triton's parsed JSON answer
        data = json.dumps(body or {}).encode() if method == "POST" else None
        headers = {"Content-Type": "application/json", **http_headers(self.key)}
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read().decode(errors="replace") or "null"
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            if exc.code == 403:
                raise RequestError(f"Triton refused {path}: {detail} (wrong admin key?)") from None
            raise RequestError(f"Triton answered {exc.code} to {path}: {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            # HTTPException: an answer cut short or malformed (a server going down)
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            why = str(reason) or type(reason).__name__  # some carry no message
            raise BackendUnavailable(f"cannot reach Triton at {self.base}: {why}") from None
        try:
            return json.loads(text)
        except ValueError:
            raise BackendUnavailable(
                f"Triton answered {path} with no JSON: {text[:200]!r}"
            ) from None

    def load(self, model: str) -> None:
        """Load (or reload) ``model``; returns once Triton has it ready or raises."""
        self._load(model, None)

    def reload(self, model: str, parameters: dict[str, str] | None = None) -> None:
        """Load ``model`` again, with new instances, even when none of its files changed.

        Triton skips a load whose model files did not change, so the load carries the
        model's config with a fresh ``hps_reload_stamp`` parameter (plus ``parameters``, for
        this load only): the new instances re-import changed tables and replace the old ones.
        """
        config = self._call("GET", f"/v2/models/{model}/config")
        params = {k: v for k, v in config.get("parameters", {}).items() if k not in RELOAD_ONLY}
        extra = {RELOAD_STAMP: str(time.time_ns()), **(parameters or {})}
        params.update({k: {"string_value": v} for k, v in extra.items()})
        body = {"parameters": {"config": json.dumps({**config, "parameters": params})}}
        self._load(model, body)

    def _load(self, model: str, body: Mapping[str, object] | None) -> None:
        """A load; one that Triton answers with a failure (new instances that did not come
        up: the old ones serve on) is logged with what it costs at shutdown, then raised."""
        try:
            self._call("POST", f"/v2/repository/models/{model}/load", body)
        except RequestError as exc:
            if "load failed" in str(exc):  # Triton's "load failed for model '...': ..."
                log.warning("loading %s failed; %s", model, FAILED_LOAD_COST)
            raise

    def unload(self, model: str) -> None:
        self._call("POST", f"/v2/repository/models/{model}/unload")

    def states(self) -> dict[str, str]:
        """Model name -> state (READY, UNLOADING, UNAVAILABLE, LOADING) in the repository."""
        index = self._call("POST", "/v2/repository/index", {})
        return {m["name"]: m.get("state", "") for m in index or []}

    def version_states(self, model: str) -> dict[int, str]:
        """Version -> state of one model's versions in the repository (a version Triton
        never loaded, or unloaded long ago, may be absent)."""
        index = self._call("POST", "/v2/repository/index", {})
        return {
            int(m["version"]): m.get("state", "")
            for m in index or []
            if m.get("name") == model and str(m.get("version", "")).isdigit()
        }

    def server_ready(self) -> bool:
        """Whether Triton reports itself ready (``/v2/health/ready``)."""
        return self._ready("/v2/health/ready")

    def model_ready(self, model: str) -> bool:
        """Whether ``model`` is loaded and ready (``/v2/models/<model>/ready``)."""
        return self._ready(f"/v2/models/{model}/ready")

    def _ready(self, path: str) -> bool:
        """True on 200, False on Triton's "not ready" (an HTTP error); unreachable raises."""
        try:
            with urllib.request.urlopen(self.base + path, timeout=self.timeout) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError:
            return False
        except (urllib.error.URLError, OSError) as exc:
            raise BackendUnavailable(f"cannot reach Triton at {self.base}: {exc}") from None

    def drain(self, timeout: float) -> bool:
        """Unload every model and wait until none is left: in-flight requests finish first,
        new ones get an error. True if every model was unloaded within ``timeout``."""
        deadline = time.monotonic() + timeout
        loaded = [m for m, s in self.states().items() if s in ("READY", "LOADING")]
        for model in loaded:
            self.unload(model)
        while time.monotonic() < deadline:
            busy = [m for m, s in self.states().items() if s in ("READY", "LOADING", "UNLOADING")]
            if not busy:
                return True
            time.sleep(0.1)
        return False
