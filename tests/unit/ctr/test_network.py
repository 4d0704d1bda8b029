"""The example CTR model's pooling and dense network, against loop references."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.cache.xp import available_xps, to_host
from hps.config import ModelConfig
from hps.ctr.network import DenseNetwork, check_dense_inputs, make_weights, pool_embeddings
from hps.errors import ConfigError, InvalidValueError, ShapeError
from hps.types import ArrayModule


@pytest.mark.parametrize("xp", available_xps(), ids=lambda m: m.__name__)
@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=4),
    seed=st.integers(0, 1000),
)
def test_pool_embeddings_matches_a_loop(
    xp: ArrayModule, counts: list[list[int]], seed: int
) -> None:
    """On the device the rows are on (a lookup answered on the GPU is pooled there)."""
    batch = len(counts[0])
    counts = [(c * batch)[:batch] for c in counts]  # same number of samples in every table
    dims = [2 + t for t in range(len(counts))]
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal((sum(c), d), np.float32) for c, d in zip(counts, dims, strict=True)]
    flat = np.concatenate([r.ravel() for r in rows])
    offsets = np.array([[0, *np.cumsum(c)] for c in counts])
    got = to_host(pool_embeddings(xp.asarray(flat), offsets[:, -1], offsets, dims))
    want = np.zeros((batch, sum(dims)), dtype=np.float32)
    col = 0
    for t, d in enumerate(dims):
        for s in range(batch):
            for r in range(offsets[t, s], offsets[t, s + 1]):
                want[s, col : col + d] += rows[t][r]
        col += d
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_dense_network_matches_hand_computation(tmp_path: Path) -> None:
    path = tmp_path / "w.npz"
    make_weights(path, num_dense=3, emb_width=5, hidden=(4,), seed=1)
    net = DenseNetwork(path, "numpy")
    assert net.num_dense == 3 and net.input_width == 8
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((6, 3)).astype(np.float32)
    pooled = rng.standard_normal((6, 5)).astype(np.float32)
    w = np.load(path)
    hidden = np.maximum(np.hstack([dense, pooled]) @ w["w0"] + w["b0"], 0)
    want = 1 / (1 + np.exp(-(hidden @ w["w1"] + w["b1"])[:, 0]))
    got = net(dense, pooled)
    assert got.dtype == np.float32 and got.shape == (6,)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(ShapeError, match="takes 8 inputs, got 7"):
        net(dense, pooled[:, :4])


def test_dense_features_that_overflow_the_network_are_refused_not_answered_nan(
    tmp_path: Path,
) -> None:
    """Both hidden units overflow to +inf, and the output layer weighs them +1 and -1:
    inf - inf, a NaN that must not go out as a click probability."""
    path = tmp_path / "w.npz"
    np.savez(path, num_dense=np.array(3), w0=np.ones((8, 2), np.float32),
             b0=np.zeros(2, np.float32), w1=np.array([[1.0], [-1.0]], np.float32),
             b1=np.zeros(1, np.float32))  # fmt: skip
    net = DenseNetwork(path, "numpy")
    dense = np.array([[1.0, 1.0, 1.0], [3e38, 3e38, 3e38]], np.float32)  # finite
    with pytest.raises(InvalidValueError, match=r"not a number for samples \[1\]"):
        net(dense, np.zeros((2, 5), np.float32))
    assert net(dense[:1], np.zeros((1, 5), np.float32)).tolist() == [0.5]


def test_the_dense_width_of_the_weights_must_be_the_ps_json_s(tmp_path: Path) -> None:
    """The request-size gate sizes DES by maxnum_des_feature_per_sample: weights that take
    another width would have valid requests refused (or allowed too large)."""
    from hps.config import ModelConfig
    from hps.ctr.network import check_dense_inputs

    make_weights(tmp_path / "w.npz", num_dense=3, emb_width=4, hidden=(4,))
    doc = {"model": "m", "embedding_vecsize_per_table": [4], "dense_file": str(tmp_path / "w.npz")}
    check_dense_inputs(ModelConfig.model_validate({**doc, "maxnum_des_feature_per_sample": 3}))
    with pytest.raises(ConfigError, match="takes 3 dense features but maxnum_des_feature_"):
        check_dense_inputs(ModelConfig.model_validate(doc))  # the default, 26


def test_the_embedding_width_of_the_weights_must_be_the_tables_dims(tmp_path: Path) -> None:
    """The network takes the pooled rows of every table beside the dense features: weights
    for other dimensions fail every request (a ShapeError), so the entry is refused."""
    from hps.config import ModelConfig
    from hps.ctr.network import check_dense_inputs

    make_weights(tmp_path / "w.npz", num_dense=3, emb_width=12, hidden=(4,))
    doc = {"model": "m", "dense_file": str(tmp_path / "w.npz"), "maxnum_des_feature_per_sample": 3}
    check_dense_inputs(ModelConfig.model_validate({**doc, "embedding_vecsize_per_table": [4, 8]}))
    with pytest.raises(ConfigError, match=r"takes 12 embedding inputs beside its 3 dense "
                       r"features, but the tables' dimensions \[4, 4\] add up to 8"):  # fmt: skip
        check_dense_inputs(
            ModelConfig.model_validate({**doc, "embedding_vecsize_per_table": [4, 4]})
        )


def test_bad_weight_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not CTR weights"):
        DenseNetwork(tmp_path / "missing.npz")
    np.savez(tmp_path / "two.npz", num_dense=np.array(1), w0=np.ones((2, 2)), b0=np.ones(2))
    with pytest.raises(ConfigError, match="one output"):
        DenseNetwork(tmp_path / "two.npz")


def weights(path: Path, w1: tuple[int, int] = (64, 1), b0: tuple[int, ...] = (64,)) -> Path:
    """CTR weights for 3 dense features and 5 embedding inputs; ``w1`` and ``b0`` as given."""
    arrays = {"w0": np.ones((8, 64)), "b0": np.ones(b0), "w1": np.ones(w1), "b1": np.ones(1)}
    np.savez(path, num_dense=np.array(3), **{k: v.astype(np.float32) for k, v in arrays.items()})
    return path


def ctr_model(path: Path) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "model": "m",
            "embedding_vecsize_per_table": [5],
            "dense_file": str(path),
            "maxnum_des_feature_per_sample": 3,
        }  # fmt: skip
    )


@pytest.mark.parametrize(
    ("w1", "b0", "message"),
    [
        (
            (50, 1),
            (64,),
            r"layer 1: w1 \(50, 1\) takes 50 inputs, but layer 0 \(w0 \(8, 64\)\) gives 64",
        ),
        (
            (64, 1),
            (63,),
            r"layer 0: b0 has shape \(63,\), not \(64,\) \(the outputs of w0 \(8, 64\)\)",
        ),
        ((64, 1), (1, 64), r"layer 0: b0 has shape \(1, 64\), not \(64,\)"),
        ((64,), (64,), r"layer 1: w1 has shape \(64,\), not \(inputs, outputs\)"),
    ],
)
def test_layers_that_do_not_chain_are_refused_when_the_weights_are_loaded(
    tmp_path: Path, w1: tuple[int, int], b0: tuple[int, ...], message: str
) -> None:
    """Weights whose layers do not chain would load and fail every request in a matrix
    product: the server's start (check_dense_inputs), a version's import (the same) and
    the model's load (DenseNetwork) refuse them, naming the file and the layer."""
    path = weights(tmp_path / "bad.npz", w1, b0)
    with pytest.raises(ConfigError, match=f"^dense_file {path}: {message}"):
        DenseNetwork(path, "numpy")
    with pytest.raises(ConfigError, match=f"^model m: dense_file {path}: {message}"):
        check_dense_inputs(ctr_model(path))
    good = weights(tmp_path / "good.npz")
    check_dense_inputs(ctr_model(good))
    assert DenseNetwork(good, "numpy").input_width == 8


