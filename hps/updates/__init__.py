"""Online updates over Kafka: wire format, training-side producer, consumer and L1 freshness.

``from hps.updates import Publisher`` needs confluent-kafka; the codec does not. Names are
imported lazily so ``import hps.updates`` works without Kafka installed.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Publisher": "hps.updates.producer",
    "Applier": "hps.updates.applier",
    "UpdateConsumer": "hps.updates.consumer",
    "build_service": "hps.updates.runtime",
    "start_updates": "hps.updates.runtime",
    "start_background_applier": "hps.updates.runtime",
    "start_l1_listener": "hps.updates.runtime",
    "topic_name": "hps.updates.codec",
    "parse_topic": "hps.updates.codec",
    "encode": "hps.updates.codec",
    "encode_hugectr": "hps.updates.codec",
    "decode": "hps.updates.codec",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hps.updates' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
