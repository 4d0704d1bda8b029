"""Prepare a Triton model repository for a ps.json from the model templates.

The templates (``hps_embedding``, ``hps_ctr``, ``hps_floor``) ship inside the package, in
``hps/triton/model/templates/``, and are found with :mod:`importlib.resources`, so a wheel
or a container image serves exactly like a checkout.

Each ps.json model becomes a Triton model of the same name with HugeCTR's HPS interface
(``hps_embedding``), as HugeCTR's HPS backend named them; a model whose ``dense_file`` is
an ``.npz`` of :mod:`hps.ctr.network` also gets ``<model>_ctr`` (``hps_ctr``). The copies
get the config.pbtxt parameters filled in (ps.json path, model name, where relative paths
start), ``hps_instances`` as instance count, the ps.json model's ``max_batch_size`` as
Triton's (the most rows a request may have) and its queue policy (:class:`QueuePolicy`).
A model whose L1 is configured on the GPU (``hps_cache.device: cupy``) gets ``KIND_GPU``
instances spread over its ``deployed_device_list``
(:attr:`hps.config.ModelConfig.instance_gpus`), the others ``KIND_CPU`` ones.

The templates are the one source of the models; the ``model_repository/`` at the top of a
checkout is what :func:`write_demo_repository` writes from them for the demo (``hps
repository``, ``make model-repository``), and a test keeps the checked-in copy equal to it.
"""

from __future__ import annotations

import importlib.util
import math
import os
import py_compile
import re
import shutil
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from hps.config import ModelConfig, PSConfig, parse_config
from hps.errors import ConfigError
from hps.versions.registry import VersionRegistry

TEMPLATES_ENV = "HPS_MODEL_REPOSITORY"
DEMO_REPOSITORY = "model_repository"  # the checked-in copy, at the top of a checkout
DEMO_CONFIG = Path("demo") / "ps.json"  # where `make serve` creates the demo, beside it


def packaged_templates() -> Path:
    """The templates shipped as package data (``hps/triton/model/templates/``).

    Found from ``hps.triton``, so that writing a repository does not import the package of
    the model process (:mod:`hps.triton.model`)."""
    resource = files("hps.triton").joinpath("model").joinpath("templates")
    # An installed package is a folder on disk (never a zip: tritonserver reads model.py files).
    return Path(str(resource))


def templates_dir() -> Path:
    """The model templates: ``$HPS_MODEL_REPOSITORY`` if set, else the packaged ones."""
    path = Path(os.environ.get(TEMPLATES_ENV) or packaged_templates())
    if not (path / "hps_embedding" / "config.pbtxt").is_file():
        raise ConfigError(
            f"no model templates in {path}; unset {TEMPLATES_ENV} or point it at a copy of "
            "hps/triton/model/templates/"
        )
    return path


def get_parameter(text: str, key: str) -> str | None:
    """One string parameter of a config.pbtxt written like the templates (None: absent)."""
    value = r'"((?:[^"\\]|\\.)*)"'
    pattern = r'\{\s*key:\s*"' + re.escape(key) + r'",?\s*value:\s*\{\s*string_value:\s*' + value
    found = re.search(pattern, text)
    return None if found is None else re.sub(r"\\(.)", r"\1", found.group(1))


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


