"""File formats, pure: HugeCTR sparse-model folders, .npy pairs, keyset and frequency files,
a progress line, and the size of a chunk of any pass over a whole table (:mod:`hps.io.chunks`).

A leaf: it imports nothing of ours above :mod:`hps.errors`, :mod:`hps.types` and (for types
only) :mod:`hps.config` (``tests/unit/test_layers.py``). Loading the files into the tiers is
:mod:`hps.loading`.
"""
