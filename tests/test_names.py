"""registry.names: registry names (the rule the stores and the OpenAPI pattern share)."""

from __future__ import annotations

import pytest

from registry.errors import InvalidRegistryName
from registry.names import validate_registry_name


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
