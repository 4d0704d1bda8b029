"""The example CTR model: sum-pooled embeddings + dense features through a small MLP.

Weights live in one ``.npz`` file (the model's ``dense_file`` in ps.json) holding
``num_dense`` (an integer scalar) and ``w0, b0, w1, b1, ...``: weight ``w<i>`` of shape ``(inputs,
outputs)``, its inputs the outputs of ``w<i-1>``, bias ``b<i>`` of shape ``(outputs,)``;
ReLU between layers, a sigmoid on the last one, which has one output (the click
probability); every array of a real number type (integer or float), finite as float32.
Weights that are not so are a ConfigError when they are loaded (:func:`read_weights`).
The same code runs on NumPy or CuPy (``xp``); the network is tiny next to the embedding
lookup.

On CuPy the network runs on the GPU the pooled rows are on (L1's GPU, which need not be the
current one: a ``KIND_CPU`` instance keeps L1 on its ``deployed_device_list[0]`` without
making it current), under that GPU's scope, with its weights copied there on first use.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np
import numpy.typing as npt

from hps.cache.xp import array_module, device_scope, gpu_of, select_xp, to_host
from hps.config import ModelConfig
from hps.errors import ConfigError, InvalidValueError, ShapeError
from hps.types import ArrayModule, Vectors

Array = npt.NDArray[np.float32]


def make_weights(
    path: str | Path,
    num_dense: int,
    emb_width: int,
    hidden: tuple[int, ...] = (64, 32),
    seed: int = 0,
) -> None:
    """Write random (He-initialised) weights for ``num_dense + emb_width`` inputs."""
    rng = np.random.default_rng(seed)
    sizes = [num_dense + emb_width, *hidden, 1]
    arrays: dict[str, np.ndarray] = {"num_dense": np.array(num_dense)}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        arrays[f"w{i}"] = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(
            np.float32
        )
        arrays[f"b{i}"] = (rng.standard_normal(n_out) * 0.01).astype(np.float32)
    np.savez(path, allow_pickle=False, **arrays)


def xp_f32(xp: ArrayModule, a: np.ndarray) -> Array:
    return xp.asarray(a, dtype=xp.float32)


Layers = list[tuple[np.ndarray, np.ndarray]]


def read_weights(path: str | Path) -> tuple[int, Layers]:
    """``num_dense`` and the layers ``(w<i>, b<i>)`` of the ``.npz`` at ``path``; a
    ConfigError naming the file (and the array or layer) unless they make a network:
    ``num_dense`` an integer scalar from 0 to the inputs of ``w0``, each weight and bias of
    a real number type (integer or float) and finite once cast to float32, each weight a
    matrix ``(inputs, outputs)`` taking what the layer before gives, each bias of its
    weight's outputs, the last layer with one output (:func:`check_layers`)."""
    try:
        with _open_npz(path) as f:
            num_dense = f["num_dense"]
            n = sum(1 for k in f.files if re.fullmatch(r"w\d+", k))
            layers = [(f[f"w{i}"], f[f"b{i}"]) for i in range(n)]
    except (OSError, KeyError, ValueError, IndexError, TypeError) as exc:
        raise ConfigError(f"dense_file {path}: not CTR weights of hps demo ({exc})") from None
    for i, (w, b) in enumerate(layers):
        _check_values(path, f"w{i}", w)
        _check_values(path, f"b{i}", b)
    check_layers(path, layers)
    return _num_dense(path, num_dense, int(layers[0][0].shape[0])), layers


def _open_npz(path: str | Path) -> np.lib.npyio.NpzFile:
    """The archive at ``path``; a ConfigError for a file that is not one (rather than
    NumPy's advice to load it with pickle)."""
    try:
        f = np.load(path, allow_pickle=False)
    except (ValueError, zipfile.BadZipFile):
        raise ConfigError(f"dense_file {path}: not an .npz archive (numpy.savez)") from None
    if not isinstance(f, np.lib.npyio.NpzFile):  # a single array: an .npy file
        raise ConfigError(f"dense_file {path}: not an .npz archive (numpy.savez)")
    return f


