"""Model versions: immutable snapshots of a model's tables and dense weights, each a Triton
model version, imported beside the live one, activated and rolled back without an import.

- :mod:`hps.versions.registry`: the node's record (versions, states, the live one).
- :mod:`hps.versions.rollout`: import, activate, retire.
- :mod:`hps.versions.held`: version 1's ps.json entry checked against the rows the node
  holds before it is first recorded.
- :mod:`hps.versions.node_record`: the record a node publishes into a shared Redis L2, and
  which other nodes hold a version; :mod:`hps.versions.shared_rows`: a version's rows in
  that L2 kept while another node holds it.
"""

from hps.versions.registry import VersionInfo, VersionRegistry, VersionState

__all__ = ["VersionInfo", "VersionRegistry", "VersionState"]
