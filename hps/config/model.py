"""``models[]`` of the ps.json: one model's tables, its L1 cache (``hps_cache``) and limits."""

from __future__ import annotations

import warnings
from typing import Annotated, Literal, TypeVar

from pydantic import Field, StrictInt, field_validator, model_validator

from hps.config.common import NAME_RE, SIDE_TABLE_MARK, Frozen
from hps.rowformat import RowDtype
from hps.types import TableSpec

T = TypeVar("T")

CTR_SUFFIX = "_ctr"  # the Triton model of a model's CTR network: <model>_ctr

INT32_MAX = 2**31 - 1  # Triton's max_batch_size and shape dimensions are int32
MAX_CACHE_ROWS = INT32_MAX
"""The most rows of one table's L1: its index maps keys to int32 rows (-1: absent)."""
MAX_TABLES = 4096
"""The most tables a model may have (each per-table list of its entry at most as long):
far above any model's, low enough that a list of millions (a control-plane body) is
refused before it is validated item by item."""
MAX_DIM = 1 << 16
"""The largest vector size of a table (256 KiB float32 rows): far above any embedding's,
low enough that a typo (or a dims list missing a comma) is refused before a tier sizes
rows by it."""
FLOAT32_MAX = 3.4028234663852886e38
QueryCount = Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]
Float32Value = Annotated[float, Field(allow_inf_nan=False, ge=-FLOAT32_MAX, le=FLOAT32_MAX)]
DeviceIndex = Annotated[int, Field(ge=0)]
MAX_REFRESH_S = 365 * 24 * 3600
"""The longest ``refresh_interval`` and ``refresh_delay``: a year (a longer wait overflowed
the refresher thread's ``Event.wait`` beyond ``threading.TIMEOUT_MAX``, ending it)."""
RefreshSeconds = Annotated[float, Field(ge=0.0, le=MAX_REFRESH_S, allow_inf_nan=False)]


class CacheConfig(Frozen):
    """``hps_cache``: our L1 settings (an extension of ps.json)."""

    policy: Literal["lru", "lfu", "frequency"] = "lru"
    capacity: int | None = Field(
        default=None, ge=1, le=MAX_CACHE_ROWS, description="rows; default gpucacheper x rows"
    )
    device: Literal["auto", "numpy", "cupy"] = "auto"
    static_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    frequency_file: str | None = None
    warmup_keyset: str | None = None
    default_on_async_miss: bool = False
    frequency_window: int | None = Field(
        default=None, ge=0, description="accesses per ageing step of `frequency` (50 x capacity)"
    )