def _check_values(path: str | Path, name: str, a: np.ndarray) -> None:
    """ConfigError unless ``a`` is of a real number type and finite as float32: NaN would
    fail every request as if its dense features were, infinity answer 1.0 to all."""
    if a.dtype.kind not in "iuf":  # not bool, complex, strings or objects
        raise ConfigError(
            f"dense_file {path}: {name} is of dtype {a.dtype}, not a real number type"
        )
    with np.errstate(over="ignore"):
        finite = np.isfinite(a.astype(np.float32)).all()
    if not finite:
        raise ConfigError(f"dense_file {path}: {name} holds NaN or infinity as float32")


def _num_dense(path: str | Path, value: np.ndarray, inputs: int) -> int:
    """``num_dense`` as an int; ConfigError unless an integer scalar from 0 to ``inputs``."""
    if value.ndim != 0 or value.dtype.kind not in "iu":
        raise ConfigError(f"dense_file {path}: num_dense is {value}, not an integer scalar")
    n = int(value)
    if not 0 <= n <= inputs:
        raise ConfigError(
            f"dense_file {path}: num_dense is {n}, not 0 to the {inputs} inputs of w0"
        )
    return n


def check_layers(path: str | Path, layers: Layers) -> None:
    """ConfigError unless ``layers`` chain (see :func:`read_weights`): caught when the
    weights are loaded, not by every request failing in a matrix product."""
    for i, (w, b) in enumerate(layers):
        if w.ndim != 2:
            raise ConfigError(
                f"dense_file {path}: layer {i}: w{i} has shape {w.shape}, not (inputs, outputs)"
            )
        if i and w.shape[0] != layers[i - 1][0].shape[1]:
            prev = layers[i - 1][0].shape
            raise ConfigError(
                f"dense_file {path}: layer {i}: w{i} {w.shape} takes {w.shape[0]} inputs, but "
                f"layer {i - 1} (w{i - 1} {prev}) gives {prev[1]}"
            )
        if b.shape != (w.shape[1],):
            raise ConfigError(
                f"dense_file {path}: layer {i}: b{i} has shape {b.shape}, not ({w.shape[1]},) "
                f"(the outputs of w{i} {w.shape})"
            )
    if not layers or layers[-1][0].shape[1] != 1:
        raise ConfigError(f"dense_file {path}: the last layer must have one output")


def check_dense_inputs(model: ModelConfig) -> None:
    """ConfigError unless ``model``'s CTR weights make a network (:func:`read_weights`)
    that takes ``maxnum_des_feature_per_sample`` dense features (the request-size gate
    sizes ``DES`` by that key, the network by its own) and, beside them, the tables'
    pooled rows: ``embedding_vecsize_per_table`` summed."""
    try:
        n, layers = read_weights(model.dense_file)
    except ConfigError as exc:
        raise ConfigError(f"model {model.model}: {exc}") from None
    inputs = int(layers[0][0].shape[0])
    if n != model.maxnum_des_feature_per_sample:
        raise ConfigError(
            f"model {model.model}: dense_file {model.dense_file} takes {n} dense features but "
            f"maxnum_des_feature_per_sample is {model.maxnum_des_feature_per_sample}: set it "
            f"to {n} (the request-size gate sizes DES by it)"
        )
    dims = model.embedding_vecsize_per_table
    if inputs - n != sum(dims):
        raise ConfigError(
            f"model {model.model}: dense_file {model.dense_file} takes {inputs - n} embedding "
            f"inputs beside its {n} dense features, but the tables' dimensions {dims} add up "
            f"to {sum(dims)}: give weights trained for these dimensions"
        )


