"""Entry point for running Locust by hand: ``locust -f loadtests/locustfile.py --hps-config ...``.

The users live in :mod:`hps.loadtest.locustfile` (installed with the package, so
``hps loadtest`` finds them anywhere); see docs/loadtest.md.
"""

from hps.loadtest.locustfile import *  # noqa: F403  (Locust collects the User classes)
from hps.loadtest.locustfile import HPSShape as HPSShape
