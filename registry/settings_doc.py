"""docs/configuration.md, written from the settings' own field descriptions.

The reference table used to be copied by hand into the README and drifted (two fields were
missing). Now the fields are the one source: each row is a field's environment variable, its
default, its bounds and its ``description``, under the concern group that declares it
(:class:`registry.settings.SettingsGroup`: the group a part is handed). The command that writes
the file lives with the web layer, which knows both the domain's and its own settings::

    python -m service.settings_doc            # rewrite docs/configuration.md
    python -m service.settings_doc --check    # exit 1 if it is stale

``tests/test_settings_doc.py`` fails when the committed file differs.
"""

from __future__ import annotations

import inspect
from enum import Enum
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from registry.settings import SettingsGroup

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
COMMAND = "python -m service.settings_doc"


def own_fields(group: type[BaseModel]) -> list[str]:
    """The fields ``group`` declares itself (not those of the groups it builds on)."""
    return [name for name in vars(group).get("__annotations__", {}) if name in group.model_fields]


def groups(cls: type[BaseModel], skip: tuple[type, ...] = ()) -> list[type[SettingsGroup]]:
    """The concern groups ``cls`` is made of (in its MRO order), bar those in ``skip``."""
    return [
        base
        for base in cls.__mro__
        if issubclass(base, SettingsGroup) and base not in skip and own_fields(base)
    ]


def title(group: type) -> tuple[str, str]:
    """``(title, explanation)`` from a group's docstring, ``"Title: explanation."``."""
    doc = inspect.getdoc(group) or group.__name__
    head, _, rest = doc.partition(":")
    return (head.strip(), rest.strip()) if rest else (group.__name__, doc)


def _value(value: Any) -> str:
    if value is None or value == ():
        return "unset"
    if isinstance(value, SecretStr):
        return "set"
    if isinstance(value, bool):
        value = "true" if value else "false"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path) and value.is_relative_to(ROOT):
        value = value.relative_to(ROOT)  # artifacts beside the packages: not this checkout's path
    elif isinstance(value, Path) and not value.is_absolute():
        value = f"./{value}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`".replace("|", "\\|")  # a pipe would end the table cell


def _bounds(info: FieldInfo) -> str:
    low = high = ""
    for meta in info.metadata:
        if isinstance(meta, Ge):
            low = f">= {meta.ge}"
        elif isinstance(meta, Gt):
            low = f"> {meta.gt}"
        elif isinstance(meta, Le):
            high = f"<= {meta.le}"
        elif isinstance(meta, Lt):
            high = f"< {meta.lt}"
        elif isinstance(meta, MinLen):
            low = f"length >= {meta.min_length}"
        elif isinstance(meta, MaxLen):
            high = f"length <= {meta.max_length}"
    return ", ".join(b for b in (low, high) if b)


def _choices(annotation: Any) -> str:
    """``'a' | 'b'`` for a Literal field (optional or not), else empty."""
    for arg in (annotation, *get_args(annotation)):
        if get_origin(arg) is Literal:
            return " \\| ".join(f"`{choice}`" for choice in get_args(arg))
    return ""


def rows(cls: type[BaseModel], skip: tuple[type, ...] = ()) -> list[tuple[str, str, str, str]]:
    """``(section, variable, default, meaning)`` per field, group by group (``section``: the
    group's class name; a class made of no groups gives one unnamed section)."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    made_of = groups(cls)
    parts = [(g.__name__, own_fields(g)) for g in made_of if g not in skip]
    if not made_of:
        parts = [("", list(cls.model_fields))]
    found = []
    for section, names in parts:
        for name in names:
            info = cls.model_fields[name]
            allowed = " ".join(part for part in (_choices(info.annotation), _bounds(info)) if part)
            # Markdown would end the cell at a pipe and read <data_dir> as an HTML tag.
            meaning = (info.description or "").replace("|", "\\|").replace("<", "\\<")
            if allowed:
                meaning += f" Allowed: {allowed}."
            found.append((section, f"`{(prefix + name).upper()}`", _value(info.default), meaning))
    return found


def render(classes: tuple[type[BaseModel], ...]) -> str:
    """The whole of docs/configuration.md for ``classes``; a class that extends another of them
    lists only the groups it adds."""
    lines = [
        "# Configuration",
        "",
        f"<!-- Generated by `{COMMAND}` from the settings' field descriptions: edit those, then run it. -->",
        "",
        "Every setting is an environment variable, read once at start-up (an unknown `SHORTLIST_*`",
        "variable is ignored; a value out of its bounds stops the start, naming the field).",
        "`make run` honours them all, e.g. `SHORTLIST_PORT=9000 make run`. Each section is one",
        "concern's group: the class named in it is what the part reading those settings is handed.",
    ]
    for cls in classes:
        seen = tuple(g for base in classes if base is not cls and issubclass(cls, base) for g in groups(base))
        lines += ["", f"## `{cls.__module__}.{cls.__name__}`", ""]
        doc = inspect.getdoc(cls)
        if doc:
            lines += [doc, ""]
        by_name = {g.__name__: g for g in groups(cls, seen)}
        section = None
        for name, variable, default, meaning in rows(cls, seen):
            if name != section:
                section = name
                group = by_name.get(name)
                heading, explanation = title(group) if group is not None else (name or "Settings", "")
                label = f" (`{name}`)" if group is not None else ""
                lines += ["", f"### {heading[:1].upper() + heading[1:]}{label}", ""]
                if explanation:
                    lines += [explanation[:1].upper() + explanation[1:], ""]
                lines += ["| variable | default | meaning |", "|---|---|---|"]
            lines.append(f"| {variable} | {default} | {meaning} |")
    return "\n".join(line.rstrip() for line in lines).replace("\n\n\n", "\n\n") + "\n"
