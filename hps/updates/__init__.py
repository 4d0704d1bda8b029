"""Online updates over Kafka: wire format, training-side producer, consumer and L1 freshness.

``from hps.updates import Publisher`` needs confluent-kafka; the codec does not. Names are
imported lazily so ``import hps.updates`` works without Kafka installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "Publisher": "hps.updates.producer",
    "Applier": "hps.updates.applier",
    "UpdateConsumer": "hps.updates.consumer",
    "build_service": "hps.updates.runtime",
    "start_updates": "hps.updates.runtime",
    "start_background_applier": "hps.updates.embedded",
    "start_l1_listener": "hps.updates.listener",
    "topic_name": "hps.updates.codec",
    "parse_topic": "hps.updates.codec",
    "encode": "hps.updates.codec",
    "encode_hugectr": "hps.updates.codec",
    "decode": "hps.updates.codec",
}

__all__ = [
    "Applier",
    "Publisher",
    "UpdateConsumer",
    "build_service",
    "decode",
    "encode",
    "encode_hugectr",
    "parse_topic",
    "start_background_applier",
    "start_l1_listener",
    "start_updates",
    "topic_name",
]
assert sorted(__all__) == sorted(_EXPORTS)

if TYPE_CHECKING:  # what the names are, to a type checker
    from hps.updates.applier import Applier
    from hps.updates.codec import decode, encode, encode_hugectr, parse_topic, topic_name
    from hps.updates.consumer import UpdateConsumer
    from hps.updates.embedded import start_background_applier
    from hps.updates.listener import start_l1_listener
    from hps.updates.producer import Publisher
    from hps.updates.runtime import build_service, start_updates


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hps.updates' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
