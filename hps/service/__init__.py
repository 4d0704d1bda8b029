"""The control plane: a FastAPI application served by uvicorn (``hps admin``).

It runs beside ``hps serve`` on a node (a sidecar in Kubernetes) and reuses the core:
:class:`hps.tiers.Tiers` for L2/L3, the :class:`hps.topology.Topology`, the one loader
(:mod:`hps.loading.loader`) for imports, the :class:`hps.updates.Publisher` when Kafka is
configured, and Triton's model-control API to reach every serving instance. See
docs/control-plane.md.

``import hps.service`` needs nothing beyond the core; :func:`hps.service.app.create_app`
needs the ``admin`` extra (FastAPI).
"""
