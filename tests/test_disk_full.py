"""A full or failing disk (local mode): writes and feedback answer 507 (no space) or 503 (other
I/O errors) with a clear error type, nothing is torn on disk, and the registries keep their
previous versions in memory and on disk. Injected errors, and a real 2 MiB tmpfs."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from registry.errors import StorageFull, StorageUnavailable
from registry.fsio import append_whole, storage_error
from registry.store.local import LocalStore
from tests.conftest import weather_tools


def refuse(code: int):
    def fail(*_args, **_kwargs):
        raise OSError(code, os.strerror(code))

    return fail


def half_then(code: int):
    """An ``os.write`` that writes half its buffer, then fails: a torn record if not cut back."""
    real = os.write
    calls: list[int] = []

    def write(fd, data):
        if not calls:
            calls.append(1)
            return real(fd, bytes(data[: max(1, len(data) // 2)]))
        raise OSError(code, os.strerror(code))

    return write


def test_os_errors_become_domain_errors():
    full = storage_error(OSError(errno.ENOSPC, "No space left on device", "/secret/path"), "saving x")
    assert isinstance(full, StorageFull) and full.error_type == "storage_full"
    assert "no space left" in full.message and "/secret" not in full.message
    assert full.details == {"operation": "saving x", "errno": "ENOSPC"}
    quota = storage_error(OSError(errno.EDQUOT, "Disk quota exceeded"), "saving x")
    assert isinstance(quota, StorageFull)
    other = storage_error(OSError(errno.EIO, "Input/output error"), "saving x")
    assert type(other) is StorageUnavailable and other.error_type == "storage_unavailable"


def test_append_is_whole_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "log"
    path.write_bytes(b"first record\n")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        monkeypatch.setattr(os, "write", half_then(errno.ENOSPC))
        with pytest.raises(OSError):
            append_whole(fd, b"second record, torn half way\n", 13)
        monkeypatch.undo()
        assert path.read_bytes() == b"first record\n"  # the half record was cut back off
        assert append_whole(fd, b"third\n", 13) == 19
    finally:
        os.close(fd)
    assert path.read_bytes() == b"first record\nthird\n"


@pytest.mark.parametrize("fresh_file", [False, True])
def test_embedding_cache_never_keeps_a_torn_record(tmp_path, monkeypatch, caplog, fresh_file):
    store = LocalStore(tmp_path)
    vec = {f"{i:064x}": np.full(8, i, dtype=np.float32) for i in range(1, 4)}
    if not fresh_file:
        store.put_embeddings("m", {k: vec[k] for k in list(vec)[:1]})
    file = next((tmp_path / "embeddings").glob("*.bin"), None)
    before = file.read_bytes() if file else b""
    monkeypatch.setattr(os, "write", half_then(errno.ENOSPC))
    store.put_embeddings("m", vec)  # a cache: logged, not raised
    monkeypatch.undo()
    assert "not stored" in caplog.text
    file = next((tmp_path / "embeddings").glob("*.bin"))
    assert file.read_bytes() == before  # cut back to the previous length
    store.put_embeddings("m", vec)  # offered again: now stored
    reopened = LocalStore(tmp_path)
    assert set(reopened.get_embeddings("m", list(vec))) == set(vec)
    assert (file.stat().st_size - 4) % (32 + 8 * 4) == 0  # whole records only


# -- over HTTP --------------------------------------------------------------------------------


def snapshot_of_disk(data_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(data_dir)): p.read_bytes()
        for p in sorted(data_dir.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize(
    ("code", "status", "error_type"),
    [(errno.ENOSPC, 507, "storage_full"), (errno.EDQUOT, 507, "storage_full"), (errno.EIO, 503, "storage_unavailable")],
)
def test_writes_and_feedback_on_a_failing_disk(client, settings, monkeypatch, code, status, error_type):
    assert client.put("/registries/r", json=weather_tools()).status_code == 200
    served = client.post("/shortlist", json={"registry": "r", "query": "weather in Oslo", "k": 2}).json()
    before = snapshot_of_disk(settings.data_dir)

    monkeypatch.setattr(os, "fsync", refuse(code))  # what a full disk answers at the latest
    attempts = [
        client.post("/registries/r/tools", json={"tools": [{"name": "extra", "description": "An extra tool."}]}),
        client.put("/registries/r", json=weather_tools()[:2]),
        client.put("/registries/new", json=weather_tools()),
        client.delete("/registries/r/tools/send_email"),
        client.post("/feedback", json={"shortlist_id": served["shortlist_id"], "used": ["get_weather"]}),
    ]
    for response in attempts:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["type"] == error_type
        assert "nothing was changed" in error["message"] and str(settings.data_dir) not in error["message"]
    # reads are still answered, from the previous version
    got = client.get("/registries/r").json()
    assert (got["version"], len(got["tools"])) == (1, 4)
    assert client.get("/registries/new").status_code == 404
    again = client.post("/shortlist", json={"registry": "r", "query": "weather in Oslo", "k": 2}).json()
    assert [t["name"] for t in again["tools"]] == [t["name"] for t in served["tools"]]
    monkeypatch.undo()

    after = {k: v for k, v in snapshot_of_disk(settings.data_dir).items() if "/.tmp-" not in k}
    assert after == before  # byte for byte: no torn record, no half version, no leftover
    assert not list(settings.data_dir.rglob(".tmp-*"))
    # once the disk takes writes again, the same requests go through (the feedback is not a resend)
    feedback = client.post("/feedback", json={"shortlist_id": served["shortlist_id"], "used": ["get_weather"]})
    assert feedback.status_code == 200 and feedback.json().get("duplicate") in (False, None)
    assert client.post("/registries/r/tools", json={"tools": [{"name": "extra", "description": "x"}]}).json()[
        "version"
    ] == 2


# -- a real full device ------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 2 MiB tmpfs (root only: CI runs as root). Without mount rights the test fails loudly
    rather than pretending: inject ENOSPC instead (the tests above)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    assert done.returncode == 0, f"cannot mount a tmpfs (needs root): {done.stderr.strip()}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path, leave: int) -> Path:
    """A filler file taking all but about ``leave`` bytes of the device."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    filler = directory / "filler"
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(0, free - leave))
    return filler


