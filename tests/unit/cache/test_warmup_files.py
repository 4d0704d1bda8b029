"""Frequency files, access logs and the warm-up plan (which keys, pinned or not)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.cache.warmup import hottest, plan_warm_up, prefill_wanted
from hps.cli import main
from hps.config import parse_config
from hps.errors import FormatError
from hps.io.frequency import count_access_log, read_frequency_file, write_frequency_file
from hps.io.keyset import write_keyset


def model(**kw: object):  # type: ignore[no-untyped-def]
    doc = {"model": "m", "embedding_table_names": ["t"], "embedding_vecsize_per_table": [4], **kw}
    return parse_config({"models": [doc]}).models[0]


def test_frequency_file_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "f"  # no .npz suffix: written exactly where asked
    write_frequency_file(path, np.array([3, 1, 2]), np.array([5.0, 1.0, 9.0]))
    keys, counts = read_frequency_file(path)
    assert keys.dtype == np.int64 and keys.tolist() == [3, 1, 2] and counts.tolist() == [5, 1, 9]
    with pytest.raises(FormatError, match="3 keys but 2 counts"):
        write_frequency_file(path, np.array([1, 2, 3]), np.array([1, 2]))
    np.savez(tmp_path / "bad.npz", keys=np.array([1, 2]))
    with pytest.raises(FormatError, match="needs arrays"):
        read_frequency_file(tmp_path / "bad.npz")
    (tmp_path / "junk").write_bytes(b"not numpy")
    with pytest.raises(FormatError, match="not a frequency file"):
        read_frequency_file(tmp_path / "junk")
    np.savez(tmp_path / "floats.npz", keys=np.array([1.5]), counts=np.array([1]))
    with pytest.raises(FormatError, match="integers"):
        read_frequency_file(tmp_path / "floats.npz")


def test_access_log_counts_and_hottest(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    log = rng.integers(0, 50, 10_000).astype(np.int64)
    write_keyset(tmp_path / "log", log)
    keys, counts = count_access_log(tmp_path / "log", chunk_keys=777)
    expect_keys, expect_counts = np.unique(log, return_counts=True)
    np.testing.assert_array_equal(keys, expect_keys)
    np.testing.assert_array_equal(counts, expect_counts)
    top = hottest(keys, counts, 5)
    top_counts = expect_counts[np.searchsorted(expect_keys, top)]
    assert top_counts.tolist() == sorted(expect_counts.tolist(), reverse=True)[:5]  # hottest first
    assert hottest(keys, counts, 0).size == 0
    (tmp_path / "odd").write_bytes(b"123")
    with pytest.raises(FormatError, match="whole number"):
        count_access_log(tmp_path / "odd")


def test_freq_command_writes_the_hottest_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    write_keyset(tmp_path / "log", np.array([7, 7, 7, 8, 8, 9], dtype=np.int64))
    assert (
        main(["freq", str(tmp_path / "log"), "--out", str(tmp_path / "f.npz"), "--top", "2"]) == 0
    )
    keys, counts = read_frequency_file(tmp_path / "f.npz")
    assert dict(zip(keys.tolist(), counts.tolist(), strict=True)) == {7: 3, 8: 2}
    assert "2 keys, 5 accesses" in capsys.readouterr().out


def test_plan_pins_only_for_the_frequency_policy(tmp_path: Path) -> None:
    write_frequency_file(tmp_path / "f.npz", np.arange(10), np.arange(10))  # 9 is hottest
    for policy, pinned in (("frequency", [9, 8]), ("lru", [])):
        cfg = {"policy": policy, "frequency_file": str(tmp_path / "f.npz"), "static_fraction": 0.5}
        plan = plan_warm_up(model(hps_cache=cfg), 0, capacity=4)
        assert plan.pinned.tolist() == pinned
        assert np.concatenate([plan.pinned, plan.rest]).tolist() == [9, 8, 7, 6]


def test_plan_keyset_fills_the_room_left_without_repeats(tmp_path: Path) -> None:
    write_frequency_file(tmp_path / "f.npz", np.array([1, 2]), np.array([5, 6]))
    write_keyset(tmp_path / "k", np.array([2, 30, 30, 40, 50, 60], dtype=np.int64))
    cfg = {"frequency_file": str(tmp_path / "f.npz"), "warmup_keyset": str(tmp_path / "k")}
    plan = plan_warm_up(model(hps_cache=cfg), 0, capacity=5)
    assert plan.rest.tolist() == [2, 1, 30, 40, 50] and plan.size == 5


def test_prefill_follows_init_ec_and_the_table_size() -> None:
    assert prefill_wanted(model(), capacity=100, table_rows=100)
    assert not prefill_wanted(model(), capacity=99, table_rows=100)
    assert prefill_wanted(model(cache_refresh_percentage_per_iteration=0.1), 99, 100)
    assert not prefill_wanted(model(init_ec=False), 100, 100)
    assert not prefill_wanted(model(), 100, 0)
    keys = np.array([5, 3, 9], dtype=np.int64)
    assert plan_warm_up(model(), 0, 2, keys).rest.tolist() == [3, 5]
    assert plan_warm_up(model(init_ec=False), 0, 2, keys).size == 0


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_the_keyset_read_in_chunks_plans_what_the_whole_file_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """The first distinct keys of the file, hottest-first keys of the frequency file left
    out, as ``first_occurrences`` of the whole file gave them, whatever the chunks."""
    from hps.dedup import first_occurrences
    from hps.io import keyset

    monkeypatch.setattr(keyset, "CHUNK_KEYS", chunk)
    rng = np.random.default_rng(chunk)
    keys = rng.integers(0, 40, 300).astype(np.int64)  # many repeats
    write_keyset(tmp_path / "k", keys)
    write_frequency_file(tmp_path / "f.npz", np.array([5, 6, 7]), np.array([3, 2, 1]))
    cfg = {"frequency_file": str(tmp_path / "f.npz"), "warmup_keyset": str(tmp_path / "k")}
    for capacity in (0, 2, 3, 10, 25, 40, 100):
        top = np.array([5, 6, 7], dtype=np.int64)[:capacity]
        whole = first_occurrences(keys[~np.isin(keys, top)])[: max(0, capacity - top.size)]
        plan = plan_warm_up(model(hps_cache=cfg), 0, capacity=capacity)
        assert plan.rest.tolist() == top.tolist() + whole.tolist()


def test_a_keyset_far_larger_than_the_cache_is_read_no_further_than_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hps.io import keyset

    monkeypatch.setattr(keyset, "CHUNK_KEYS", 1000)
    write_keyset(tmp_path / "k", np.arange(100_000, dtype=np.int64) % 50_000)  # 800 kB
    read: list[int] = []
    real = keyset._read_chunk

    def counted(f, n):  # type: ignore[no-untyped-def]
        chunk = real(f, n)
        read.append(chunk.nbytes)
        return chunk

    monkeypatch.setattr(keyset, "_read_chunk", counted)
    plan = plan_warm_up(model(hps_cache={"warmup_keyset": str(tmp_path / "k")}), 0, 2500)
    assert plan.rest.tolist() == list(range(2500))
    assert read == [8000, 8000, 8000]  # three chunks of 1,000 keys, of 100 chunks


@pytest.mark.parametrize("setting", ["warmup_keyset", "frequency_file"])
def test_a_missing_or_folder_warm_up_file_is_a_format_error_naming_it(
    tmp_path: Path, setting: str
) -> None:
    for path, why in ((tmp_path / "missing", "No such file"), (tmp_path, "Is a directory")):
        with pytest.raises(FormatError, match=f"^hps_cache.{setting} {path}: .*{why}"):
            plan_warm_up(model(hps_cache={setting: str(path)}), 0, capacity=4)