class ModelConfig(Frozen):
    model: str
    sparse_files: list[str] = Field(default=[], max_length=MAX_TABLES)
    dense_file: str = ""
    network_file: str = ""
    deployed_device_list: list[DeviceIndex] = Field(default=[0], max_length=MAX_TABLES)
    max_batch_size: int = Field(default=64, ge=1, le=INT32_MAX)
    embedding_table_names: list[str] = Field(default=[], max_length=MAX_TABLES)
    embedding_vecsize_per_table: list[StrictInt] = Field(max_length=MAX_TABLES)  # not `true`
    maxnum_catfeature_query_per_table_per_sample: list[QueryCount] = Field(
        default=[], max_length=MAX_TABLES
    )
    maxnum_des_feature_per_sample: int = Field(default=26, ge=0)
    default_value_for_each_table: list[Float32Value] = Field(default=[0.0], max_length=MAX_TABLES)
    gpucache: bool = True
    gpucacheper: float = Field(default=0.2, ge=0.0, le=1.0)
    # above 1 (HugeCTR's documented way to disable asynchronous insertion): always synchronous
    hit_rate_threshold: float = Field(default=0.9, ge=0.0, allow_inf_nan=False)
    num_of_worker_buffer_in_pool: int = Field(default=1, ge=1)
    num_of_refresher_buffer_in_pool: int = Field(default=1, ge=0)
    cache_refresh_percentage_per_iteration: float = Field(default=0.0, ge=0.0, le=1.0)
    refresh_delay: RefreshSeconds = 0.0
    refresh_interval: RefreshSeconds = 0.0
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
    hps_keep_versions: int = Field(
        default=2,
        ge=1,
        description="model versions kept and served for rollback: the live one, the one live "
        "before it, the newest others (versions imported above the live one: kept besides)",
    )
    hps_max_queue_size: int = Field(
        default=0,
        ge=0,
        le=INT32_MAX,
        description="requests of each Triton model that may wait for a free instance; more "
        "are refused at once (0: no limit)",
    )
    hps_queue_timeout_s: float = Field(
        default=0.0,
        ge=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="seconds a request may wait for a free instance before it is refused "
        "unlooked-up (0: no limit)",
    )
    version: int = Field(
        default=1, ge=1, exclude=True, description="the model version this entry describes"
    )
    hps_row_dtype: RowDtype | list[RowDtype] | None = Field(
        default=None,
        description="how every tier stores the rows: one format, or one per table "
        "(float32 unless fp8_quant asks for 8-bit rows)",
    )

    @property
    def triton_names(self) -> tuple[str, ...]:
        """The Triton models that serve this model: ``<model>``, and ``<model>_ctr`` when
        it :attr:`serves_ctr`."""
        return (self.model, self.model + CTR_SUFFIX) if self.serves_ctr else (self.model,)

    @property
    def serves_ctr(self) -> bool:
        """Whether Triton also serves the model's CTR network (``<model>_ctr``, the
        embedding lookup and :mod:`hps.ctr.network` in one model): its ``dense_file`` is
        such an ``.npz``."""
        return self.dense_file.endswith(".npz")

    @property
    def processes(self) -> int:
        """Triton instance processes that serve the model, each with its own L1 (and
        in-process L2): ``hps_instances`` for the embedding model, as many again for the
        CTR model where there is one."""
        return self.hps_instances * (2 if self.serves_ctr else 1)

    @property
    def instance_gpus(self) -> tuple[int, ...]:
        """The GPUs the model's Triton instances run on (``KIND_GPU``), filled round robin
        in this order; empty: ``KIND_CPU`` instances.

        Only a model whose L1 is configured on the GPU (``gpucache`` and
        ``hps_cache.device: cupy``) gets GPU instances: each keeps its L1 on the GPU Triton
        placed it on, and the embedding model answers ``OUTPUT0`` there (a GPU model behind
        it, in an ensemble, reads it without a copy). ``auto`` decides inside the instance,
        after Triton placed it, so its instances stay ``KIND_CPU``, every L1 on the first
        ``deployed_device_list`` GPU."""
        if not self.gpucache or self.hps_cache.device != "cupy":
            return ()
        return tuple(dict.fromkeys(self.deployed_device_list))

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
        if big := [d for d in v if d > MAX_DIM]:
            raise ValueError(f"vector sizes are at most {MAX_DIM}, not {big[0]}")
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
            if SIDE_TABLE_MARK in name:
                raise ValueError(
                    f"embedding_table_names: {name!r}: names containing {SIDE_TABLE_MARK!r} "
                    "are HPS's own side tables"
                )
        if len(set(names)) != len(names):
            raise ValueError("embedding_table_names: duplicate table names")
        queries = len(self.maxnum_catfeature_query_per_table_per_sample)
        if queries not in (0, 1, n):
            raise ValueError(
                f"maxnum_catfeature_query_per_table_per_sample has {queries} entries but the "
                f"model has {n} tables"
            )
        if (defaults := len(self.default_value_for_each_table)) > n:
            raise ValueError(
                f"default_value_for_each_table has {defaults} entries but the model has {n} tables"
            )
        dtypes = self.hps_row_dtype
        if isinstance(dtypes, list) and len(dtypes) not in (1, n):
            raise ValueError(
                f"hps_row_dtype has {len(dtypes)} entries but the model has {n} tables"
            )
        if self.fp8_quant and dtypes is not None and set(self._per_table_dtypes()) != {"int8"}:
            raise ValueError(
                "fp8_quant: true asks for 8-bit rows (int8) but hps_row_dtype says "
                f"{dtypes!r}: set one of them"
            )
        if self.sparse_files and len(self.sparse_files) != n:
            raise ValueError(f"sparse_files has {len(self.sparse_files)} entries for {n} tables")
        return self

    @field_validator("deployed_device_list")
    @classmethod
    def _some_device(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("needs at least one device (a GPU index, e.g. [0])")
        return v

    @model_validator(mode="after")
    def _short_defaults(self) -> ModelConfig:
        # HugeCTR's parser gives the tables past the values 0.0, not the first value: say so
        # where that is not what repeating the values given would have given
        given = self.default_value_for_each_table
        names = self.table_names
        if len(given) < len(names) and any(v != 0.0 for v in given):
            warnings.warn(
                f"{self.model}: default_value_for_each_table gives {len(given)} values for "
                f"{len(names)} tables; tables {names[len(given) :]} get 0.0 (as in HugeCTR)",
                UserWarning,
                stacklevel=2,
            )
        return self

    @property
    def default_values(self) -> list[float]:
        """Each table's ``default_value_for_each_table``: the values given, then 0.0 for the
        tables past them, as HugeCTR's ps.json parser read them."""
        given = [float(v) for v in self.default_value_for_each_table]
        return given + [0.0] * (len(self.embedding_vecsize_per_table) - len(given))

    @property
    def table_names(self) -> list[str]:
        n = len(self.embedding_vecsize_per_table)
        return list(self.embedding_table_names) or [f"sparse_embedding{i}" for i in range(n)]

    def _per_table(self, values: list[T], fallback: T) -> list[T]:
        n = len(self.embedding_vecsize_per_table)
        if not values:
            return [fallback] * n
        return list(values) * n if len(values) == 1 else list(values)

    def _per_table_dtypes(self) -> list[RowDtype]:
        """Each table's row format: ``hps_row_dtype``; else int8 for HugeCTR's ``fp8_quant``."""
        dtypes = self.hps_row_dtype
        if dtypes is None:
            dtypes = "int8" if self.fp8_quant else "float32"
        return self._per_table([dtypes] if isinstance(dtypes, str) else dtypes, "float32")

    def at_version(self, version: int) -> ModelConfig:
        """This entry as model version ``version`` (its tables in that version's namespace)."""
        return self.model_copy(update={"version": version})

    @property
    def tables(self) -> list[TableSpec]:
        """Tables of this model in request order."""
        queries = self._per_table(self.maxnum_catfeature_query_per_table_per_sample, 0)
        return [
            TableSpec(
                model=self.model,
                table=name,
                dim=dim,
                default_value=default,
                max_keys_per_request=int(q) * self.max_batch_size,
                row_dtype=dtype,
                version=self.version,
            )
            for name, dim, q, default, dtype in zip(
                self.table_names,
                self.embedding_vecsize_per_table,
                queries,
                self.default_values,
                self._per_table_dtypes(),
                strict=True,
            )
        ]
