"""``volatile_db`` (L2) and ``persistent_db`` (L3) of the ps.json.

**The shared L2's segment.** A ``multi_process_hash_map`` lives in the segment
``/dev/shm/<shared_memory_name>``, which every process of a deployment on the host opens.
Two deployments on one host (their own ps.json, their own L3) must not meet there, so a
ps.json that names no segment gets one of its deployment's own: named after its L3's
resolved path (:func:`shared_memory_name_for`, the one place that decides it;
:meth:`VolatileDBConfig.for_deployment`, applied when a ps.json is read and again by
``hps.triton.serving.serving_config`` once it resolved relative paths). A ps.json that names
no ``type`` and runs a model in several Triton instances gets that shared L2 too
(:meth:`VolatileDBConfig.for_instances`, applied when it is read). That path is also
the deployment's identity (:attr:`VolatileDBConfig.deployment`), which the segment records:
a process of another deployment that opens it (the same name given by hand) is refused.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import PurePath
from typing import ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from hps.config.common import (
    NO_LIMIT,
    Frozen,
    check_regexes,
    drop_ignored,
    from_env,
    rename_deprecated,
)

OverflowPolicy = Literal["evict_random", "evict_least_used", "evict_oldest"]
IGNORED_KEYS = ("initialize_after_startup",)
"""Keys of both databases that HugeCTR's documented samples hold but its ps.json parser never
read (only its Python API did): accepted (a boolean) and ignored. HPS imports the
``sparse_files`` whenever L3 does not hold them yet (docs/config.md)."""

DEFAULT_L3_PATH = "/tmp/rocksdb"
"""``persistent_db.path`` when the ps.json gives none (HugeCTR's default)."""
SHM_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")
"""What a ``shared_memory_name`` may hold (whole, after any leading ``/``)."""
SHM_NAME_MAX = 200
"""The longest ``shared_memory_name``: a file name (at most 255 bytes) with room for the
suffixes of its lock files (``.lock``, ``.users``, ``.turn``)."""
SHM_FILE_SUFFIXES = (".lock", ".users", ".turn")
"""The files beside a segment; no segment name ends with one (it would be another's)."""


def shared_memory_name_for(l3_path: str) -> str:
    """The ``shared_memory_name`` of a deployment whose ps.json names none: ``hps_l2_`` and
    12 hex digits of the SHA-256 of its L3's path (``persistent_db.path``, resolved: absolute,
    symbolic links followed), so that every process of the deployment opens one segment and
    two deployments with different L3 folders never share one."""
    digest = hashlib.sha256(os.path.realpath(l3_path).encode()).hexdigest()
    return f"hps_l2_{digest[:12]}"


DEFAULT_SHM_NAME = shared_memory_name_for(DEFAULT_L3_PATH)
"""The segment of a ``volatile_db`` read on its own (no ``persistent_db`` beside it)."""
SHARED_L2_DEFAULT = "multi_process_hash_map"
"""The L2 of a deployment whose ps.json names no ``volatile_db.type`` and one of whose models
runs several Triton instances (:meth:`VolatileDBConfig.for_instances`)."""


def shm_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a ``shared_memory_name`` (``None``: nothing)."""
    bare = name.lstrip("/")
    if len(bare) > SHM_NAME_MAX:
        return f"is {len(bare)} characters long; at most {SHM_NAME_MAX}"
    if not SHM_NAME_RE.fullmatch(bare) or bare.startswith("."):
        return "may hold letters, digits, '_', '.' and '-' only, and not start with '.'"
    if bare.endswith(SHM_FILE_SUFFIXES):
        return f"ends with one of {list(SHM_FILE_SUFFIXES)}, which name a segment's lock files"
    return None


class _DatabaseConfig(Frozen):
    """What both databases share: HugeCTR's old batch-size keys, the keys it never read
    (:data:`IGNORED_KEYS`) and ``update_filters``."""

    _section: ClassVar[str]
    update_filters: list[str] = [".+"]

    @model_validator(mode="before")
    @classmethod
    def _deprecated(cls, data: object) -> object:
        return rename_deprecated(
            drop_ignored(data, IGNORED_KEYS),
            {"max_get_batch_size": "max_batch_size", "max_set_batch_size": "max_batch_size"},
            cls._section,
        )

    @field_validator("update_filters")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        return check_regexes(v)


class VolatileDBConfig(_DatabaseConfig):
    _section = "volatile_db"
    type: Literal[
        "disabled",
        "hash_map",
        "parallel_hash_map",
        "multi_process_hash_map",
        "redis_cluster",
        "redis",
    ] = "hash_map"
    address: str = "127.0.0.1:7000"
    user_name: str = "default"
    password: str = ""
    num_partitions: int = Field(default=16, ge=1)
    num_node_connections: int = Field(default=5, ge=1)
    allocation_rate: int = Field(default=256 * 1024 * 1024, ge=1)
    shared_memory_size: int = Field(default=16 * 1024**3, ge=1)
    shared_memory_name: str = Field(
        default=DEFAULT_SHM_NAME,
        description="the segment; default: named after persistent_db.path (for_deployment)",
    )
    shared_memory_auto_remove: bool = True
    max_batch_size: int = Field(default=65536, ge=1)
    enable_tls: bool = False
    tls_ca_certificate: str = "cacertbundle.crt"
    tls_client_certificate: str = "client_cert.pem"
    tls_client_key: str = "client_key.pem"
    tls_server_name_identification: str = "redis.localhost"
    overflow_margin: int = Field(default=NO_LIMIT, ge=1)
    overflow_policy: OverflowPolicy = "evict_random"
    overflow_resolution_target: float = Field(default=0.8, gt=0.0, le=1.0)
    initial_cache_rate: float = Field(default=1.0, ge=0.0, le=1.0)
    cache_missed_embeddings: bool = False
    hps_socket_timeout_s: float = Field(default=5.0, gt=0.0, description="Redis connect/read")
    hps_password_env: str = Field(
        default="", description="env variable NAME holding the password, or NAME_FILE a file"
    )

    @model_validator(mode="before")
    @classmethod
    def _password_from_env(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(var := data.get("hps_password_env"), str) and var:
            data = {**data, "password": from_env(var, "hps_password_env")}  # resolved at load
        return data

    hps_breaker_backoff_s: float = Field(
        default=1.0, ge=0.0, description="skip Redis this long after a failure (0: never skip)"
    )
    hps_breaker_max_backoff_s: float = Field(
        default=10.0, ge=0.0, description="the back-off doubles after each failed probe, to this"
    )

    @model_validator(mode="after")
    def _breaker_bounds(self) -> VolatileDBConfig:
        if self.hps_breaker_max_backoff_s < self.hps_breaker_backoff_s:
            raise ValueError(
                "hps_breaker_max_backoff_s must be >= hps_breaker_backoff_s "
                f"({self.hps_breaker_max_backoff_s} < {self.hps_breaker_backoff_s})"
            )
        return self

    _deployment: str = PrivateAttr(default="")
    _name_derived: bool = PrivateAttr(default=False)
    _type_defaulted: bool = PrivateAttr(default=False)

    @field_validator("shared_memory_name")
    @classmethod
    def _segment_name(cls, v: str) -> str:
        # The length always (no file has a longer name); the characters where the segment is
        # opened (hps.storage._shm_segment): a ps.json of another L2 type may carry any.
        if len(v.lstrip("/")) > SHM_NAME_MAX:
            raise ValueError(f"{len(v.lstrip('/'))} characters long; at most {SHM_NAME_MAX}")
        return v

    def for_deployment(self, l3_path: str) -> VolatileDBConfig:
        """This section as the deployment whose L3 is at ``l3_path`` opens it: the path,
        resolved, is its :attr:`deployment`, and unless the ps.json names a segment
        (``shared_memory_name``), the segment is named after it
        (:func:`shared_memory_name_for`). Applying it again with another path renames a
        derived name, never a configured one."""
        path = os.path.realpath(l3_path)
        derived = self._name_derived or "shared_memory_name" not in self.model_fields_set
        name = {"shared_memory_name": shared_memory_name_for(path)} if derived else {}
        bound = self.model_copy(update=name)
        bound._deployment = path
        bound._name_derived = derived
        return bound

    def for_instances(self, instances: int) -> VolatileDBConfig:
        """This section as served when a model runs ``instances`` Triton instances (the most
        of any model): one L2 per node, :data:`SHARED_L2_DEFAULT`, rather than one per Triton
        process, when there are several and the ps.json names no ``type``. The one place
        this is decided: applied when a ps.json is read (:class:`hps.config.PSConfig`), so
        every command (``hps serve``, ``plan``, ``import``, ``consume``, ...) sees the L2 that
        serving opens. A named type is kept."""
        if instances > 1 and "type" not in self.model_fields_set:
            shared = self.model_copy(update={"type": SHARED_L2_DEFAULT})
            shared._type_defaulted = True
            return shared
        return self

    @property
    def type_defaulted(self) -> bool:
        """Whether ``type`` is :data:`SHARED_L2_DEFAULT` because the ps.json named none and
        a model runs several instances (:meth:`for_instances`), for messages."""
        return self._type_defaulted

    @property
    def deployment(self) -> str:
        """The resolved L3 path of the deployment this section was read for (see
        :meth:`for_deployment`); ``""`` for a section read on its own. A
        ``multi_process_hash_map`` segment records the first one and refuses others."""
        return self._deployment

    @property
    def bounded(self) -> bool:
        """Whether ``overflow_margin`` limits the rows (anything below :data:`NO_LIMIT`)."""
        return self.overflow_margin < NO_LIMIT


class PersistentDBConfig(_DatabaseConfig):
    _section = "persistent_db"
    type: Literal["disabled", "rocks_db", "rocksdb"] = "disabled"
    path: str = DEFAULT_L3_PATH
    num_threads: int = Field(default=16, ge=1)
    read_only: bool = False
    max_batch_size: int = Field(default=65536, ge=1)
    hps_write_buffer_mb: int = Field(
        default=64,
        ge=1,
        description="memtables of all tables together (MiB); the WAL is kept under twice that",
    )
    hps_block_cache_mb: int = Field(
        default=64, ge=1, description="block cache of all tables together (MiB), per process"
    )

    @model_validator(mode="after")
    def _names_a_folder(self) -> PersistentDBConfig:
        # L3's records, lock and model repository live beside it (<path>.hps-*): it needs a
        # name of its own, which "", ".", ".." and "/" lack
        if self.type != "disabled" and PurePath(self.path).name in ("", ".", ".."):
            raise ValueError(
                f"path {self.path!r} names no folder of its own; give one, e.g. /var/lib/hps/l3"
            )
        return self