def test_hps_serve_refuses_a_ps_json_whose_ctr_weights_do_not_chain(tmp_path: Path) -> None:
    from hps.triton.serving import serving_config

    doc = {"models": [{"model": "m", "embedding_vecsize_per_table": [5], "dense_file": "w.npz",
                       "maxnum_des_feature_per_sample": 3}]}  # fmt: skip
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    weights(tmp_path / "w.npz", w1=(50, 1))
    with pytest.raises(ConfigError, match=r"model m: dense_file .*w\.npz: layer 1: w1 \(50, 1\)"):
        serving_config(tmp_path / "ps.json", tmp_path)


def test_the_network_runs_on_the_gpu_of_the_pooled_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CTR instance whose L1 is on GPU 1 but whose current GPU is 0 (``KIND_CPU``): the
    weights are placed on GPU 1 when rows from there first come, and the network runs there,
    as on NumPy. Checked with a stand-in for CuPy that records each array's GPU."""
    from hps.ctr import network
    from tests.unit.cache import fake_cupy

    cp = fake_cupy.install(monkeypatch)
    monkeypatch.setattr(network, "select_xp", lambda device: cp)
    path = tmp_path / "w.npz"
    make_weights(path, num_dense=3, emb_width=5, hidden=(4,), seed=1)
    net = DenseNetwork(path, "cupy")
    assert cp.events == []  # nothing placed before the rows' GPU is known
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((6, 3)).astype(np.float32)
    pooled = rng.standard_normal((6, 5)).astype(np.float32)
    with cp.cuda.Device(1):
        on_gpu = cp.asarray(pooled)
    cp.events.clear()
    got = net(dense, on_gpu)
    assert cp.gpus_of("array:") == {1} and cp.current == 0
    assert {w.gpu for layer in net.layers(1) for w in layer} == {1}
    np.testing.assert_allclose(got, DenseNetwork(path, "numpy")(dense, pooled), rtol=1e-6)


