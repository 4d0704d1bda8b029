"""`hps import --version` and `hps versions list|activate|retire`: arguments, output, errors
(real RocksDB files; activation against a running `hps serve` is an integration test)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from hps.cli import main
from hps.commands.versions import report_lines
from hps.io.sparse_model import write_sparse_model
from hps.triton.serving import serving_config
from hps.versions import VersionRegistry
from tests.helpers import rows
from tests.unit.commands.conftest import KEYS, write_tables


def hps(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--version", "2"], "--version needs --model"),
        (["--model", "demo"], "--model: only with --version N"),
        (["--sparse-files", "a", "b"], "--sparse-files: only with --version N"),
        (["--dense-file", "d.npz", "--table", "demo.t0"], "--dense-file: only with --version"),
        (["--row-dtype", "float16"], "--row-dtype: only with --version N"),
        (["--dims", "4", "8"], "--dims: only with --version N"),
        (
            ["--version", "2", "--model", "demo", "--table", "demo.t0", "--npy", "k", "v"],
            "not with --table, --npy",
        ),
        (["--version", "2", "--model", "demo", "--force"], "not with --force"),
    ],
)
def test_import_version_arguments_that_mean_nothing_are_refused(
    ps_json: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = hps(capsys, "import", "--config", str(ps_json), *args)
    assert code == 2 and message in err and out == ""
    assert not (ps_json.parent / "rocksdb").exists()  # nothing was written


@pytest.mark.parametrize("bad", ["0", "-1", "two", str(2**31), "9" * 30])
def test_a_version_is_a_positive_integer(
    ps_json: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    for argv in (
        ["import", "--config", str(ps_json), "--model", "demo", "--version", bad],
        ["versions", "retire", "--config", str(ps_json), "--model", "demo", "--", bad],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert "model version" in capsys.readouterr().err


def test_import_list_and_retire_a_version(
    ps_json: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(ps_json)
    assert hps(capsys, "import", "--config", config, "--quiet")[0] == 0  # version 1
    v2 = write_tables(tmp_path / "v2", seed=5)
    code, out, err = hps(
        capsys,
        "import",
        "--config",
        config,
        "--model",
        "demo",
        "--version",
        "2",
        "--sparse-files",
        *v2,
        "--quiet",
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:2] == ["demo.t0@2: 40 rows", "demo.t1@2: 40 rows"]
    assert lines[2].startswith("demo: version 2 ready; make it live with: hps versions activate")

    code, out, err = hps(capsys, "versions", "list", "--config", config, "--model", "demo")
    assert code == 0, err
    one, two = out.splitlines()
    assert one.split()[:4] == ["demo", "1", "live", "served"]
    assert two.split()[:4] == ["demo", "2", "ready", "created"]  # imported, not served
    assert "l2 -" in two and "l3 ~80 rows" in two  # hash_map L2: each serving process's

    code, out, err = hps(
        capsys, "versions", "list", "--config", config, "--model", "demo", "--exact"
    )
    assert "l3 80 rows (" in out.splitlines()[1]

    # the live version, a number taken, an unknown version or model: exit 2, named
    code, _, err = hps(capsys, "versions", "retire", "--config", config, "--model", "demo", "1")
    assert code == 2 and "version 1 is live" in err
    code, _, err = hps(
        capsys, "import", "--config", config, "--model", "demo", "--version", "2", "--quiet"
    )
    assert code == 2 and "version 2 exists (ready)" in err
    code, _, err = hps(capsys, "versions", "retire", "--config", config, "--model", "demo", "7")
    assert code == 2 and "has no version 7" in err
    code, _, err = hps(capsys, "versions", "list", "--config", config, "--model", "nope")
    assert code == 2 and "unknown model 'nope'" in err

    code, out, err = hps(capsys, "versions", "retire", "--config", config, "--model", "demo", "2")
    assert code == 0, err
    assert out == "demo: version 2 retired (its rows dropped in every tier)\n"
    registry = VersionRegistry(serving_config(ps_json))
    assert registry.get("demo", 2).state == "retired"
    _, out, _ = hps(capsys, "versions", "list", "--config", config, "--model", "demo")
    assert out.splitlines()[1].split()[2] == "retired" and "l3 -" in out


def test_import_version_default_files_and_a_wrong_count(
    ps_json: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(ps_json)
    code, _, err = hps(
        capsys,
        "import",
        "--config",
        config,
        "--model",
        "demo",
        "--version",
        "3",
        "--sparse-files",
        str(tmp_path / "v1" / "t0"),
        "--quiet",
    )
    assert code == 2 and "2 tables but 1 sparse files" in err
    code, out, err = hps(
        capsys, "import", "--config", config, "--model", "demo", "--version", "3", "--quiet"
    )
    assert code == 0, err  # the ps.json entry's sparse files, as version 3
    assert "demo.t0@3: 40 rows" in out


def test_activate_needs_the_repository_of_hps_serve(
    ps_json: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(ps_json)
    code, _, err = hps(
        capsys,
        "versions",
        "activate",
        "--config",
        config,
        "--model",
        "demo",
        "1",
        "--repository",
        str(tmp_path / "none"),
    )
    assert code == 2 and "no model repository of hps serve at" in err
    code, _, err = hps(capsys, "versions", "activate", "--config", config, "--model", "demo", "1")
    assert code == 2 and "hps-repository" in err  # the default: beside L3, not written yet


def test_report_lines() -> None:
    report = {
        "model": "m",
        "rows_estimated": ["l3"],
        "versions": [
            {
                "version": 1,
                "state": "ready",
                "created": None,
                "served": True,
                "rows": {"l2": 10, "l3": 2048},
                "bytes": {"l2": 500, "l3": 3 * 1024**2},
                "dims": [16, 32],
                "row_dtypes": ["float32", "float32"],
            },
            {
                "version": 12,
                "state": "retired",
                "created": 1.7e9,
                "served": False,
                "rows": {"l2": None, "l3": None},
                "bytes": {"l2": None, "l3": None},
                "dims": [8, 32],
                "row_dtypes": ["float16", "int8"],
            },
        ],
    }
    one, two = report_lines(report)
    assert one.split() == [
        "m",
        "1",
        "ready",
        "served",
        "created",
        "-",
        "l2",
        "10",
        "rows",
        "(500",
        "B)",
        "l3",
        "~2048",
        "rows",
        "(3.0",
        "MiB)",
        "dims",
        "16/32",
        "float32",
    ]
    assert two.split()[:3] == ["m", "12", "retired"]
    assert two.endswith("l2 -  l3 -  dims 8/32 float16/int8")
    report["versions"][1]["rows_left"] = True  # a retire whose drop failed
    assert report_lines(report)[1].endswith("int8  rows left: retire it again")


def test_plain_imports_leave_a_kept_version_1_alone_and_a_table_goes_to_the_live_one(
    ps_json: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With version 2 live, the ps.json's files (retrained in place, say) are not imported
    over version 1, the snapshot kept for rollback; ``--table`` writes the live version."""
    config = str(ps_json)
    assert hps(capsys, "import", "--config", config, "--quiet")[0] == 0  # version 1
    v2 = write_tables(tmp_path / "v2", seed=5)
    args = ["--model", "demo", "--version", "2", "--sparse-files", *v2, "--quiet"]
    assert hps(capsys, "import", "--config", config, *args)[0] == 0
    VersionRegistry(serving_config(ps_json)).set_live("demo", 2)  # as an activation records
    write_tables(tmp_path / "v1", seed=9)  # the ps.json's files retrained in place

    code, out, err = hps(capsys, "import", "--config", config, "--quiet")
    assert code == 2 and out == ""
    assert "demo (version 2 is live): the ps.json's files are version 1's" in err
    assert _t0_rows(ps_json, 1) == rows(KEYS[:2], 4, 0)[:, 0].tolist()  # untouched

    write_tables(tmp_path / "one", seed=33)
    table = ["--table", "demo.t0", "--sparse", str(tmp_path / "one" / "t0"), "--quiet"]
    code, out, err = hps(capsys, "import", "--config", config, *table)
    assert code == 0, err
    assert out == "demo.t0@2: 40 rows\n"
    assert _t0_rows(ps_json, 2) == rows(KEYS[:2], 4, 33)[:, 0].tolist()
    assert _t0_rows(ps_json, 1) == rows(KEYS[:2], 4, 0)[:, 0].tolist()

    code, out, err = hps(capsys, "lookup", "--config", config, "--table", "demo.t0", "1", "--json")
    assert code == 0, err  # the live version's row
    assert json.loads(out)["vector"] == pytest.approx(rows(KEYS[1:2], 4, 33)[0].tolist())
    npy = [str(tmp_path / "k.npy"), str(tmp_path / "v.npy")]
    assert hps(capsys, "export", "--config", config, "--table", "demo.t0", "--npy", *npy)[0] == 0
    exported = dict(zip(np.load(npy[0]).tolist(), np.load(npy[1]), strict=True))
    np.testing.assert_array_equal(exported[1], rows(KEYS[1:2], 4, 33)[0])


