"""The ps.json of HugeCTR's HPS, as frozen typed models.

A ps.json written for HugeCTR is accepted as it is (defaults are HugeCTR's, v24.06). Keys
that start with ``hps_`` are our extensions. Keys of older HugeCTR releases are accepted
with a warning naming their replacement; any other unknown key is a :class:`ConfigError`
naming the key and the file. Keys that only tuned HugeCTR's C++ internals are accepted and
ignored (docs/config.md lists them).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from hps.errors import ConfigError
from hps.types import TableSpec

NAME_RE = re.compile(r"^[A-Za-z0-9_\-]+$")
NO_LIMIT = 2**64 - 1
"""``overflow_margin`` when none is set: the one "no capacity limit" value of every L2."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def _rename_deprecated(data: Any, renames: dict[str, str], where: str) -> Any:
    """Map keys of older HugeCTR releases onto their replacement, with a warning."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for old, new in renames.items():
        if old in data:
            value = data.pop(old)
            warnings.warn(
                f"{where}.{old} is deprecated (HugeCTR < 3.4); use {where}.{new}",
                FutureWarning,
                stacklevel=2,
            )
            data.setdefault(new, value)
    return data


def _from_env(variable: str, what: str) -> str:
    """A secret named by environment variable: ``$NAME``, or the file ``$NAME_FILE`` names.

    ``NAME_FILE`` is how a mounted Kubernetes or Compose secret arrives: the file's content,
    less a trailing newline, is the secret. Setting both is an error. Messages name the
    variable and the file, never the content.
    """
    if not NAME_RE.match(variable):
        raise ValueError(f"{what}: {variable!r} is not an environment variable name")
    value = os.environ.get(variable)
    path = os.environ.get(f"{variable}_FILE")
    if value is not None and path is not None:
        raise ValueError(f"{what}: set {variable} or {variable}_FILE, not both")
    if path is not None:
        try:
            return Path(path).read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ValueError(f"{what}: {variable}_FILE names {path}: {reason}") from None
    if value is None:
        raise ValueError(
            f"{what}: environment variable {variable} is not set (nor {variable}_FILE)"
        )
    return value


class CacheConfig(_Frozen):
    """``hps_cache``: our L1 settings (an extension of ps.json)."""

    policy: Literal["lru", "lfu", "frequency"] = "lru"
    capacity: int | None = Field(default=None, ge=1, description="rows; default gpucacheper x rows")
    device: Literal["auto", "numpy", "cupy"] = "auto"
    static_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    frequency_file: str | None = None
    warmup_keyset: str | None = None
    default_on_async_miss: bool = False
    frequency_window: int | None = Field(
        default=None, ge=0, description="accesses per ageing step of `frequency` (50 x capacity)"
    )


class ModelConfig(_Frozen):
    model: str
    sparse_files: list[str] = []
    dense_file: str = ""
    network_file: str = ""
    deployed_device_list: list[int] = [0]
    max_batch_size: int = Field(default=64, ge=1)
    embedding_table_names: list[str] = []
    embedding_vecsize_per_table: list[StrictInt]  # `true` is not a dim of 1
    maxnum_catfeature_query_per_table_per_sample: list[StrictInt] = []
    maxnum_des_feature_per_sample: int = Field(default=26, ge=0)
    default_value_for_each_table: list[float] = [0.0]
    gpucache: bool = True
    gpucacheper: float = Field(default=0.2, ge=0.0, le=1.0)
    hit_rate_threshold: float = Field(default=0.9, ge=0.0, le=1.0)
    num_of_worker_buffer_in_pool: int = Field(default=1, ge=1)
    num_of_refresher_buffer_in_pool: int = Field(default=1, ge=0)
    cache_refresh_percentage_per_iteration: float = Field(default=0.0, ge=0.0, le=1.0)
    refresh_delay: float = Field(default=0.0, ge=0.0)
    refresh_interval: float = Field(default=0.0, ge=0.0)
    use_static_table: bool = False
    embedding_cache_type: Literal["dynamic", "uvm", "static", "stochastic"] = "dynamic"
    use_context_stream: bool = True
    use_hctr_cache_implementation: bool = True
    thread_pool_size: int = Field(default=16, ge=1)
    init_ec: bool = True
    enable_pagelock: bool = False
    fp8_quant: bool = False
    label_dim: int = Field(default=1, ge=0)
    slot_num: int = Field(default=10, ge=0)
    hps_cache: CacheConfig = CacheConfig()
    hps_instances: int = Field(default=1, ge=1, description="Triton instances of the model")

    @field_validator("model")
    @classmethod
    def _model_name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"model name {v!r} must match {NAME_RE.pattern}")
        return v

    @field_validator("embedding_vecsize_per_table")
    @classmethod
    def _dims(cls, v: list[int]) -> list[int]:
        if not v or any(d <= 0 for d in v):
            raise ValueError("needs one positive vector size per table")
        return v

    @model_validator(mode="after")
    def _tables_consistent(self) -> ModelConfig:
        n = len(self.embedding_vecsize_per_table)
        names = self.embedding_table_names
        if names and len(names) != n:
            raise ValueError(
                f"embedding_table_names has {len(names)} names but embedding_vecsize_per_table "
                f"has {n} sizes"
            )
        for name in names:
            if not NAME_RE.match(name):
                raise ValueError(f"embedding_table_names: invalid table name {name!r}")
        if len(set(names)) != len(names):
            raise ValueError("embedding_table_names: duplicate table names")
        for key in ("maxnum_catfeature_query_per_table_per_sample", "default_value_for_each_table"):
            got = getattr(self, key)
            if len(got) not in (0, 1, n):
                raise ValueError(f"{key} has {len(got)} entries but the model has {n} tables")
        if self.sparse_files and len(self.sparse_files) != n:
            raise ValueError(f"sparse_files has {len(self.sparse_files)} entries for {n} tables")
        return self

    @property
    def table_names(self) -> list[str]:
        n = len(self.embedding_vecsize_per_table)
        return list(self.embedding_table_names) or [f"sparse_embedding{i}" for i in range(n)]

    def _per_table(self, values: list[Any], fallback: Any) -> list[Any]:
        n = len(self.embedding_vecsize_per_table)
        if not values:
            return [fallback] * n
        return list(values) * n if len(values) == 1 else list(values)

    @property
    def tables(self) -> list[TableSpec]:
        """Tables of this model in request order."""
        queries = self._per_table(self.maxnum_catfeature_query_per_table_per_sample, 0)
        defaults = self._per_table(self.default_value_for_each_table, 0.0)
        return [
            TableSpec(
                model=self.model,
                table=name,
                dim=dim,
                default_value=float(default),
                max_keys_per_request=int(q) * self.max_batch_size,
            )
            for name, dim, q, default in zip(
                self.table_names, self.embedding_vecsize_per_table, queries, defaults, strict=True
            )
        ]


OverflowPolicy = Literal["evict_random", "evict_least_used", "evict_oldest"]


class _DatabaseConfig(_Frozen):
    """What both databases share: HugeCTR's old batch-size keys and ``update_filters``."""

    _section: ClassVar[str]
    update_filters: list[str] = [".+"]

    @model_validator(mode="before")
    @classmethod
    def _deprecated(cls, data: Any) -> Any:
        return _rename_deprecated(
            data,
            {"max_get_batch_size": "max_batch_size", "max_set_batch_size": "max_batch_size"},
            cls._section,
        )

    @field_validator("update_filters")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        return _check_regexes(v)


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
    shared_memory_name: str = "hctr_mp_hash_map_database"
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
    def _password_from_env(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(var := data.get("hps_password_env"), str) and var:
            data = {**data, "password": _from_env(var, "hps_password_env")}  # resolved at load
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

    @property
    def bounded(self) -> bool:
        """Whether ``overflow_margin`` limits the rows (anything below :data:`NO_LIMIT`)."""
        return self.overflow_margin < NO_LIMIT


class PersistentDBConfig(_DatabaseConfig):
    _section = "persistent_db"
    type: Literal["disabled", "rocks_db", "rocksdb"] = "disabled"
    path: str = "/tmp/rocksdb"
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


class UpdateSourceConfig(_Frozen):
    type: Literal["null", "kafka_message_queue", "kafka", "kafka_mq"] = "null"
    brokers: str = "127.0.0.1:9092"
    metadata_refresh_interval_ms: int = Field(default=30_000, ge=1)
    receive_buffer_size: int = Field(default=256 * 1024, ge=1)
    poll_timeout_ms: int = Field(default=500, ge=0)
    max_batch_size: int = Field(default=8192, ge=1)
    failure_backoff_ms: int = Field(default=50, ge=0)
    max_commit_interval: int = Field(default=32, ge=1)
    hps_group_id: str = "hps"
    hps_dead_letter_topic: str = "hps_et.dead_letter"
    hps_max_version_ahead_s: float = Field(
        default=300.0,
        ge=0.0,
        description="an update version (ns) beyond its message's timestamp + this is refused",
    )
    hps_kafka_config: dict[str, str | int | bool] = {}
    hps_kafka_config_env: dict[str, str] = Field(
        default={},
        description="librdkafka setting -> env variable NAME holding it, or NAME_FILE a file",
    )

    @model_validator(mode="before")
    @classmethod
    def _kafka_secrets_from_env(cls, data: Any) -> Any:
        env = data.get("hps_kafka_config_env") if isinstance(data, dict) else None
        if isinstance(env, dict) and env:
            resolved = {k: _from_env(str(v), f"hps_kafka_config_env.{k}") for k, v in env.items()}
            data = {**data, "hps_kafka_config": {**data.get("hps_kafka_config", {}), **resolved}}
        return data

    @property
    def enabled(self) -> bool:
        return self.type != "null"


def _check_regexes(patterns: list[str]) -> list[str]:
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {p!r}: {exc}") from None
    return patterns


class PSConfig(_Frozen):
    """The whole ps.json."""

    supportlonglong: bool = True
    # Ours defaults to true (measured faster, same results: hps/fused.py); HugeCTR's to false.
    fuse_embedding_table: bool = True
    models: list[ModelConfig]
    volatile_db: VolatileDBConfig = VolatileDBConfig()
    persistent_db: PersistentDBConfig = PersistentDBConfig()
    update_source: UpdateSourceConfig = UpdateSourceConfig()
    source: str = Field(default="<memory>", exclude=True, description="file it was read from")

    @field_validator("models")
    @classmethod
    def _some_models(cls, v: list[ModelConfig]) -> list[ModelConfig]:
        if not v:
            raise ValueError("needs at least one model (an empty list would serve nothing)")
        return v

    @model_validator(mode="after")
    def _unique_models(self) -> PSConfig:
        names = [m.model for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: duplicate model names {names}")
        if not self.supportlonglong:
            raise ValueError("supportlonglong: HPS stores int64 keys; set it to true")
        return self

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.model == name:
                return m
        from hps.errors import UnknownTableError

        raise UnknownTableError(
            f"unknown model {name!r}; configured: {[m.model for m in self.models]}"
        )

    @property
    def tables(self) -> list[TableSpec]:
        return [t for m in self.models for t in m.tables]


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ""
        for part in err["loc"]:
            loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"{source}: {loc or '<top>'}: {msg}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<memory>") -> PSConfig:
    """Validate an already-parsed ps.json document."""
    if isinstance(data, dict):
        data = {**data, "source": source}
    try:
        return PSConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def load_config(path: str | Path) -> PSConfig:
    """Read and validate a ps.json; relative paths in it stay relative to the caller."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    return parse_config(data, str(path))
