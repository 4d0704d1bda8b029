"""Inference through tritonclient (HTTP or gRPC): HugeCTR-shaped requests, errors translated
to hps.errors.

Used by ``hps query``, the watchdog's probes, the control plane's lookups, ``hps bench
triton``, the load test and the integration tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from http.client import HTTPException
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from hps.config import ModelConfig, PSConfig
from hps.errors import BackendUnavailable, ConfigError, RequestError, UnknownTableError
from hps.triton.client import _hub
from hps.triton.client.address import triton_address

if TYPE_CHECKING:  # tritonclient has no type hints: these names document what is meant
    import tritonclient.grpc
    import tritonclient.http
    from tritonclient.utils import InferenceServerException


class Client:
    """One tritonclient connection (HTTP or gRPC) to a Triton server at ``url``
    (:func:`hps.triton.client.address.triton_address`: ``host:port``, with or without the
    protocol's scheme)."""

    def __init__(self, url: str, *, grpc: bool = False, **kw: object) -> None:
        url = triton_address(url, grpc=grpc)  # before tritonclient, which raises noisily
        if grpc:
            import tritonclient.grpc as module
        else:
            import tritonclient.http as module
        self.module: ModuleType = module
        self.url = url
        self.grpc = grpc
        self.client: tritonclient.grpc.InferenceServerClient | (
            tritonclient.http.InferenceServerClient
        ) = module.InferenceServerClient(url, **kw)
        if not grpc:
            _hub.opened()

    def close(self) -> None:
        """Close the connection; an HTTP client belongs to the thread that made it, and the
        thread's last one also takes the event loop tritonclient made there (see ``_hub``)."""
        self.client.close()
        if not self.grpc:
            _hub.closed()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _input(
        self, name: str, array: np.ndarray
    ) -> tritonclient.grpc.InferInput | tritonclient.http.InferInput:
        from tritonclient.utils import np_to_triton_dtype

        tensor = self.module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        return tensor

    def infer(
        self, model: str, inputs: dict[str, np.ndarray], output: str = "OUTPUT0"
    ) -> np.ndarray:
        """Send one request; the named output. Triton errors become hps errors."""
        return self.infer_outputs(model, inputs, (output,))[output]

    def infer_outputs(
        self, model: str, inputs: dict[str, np.ndarray], outputs: tuple[str, ...]
    ) -> dict[str, np.ndarray]:
        """Send one request asking for ``outputs`` only (e.g. ``OUTPUT0`` and an
        ``hps_embedding``'s ``LOOKUP_START_NS``); each of them by name."""
        tensors = [self._input(name, array) for name, array in inputs.items()]
        wanted = [self.module.InferRequestedOutput(name) for name in outputs]
        with self._translated():
            result = self.client.infer(model, tensors, outputs=wanted)
        return {name: np.asarray(result.as_numpy(name)) for name in outputs}

    def lookup(self, model: str, keys: np.ndarray, numkeys: np.ndarray) -> np.ndarray:
        """HugeCTR's HPS request: KEYS [1, n] int64, NUMKEYS [1, tables] int32 -> [1, n x dim]."""
        return self.infer(
            model,
            {
                "KEYS": np.asarray(keys, dtype=np.int64).reshape(1, -1),
                "NUMKEYS": np.asarray(numkeys, dtype=np.int32).reshape(1, -1),
            },
        )

    def predict(
        self, model: str, dense: np.ndarray, keys: np.ndarray, rowindex: np.ndarray
    ) -> np.ndarray:
        """HugeCTR's CTR request: DES, CATCOLUMN, ROWINDEX, each [1, n] -> scores [1, samples]."""
        return self.infer(
            model,
            {
                "DES": np.asarray(dense, dtype=np.float32).reshape(1, -1),
                "CATCOLUMN": np.asarray(keys, dtype=np.int64).reshape(1, -1),
                "ROWINDEX": np.asarray(rowindex, dtype=np.int32).reshape(1, -1),
            },
        )

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """The one boundary where client-library errors become hps errors."""
        from tritonclient.utils import InferenceServerException

        try:
            yield
        except InferenceServerException as exc:
            raise translate(exc) from None
        except (ConnectionError, OSError, HTTPException) as exc:  # refused, reset, closed
            raise BackendUnavailable(f"cannot reach Triton at {self.url}: {exc}") from None

    def model_ready(self, model: str) -> bool:
        """Whether ``model`` is ready (this also opens the connection)."""
        with self._translated():
            return bool(self.client.is_model_ready(model))

    def input_names(self, model: str) -> list[str]:
        with self._translated():
            meta = self.client.get_model_metadata(model, **({"as_json": True} if self.grpc else {}))
        return [i["name"] for i in meta.get("inputs", [])]

    def model_parameters(self, model: str) -> dict[str, str]:
        with self._translated():
            cfg = self.client.get_model_config(model, **({"as_json": True} if self.grpc else {}))
        cfg = cfg.get("config", cfg)
        params = cfg.get("parameters", {})
        return {k: v.get("string_value", v.get("stringValue", "")) for k, v in params.items()}

    def served_config(self, model: str, path: str | None = None) -> tuple[PSConfig, ModelConfig]:
        """The ps.json a model is served from (its ``ps_config`` parameter, unless ``path``)."""
        from hps.triton.serving import serving_config

        params = self.model_parameters(model)
        ps_path = path or params.get("ps_config")
        if not ps_path:
            raise ConfigError(f"model {model!r} names no ps.json; pass --config")
        config = serving_config(ps_path, params.get("base_dir") or None)
        return config, config.model(params.get("hps_model") or model)


def translate(exc: InferenceServerException) -> Exception:
    """A tritonclient InferenceServerException as the hps error it stands for."""
    message = exc.message() if callable(getattr(exc, "message", None)) else str(exc)
    status = str(exc.status() or "")
    if "unknown model" in message.lower() or "NOT_FOUND" in status or status == "404":
        return UnknownTableError(message)
    if "UNAVAILABLE" in status or status in ("502", "503"):
        return BackendUnavailable(message)
    return RequestError(message)


def ctr_request(
    samples: int, num_dense: int, rows: list[int], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random CTR inputs: one key per table (one per entry of ``rows``) per sample, keys
    below each table's ``rows``."""
    keys = np.concatenate([rng.integers(0, max(r, 1), samples) for r in rows])
    per_table = np.arange(samples + 1, dtype=np.int32)
    rowindex = np.tile(per_table, len(rows))
    dense = rng.standard_normal(samples * num_dense).astype(np.float32)
    return dense, keys, rowindex
