"""The one Triton client: every call HPS makes to a Triton server goes through this package.

- :class:`Client` (:mod:`.inference`): inference through tritonclient, HTTP or gRPC,
  HugeCTR-shaped requests, Triton's errors translated to :mod:`hps.errors`;
- :class:`ModelControl` (:mod:`.control`): model control and health over Triton's HTTP API
  (plain ``urllib``), with the admin key (:mod:`hps.triton.admin_key`);
- :func:`parse_hits` (:mod:`.metrics`): Triton's ``/metrics``, read back.

Used by ``hps query`` and ``hps reload``, the supervisor (its watchdog and shutdown drain),
the control plane (:mod:`hps.service.triton_admin`), the benchmarks, the load test and the
tests. Runs in the caller's process, never inside Triton.
"""

from hps.triton.client.control import ModelControl
from hps.triton.client.inference import Client, ctr_request, translate
from hps.triton.client.metrics import parse_hits

__all__ = [
    "Client",
    "ModelControl",
    "ctr_request",
    "parse_hits",
    "translate",
]
