"""What the model.py adapters share inside a Triton Python-backend process.

Imported only by model.py files (it imports ``triton_python_backend_utils``, which exists
only inside Triton's Python stub).

Tensors cross the stub through DLPack, not ``as_numpy()`` / ``Tensor(name, array)``: the
stub's pybind11 NumPy bridge predates NumPy 2 and silently corrupts data under it (an
INT64 input arrived as ``[1, 1, 1]`` for ``[1, 2, 3]``; outputs came back empty).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from hps.cache.xp import use_device
from hps.redact import scrub
from hps.triton.instance_ready import InstanceReady
from hps.triton.model.metrics import MetricsExporter
from hps.triton.model.request import c_order, error_reply
from hps.types import Array

log = logging.getLogger(__name__)

START_OUTPUT = "LOOKUP_START_NS"
_CAPSULE_NOISE = "PyCapsule_GetPointer called with incorrect name"


def _quiet_capsule_hook(default: Any) -> Any:
    """Drop one known-harmless unraisable error, pass the others on.

    ``Tensor.from_dlpack`` renames the consumed capsule ``used_dlpack`` where NumPy's
    capsule destructor expects ``used_dltensor``; the destructor then reports an unraisable
    ValueError for every output. The stub owns and frees the tensor itself (checked: no
    growth over thousands of requests), so the report is noise.
    """

    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_value
        if isinstance(exc, ValueError) and str(exc) == _CAPSULE_NOISE:
            return
        default(unraisable)

    return hook


sys.unraisablehook = _quiet_capsule_hook(sys.unraisablehook)


def input_array(request: Any, name: str) -> np.ndarray:
    """Input ``name`` of a request as a NumPy array (a view of the stub's buffer)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise KeyError(f"request has no input {name}")
    return np.from_dlpack(tensor)


def output_tensor(name: str, array: Array) -> Any:
    """An output tensor of ``array``'s memory (:func:`c_order`): a CuPy array (a GPU
    instance's answer) stays on its GPU, for the model that reads it next."""
    return pb_utils.Tensor.from_dlpack(name, c_order(array))


def error_response(exc: BaseException) -> Any:
    """A response carrying a Triton error for this request only."""
    message, code = error_reply(exc)
    message = scrub(message)  # e.g. a backend's error text: no registered secret in it
    return pb_utils.InferenceResponse(
        output_tensors=[], error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))
    )


CANCELLED = "request cancelled (its client gave up or its deadline passed) before its lookup"


def cancelled_response() -> Any:
    """The answer to a request cancelled while it waited: a CANCELLED error (which no client
    reads any more), nothing looked up."""
    error = pb_utils.TritonError(CANCELLED, pb_utils.TritonError.CANCELLED)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


def model_parameters(args: dict[str, str]) -> dict[str, str]:
    """The ``parameters`` of the model's config.pbtxt, as strings."""
    params = json.loads(args["model_config"]).get("parameters", {})
    return {k: v.get("string_value", "") for k, v in params.items()}


