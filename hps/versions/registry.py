"""The node's record of each model's versions: which exist, in which state, which is live.

A model version is an immutable snapshot of one ps.json model entry (its tables, sparse
files, dense weights, row formats) imported under its own number; its rows live in their
own namespace in every tier (:attr:`hps.types.TableSpec.name`). The record is one JSON
file beside L3 (:func:`hps.loading.imports.node_file` ``.hps-versions.json``), written
under a lock by atomic replacement, read by every process of the node: ``hps serve`` (which
versions Triton loads), each serving instance (the entry of its version), ``hps consume``
(which version an untagged update goes to), the control plane and the CLI.

A model with no record is at version 1, live, described by the ps.json entry itself: a
node that never used versions reads as it always did. Its first record (the first versioned
import) records version 1 from that entry, once the tiers are found to hold version 1's rows
as it says (:mod:`hps.versions.held`: a ps.json edited for the retrain is refused). A node
without a state folder (no L3 and an in-process L2) keeps nothing across restarts, and has
version 1 only.

States: ``loading`` (an import is writing it), ``ready`` (complete, not served by default),
``live`` (what ``/v2/models/<model>/infer`` answers with; exactly one), ``retired`` (nothing
serves it or writes it any more, its rows are dropped; the number is never reused). A
version is recorded retired before its rows are dropped, with ``rows_left`` until the drop
has succeeded: a drop that failed (L3 held by ``hps consume``) or never ran (a crash) is
done again by the next retire of it, the next activation of its model, or a purge. Its rows
in a Redis L2 that other nodes share and still hold it in are kept, with
``shared_rows_left`` (:mod:`hps.versions.shared_rows`).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal, cast

from hps.config import ModelConfig, PSConfig
from hps.errors import ConfigError, UnknownTableError
from hps.io.durable import replace_durably
from hps.types import JSON, MAX_VERSION

VersionState = Literal["loading", "ready", "live", "retired"]
SUFFIX = ".hps-versions.json"


def check_number(version: int) -> None:
    """ConfigError unless ``version`` is a model version number: 1 to
    :data:`hps.types.MAX_VERSION`."""
    if not 1 <= version <= MAX_VERSION:
        raise ConfigError(
            f"model versions are positive integers up to {MAX_VERSION}, not {version}: "
            "import under a number in that range"
        )


@dataclass(frozen=True)
class VersionInfo:
    """One version of one model as recorded."""

    version: int
    state: VersionState
    created: float  # unix time the import began
    entry: JSON  # the ps.json model entry it was imported from (paths absolute)
    rows_left: bool = False  # retired, its rows not dropped yet (see the module docstring)
    shared_rows_left: bool = False  # retired, its rows kept in a shared L2 another node holds
    fingerprint: str | None = None
    """What identifies the files it was imported from by content
    (:func:`hps.versions.rollout.fingerprint`); None: not known (version 1 as the ps.json
    describes it, or recorded by an older release)."""

    def model_config(self) -> ModelConfig:
        """The entry as a ModelConfig whose tables are in this version's namespace."""
        return ModelConfig.model_validate(self.entry).at_version(self.version)


