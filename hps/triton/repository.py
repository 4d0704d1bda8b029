"""Prepare a Triton model repository for a ps.json from the templates in model_repository/.

Each ps.json model becomes a Triton model of the same name with HugeCTR's HPS interface
(``hps_embedding``), as HugeCTR's HPS backend named them; a model whose ``dense_file`` is
an ``.npz`` of :mod:`hps.triton.ctr` also gets ``<model>_ctr`` (``hps_ctr``). The copies
get the config.pbtxt parameters filled in (ps.json path, model name, where relative paths
start), ``hps_instances`` as instance count and the ps.json model's ``max_batch_size`` as
Triton's (the most rows a request may have).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from hps.config import PSConfig
from hps.errors import ConfigError

TEMPLATES_ENV = "HPS_MODEL_REPOSITORY"
CTR_SUFFIX = "_ctr"


def templates_dir() -> Path:
    """model_repository/ of this checkout (or ``$HPS_MODEL_REPOSITORY``)."""
    default = Path(__file__).resolve().parents[2] / "model_repository"
    path = Path(os.environ.get(TEMPLATES_ENV) or default)
    if not (path / "hps_embedding" / "config.pbtxt").is_file():
        raise ConfigError(f"no model templates in {path}; set {TEMPLATES_ENV} to model_repository/")
    return path


def set_parameter(text: str, key: str, value: str) -> str:
    """Set one string parameter of a config.pbtxt written like the templates."""
    pattern = re.compile(
        r'(\{\s*key:\s*"' + re.escape(key) + r'",?\s*value:\s*\{\s*string_value:\s*)"[^"]*"'
    )
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    text, n = pattern.subn(lambda m: f'{m.group(1)}"{escaped}"', text)
    if n != 1:
        raise ConfigError(f"config.pbtxt template has no parameter {key!r}")
    return text


def render_config(
    text: str, name: str, instances: int, params: dict[str, str], max_batch_size: int = 0
) -> str:
    text = re.sub(r'^name:\s*"[^"]*"', f'name: "{name}"', text, count=1, flags=re.M)
    if max_batch_size:
        text = re.sub(
            r"^max_batch_size:\s*\d+",
            f"max_batch_size: {max_batch_size}",
            text,
            count=1,
            flags=re.M,
        )
    text = re.sub(r"(instance_group\s*\[\s*\{\s*count:\s*)\d+", rf"\g<1>{instances}", text, count=1)
    for key, value in params.items():
        text = set_parameter(text, key, value)
    return text


@dataclass(frozen=True)
class ServedModel:
    triton_name: str
    template: str
    hps_model: str
    instances: int
    max_batch_size: int = 0


def served_models(config: PSConfig) -> list[ServedModel]:
    out = []
    for m in config.models:
        batch = m.max_batch_size
        out.append(ServedModel(m.model, "hps_embedding", m.model, m.hps_instances, batch))
        if m.dense_file.endswith(".npz"):
            out.append(
                ServedModel(m.model + CTR_SUFFIX, "hps_ctr", m.model, m.hps_instances, batch)
            )
    return out


def copy_template(
    template: str,
    dest: Path,
    name: str,
    instances: int,
    params: dict[str, str],
    max_batch_size: int = 0,
) -> None:
    src = templates_dir() / template
    target = dest / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = target / "config.pbtxt"
    cfg.write_text(render_config(cfg.read_text(), name, instances, params, max_batch_size))


def prepare_repository(
    config: PSConfig,
    dest: str | Path,
    *,
    base_dir: str | Path | None = None,
    metrics_interval_s: float = 1.0,
) -> list[str]:
    """Write the Triton models of ``config`` under ``dest``; their names, in order."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    ps_path = str(Path(config.source).resolve())
    base = str(Path(base_dir or os.getcwd()).resolve())
    names = []
    for served in served_models(config):
        params = {
            "ps_config": ps_path,
            "hps_model": served.hps_model,
            "base_dir": base,
            "metrics_interval_s": str(metrics_interval_s),
        }
        copy_template(
            served.template,
            dest,
            served.triton_name,
            served.instances,
            params,
            served.max_batch_size,
        )
        names.append(served.triton_name)
    return names
