"""docs/configuration.md is generated from the settings' field descriptions; a stale copy fails here."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from registry.settings import Settings
from registry.settings_doc import COMMAND, DOC, main, render, rows


def test_the_committed_configuration_doc_is_the_generated_one():
    assert DOC.read_text(encoding="utf-8") == render(), f"docs/configuration.md is stale: run `{COMMAND}`"


def test_every_field_is_documented_with_its_description():
    text = render()
    for name, info in Settings.model_fields.items():
        assert f"`SHORTLIST_{name.upper()}`" in text
        assert info.description, f"Settings.{name} has no description for docs/configuration.md"
        assert info.description.replace("|", "\\|").replace("<", "\\<") in text


class _Example(BaseSettings):
    """An example class."""

    model_config = SettingsConfigDict(env_prefix="EX_")

    # -- first concern ------------------------------------------------------------------------
    port: int = Field(8080, ge=1, le=65535, description="A port.")
    mode: str = Field("a|b", description="Pipes | escaped.")

    # -- second concern -----------------------------------------------------------------------
    path: Path | None = Field(None, description="Off when unset.")


def test_rows_carry_section_default_and_bounds():
    assert rows(_Example) == [
        ("first concern", "`EX_PORT`", "`8080`", "A port. Allowed: >= 1, <= 65535."),
        ("first concern", "`EX_MODE`", "`a\\|b`", "Pipes \\| escaped."),
        ("second concern", "`EX_PATH`", "unset", "Off when unset."),
    ]
    text = render((_Example,))
    assert "### First concern" in text and "### Second concern" in text


def test_check_fails_on_a_stale_file_and_names_the_command(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    out.write_text(render().replace("Address the HTTP server binds.", "Old words."), encoding="utf-8")
    assert main(["--check", "--out", str(out)]) == 1
    assert COMMAND in capsys.readouterr().err
    assert main(["--out", str(out)]) == 0
    assert main(["--check", "--out", str(out)]) == 0
