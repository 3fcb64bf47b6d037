"""A data directory that cannot be written at start: `shortlist serve` exits with one line
naming the file and the setting, not a traceback. A real read-only tmpfs (root, as CI runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server import ROOT, free_port


@pytest.fixture
def read_only_data(tmp_path: Path) -> Iterator[Path]:
    """A data directory left by an earlier run (an interrupted compaction's file included),
    on a tmpfs then remounted read-only."""
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"cannot mount a tmpfs (needs root): {done.stderr.strip()}"
    try:
        data = mount / "data"
        for folder in ("feedback", "registries", "embeddings", "learning", "policies", "jobs/write"):
            (data / folder).mkdir(parents=True)
        (data / "feedback" / "events.jsonl").write_bytes(b"")
        (data / "feedback" / "events.jsonl.compacting").write_bytes(b"{}\n")
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        yield data
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_read_only_data_dir_at_start_is_one_line(read_only_data: Path, minilm_cache: Path):
    env = dict(os.environ, SHORTLIST_DATA_DIR=str(read_only_data), SHORTLIST_PORT=str(free_port()),
               SHORTLIST_DEMO_REGISTRY="", SHORTLIST_EMBEDDER_CACHE_DIR=str(minilm_cache))
    done = subprocess.run([sys.executable, "-m", "service.cli", "serve"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, output
    assert "Traceback" not in output
    assert len(output.splitlines()) == 1, output
    assert "cannot start: Read-only file system" in output and "SHORTLIST_DATA_DIR" in output
