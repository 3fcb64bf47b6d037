"""The calls ``bench/learning_curve.py`` makes on the core, over HTTP to a real server
(``--http``): the same stream, feedback, refits and evaluation through the public routes.

A server has one exploration share for every registry (``SHORTLIST_EXPLORE_SHARE``, set at
start), so the HTTP run cannot switch exploration off for evaluation or on for refitting
configurations the way the in-process run does: it runs every configuration at that share
(``--explore``, 0 by default over HTTP) and says so in its results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx

from registry.request import ShortlistRequest

REFIT_TIMEOUT = 1800.0


@dataclass
class _Tool:
    name: str


@dataclass
class _Result:
    shortlist_id: str
    tools: list[_Tool]
    policy_version: str


@dataclass
class HttpCore:
    """What the learning curve calls on ``registry.core.Shortlister``, over HTTP at ``url``."""

    url: str
    client: httpx.Client = field(init=False)
    _tools: dict[str, list[str]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.url, timeout=120.0)
        self.policies = SimpleNamespace(refit=self._refit)

    def _ok(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise RuntimeError(f"{response.request.method} {response.request.url}: {response.status_code} {response.text[:300]}")
        return response.json() if response.content else None

    def put_registry(self, registry: str, tools: list[dict[str, Any]]) -> None:
        response = self.client.put(f"/registries/{registry}", json={"tools": tools})
        self._ok(response)
        if response.status_code == 202:  # a large upload: poll its job until it is final
            while (job := self._ok(self.client.get(response.headers["Location"])))["state"] in ("queued", "running"):
                time.sleep(0.5)
            if job["state"] != "done":
                raise RuntimeError(f"upload of {registry!r}: {job}")
        self._tools[registry] = [str(t.get("name") or t.get("function", {}).get("name")) for t in tools]

    def snapshot(self, registry: str) -> Any:
        return SimpleNamespace(tools=[_Tool(n) for n in self._tools[registry]])

    def set_learning(self, registry: str, enabled: bool) -> None:
        self._ok(self.client.put(f"/registries/{registry}/learning", json={"enabled": enabled}))

    def wipe_learning(self, registry: str) -> None:
        self._ok(self.client.delete(f"/registries/{registry}/learning"))

    def profile_weight(self, registry: str) -> float:
        return float(self._ok(self.client.get(f"/registries/{registry}/learning"))["profile_weight"])

    def memory_similarity(self, registry: str) -> float | None:
        value = self._ok(self.client.get(f"/registries/{registry}/learning")).get("similarity")
        return None if value is None else float(value)

    def shortlist(self, request: ShortlistRequest, caller: str | None = None) -> _Result:
        body: dict[str, Any] = {"registry": request.registry, "query": request.query}
        if request.k is not None:
            body["k"] = request.k
        headers = {"X-Caller-Id": caller} if caller else {}
        data = self._ok(self.client.post("/shortlist", json=body, headers=headers))
        return _Result(data["shortlist_id"], [_Tool(t["name"]) for t in data["tools"]], data["policy_version"])

    def feedback(self, shortlist_id: str, used: list[str], success: bool, caller: str | None = None) -> None:
        headers = {"X-Caller-Id": caller} if caller else {}
        body = {"shortlist_id": shortlist_id, "used": used, "success": success}
        self._ok(self.client.post("/feedback", json=body, headers=headers))

    def _refit(self, registry: str) -> Any:
        response = self.client.post(f"/registries/{registry}/policies/refit", json={}, timeout=REFIT_TIMEOUT)
        job = self._ok(response)
        return SimpleNamespace(**{k: job.get(k) for k in ("state", "reason", "version", "active", "estimate")})

    def close(self) -> None:
        self.client.close()
