"""Names (models, tables, environment variables) are matched whole: a final newline is no
part of a name."""

from __future__ import annotations

import re

import pytest

from hps.config import parse_config
from hps.config.common import NAME_RE, from_env
from hps.errors import ConfigError
from hps.service.schemas import ModelEntry


def entry(model: str = "m", table: str = "t") -> dict[str, object]:
    return {"model": model, "embedding_table_names": [table], "embedding_vecsize_per_table": [4]}


@pytest.mark.parametrize("name", ["evil\n", "t\n", "a\nb", "\nx", "x\n\n", "evil!", ""])
def test_names_with_a_newline_or_other_characters_do_not_match(name: str) -> None:
    assert not NAME_RE.match(name)
    assert not re.search(NAME_RE.pattern, name)  # as a JSON Schema validator applies it


@pytest.mark.parametrize("name", ["m", "demo", "Wide_and-Deep_2", "0", "-_-", "m" * 128])
def test_ordinary_names_still_match(name: str) -> None:
    assert NAME_RE.match(name)
    assert parse_config({"models": [entry(name, name)]}).models[0].model == name


@pytest.mark.parametrize("model", ["evil\n", "t\n", "m" * 129])
def test_a_model_name_ending_in_a_newline_is_refused(model: str) -> None:
    with pytest.raises(ConfigError, match=r"models\[0\]\.model.*model name .* must match"):
        parse_config({"models": [entry(model=model)]})
    with pytest.raises(ValueError, match="model name .* must match"):
        ModelEntry.model_validate({**entry(model=model), "sparse_files": ["/x"]})


@pytest.mark.parametrize("table", ["evil\n", "t\n"])
def test_a_table_name_ending_in_a_newline_is_refused(table: str) -> None:
    with pytest.raises(ConfigError, match=r"embedding_table_names: invalid table name"):
        parse_config({"models": [entry(table=table)]})
    with pytest.raises(ValueError, match="embedding_table_names: invalid table name"):
        ModelEntry.model_validate({**entry(table=table), "sparse_files": ["/x"]})


def test_an_environment_variable_name_ending_in_a_newline_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HPS_TEST_SECRET", "s3cret")
    assert from_env("HPS_TEST_SECRET", "x") == "s3cret"
    with pytest.raises(ValueError, match="is not an environment variable name"):
        from_env("HPS_TEST_SECRET\n", "x")
