"""The checked-in model_repository/ is what `hps serve`'s repository writer makes of the demo.

The templates in hps/triton/model/templates/ are the one source; model_repository/ at the
top of the checkout is generated from them (`make model-repository`, i.e. `hps repository`).
"""

from __future__ import annotations

import re
from pathlib import Path

from hps.config import parse_config
from hps.ctr.demo import demo_config
from hps.triton.repository import DEMO_CONFIG, prepare_repository, write_demo_repository

ROOT = Path(__file__).resolve().parents[3]
CHECKED_IN = ROOT / "model_repository"
REGENERATE = "model_repository/ drifted from the templates: run `make model-repository`"


def model_files(repo: Path) -> dict[str, str]:
    """Relative path -> text of every file of the models (not the README, no caches)."""
    return {
        str(p.relative_to(repo)): p.read_text()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts
    }


def test_the_checked_in_repository_is_what_the_writer_produces(tmp_path: Path) -> None:
    fresh = tmp_path / "model_repository"
    assert write_demo_repository(fresh) == ["demo", "demo_ctr"]
    want, have = model_files(fresh), model_files(CHECKED_IN)
    assert sorted(have) == sorted(want), REGENERATE
    for name, text in want.items():
        assert have[name] == text, f"{name}: {REGENERATE}"
    assert (CHECKED_IN / "README.md").is_file()


def test_hps_serve_writes_the_same_but_for_where_the_ps_json_is(tmp_path: Path) -> None:
    """`hps serve` names the ps.json and the base folder by absolute paths; the checked-in
    copy names the ps.json relative to each model's folder: nothing else differs."""
    ps_path = tmp_path / DEMO_CONFIG
    config = parse_config(demo_config(ps_path.parent, [1000] * 26, 16), str(ps_path))
    served = tmp_path / "served"
    prepare_repository(config, served, base_dir="/srv")
    checked_in = model_files(CHECKED_IN)
    for name, text in model_files(served).items():
        if name.endswith("config.pbtxt"):
            params = dict(re.findall(r'key: "(\w+)", value: \{ string_value: "([^"]*)"', text))
            assert params["ps_config"] == str(ps_path) and params["base_dir"] == "/srv"
            text = text.replace(str(ps_path), "../../demo/ps.json").replace('"/srv"', '""')
        assert checked_in[name] == text, name


def test_the_local_demo_s_version_record_does_not_reach_the_checked_in_files(
    tmp_path: Path,
) -> None:
    """`make model-repository` in a checkout whose demo went through versions/."""
    from hps.ctr.demo import table_sizes
    from hps.versions import VersionRegistry

    ps_path = tmp_path / DEMO_CONFIG
    config = parse_config(demo_config(ps_path.parent, table_sizes(26, 100_000), 16), str(ps_path))
    registry = VersionRegistry(config)
    registry.begin(config.model("demo"), 2)
    registry.set_state("demo", 2, "ready")
    registry.set_live("demo", 2)
    assert registry.served("demo") != [1]
    dest = tmp_path / "model_repository"
    (dest / "demo" / "2").mkdir(parents=True)  # written by an earlier run
    write_demo_repository(dest)
    assert model_files(dest) == model_files(CHECKED_IN)
