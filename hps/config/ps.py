"""The whole ps.json (:class:`PSConfig`), and reading it: :func:`load_config` from a file,
:func:`parse_config` from a parsed document; errors name the key and the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import Field, ValidationError, field_validator, model_validator

from hps.config.admin import AdminConfig
from hps.config.common import Frozen, read_text
from hps.config.databases import PersistentDBConfig, VolatileDBConfig
from hps.config.model import ModelConfig
from hps.config.update_source import UpdateSourceConfig
from hps.errors import ConfigError
from hps.types import TableSpec


class PSConfig(Frozen):
    """The whole ps.json."""

    supportlonglong: bool = True
    # Accepted and ignored: every lookup takes the one pipeline (docs/config.md).
    fuse_embedding_table: bool = True
    models: list[ModelConfig]
    volatile_db: VolatileDBConfig = VolatileDBConfig()
    persistent_db: PersistentDBConfig = PersistentDBConfig()
    update_source: UpdateSourceConfig = UpdateSourceConfig()
    hps_admin: AdminConfig = AdminConfig()
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
        served = [n for m in self.models for n in m.triton_names]
        if clash := sorted({n for n in served if served.count(n) > 1}):
            raise ValueError(
                f"models: {clash} would be two Triton models (a model's CTR network is served "
                "as <model>_ctr): rename one"
            )
        if not self.supportlonglong:
            raise ValueError("supportlonglong: HPS stores int64 keys; set it to true")
        return self

    @model_validator(mode="after")
    def _l2_of_this_deployment(self) -> PSConfig:
        # volatile_db as this deployment (its L3 path) opens it: its own segment name unless
        # the file names one, the shared L2 when a model runs several instances and the file
        # names no type (hps.config.databases). Frozen: set once, here, as validation.
        instances = max(m.hps_instances for m in self.models)
        bound = self.volatile_db.for_deployment(self.persistent_db.path).for_instances(instances)
        object.__setattr__(self, "volatile_db", bound)
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


def _set_by_hps(data: dict[str, object]) -> list[str]:
    """Fields of :class:`PSConfig` that HPS sets and a ps.json must not: the file it came
    from, and the version of a model entry (``ModelConfig.at_version``)."""
    found = ["source"] if "source" in data else []
    models = data.get("models")
    if isinstance(models, list):
        found += [
            f"models[{i}].version"
            for i, m in enumerate(models)
            if isinstance(m, dict) and "version" in m
        ]
    return found


def parse_config(data: object, source: str = "<memory>") -> PSConfig:
    """Validate an already-parsed ps.json document."""
    if isinstance(data, dict):
        if found := _set_by_hps(data):
            raise ConfigError(
                "\n".join(
                    f"{source}: {loc}: unknown key (versions are imported and activated with "
                    "`hps versions` or the control plane)"
                    if loc.endswith(".version")
                    else f"{source}: {loc}: unknown key"
                    for loc in found
                )
            )
        data = {**data, "source": source}
    try:
        return PSConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def load_config(path: str | Path) -> PSConfig:
    """Read and validate a ps.json; relative paths in it stay relative to the caller."""
    path = Path(path)
    text = read_text(path, "")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid JSON: nested too deeply") from None
    except ValueError:  # the only other error of json.loads: an integer too long to convert
        raise ConfigError(
            f"{path}: invalid JSON: an integer of more than {sys.get_int_max_str_digits()} digits"
        ) from None
    return parse_config(data, str(path))