class ModelProcess:
    """One Triton model instance: its ps.json model, its LookupSession and its metrics.

    config.pbtxt parameters: ``ps_config`` (ps.json; relative to the model's folder),
    ``hps_model`` (the ps.json model; default: the Triton model's name), ``base_dir``
    (where relative paths in ps.json start; default: the ps.json's folder) and
    ``metrics_interval_s`` (how often counters reach Triton's /metrics; 0: every batch).
    ``ctr``: this is an instance of the model's CTR twin (``<model>_ctr``). ``cancellable``:
    the model has Triton's dynamic batcher (a bounded queue), which marks requests whose
    clients gave up.

    A ``KIND_GPU`` instance keeps its L1 on the GPU Triton placed it on, and ``on_gpu`` is
    true: its answers may stay there (:meth:`hps.lookup.LookupSession.lookup_request`),
    and :func:`output_tensor` hands them to Triton as GPU tensors.
    """

    def __init__(self, args: dict[str, str], *, ctr: bool = False) -> None:
        from hps.redact import protect
        from hps.startup import refreshers_for, warm_up_keysets, warm_up_session, watch_shared_l2
        from hps.topology import topology
        from hps.triton.model.session import instance_device, open_journal, open_session
        from hps.triton.serving import fill_l2, only_model, prepare_tables, serving_config
        from hps.versions import VersionRegistry

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        params = model_parameters(args)
        ps_path = Path(args["model_repository"]) / params.get("ps_config", "ps.json")
        self.name = params.get("hps_model") or args["model_name"]
        base = params.get("base_dir") or str(ps_path.parent)
        config = serving_config(ps_path, base)
        protect(config)  # no log line of this process shows the config's secrets
        # Triton's model version is the HPS model version whose rows and weights this serves
        self.version = int(args.get("model_version") or 1)
        config = VersionRegistry(config).config_at(self.name, self.version)
        self.config = only_model(config, self.name)
        self.model = self.config.model(self.name)
        start = time.perf_counter()
        # Control-plane writes reach this process through the node's change journal; its
        # position is taken before L3 is opened, so nothing written meanwhile is missed.
        self.journal = open_journal(self.config, self.name, args)
        prepare_tables(self.config)
        self.device_id = instance_device(args)
        self.on_gpu = self.device_id is not None
        if self.device_id is not None:  # the stub calls initialize and execute on one thread
            use_device(self.device_id)  # e.g. the CTR network beside L1, not on GPU 0
        self.session, mode = open_session(
            self.config, self.model, ctr=ctr, device_id=self.device_id
        )
        rows = fill_l2(self.session, self.config, self.model)
        warm = sum(warm_up_session(self.session, self.config).values())
        extra = warm_up_keysets(self.session, self.name, params.get("hps_warmup_keysets"))
        warm += sum(extra.values())
        # hps serve summarises these per model (hps.triton.supervisor.output)
        report = InstanceReady(
            instance=args["model_instance_name"],
            model=args["model_name"],
            hps_model=self.name,
            seconds=time.perf_counter() - start,
            l1_rows=warm,
            tables=len(self.model.tables),
            l2=self.config.volatile_db.type,
            l2_loaded=rows,
            l3=self.config.persistent_db.type,
            l3_mode=mode,
        )
        log.info("%s", report.message())
        self.refreshers = [r.start() for r in refreshers_for(self.session, self.config)]
        update_timings = None
        if self.config.update_source.enabled:  # Kafka: drained into /metrics by self.metrics
            from hps.updates.metrics import BufferedRecorder

            update_timings = BufferedRecorder()
        if self.journal is not None:
            vdb = self.config.volatile_db
            placement = topology(self.config).l2
            self.journal.attach(
                self.session,
                own_l2=placement == "process",
                shared_backfill=vdb.cache_missed_embeddings and placement in ("node", "server"),
                l2_share=vdb.initial_cache_rate,
                recorder=update_timings,  # hps_l1_refresh journal: hps consume's batches
            )
            self.journal.start()
        self.updates = None
        if update_timings is not None:  # the embedded applier or an L1 listener (or neither)
            from hps.updates.runtime import start_updates

            self.updates = start_updates(self.session, self.config, update_timings)
        # A node's shared-memory L2 removed or replaced: follow it, refill, re-read L1.
        self.l2_watch = watch_shared_l2(self.session, self.config, role="serving")
        if self.l2_watch is not None:
            self.l2_watch.start()
            if self.journal is not None:  # the control plane's /readyz reads it there
                self.journal.report(self.l2_problem)
        # Only Triton's dynamic batcher (a model with a bounded queue: hps_max_queue_size,
        # hps_queue_timeout_s) marks a waiting request cancelled; without it no request
        # ever read as cancelled (Triton 2.51), and each check is a round trip to the server
        self.cancellable = "dynamic_batching" in json.loads(args["model_config"])
        interval = float(params.get("metrics_interval_s") or 1.0)
        self.metrics = MetricsExporter(
            pb_utils,
            args["model_name"],
            args["model_instance_name"],
            self.session,
            interval,
            updates=update_timings,
        )
        l1_device = self.session.l1_devices.get(self.name)
        if l1_device is not None:  # where L1 runs and why, in /metrics (hps.cache.auto)
            self.metrics.l1_device(l1_device)

    def answer(self, requests: list[Any], compute: Callable[[Any], np.ndarray]) -> list[Any]:
        """One response per request: ``OUTPUT0 = compute(request)``, or that request's error.

        A request that asks for ``LOOKUP_START_NS`` (a model that declares it) also gets the
        wall-clock time at which this instance began its lookup, one per row.

        Each request succeeds or fails on its own; latency and errors reach the metrics. On
        a model whose queue is bounded (``cancellable``), a request cancelled while it
        waited (a gRPC client's deadline passed, the client went away) is not computed: it
        is answered :func:`cancelled_response` and counted as an error of code
        ``CANCELLED``.
        """
        responses = []
        for request in requests:
            if self.cancellable and request.is_cancelled():
                responses.append(cancelled_response())
                self.metrics.error("CANCELLED")
                continue
            start = time.perf_counter()
            started_ns = time.time_ns()
            try:
                out = compute(request)
                tensors = [output_tensor("OUTPUT0", out)]
                if START_OUTPUT in request.requested_output_names():
                    stamp = np.full((out.shape[0], 1), started_ns, dtype=np.int64)
                    tensors.append(output_tensor(START_OUTPUT, stamp))
                responses.append(pb_utils.InferenceResponse(tensors))
                self.metrics.observe(time.perf_counter() - start)
            except Exception as exc:
                responses.append(error_response(exc))
                self.metrics.error(error_reply(exc)[1])
        self.metrics.maybe_flush()
        return responses

    def l2_problem(self) -> str | None:
        """None while this instance serves the node's current shared L2, else why not
        (carried in its change-journal heartbeat: the control plane's ``/readyz`` answers
        503 while any instance of the node has one)."""
        return None if self.l2_watch is None else self.l2_watch.problem()

    def close(self) -> None:
        if self.journal is not None:
            self.journal.stop()
        if self.l2_watch is not None:
            self.l2_watch.stop()
        for refresher in self.refreshers:
            refresher.stop()
        if self.updates is not None:
            self.updates.stop()
        self.metrics.flush()
        self.metrics.close()
        self.session.close()
