"""Request limits checked by the models (docs/security.md, row 4): keys over all rows, CTR samples,
non-finite features. The request-size gate in front of them: test_gate.py."""

from __future__ import annotations

import numpy as np
import pytest

from hps.errors import RequestError

pytestmark = pytest.mark.integration

I64, I32 = np.int64, np.int32


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_keys_over_all_rows_are_bounded(triton, protocol: str) -> None:
    keys = np.tile(triton.data["emb.a"][0][:200], (2, 1))  # 200 a-keys per row, limit 256
    with triton.client(protocol) as client:
        with pytest.raises(RequestError, match=r"emb.a: 400 keys over the 2 rows .* limit of 256"):
            client.infer("emb", {"KEYS": keys, "NUMKEYS": np.array([[200, 0, 0]] * 2, I32)})
        huge = np.zeros((1, 1_000_000), I64)
        with pytest.raises(RequestError, match="1,000,000 keys per row exceed the 448"):
            client.infer("emb", {"KEYS": huge, "NUMKEYS": np.array([[1_000_000, 0, 0]], I32)})
        rows = np.zeros((65, 1), I64)
        with pytest.raises(RequestError, match="batch-size must be <= 64"):
            client.infer("emb", {"KEYS": rows, "NUMKEYS": np.array([[1, 0, 0]] * 65, I32)})
        out = client.infer(
            "emb", {"KEYS": keys[:, :128], "NUMKEYS": np.array([[128, 0, 0]] * 2, I32)}
        )
    np.testing.assert_array_equal(out.reshape(2, 128, 4)[1], triton.data["emb.a"][1][:128])


def ctr_inputs(samples: int, dense: np.ndarray | None = None) -> dict[str, np.ndarray]:
    return {
        "DES": np.zeros((1, samples * 5), np.float32) if dense is None else dense,
        "CATCOLUMN": np.zeros((1, 3 * samples), I64),
        "ROWINDEX": np.tile(np.arange(samples + 1, dtype=I32), 3)[None],
    }


def test_ctr_model_honours_max_batch_size_and_finite_features(triton) -> None:
    with triton.client("grpc") as client:
        assert client.infer("ctr_ctr", ctr_inputs(64)).shape == (1, 64)
        with pytest.raises(
            RequestError, match="65 samples exceed the model's max_batch_size of 64"
        ):
            client.infer("ctr_ctr", ctr_inputs(65))
        for bad in (np.nan, np.inf):
            dense = np.zeros((1, 10), np.float32)
            dense[0, 7] = bad
            with pytest.raises(RequestError, match="InvalidValueError: DES has 1 NaN or infinite"):
                client.infer("ctr_ctr", ctr_inputs(2, dense))
