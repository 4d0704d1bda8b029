"""Loading tables into the tiers: orchestration over the file formats of :mod:`hps.io`.

- :mod:`hps.loading.loader`: the one loader: a table's files validated, then streamed into
  L3 and L2 (:class:`hps.tiers.Tiers`) as the topology says;
- :mod:`hps.loading.imports`: which tables of a ps.json to import, under the node's import
  lock, recorded once complete.
"""
