"""How a serving instance opens its tiers and the node's change journal, as the topology
places it (:mod:`hps.topology`); free of Triton's stub so it runs anywhere."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hps.config import ModelConfig, PSConfig
    from hps.lookup import LookupSession
    from hps.updates.journal_follower import JournalFollower

log = logging.getLogger(__name__)


def instance_device(args: Mapping[str, str]) -> int | None:
    """The GPU Triton placed this instance on (a ``KIND_GPU`` instance, see
    :attr:`hps.config.ModelConfig.instance_gpus`); None for a ``KIND_CPU`` one."""
    if args.get("model_instance_kind") != "GPU":
        return None
    return int(args["model_instance_device_id"])


def open_session(
    config: PSConfig, model: ModelConfig, *, ctr: bool = False, device_id: int | None = None
) -> tuple[LookupSession, str]:
    """The instance's session, and how it opened L3 (the topology decides, see
    :mod:`hps.topology`): a process that applies updates itself writes L3, unless another
    process holds the writer's lock (e.g. the old instance during a reload): then it follows
    it as a secondary. An instance of the CTR twin (``ctr``) opens it as the topology's
    ``ctr_l3_mode`` says, and keeps its rows on L1's GPU (so ``hps_cache.device: auto``
    times that). ``device_id``: the GPU of the instance's L1 (default: the model's first
    ``deployed_device_list`` entry)."""
    from hps.build import build_session
    from hps.errors import BackendError
    from hps.topology import topology

    placement = topology(config).model(model.model)
    # no L3: the mode is not used
    mode = (placement.ctr_l3_mode if ctr else placement.l3_mode) or "read_write"
    fallback = None if ctr else placement.l3_fallback
    try:
        return build_session(config, l3_mode=mode, device_id=device_id, rows_on_device=ctr), mode
    except BackendError as exc:
        if fallback is None:
            raise
        log.warning("L3 writer lock held elsewhere (%s); following it as a secondary", exc)
        return build_session(config, l3_mode=fallback, device_id=device_id), fallback


def open_journal(config: PSConfig, model: str, args: dict[str, str]) -> JournalFollower | None:
    """This process's follower of the node's change journal (None: the node keeps no state,
    so the control plane writes nothing here and reloads instead)."""
    from hps.errors import ConfigError
    from hps.topology import topology
    from hps.updates.journal import Journal, journal_dir
    from hps.updates.journal_follower import JournalFollower

    state = topology(config).state_dir
    if state is None:
        return None
    reader = f"{args['model_instance_name']}.{os.getpid()}"
    try:
        return JournalFollower(Journal(journal_dir(state)), reader, model)
    except OSError as exc:  # e.g. a read-only volume: nothing can write L3 there either
        if topology(config).l1_refresh == "journal":
            raise ConfigError(
                f"update_source.hps_l1_refresh is 'journal' but the change journal beside "
                f"{state} cannot be opened ({exc.strerror}): this process would never see "
                "an update; use 'listener'"
            ) from None
        log.warning("no change journal beside %s (%s): writes reach this process by reloads",
                    state, exc.strerror)  # fmt: skip
        return None
