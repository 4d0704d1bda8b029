"""ps.json parsing: HugeCTR's files as they are, defaults, and errors that name key and file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hps.config import load_config, parse_config
from hps.errors import ConfigError

HUGECTR_PS = {
    "supportlonglong": True,
    "volatile_db": {
        "type": "redis_cluster",
        "address": "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002",
        "user_name": "default",
        "password": "",
        "num_partitions": 8,
        "max_get_batch_size": 100000,
        "max_set_batch_size": 100000,
        "overflow_margin": 10000000,
        "overflow_resolution_target": 0.8,
        "initial_cache_rate": 1.0,
        "update_filters": [".+"],
    },
    "persistent_db": {
        "type": "rocks_db",
        "path": "/hugectr/rocksdb",
        "num_threads": 16,
        "read_only": False,
        "max_get_batch_size": 1000,
        "max_set_batch_size": 10000,
    },
    "update_source": {"type": "kafka_message_queue", "brokers": "127.0.0.1:9092"},
    "models": [
        {
            "model": "wdl",
            "sparse_files": ["/wdl/0_sparse_2000.model", "/wdl/1_sparse_2000.model"],
            "dense_file": "/wdl/_dense_2000.model",
            "network_file": "/wdl/wdl.json",
            "num_of_worker_buffer_in_pool": 4,
            "num_of_refresher_buffer_in_pool": 1,
            "deployed_device_list": [0],
            "max_batch_size": 64,
            "default_value_for_each_table": [0.0, 0.0],
            "maxnum_des_feature_per_sample": 13,
            "maxnum_catfeature_query_per_table_per_sample": [2, 26],
            "embedding_vecsize_per_table": [1, 16],
            "embedding_table_names": ["table1", "table2"],
            "hit_rate_threshold": 0.9,
            "gpucacheper": 0.5,
            "gpucache": True,
            "cache_refresh_percentage_per_iteration": 0.2,
            "refresh_delay": 0,
            "refresh_interval": 0,
            "use_static_table": False,
            "embedding_cache_type": "dynamic",
            "use_context_stream": True,
            "use_hctr_cache_implementation": True,
            "thread_pool_size": 16,
            "init_ec": True,
            "enable_pagelock": False,
            "fp8_quant": False,
            "label_dim": 1,
            "slot_num": 28,
        }
    ],
}


def _write(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "ps.json"
    p.write_text(json.dumps(doc))
    return p


def test_hugectr_file_loads_with_deprecation_warnings(tmp_path: Path) -> None:
    with pytest.warns(FutureWarning) as caught:
        cfg = load_config(_write(tmp_path, HUGECTR_PS))
    assert sorted(str(w.message).split(" is ")[0] for w in caught) == [
        "persistent_db.max_get_batch_size",
        "persistent_db.max_set_batch_size",
        "volatile_db.max_get_batch_size",
        "volatile_db.max_set_batch_size",
    ]
    assert cfg.volatile_db.max_batch_size == 100000
    assert cfg.persistent_db.max_batch_size == 1000
    model = cfg.model("wdl")
    assert [t.name for t in model.tables] == ["wdl.table1", "wdl.table2"]
    assert [t.dim for t in model.tables] == [1, 16]
    assert model.tables[1].max_keys_per_request == 64 * 26
    assert cfg.update_source.enabled


def test_hugectr_defaults() -> None:
    cfg = parse_config({"models": [{"model": "m", "embedding_vecsize_per_table": [8]}]})
    m = cfg.models[0]
    assert (m.gpucacheper, m.hit_rate_threshold, m.max_batch_size) == (0.2, 0.9, 64)
    v = cfg.volatile_db
    assert (v.type, v.num_partitions, v.max_batch_size) == ("hash_map", 16, 65536)
    assert (v.overflow_policy, v.overflow_resolution_target, v.initial_cache_rate) == (
        "evict_random",
        0.8,
        1.0,
    )
    assert cfg.persistent_db.max_batch_size == 65536
    u = cfg.update_source
    assert (u.poll_timeout_ms, u.max_batch_size, u.failure_backoff_ms, u.max_commit_interval) == (
        500,
        8192,
        50,
        32,
    )
    assert [t.table for t in m.tables] == ["sparse_embedding0"]
    assert not u.enabled


BIG = 2**31  # past Triton's int32


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"volatile_db": {"typo_key": 1}}, "volatile_db.typo_key: unknown key"),
        ({"volatile_db": {"num_partitions": "many"}}, "volatile_db.num_partitions"),
        ({"persistent_db": {"type": "leveldb"}}, "persistent_db.type"),
        (
            {
                "models": [
                    {
                        "model": "m",
                        "embedding_vecsize_per_table": [8, 4],
                        "embedding_table_names": ["a"],
                    }
                ]
            },
            "embedding_table_names has 1 names",
        ),
        (
            {
                "models": [
                    {
                        "model": "m",
                        "embedding_vecsize_per_table": [8],
                        "embedding_table_names": ["bad.name"],
                    }
                ]
            },
            "invalid table name 'bad.name'",
        ),
        (
            {"models": [{"model": "m", "embedding_vecsize_per_table": [8], "gpucacheper": 2}]},
            "models[0].gpucacheper",
        ),
        ({"models": [{"model": "m"}]}, "models[0].embedding_vecsize_per_table: Field required"),
        (
            {"models": [{"model": "m", "embedding_vecsize_per_table": [8, 163264]}]},
            "vector sizes are at most 65536, not 163264",
        ),
        (
            {"update_source": {"type": "kafka", "brokerz": "x"}},
            "update_source.brokerz: unknown key",
        ),
        ({"volatile_db": {"update_filters": ["("]}}, "invalid regular expression"),
        (
            {"models": [{"model": "m", "embedding_vecsize_per_table": [8], "version": 3}]},
            "models[0].version: unknown key (versions are imported and activated with",
        ),
        ({"source": "elsewhere.json"}, "ps.json: source: unknown key"),
        (
            {
                "models": [
                    {"model": "m", "embedding_vecsize_per_table": [8], "dense_file": "m.npz"},
                    {"model": "m_ctr", "embedding_vecsize_per_table": [8]},
                ]
            },
            "['m_ctr'] would be two Triton models",
        ),
        (
            {
                "models": [
                    {
                        "model": "m",
                        "embedding_vecsize_per_table": [8],
                        "embedding_table_names": ["t__hps_version"],
                    }
                ]
            },
            "'t__hps_version': names containing '__hps_' are HPS's own side tables",
        ),
        (
            {
                "models": [
                    {
                        "model": "m",
                        "embedding_vecsize_per_table": [8, 8],
                        "maxnum_catfeature_query_per_table_per_sample": [-3, 2],
                    }
                ]
            },
            "models[0].maxnum_catfeature_query_per_table_per_sample[0]: Input should be greater",
        ),
        (
            {"models": [{"model": "m", "embedding_vecsize_per_table": [8], "max_batch_size": BIG}]},
            "models[0].max_batch_size: Input should be less than or equal to 2147483647",
        ),
        (
            {"update_source": {"hps_max_version_ahead_s": 1e300}},
            "update_source.hps_max_version_ahead_s: Input should be less than or equal to 2592000",
        ),
    ],
)
def test_errors_name_the_key_and_the_file(tmp_path: Path, patch: dict, message: str) -> None:
    doc = {"models": [{"model": "m", "embedding_vecsize_per_table": [8]}], **patch}
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, doc))
    assert message in str(err.value)
    assert str(tmp_path / "ps.json") in str(err.value)


@pytest.mark.parametrize("default", [float("nan"), float("inf"), 1e39, -1e39])
def test_a_default_value_a_float32_row_cannot_hold_is_refused(default: float) -> None:
    doc = {"models": [{"model": "m", "embedding_vecsize_per_table": [8]}]}
    doc["models"][0]["default_value_for_each_table"] = [default]
    with pytest.raises(ConfigError, match=r"models\[0\]\.default_value_for_each_table\[0\]"):
        parse_config(doc)


def test_invalid_json_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "ps.json"
    p.write_text("{ not json")
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        load_config(p)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.json")
    p.write_bytes(b'{"x": "\xe9"}')  # Latin-1, not UTF-8
    with pytest.raises(ConfigError, match=r"ps.json: not UTF-8 text \(byte 7\)"):
        load_config(p)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[" * 100_000, "nested too deeply"),
        ('{"models": [{"model": "m", "max_batch_size": ' + "9" * 5000 + "}]}",
         "an integer of more than 4300 digits"),
    ],
)  # fmt: skip
def test_json_python_cannot_parse_is_a_config_error_naming_the_file(
    tmp_path: Path, text: str, problem: str
) -> None:
    p = tmp_path / "ps.json"
    p.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert str(exc.value) == f"{p}: invalid JSON: {problem}"


def test_models_are_frozen() -> None:
    cfg = parse_config({"models": [{"model": "m", "embedding_vecsize_per_table": [8]}]})
    with pytest.raises(Exception, match="frozen"):
        cfg.models[0].gpucacheper = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"models": []}, r"models: .*needs at least one model"),
        (
            {"models": [{"model": "m", "embedding_vecsize_per_table": [True]}]},
            r"embedding_vecsize_per_table\[0\]: Input should be a valid integer",
        ),
        (
            {"models": [{"model": "m", "embedding_vecsize_per_table": [4.0]}]},
            r"embedding_vecsize_per_table\[0\]",
        ),
    ],
)
def test_empty_models_and_non_integer_dims_are_refused(doc: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(doc, "ps.json")


def _model(**extra: object) -> dict:
    return {"models": [{"model": "m", "embedding_vecsize_per_table": [8, 4, 2], **extra}]}


@pytest.mark.parametrize(
    ("extra", "formats"),
    [
        ({}, ["float32"] * 3),
        ({"hps_row_dtype": "float16"}, ["float16"] * 3),
        ({"hps_row_dtype": ["int8"]}, ["int8"] * 3),
        ({"hps_row_dtype": ["int8", "float16", "float32"]}, ["int8", "float16", "float32"]),
        ({"fp8_quant": True}, ["int8"] * 3),  # HugeCTR's 8-bit rows, honoured
        ({"fp8_quant": True, "hps_row_dtype": "int8"}, ["int8"] * 3),
    ],
)
def test_row_formats_per_table(extra: dict, formats: list[str]) -> None:
    (model,) = parse_config(_model(**extra)).models
    assert [t.row_dtype for t in model.tables] == formats


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"hps_row_dtype": "bf16"}, "models[0].hps_row_dtype"),
        ({"hps_row_dtype": ["int8", "float16"]}, "hps_row_dtype has 2 entries but the model has 3"),
        ({"fp8_quant": True, "hps_row_dtype": "float16"}, "fp8_quant: true asks for 8-bit rows"),
    ],
)
def test_row_formats_refused(extra: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(_model(**extra))


def test_hugectrs_kafka_fields_reach_every_client() -> None:
    from hps.config import UpdateSourceConfig

    us = UpdateSourceConfig(
        type="kafka_message_queue", metadata_refresh_interval_ms=5000, receive_buffer_size=4096
    )
    assert us.kafka_settings == {
        "topic.metadata.refresh.interval.ms": 5000,
        "socket.receive.buffer.bytes": 4096,
    }
    mine = us.model_copy(update={"hps_kafka_config": {"topic.metadata.refresh.interval.ms": 7}})
    assert mine.kafka_settings["topic.metadata.refresh.interval.ms"] == 7  # hps_kafka_config wins


@pytest.mark.parametrize("path", ["", ".", "..", "/"])
def test_an_l3_path_naming_no_folder_of_its_own_is_refused(path: str) -> None:
    model = {"model": "m", "embedding_vecsize_per_table": [4]}
    with pytest.raises(ConfigError, match=f"persistent_db: .*path {path!r} names no folder"):
        parse_config({"models": [model], "persistent_db": {"type": "rocks_db", "path": path}})
    parse_config({"models": [model], "persistent_db": {"type": "disabled", "path": path}})


@pytest.mark.parametrize(
    ("instances", "volatile", "l2"),
    [
        ([2], {}, "multi_process_hash_map"),  # one L2 per node, not one per Triton process
        ([1, 3], {"initial_cache_rate": 0.5}, "multi_process_hash_map"),  # any model's
        ([2], {"type": "hash_map"}, "hash_map"),  # a named type is kept
        ([1], {}, "hash_map"),
    ],
)
def test_the_l2_of_several_instances_is_decided_when_the_file_is_read(
    instances: list[int], volatile: dict, l2: str
) -> None:
    """Every command that reads the ps.json (hps serve, plan, import, consume, ...) sees the
    L2 serving opens."""
    models = [
        {"model": f"m{i}", "embedding_vecsize_per_table": [4], "hps_instances": n}
        for i, n in enumerate(instances)
    ]
    vdb = parse_config({"models": models, "volatile_db": volatile}).volatile_db
    assert vdb.type == l2
    assert vdb.type_defaulted == (l2 != volatile.get("type", "hash_map"))
    assert vdb.initial_cache_rate == volatile.get("initial_cache_rate", 1.0)