def test_a_real_full_tmpfs(small_disk, make_client):
    big = [
        {"name": f"tool_{i}", "description": f"Tool number {i}. " + "word " * 200,
         "parameters": {"type": "object", "properties": {}}}
        for i in range(40)
    ]
    with make_client(data_dir=small_disk / "data") as client:
        assert client.put("/registries/r", json=big).status_code == 200
        served = client.post("/shortlist", json={"registry": "r", "query": "tool number 3", "k": 2}).json()
        filler = fill(small_disk, leave=4096)
        before = snapshot_of_disk(small_disk / "data")
        more = [{"name": f"more_{i}", "description": "More text. " * 100} for i in range(20)]
        r = client.post("/registries/r/tools", json={"tools": more})
        assert r.status_code == 507 and r.json()["error"]["type"] == "storage_full", r.text
        for _ in range(200):  # feedback lines are small: fill the last bytes, then it refuses
            s = client.post("/shortlist", json={"registry": "r", "query": "tool number 3", "k": 2}).json()
            f = client.post("/feedback", json={"shortlist_id": s["shortlist_id"], "used": ["tool_3"]})
            if f.status_code != 200:
                break
        assert f.status_code == 507 and f.json()["error"]["type"] == "storage_full", f.text
        assert client.get("/registries/r").json()["version"] == 1
        after = snapshot_of_disk(small_disk / "data")
        assert {k: v for k, v in after.items() if "feedback" not in k} == {
            k: v for k, v in before.items() if "feedback" not in k
        }
        log = small_disk / "data" / "feedback" / "events.jsonl"
        assert log.read_bytes().endswith(b"\n")  # every line whole
        emb = next((small_disk / "data" / "embeddings").glob("*.bin"))
        dim = int.from_bytes(emb.read_bytes()[:4], "little")
        assert (emb.stat().st_size - 4) % (32 + 4 * dim) == 0  # whole embedding records only
        filler.unlink()
        r = client.post("/registries/r/tools", json={"tools": more})
        assert r.status_code == 200 and r.json()["version"] == 2
        ok = client.post("/feedback", json={"shortlist_id": served["shortlist_id"], "used": ["tool_3"]})
        assert ok.status_code == 200
