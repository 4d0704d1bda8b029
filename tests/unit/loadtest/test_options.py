"""The reader mix: weights, the CTR reader dropped where no CTR model is served."""

from __future__ import annotations

import re

import pytest

from hps.errors import ConfigError
from hps.loadtest.options import reader_mix, weights


def test_the_mix_keeps_its_readers_and_drops_ctr_when_not_served() -> None:
    assert weights("grpc=4,http,ctr=1") == {"grpc": 4, "http": 1, "ctr": 1}
    assert reader_mix("grpc=4,http=2,ctr=1,bad=1", ctr=True) == "grpc=4,http=2,ctr=1,bad=1"
    assert reader_mix("grpc=4,ctr=1", ctr=False) == "grpc=4"


@pytest.mark.parametrize(
    ("mix", "ctr", "message"),
    [
        ("", True, "--mix '' leaves no reader; give at least one of grpc, http, ctr, bad"),
        ("grpc=0,http=0", True, "leaves no reader"),
        ("ctr=1", False, "--mix 'ctr=1' leaves no reader (ctr dropped: no <model>_ctr)"),
        ("grpc=1,admin=1", True, "unknown reader 'admin'"),
    ],
)
def test_a_mix_without_a_reader_is_refused(mix: str, ctr: bool, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        reader_mix(mix, ctr)
