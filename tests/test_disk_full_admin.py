"""Admin writes other than registry writes on a data directory that cannot be written: the
learning switch, the learning wipe and a policy activation answer 507 (no space) or 503 (other
I/O errors) with one clear message, like registry writes, never a 500."""

from __future__ import annotations

import errno
import os

import pytest

from tests.conftest import weather_tools
from tests.test_disk_full import refuse

JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("code", "status", "error_type"),
    [(errno.ENOSPC, 507, "storage_full"), (errno.EROFS, 503, "storage_unavailable"),
     (errno.EPERM, 503, "storage_unavailable")],
)
def test_learning_and_activation_writes_on_a_failing_disk(client, settings, monkeypatch, code, status, error_type):
    assert client.put("/registries/r", json=weather_tools()).status_code == 200
    before = client.get("/registries/r/learning").json()
    monkeypatch.setattr(os, "fsync", refuse(code))
    monkeypatch.setattr(os, "replace", refuse(code))
    attempts = [
        client.put("/registries/r/learning", json={"enabled": not before["enabled"]}),
        client.delete("/registries/r/learning"),
        client.post("/registries/r/policies/default/activate", headers=JSON),
    ]
    monkeypatch.undo()
    for response in attempts:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["type"] == error_type, error
        assert str(settings.data_dir) not in error["message"]
    assert client.get("/registries/r/learning").json()["enabled"] == before["enabled"]
