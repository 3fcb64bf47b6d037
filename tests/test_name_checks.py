"""registry.name_checks: registry names (the rule the stores and the OpenAPI pattern share)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.errors import InvalidRegistryName
from registry.name_checks import REGISTRY_NAME_PATTERN, validate_registry_name


@pytest.mark.parametrize("name", ["demo", "bfcl-v3", "my_reg.2", "A", "a" * 128, "a..b", "_x", "-"])
def test_good_registry_names(name: str) -> None:
    assert validate_registry_name(name) == name


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("", "empty"),
        (".", "reserved"),
        ("..", "reserved"),
        (".hidden", "must not start with '.'"),  # stores keep their own files under dot names
        ("...", "must not start with '.'"),
        ("../x", "'/'"),
        ("a/b", "'/'"),
        ("a b", "' '"),
        ("a\\b", "'\\\\'"),
        ("é", "'é'"),
        ("a\n", "'\\n'"),
        ("a" * 129, "129"),
    ],
)
def test_bad_registry_names(name: str, words: str) -> None:
    with pytest.raises(InvalidRegistryName) as info:
        validate_registry_name(name)
    assert words in info.value.message
    assert info.value.details == [{"field": "registry", "message": info.value.message}]


def test_registry_name_not_a_string() -> None:
    with pytest.raises(InvalidRegistryName):
        validate_registry_name(None)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=140) | st.text(alphabet="ab._-/\\\u2024\uff0e", max_size=8))
def test_registry_names_are_accepted_exactly_as_the_documented_pattern_says(name: str) -> None:
    # The OpenAPI schema publishes REGISTRY_NAME_PATTERN; the validator must agree with it.
    documented = re.fullmatch(REGISTRY_NAME_PATTERN, name) is not None
    try:
        validate_registry_name(name)
    except InvalidRegistryName as exc:
        assert not documented, name
        assert exc.details == [{"field": "registry", "message": exc.message}]
    else:
        assert documented, name
        assert "/" not in name and "\\" not in name and not name.startswith(".")
