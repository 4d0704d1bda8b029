"""``volatile_db`` (L2) and ``persistent_db`` (L3) of the ps.json."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from hps.config.common import NO_LIMIT, Frozen, check_regexes, from_env, rename_deprecated

OverflowPolicy = Literal["evict_random", "evict_least_used", "evict_oldest"]


class _DatabaseConfig(Frozen):
    """What both databases share: HugeCTR's old batch-size keys and ``update_filters``."""

    _section: ClassVar[str]
    update_filters: list[str] = [".+"]

    @model_validator(mode="before")
    @classmethod
    def _deprecated(cls, data: object) -> object:
        return rename_deprecated(
            data,
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
