"""Load tests of a whole HPS deployment with Locust (``hps loadtest``, docs/loadtest.md).

Only :mod:`hps.loadtest.locustfile` and the users it loads (:mod:`hps.loadtest.users`)
import Locust and gevent; they run in the Locust process that :mod:`hps.loadtest.runner`
starts. Everything else here (keys, requests, workload, thresholds, stack, summary) is plain
Python and NumPy, so ``import hps`` and ``hps --help`` never need the ``load`` extra.
"""