class DenseNetwork:
    """The MLP of the example CTR model, loaded from its ``.npz`` weights."""

    def __init__(self, path: str | Path, device: str = "auto") -> None:
        self.num_dense, host = read_weights(path)
        self.xp = select_xp(device)
        self._host = host
        self._layers: dict[int | None, list[tuple[Array, Array]]] = {}  # per GPU (None: NumPy)
        self.input_width = host[0][0].shape[0]

    def layers(self, gpu: int | None) -> list[tuple[Array, Array]]:
        """The weights on GPU ``gpu`` (under its scope; ``None``: NumPy), placed on first use."""
        placed = self._layers.get(gpu)
        if placed is None:
            xp = np if gpu is None else self.xp
            with device_scope(xp, gpu):
                placed = [(xp_f32(xp, w), xp_f32(xp, b)) for w, b in self._host]
            self._layers[gpu] = placed
        return placed

    def __call__(self, dense: Array, pooled: Vectors) -> Array:
        """Click probabilities ``[batch]`` (host) of ``dense [batch, num_dense]`` and the
        pooled embeddings, on either side: on CuPy on the GPU of ``pooled`` (else the
        current one), to which the rest is copied (the module docstring)."""
        xp = self.xp
        if xp is np:
            return self._forward(np, None, dense, to_host(pooled))
        on_gpu = isinstance(pooled, xp.ndarray)
        gpu = gpu_of(pooled) if on_gpu else int(xp.cuda.runtime.getDevice())
        with device_scope(xp, gpu):
            return self._forward(xp, gpu, dense, xp.asarray(pooled))

    def _forward(self, xp: ArrayModule, gpu: int | None, dense: Array, emb: Vectors) -> Array:
        """The network on ``xp`` (under GPU ``gpu``'s scope on CuPy)."""
        layers = self.layers(gpu)
        x = xp.concatenate([xp.asarray(dense), emb], axis=1)
        if x.shape[1] != self.input_width:
            raise ShapeError(f"the network takes {self.input_width} inputs, got {x.shape[1]}")
        with np.errstate(all="ignore"):  # an overflow is refused below, by its result
            for i, (w, b) in enumerate(layers):
                x = x @ w + b
                if i < len(layers) - 1:
                    x = xp.maximum(x, 0)
            out = np.asarray(to_host(1.0 / (1.0 + xp.exp(-x[:, 0]))), dtype=np.float32)
        bad = ~np.isfinite(out)
        if bad.any():  # finite inputs, but +inf - inf inside the network
            raise InvalidValueError(
                f"the network's output is not a number for samples "
                f"{np.flatnonzero(bad)[:10].tolist()}: their dense features (DES) are too "
                "large for it"
            )
        return out


def pool_embeddings(
    vectors: Vectors, num_keys: np.ndarray, offsets: np.ndarray, dims: list[int]
) -> Vectors:
    """Sum the vectors of each sample within each table: ``[batch, sum(dims)]``, on the
    device ``vectors`` are on (NumPy or CuPy: a lookup answered on the GPU is pooled there).

    ``vectors`` is the flat output of ``lookup_request`` (table after table); ``offsets``
    (host) holds each table's CSR row offsets ``[tables, batch + 1]``.
    """
    xp = array_module(vectors)
    if xp is not np:  # every table and sample in one launch on the rows' GPU
        from hps.cache.device import gpu_device
        from hps.cache.gpu_request import pool_rows

        return pool_rows(gpu_device(gpu_of(vectors)), vectors, num_keys, offsets, dims)
    batch = offsets.shape[1] - 1
    out = np.zeros((batch, sum(dims)), dtype=np.float32)
    v_off = col = 0
    for t, dim in enumerate(dims):
        n = int(num_keys[t])
        rows = vectors[v_off : v_off + n * dim].reshape(n, dim)
        nonempty = np.flatnonzero(np.diff(offsets[t]) > 0)
        if n:
            # CSR segments are contiguous: empty ones consume no rows and stay zero.
            out[nonempty, col : col + dim] = np.add.reduceat(rows, offsets[t][:-1][nonempty])
        v_off += n * dim
        col += dim
    return out
