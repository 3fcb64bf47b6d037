"""Every test file is of one kind (unit, api, e2e), and the kinds are the markers pytest knows."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.kinds import KINDS, kind_of

TESTS = Path(__file__).resolve().parent


def test_every_test_file_is_of_exactly_one_kind():
    files = {path.stem for path in TESTS.glob("test_*.py")}
    unclassified = sorted(name for name in files if kind_of(name) is None)
    assert unclassified == [], "add them to tests/kinds.py"
    twice = sorted(name for name in files if sum(name in modules for modules in KINDS.values()) > 1)
    assert twice == []
    gone = sorted(set().union(*KINDS.values()) - files)
    assert gone == [], "tests/kinds.py names files that do not exist"


def test_the_kinds_are_registered_markers():
    config = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))
    markers = {line.split(":")[0] for line in config["tool"]["pytest"]["ini_options"]["markers"]}
    assert set(KINDS) <= markers


def test_each_collected_test_carries_its_kind(request):
    assert request.node.get_closest_marker("unit") is not None  # this file is a unit file
    assert request.node.get_closest_marker("e2e") is None