def arrays(**over: np.ndarray) -> dict[str, np.ndarray]:
    """Good CTR weights (2 dense features, 3 embedding inputs), with ``over`` replacing."""
    good = {"num_dense": np.array(2), "w0": np.ones((5, 4), np.float32),
            "b0": np.zeros(4, np.float32), "w1": np.ones((4, 1), np.float32),
            "b1": np.zeros(1, np.float32)}  # fmt: skip
    return {**good, **over}


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"w1": np.full((4, 1), np.nan, np.float32)}, r"w1 holds NaN or infinity"),
        ({"b0": np.full(4, np.inf, np.float32)}, r"b0 holds NaN or infinity"),
        ({"w0": np.full((5, 4), 1e300)}, r"w0 holds NaN or infinity as float32"),
        ({"w0": np.full((5, 4), "x")}, r"w0 is of dtype <U1, not a real number type"),
        ({"w0": np.ones((5, 4), np.complex64)}, r"w0 is of dtype complex64, not a real number"),
        ({"b1": np.ones(1, bool)}, r"b1 is of dtype bool, not a real number type"),
        ({"num_dense": np.array(2.9)}, r"num_dense is 2\.9, not an integer scalar"),
        ({"num_dense": np.array(True)}, r"num_dense is True, not an integer scalar"),
        ({"num_dense": np.array([2, 2])}, r"num_dense is \[2 2\], not an integer scalar"),
        ({"num_dense": np.array(-3)}, r"num_dense is -3, not 0 to the 5 inputs of w0"),
        ({"num_dense": np.array(9)}, r"num_dense is 9, not 0 to the 5 inputs of w0"),
    ],
)
def test_weights_that_would_fail_or_mislead_every_request_are_refused_at_load(
    tmp_path: Path, over: dict[str, np.ndarray], message: str
) -> None:
    """NaN weights would fail every request blaming the client's DES, infinite ones answer
    1.0 to all, strings fail each request, a float num_dense is truncated: refused when
    the weights are loaded (hps serve's start, a version's import, the model's load)."""
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays(**over))
    with pytest.raises(ConfigError, match=f"^dense_file {path}: {message}"):
        DenseNetwork(path, "numpy")
    doc = {"model": "m", "dense_file": str(path), "embedding_vecsize_per_table": [3],
           "maxnum_des_feature_per_sample": 2}  # fmt: skip
    with pytest.raises(ConfigError, match=f"^model m: dense_file {path}: {message}"):
        check_dense_inputs(ModelConfig.model_validate(doc))


def test_integer_weights_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "int.npz"
    np.savez(path, **arrays(w0=np.ones((5, 4), np.int64), num_dense=np.array(2, np.uint8)))
    net = DenseNetwork(path, "numpy")
    assert net.num_dense == 2
    assert net(np.ones((1, 2), np.float32), np.ones((1, 3), np.float32)).shape == (1,)


def test_a_file_that_is_not_an_npz_archive_is_named_so(tmp_path: Path) -> None:
    """Not NumPy's advice to load it with pickle."""
    (tmp_path / "text.npz").write_text("hello")
    (tmp_path / "zip.npz").write_bytes(b"PK\x03\x04garbage")
    np.save(tmp_path / "arr.npy", np.ones(3))
    for name in ("text.npz", "zip.npz", "arr.npy"):
        path = tmp_path / name
        with pytest.raises(ConfigError) as raised:
            DenseNetwork(path, "numpy")
        assert str(raised.value) == f"dense_file {path}: not an .npz archive (numpy.savez)"