class VersionRegistry:
    """The versions of the models of ``config`` on this node (see the module docstring).

    ``config`` is the ps.json as served (:func:`hps.triton.serving.serving_config`): the
    entry of version 1, when nothing is recorded, is its model entry.
    """

    def __init__(self, config: PSConfig) -> None:
        from hps.loading.imports import node_file
        from hps.topology import topology

        self.config = config
        state = topology(config).state_dir
        self.path: Path | None = None if state is None else node_file(state, SUFFIX)

    # -- reading ---------------------------------------------------------------------------

    def _read(self) -> dict[str, JSON]:
        if self.path is None:
            return {}
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.path}: unreadable version record: {exc}") from None
        return doc if isinstance(doc, dict) else {}

    def _implicit(self, model: str) -> VersionInfo:
        entry = self.config.model(model).model_dump(mode="json")
        return VersionInfo(1, "live", 0.0, entry)

    def _record(self, model: str) -> JSON | None:
        rec = self._read().get(model)
        return rec if isinstance(rec, dict) else None

    def versions(self, model: str) -> list[VersionInfo]:
        """Every recorded version of ``model`` (retired ones too), oldest first; a model
        neither in the ps.json nor recorded is an UnknownTableError."""
        rec = self._record(model)
        if rec is None:
            return [self._implicit(model)]
        raw = cast(dict[str, JSON], rec.get("versions", {}))
        return sorted(
            (
                VersionInfo(
                    int(n),
                    cast(VersionState, v["state"]),
                    float(cast(float, v["created"])),
                    cast(JSON, v["entry"]),
                    bool(v.get("rows_left", False)),
                    bool(v.get("shared_rows_left", False)),
                    _fingerprint(v.get("fingerprint")),
                )
                for n, v in raw.items()
            ),
            key=lambda v: v.version,
        )

    def removed(self, model: str) -> bool:
        """Whether ``model`` was removed at runtime (not served, even if the ps.json names it;
        :mod:`hps.versions.models`)."""
        rec = self._record(model)
        return rec is not None and bool(rec.get("removed"))

    def stamp(self) -> tuple[int, int, int] | None:
        """The record file's identity, time and size (None: no file): it changed when this
        did (a write replaces the file)."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def recorded_models(self) -> list[str]:
        """Every model the record names (removed ones too)."""
        return sorted(name for name, rec in self._read().items() if isinstance(rec, dict))

    def runtime(self, model: str) -> bool:
        """Whether ``model`` was added at runtime (:mod:`hps.versions.models`)."""
        rec = self._record(model)
        return rec is not None and bool(rec.get("runtime"))

    def runtime_models(self) -> list[str]:
        """Models added at runtime (not in the ps.json) and not removed."""
        named = {m.model for m in self.config.models}
        return [
            name for name, rec in self._read().items()
            if isinstance(rec, dict) and rec.get("runtime") and not rec.get("removed")
            and name not in named
        ]  # fmt: skip

    def get(self, model: str, version: int) -> VersionInfo:
        for info in self.versions(model):
            if info.version == version:
                return info
        raise UnknownTableError(f"model {model!r} has no version {version}")

    def live(self, model: str) -> int:
        """The live version of ``model`` (a removed model has none: UnknownTableError)."""
        if self.removed(model):
            raise UnknownTableError(f"model {model!r} was removed; it has no live version")
        for v in self.versions(model):
            if v.state == "live":
                return v.version
        raise UnknownTableError(f"model {model!r} has no live version")

    def kept(self, model: str, live: int | None = None) -> list[int]:
        """The versions kept for rollback when ``live`` (default: the recorded live one) is
        live: the live one, the one live before it (what a rollback returns to: known good;
        not with ``hps_keep_versions`` 1), then the highest-numbered other ready ones below
        the live one, ``hps_keep_versions`` in all; and besides them every ready version
        above the live one (imported for a later activation, or rolled back from), which
        an activation never retires."""
        recorded: int | None
        try:
            recorded = self.live(model)
        except UnknownTableError:  # a removed model: only a given live one
            if live is None:
                raise
            recorded = None
        at = live if live is not None else cast(int, recorded)
        keep = self._keep(model)
        ready = {v.version for v in self.versions(model) if v.state in ("ready", "live")}
        previous = recorded if recorded != at else self._previous(model)
        kept = {at}
        if keep >= 2 and previous is not None and previous in ready:
            kept.add(previous)
        below = sorted((v for v in ready if v < at and v not in kept), reverse=True)
        counted = sum(1 for v in kept if v <= at)
        kept.update(below[: max(0, keep - counted)])
        kept.update(v for v in ready if v > at)
        return sorted(kept)

    def _previous(self, model: str) -> int | None:
        """The version live before the recorded live one (recorded by :meth:`set_live`;
        None where it never changed)."""
        rec = self._record(model)
        previous = rec.get("previous") if rec is not None else None
        return previous if isinstance(previous, int) else None

    def _keep(self, model: str) -> int:
        """``hps_keep_versions`` of the ps.json's entry, else of the live version's."""
        for m in self.config.models:
            if m.model == model:
                return m.hps_keep_versions
        return self.model_at(model, self.live(model)).hps_keep_versions

    def served(self, model: str, live: int | None = None) -> list[int]:
        """The versions Triton loads when ``live`` is live: the kept ones up to the live
        one, so that an unversioned request, which Triton sends to the highest ready
        version, goes to the live one. Without ``live``: what the last activation gave
        Triton (recorded with :meth:`set_live`; a version imported since, which changes
        what is kept, does not change what Triton serves), else the recorded live one's."""
        if live is None:
            rec = self._record(model)
            given = rec.get("served") if rec is not None else None
            if isinstance(given, list):
                states = {v.version: v.state for v in self.versions(model)}
                return [int(v) for v in given if states.get(int(v)) in ("ready", "live")]
            live = self.live(model)
        return [v for v in self.kept(model, live) if v <= live]

    def rows_left(self, model: str) -> list[int]:
        """Retired versions whose rows are still to be dropped."""
        return [v.version for v in self.versions(model) if v.rows_left]

    def shared_rows_left(self) -> list[tuple[str, VersionInfo]]:
        """``(model, version)`` of every retired version whose rows in a shared L2 are kept
        for another node (:mod:`hps.versions.shared_rows`)."""
        return [
            (m, v) for m in self.recorded_models() for v in self.versions(m) if v.shared_rows_left
        ]

    def beyond_kept(self, model: str) -> list[int]:
        """Ready versions no longer kept (what an activation retires)."""
        kept = self.kept(model)
        return [
            v.version for v in self.versions(model) if v.state == "ready" and v.version not in kept
        ]

    def model_at(self, model: str, version: int) -> ModelConfig:
        """The model entry of ``version`` (the ps.json's own for an unrecorded version 1)."""
        info = self.get(model, version)
        if info.state in ("retired", "loading"):
            raise ConfigError(f"model {model!r} version {version} is {info.state}")
        return info.model_config()

    def live_config(self) -> PSConfig:
        """``config`` with each model's entry at its live version, as recorded now (the
        ps.json's own where nothing else was activated); a model that has none (removed at
        runtime) is left out."""
        if self.path is None:
            return self.config  # no record: every model at version 1, the ps.json's entry
        models = []
        for m in self.config.models:
            try:
                models.append(self.model_at(m.model, self.live(m.model)))
            except UnknownTableError:
                continue
        return self.config.model_copy(update={"models": models})

    def config_at(self, model: str, version: int) -> PSConfig:
        """``config`` with ``model``'s entry replaced by that of ``version``."""
        entry = self.model_at(model, version)
        models = [entry if m.model == model else m for m in self.config.models]
        if entry not in models:  # a model added at runtime
            models.append(entry)
        return self.config.model_copy(update={"models": models})

    # -- writing ---------------------------------------------------------------------------

    @contextmanager
    def changing(self) -> Iterator[None]:
        """Held by an activation (from its first look at the record to its last retire) and
        by a retire, in every process of the node: the control plane and ``hps versions``
        never interleave them. Not re-entrant: take it once."""
        if self.path is None:
            yield  # version 1 only: nothing to activate or retire
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".change.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @contextmanager
    def editing(self) -> Iterator[dict[str, JSON]]:
        """The whole record, locked, written back when the block ends (without an error)."""
        if self.path is None:
            raise ConfigError(
                f"{self.config.source}: model versions need a node state folder "
                "(a persistent_db, or a shared volatile_db) to be recorded in"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            doc = self._read()
            yield doc
            replace_durably(self.path, json.dumps(doc, indent=1))

    def _edit(
        self,
        model: str,
        change: Callable[[dict[int, VersionInfo]], int | None],
        served: list[int] | None = None,
    ) -> None:
        """Apply ``change`` to the model's versions (a dict it may edit in place); it returns
        the new live version or None to keep it. ``served``: what Triton now serves."""
        with self.editing() as doc:
            self.check_unrecorded(model)
            current = {v.version: v for v in self.versions(model)}
            old_live = [n for n, v in current.items() if v.state == "live"]
            new_live = change(current)
            rec = cast(JSON, doc.get(model) or {})
            if new_live is not None:
                if old_live and old_live[0] != new_live:
                    rec["previous"] = old_live[0]  # what a rollback returns to: kept
                for n, v in list(current.items()):
                    if n == new_live:
                        current[n] = replace(v, state="live")
                    elif v.state == "live":
                        current[n] = replace(v, state="ready")
            rec["versions"] = {str(n): asdict(v) for n, v in sorted(current.items())}
            if served is not None:
                rec["served"] = cast(JSON, sorted(served))
            doc[model] = rec

    def check_unrecorded(self, model: str) -> None:
        """While ``model`` has no record: a ConfigError where its ps.json entry, which its
        first record records version 1 from, does not describe the rows the node holds of
        version 1 (:func:`hps.versions.held.check_held`: a ps.json edited for a retrain in
        another row format or dimension). Nothing to check once it is recorded."""
        if self._record(model) is None:
            from hps.versions.held import check_held

            check_held(self.config, self.config.model(model))

    def begin(self, model: ModelConfig, version: int, fingerprint: str | None = None) -> None:
        """Record ``version`` of ``model`` as ``loading`` from its entry, with the
        ``fingerprint`` of its files; a number already used (even retired), or not one of 1
        to :data:`hps.types.MAX_VERSION`, is a ConfigError."""
        check_number(version)

        def change(current: dict[int, VersionInfo]) -> None:
            _refuse_used(model.model, version, current)
            entry = model.model_dump(mode="json")
            current[version] = VersionInfo(
                version, "loading", time.time(), entry, fingerprint=fingerprint
            )

        self._edit(model.model, change)

    def check_new(self, model: str, version: int) -> None:
        """The ConfigErrors :meth:`begin` raises (a number already used, a first record
        whose version 1 is not what the node holds: :meth:`check_unrecorded`), without its
        lock: a look before the import reads its files (``begin`` looks again)."""
        self.check_unrecorded(model)
        _refuse_used(model, version, {v.version: v for v in self.versions(model)})

    def set_state(
        self,
        model: str,
        version: int,
        state: VersionState,
        *,
        rows_left: bool = False,
        shared_rows_left: bool = False,
    ) -> None:
        """``loading`` -> ``ready`` when an import completes, or -> ``retired`` (with
        ``rows_left`` until its rows are dropped, ``shared_rows_left`` while those of a shared
        L2 are kept for another node: :mod:`hps.versions.shared_rows`)."""

        def change(current: dict[int, VersionInfo]) -> None:
            v = self._known(model, current, version)
            if v.state == "live" and state != "live":
                raise ConfigError(f"model {model!r} version {version} is live: activate another")
            current[version] = replace(
                v, state=state, rows_left=rows_left, shared_rows_left=shared_rows_left
            )

        self._edit(model, change)

    def set_live(self, model: str, version: int, served: list[int] | None = None) -> None:
        """Record ``version`` (ready or live) as the live one; the previous live one becomes
        ``ready``, recorded as the one a rollback returns to (:meth:`kept` keeps it).
        ``served``: the versions Triton was told to serve (default: computed)."""

        def change(current: dict[int, VersionInfo]) -> int:
            v = self._known(model, current, version)
            if v.state not in ("ready", "live"):
                raise ConfigError(f"model {model!r} version {version} is {v.state}, not ready")
            return version

        self._edit(model, change, served or self.served(model, live=version))

    def forget(self, model: str, version: int) -> None:
        """Drop the record of a version whose import failed (state ``loading``)."""

        def change(current: dict[int, VersionInfo]) -> None:
            if version in current and current[version].state == "loading":
                del current[version]

        self._edit(model, change)

    @staticmethod
    def _known(model: str, current: dict[int, VersionInfo], version: int) -> VersionInfo:
        if version not in current:
            raise UnknownTableError(f"model {model!r} has no version {version}")
        return current[version]


def _fingerprint(value: object) -> str | None:
    """A recorded fingerprint; anything but a string (none recorded) is unknown."""
    return value if isinstance(value, str) else None


def _refuse_used(model: str, version: int, current: dict[int, VersionInfo]) -> None:
    """ConfigError when ``version`` is one of ``current`` (any state: numbers are never
    reused)."""
    if version not in current:
        return
    state = current[version].state
    unfinished = (
        " (an import of it runs, or died: `hps versions retire` it to drop what it wrote)"
        if state == "loading"
        else ""
    )
    raise ConfigError(
        f"model {model!r} version {version} exists ({state}){unfinished}; import under a new number"
    )