def instance_group(instances: int, gpus: tuple[int, ...] = ()) -> str:
    """The ``instance_group`` of ``instances`` instances: on the CPU, or round robin over
    ``gpus`` (Triton counts a group's instances per listed GPU: one group per GPU)."""
    if not gpus:
        return f"instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]"
    counts = [instances // len(gpus) + (i < instances % len(gpus)) for i in range(len(gpus))]
    groups = [
        f"{{ count: {n}, kind: KIND_GPU, gpus: [ {gpu} ] }}"
        for gpu, n in zip(gpus, counts, strict=True)
        if n
    ]
    return f"instance_group [ {', '.join(groups)} ]"


def check_gpu_instances(config: PSConfig) -> None:
    """A model with GPU instances needs CuPy and a usable GPU here: a ConfigError that
    says so before Triton starts (Triton would refuse a ``KIND_GPU`` instance less
    clearly)."""
    from hps.cache.xp import usable_cupy

    wanting = [m.model for m in config.models if m.instance_gpus]
    if wanting and usable_cupy() is None:
        raise ConfigError(
            f"{config.source}: model(s) {', '.join(wanting)} set hps_cache.device 'cupy' "
            "(GPU instances), but no usable GPU/CuPy was found here; use 'auto' or 'numpy'"
        )


_INSTANCE_GROUP = re.compile(r"^instance_group\s*\[.*\]\s*$", re.M)


@dataclass(frozen=True)
class QueuePolicy:
    """How long Triton's queue of a model may grow: at most ``max_queue_size`` requests
    wait for a free instance (0: no limit), none longer than ``timeout_us`` microseconds
    (0: no limit); Triton refuses the others, ``UNAVAILABLE``, unlooked-up.

    Without either limit (the default) a model keeps Triton's default scheduler. With one,
    it gets the dynamic batcher for the policy alone (:func:`dynamic_batching`), which
    Triton 2.51 (24.10) pays for: see docs/serving.md, "Overload"."""

    max_queue_size: int = 0
    timeout_us: int = 0

    @classmethod
    def of(cls, model: ModelConfig) -> QueuePolicy:
        """The ps.json model's ``hps_max_queue_size`` and ``hps_queue_timeout_s``."""
        return cls(model.hps_max_queue_size, math.ceil(model.hps_queue_timeout_s * 1e6))

    @property
    def bounded(self) -> bool:
        return bool(self.max_queue_size or self.timeout_us)


def dynamic_batching(queue: QueuePolicy) -> str:
    """The ``dynamic_batching`` block of a model with a bounded queue. A preferred batch of
    one request and no delay: Triton never adds a request to a batch that holds one, so
    each ``execute()`` still gets one request, as without a batcher; a client may ask for
    a shorter wait than ``timeout_us`` (``allow_timeout_override``)."""
    return (
        "dynamic_batching {\n"
        "  preferred_batch_size: [ 1 ]\n"
        "  max_queue_delay_microseconds: 0\n"
        "  default_queue_policy {\n"
        "    timeout_action: REJECT\n"
        f"    default_timeout_microseconds: {queue.timeout_us}\n"
        "    allow_timeout_override: true\n"
        f"    max_queue_size: {queue.max_queue_size}\n"
        "  }\n"
        "}\n"
    )


def render_config(
    text: str,
    name: str,
    instances: int,
    params: dict[str, str],
    max_batch_size: int = 0,
    gpus: tuple[int, ...] = (),
    queue: QueuePolicy = QueuePolicy(),
) -> str:
    """``text``, a template's config.pbtxt, for the Triton model ``name``: its instances,
    parameters, queue policy and, where given, its ``max_batch_size`` (else the
    template's)."""
    text = re.sub(r'^name:\s*"[^"]*"', f'name: "{name}"', text, count=1, flags=re.M)
    if max_batch_size:
        text = re.sub(
            r"^max_batch_size:\s*\d+",
            f"max_batch_size: {max_batch_size}",
            text,
            count=1,
            flags=re.M,
        )
    scheduling = instance_group(instances, gpus)
    if queue.bounded:
        scheduling = dynamic_batching(queue) + scheduling
    text, n = _INSTANCE_GROUP.subn(lambda _: scheduling, text, count=1)
    if n != 1:
        raise ConfigError("config.pbtxt template has no one-line instance_group")
    for key, value in params.items():
        text = set_parameter(text, key, value)
    return text


_POLICY = re.compile(r"^version_policy:.*$", re.M)


def write_versions(model_dir: Path, versions: list[int], *, precompile: bool = True) -> None:
    """Serve ``versions`` (HPS model versions, Triton's) from the model folder ``model_dir``:
    a version folder for each (the thin model.py of ``1/``; the instance reads its version
    from Triton) and a ``specific`` version policy naming them. Folders of other versions
    stay, unserved. Safe while the model is loaded: Triton reads them at the next load.

    ``precompile``: each version's model.py gets its bytecode now (:func:`_precompiled`)."""
    template = model_dir / "1" / "model.py"
    for v in versions:
        target = model_dir / str(v) / "model.py"
        if v != 1 and not target.exists():
            target.parent.mkdir(exist_ok=True)
            tmp = target.with_suffix(".tmp")
            shutil.copyfile(template, tmp)
            tmp.replace(target)
        if precompile:
            _precompiled(target)
    cfg = model_dir / "config.pbtxt"
    listed = ", ".join(map(str, versions))
    policy = f"version_policy: {{ specific: {{ versions: [ {listed} ] }} }}"
    text = cfg.read_text()
    text = _POLICY.sub(policy, text) if _POLICY.search(text) else f"{text.rstrip()}\n{policy}\n"
    tmp = cfg.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(cfg)


def _precompiled(module: Path) -> None:
    """Write ``module``'s bytecode beside it before Triton loads it, as the stub's import
    would (the stub runs this interpreter), unless it is there already.

    Triton decides that a loaded version was modified when anything in its folder is newer
    than when it was loaded, and then loads that version anew at the model's next load (an
    activation of another version) instead of keeping it serving: new instances, their
    warm-up again, and the requests that arrive meanwhile waiting for them. The stub's
    import would write ``__pycache__`` into the folder just after the load, and it ignores
    ``PYTHONDONTWRITEBYTECODE``; with the bytecode there first, the import writes nothing."""
    if not Path(importlib.util.cache_from_source(str(module))).exists():
        py_compile.compile(str(module), doraise=True)


@dataclass(frozen=True)
class ServedModel:
    triton_name: str
    template: str
    hps_model: str
    instances: int
    max_batch_size: int = 0
    gpus: tuple[int, ...] = ()  # KIND_GPU instances over these; (): KIND_CPU
    queue: QueuePolicy = QueuePolicy()


def served_models(config: PSConfig) -> list[ServedModel]:
    out = []
    for m in config.models:
        batch, gpus, queue = m.max_batch_size, m.instance_gpus, QueuePolicy.of(m)
        for name, template in zip(m.triton_names, ("hps_embedding", "hps_ctr"), strict=False):
            out.append(ServedModel(name, template, m.model, m.hps_instances, batch, gpus, queue))
    return out


def copy_template(
    template: str,
    dest: Path,
    name: str,
    instances: int,
    params: dict[str, str],
    max_batch_size: int = 0,
    gpus: tuple[int, ...] = (),
    queue: QueuePolicy = QueuePolicy(),
) -> None:
    src = templates_dir() / template
    target = dest / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = target / "config.pbtxt"
    text = render_config(cfg.read_text(), name, instances, params, max_batch_size, gpus, queue)
    cfg.write_text(text)


def prepare_repository(
    config: PSConfig,
    dest: str | Path,
    *,
    base_dir: str | Path | None = None,
    metrics_interval_s: float = 1.0,
    relative: bool = False,
    models: list[str] | None = None,
    recorded: bool = True,
) -> list[str]:
    """Write the Triton models of ``config`` (of its ``models`` only, if given) under
    ``dest``; their names, in order.

    ``relative``: name the ps.json relative to each model's folder and leave ``base_dir``
    empty (relative paths in the ps.json then start at its own folder), so that the
    repository moves with its ps.json; otherwise both are absolute (``hps serve``).
    ``recorded``: serve the versions the node's record names; without it, version 1 (the
    record of whatever node the paths lead to is not read).
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    ps_path = str(Path(config.source).resolve())
    base = "" if relative else str(Path(base_dir or os.getcwd()).resolve())
    names = []
    registry = VersionRegistry(config)
    for served in served_models(config):
        if models is not None and served.hps_model not in models:
            continue
        model_dir = dest.resolve() / served.triton_name
        params = {
            "ps_config": os.path.relpath(ps_path, model_dir) if relative else ps_path,
            "hps_model": served.hps_model,
            "base_dir": base,
            "metrics_interval_s": str(metrics_interval_s),
            **request_parameters(config.model(served.hps_model), served.template),
        }
        copy_template(
            served.template,
            dest,
            served.triton_name,
            served.instances,
            params,
            served.max_batch_size,
            served.gpus,
            served.queue,
        )
        versions = registry.served(served.hps_model) if recorded else [1]
        write_versions(model_dir, versions, precompile=not relative)
        names.append(served.triton_name)
    return names


def request_parameters(model: ModelConfig, template: str) -> dict[str, str]:
    """What a client needs to build a request of ``model`` without its ps.json (``hps
    query`` from another machine): its tables in request order, and a CTR model's dense
    features per sample."""
    params = {"hps_tables": ",".join(t.table for t in model.tables)}
    if template == "hps_ctr":
        params["hps_num_dense"] = str(model.maxnum_des_feature_per_sample)
    return params


def write_demo_repository(dest: str | Path = DEMO_REPOSITORY) -> list[str]:
    """Write the checked-in ``model_repository/`` into ``dest``; the models' names.

    It is what ``hps serve`` writes for the demo ``make serve`` serves (``hps demo --dir
    demo`` with its defaults, ``demo/ps.json`` beside ``dest``), with the ps.json named
    relative to each model's folder (``../../demo/ps.json``) and ``base_dir`` empty, so
    that the files read the same on every machine, at version 1 whatever the local demo's
    version record says. Model folders of ``dest`` that the demo no longer serves, and
    version folders other than ``1``, are removed; other files (its README.md) stay.
    """
    from hps.ctr.demo import demo_config, table_sizes

    dest = Path(dest).resolve()
    ps_path = dest.parent / DEMO_CONFIG
    # hps demo's defaults; only the model's name, instances, max_batch_size and queue policy
    # reach the files
    config = parse_config(demo_config(ps_path.parent, table_sizes(26, 100_000), 16), str(ps_path))
    names = prepare_repository(config, dest, relative=True, recorded=False)
    for stale in dest.iterdir():
        if stale.name in names:  # version folders a record once named
            for extra in stale.iterdir():
                if extra.is_dir() and extra.name.isdigit() and extra.name != "1":
                    shutil.rmtree(extra)
        if stale.name not in names and (stale / "config.pbtxt").is_file():
            shutil.rmtree(stale)
    return names
