"""The Locust users of ``hps loadtest``, one module per service they talk to.

- :mod:`.triton`: readers of the HPS model over gRPC and HTTP, of the example CTR model, and
  a sender of malformed requests that must be refused;
- :mod:`.kafka`: the publisher's bulk updates and the freshness probes, through
  :mod:`.publisher` (``hps.updates.Publisher`` with its blocking calls off the gevent loop);
- :mod:`.admin`: the control plane's read routes;
- :mod:`.shared`: what they share in the Locust process (the run's state, timing a call).

They run in the Locust process only: with :mod:`hps.loadtest.locustfile`, which loads them,
the only modules of ours that import Locust and gevent.
"""