def _t0_rows(ps_json: Path, version: int) -> list[float]:
    """The first element of keys 0 and 1 of table t0 of ``version``, read from L3."""
    from hps.tiers import Tiers

    config = serving_config(ps_json)
    spec = config.model("demo").at_version(version).tables[0]
    tiers = Tiers.open(config, l3_mode="read_only", l2=False)
    try:
        tiers.open_tables([spec])
        assert tiers.persistent is not None
        values, found = tiers.persistent.fetch(spec.name, KEYS[:2])
        assert found.all()
        return [float(v) for v in values[:, 0]]
    finally:
        tiers.close()


def _version_2(capsys: pytest.CaptureFixture[str], config: str, *args: str) -> tuple[int, str, str]:
    return hps(capsys, "import", "--config", config, "--model", "demo", "--version", "2",
               "--quiet", *args)  # fmt: skip


def test_a_ps_json_edited_for_the_retrain_is_refused_and_row_dtype_says_it_instead(
    ps_json: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first versioned import records version 1 from the ps.json entry: edited to
    float16 while L3 holds version 1 as float32, it is refused, nothing recorded or
    written. The entry as imported, `--row-dtype float16` makes version 2 float16; served
    live, `hps lookup` answers its float16 rows, and version 1 stays float32."""
    config = str(ps_json)
    assert hps(capsys, "import", "--config", config, "--quiet")[0] == 0  # version 1, float32
    v2 = []
    for name, dim in (("t0", 4), ("t1", 8)):  # values float16 rounds
        write_sparse_model(tmp_path / "v2" / name, KEYS, rows(KEYS, dim) + 0.1)
        v2.append(str(tmp_path / "v2" / name))
    doc = json.loads(ps_json.read_text())
    doc["models"][0]["hps_row_dtype"] = "float16"
    ps_json.write_text(json.dumps(doc))

    code, out, err = _version_2(capsys, config, "--sparse-files", *v2)
    assert code == 2 and out == ""
    assert "table t0 is held in L3 (rocks_db) as float32 rows of dimension 4 but configured " \
        "as float16 rows of dimension 4" in err  # fmt: skip
    assert "restore the entry version 1 was imported from" in err and "--row-dtype" in err
    assert not (tmp_path / "rocksdb.hps-versions.json").exists()  # nothing recorded
    assert [c for c in column_families(ps_json) if "@" in c] == []  # no rows written

    del doc["models"][0]["hps_row_dtype"]  # restored
    ps_json.write_text(json.dumps(doc))
    code, out, err = _version_2(capsys, config, "--sparse-files", *v2, "--row-dtype", "float16")
    assert code == 0, err
    registry = VersionRegistry(serving_config(ps_json))
    assert [t.row_dtype for t in registry.model_at("demo", 2).tables] == ["float16"] * 2
    registry.set_live("demo", 2)  # as an activation records it
    code, out, err = hps(capsys, "lookup", "--config", config, "--table", "demo.t0", "1", "--json")
    assert code == 0, err
    want = (rows(KEYS[1:2], 4) + 0.1).astype(np.float16).astype(np.float32)[0]
    assert json.loads(out)["vector"] == want.tolist() != (rows(KEYS[1:2], 4) + 0.1)[0].tolist()
    assert _t0_rows(ps_json, 1) == rows(KEYS[:2], 4, 0)[:, 0].tolist()  # float32, as imported


def column_families(ps_json: Path) -> list[str]:
    import rocksdict as rd

    return rd.Rdict.list_cf(str(ps_json.parent / "rocksdb"), rd.Options(raw_mode=True))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--row-dtype", "float16", "int8", "float16"], "2 tables (t0, t1) but 3 row formats"),
        (["--row-dtype", "float8"], "unknown row format 'float8': one of float32, float16, int8"),
        (["--dims", "0"], "a table's dimension is a positive integer up to 65536, not 0"),
        (["--dims", "4", "8", "8"], "2 tables (t0, t1) but 3 dimensions were given"),
        (["--dims", "6"], "x dim 6"),  # the sparse files hold dims 4 and 8
    ],
)
def test_bad_row_formats_and_dims_are_refused(
    ps_json: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    code, out, err = _version_2(capsys, str(ps_json), *args)
    assert code == 2 and says in err and out == ""
    assert [v.version for v in VersionRegistry(serving_config(ps_json)).versions("demo")] == [1]


def test_a_rollout_sends_the_version_s_formats_and_dims() -> None:
    from hps.commands.rollout import import_body

    args = argparse.Namespace(sparse_files=["/m/v2/t0", "/m/v2/t1"], dense_file=None,
                              row_dtype=["float16"], dims=[8, 16])  # fmt: skip
    assert import_body(args) == {"sparse_files": ["/m/v2/t0", "/m/v2/t1"],
                                 "row_dtype": ["float16"], "dims": [8, 16]}  # fmt: skip


def test_a_rollout_refuses_a_version_a_pod_holds_in_other_dims_or_formats() -> None:
    """A version a pod holds is activated as held, never imported again: a rollout asking
    for other dims or formats says so rather than serving what it did not ask for."""
    from hps.commands.rollout import ControlPlane, check_held_as_asked
    from hps.errors import RequestError

    pod = ControlPlane("http://pod-0:8000", None, 1.0)
    held = {"version": 2, "dims": [8, 16], "row_dtypes": ["float16", "float16"]}
    check_held_as_asked(pod, held, {"dims": [8, 16], "row_dtype": ["float16"]})  # as held
    check_held_as_asked(pod, held, {"sparse_files": ["/m/t0", "/m/t1"]})  # none asked
    with pytest.raises(RequestError, match=r"pod-0:8000 holds version 2 with dims \[8, 16\], "
                       r"not the \[8, 8\] asked for"):  # fmt: skip
        check_held_as_asked(pod, held, {"dims": [8]})
    with pytest.raises(RequestError, match="row_dtypes"):
        check_held_as_asked(pod, held, {"row_dtype": ["float16", "int8"]})


@pytest.mark.parametrize(
    ("edit", "now"), [({"hps_row_dtype": "float16"}, "t0 float16 x 4"),
                      ({"embedding_vecsize_per_table": [6, 8]}, "t0 float32 x 6")]
)  # fmt: skip
def test_a_forced_import_in_another_format_than_version_1_s_record_is_refused(
    edit: dict[str, object], now: str, ps_json: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Once a model has a version record, every reader takes version 1's recorded entry: a
    forced import of the ps.json's files in another row format or dims is refused before
    anything is dropped, and version 1 stays readable as recorded."""
    config = str(ps_json)
    assert hps(capsys, "import", "--config", config, "--quiet")[0] == 0  # version 1, float32
    assert _version_2(capsys, config, "--sparse-files", *write_tables(tmp_path / "v2", 3))[0] == 0
    doc = json.loads(ps_json.read_text())
    doc["models"][0].update(edit)
    ps_json.write_text(json.dumps(doc))

    code, out, err = hps(capsys, "import", "--config", config, "--force", "--quiet")
    assert code == 2 and out == "", err
    assert "version 1 is recorded" in err and "t0 float32 x 4, t1 float32 x 8" in err
    assert f"the ps.json's entry now gives {now}" in err
    assert "--model demo --version N" in err and "docs/versions.md" in err
    code, out, err = hps(capsys, "lookup", "--config", config, "--table", "demo.t0", "1")
    assert code == 0, err  # version 1 read as recorded

    doc["models"][0]["hps_row_dtype"] = "float32"  # the recorded format, spelled out
    doc["models"][0]["embedding_vecsize_per_table"] = [4, 8]
    ps_json.write_text(json.dumps(doc))
    assert _t0_rows(ps_json, 1) == rows(KEYS[:2], 4, 0)[:, 0].tolist()  # untouched
    code, out, err = hps(capsys, "import", "--config", config, "--force", "--quiet")
    assert code == 0, err
