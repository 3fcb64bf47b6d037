"""docs/configuration.md is generated from the settings' field descriptions; a stale copy fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from registry.settings import ServingArgs, Settings, SettingsGroup
from registry.settings_doc import COMMAND, DOC, render, rows
from service.settings import ServiceSettings
from service.settings_doc import CLASSES, main


def test_the_committed_configuration_doc_is_the_generated_one():
    assert DOC.read_text(encoding="utf-8") == render(CLASSES), f"docs/configuration.md is stale: run `{COMMAND}`"


def test_every_field_is_documented_once_with_its_description():
    text = render(CLASSES)
    for name, info in ServiceSettings.model_fields.items():
        assert text.count(f"| `SHORTLIST_{name.upper()}` |") == 1, name
        assert info.description, f"{name} has no description for docs/configuration.md"
        assert info.description.replace("|", "\\|").replace("<", "\\<") in text


def test_the_domain_settings_hold_no_field_of_the_web_layer():
    web = {"host", "port", "max_body_bytes", "max_feedback_body_bytes", "allowed_hosts", "worker_threads",
           "admin_token", "query_token", "mcp_max_streams", "mcp_stream_idle_seconds", "default_registry",
           "metrics_max_registries", "log_format"}
    assert web.isdisjoint(Settings.model_fields)
    assert web <= set(ServiceSettings.model_fields)  # same names, so the same SHORTLIST_* variables


class _First(SettingsGroup):
    """First concern: what comes first."""

    port: int = Field(8080, ge=1, le=65535, description="A port.")
    mode: str = Field("a|b", description="Pipes | escaped.")


class _Second(SettingsGroup):
    """Second concern: the rest."""

    path: Path | None = Field(None, description="Off when unset.")


class _Example(_First, _Second, BaseSettings):
    """An example class."""

    model_config = SettingsConfigDict(env_prefix="EX_", frozen=False)


def test_rows_carry_group_default_and_bounds():
    assert rows(_Example) == [
        ("_First", "`EX_PORT`", "`8080`", "A port. Allowed: >= 1, <= 65535."),
        ("_First", "`EX_MODE`", "`a\\|b`", "Pipes \\| escaped."),
        ("_Second", "`EX_PATH`", "unset", "Off when unset."),
    ]
    text = render((_Example,))
    assert "### First concern (`_First`)" in text and "### Second concern (`_Second`)" in text
    assert "What comes first." in text


def test_a_group_handed_to_a_part_is_a_frozen_copy_of_its_fields_alone():
    serving = ServingArgs.of(Settings(fixed_k=7))
    assert type(serving) is ServingArgs and serving.fixed_k == 7
    assert not hasattr(serving, "data_dir") and not hasattr(serving, "learning")  # no other concern
    with pytest.raises(ValidationError):
        serving.fixed_k = 3


def test_check_fails_on_a_stale_file_and_names_the_command(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    out.write_text(render(CLASSES).replace("Address the HTTP server binds.", "Old words."), encoding="utf-8")
    assert main(["--check", "--out", str(out)]) == 1
    assert COMMAND in capsys.readouterr().err
    assert main(["--out", str(out)]) == 0
    assert main(["--check", "--out", str(out)]) == 0
