"""The asyncio client of the tool-shortlist HTTP API (:class:`AsyncShortlistClient`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any, Self

import httpx

from tool_shortlist_client._base import (
    JOB_POLL_SECONDS,
    _Base,
    _Equivalents,
    _is_job,
    _job_call,
    _job_result,
)
from tool_shortlist_client._core import (
    DEFAULT_URL,
    Call,
    CallSpec,
    ToolsSource,
    registry_path,
)
from tool_shortlist_client.errors import (
    TransportError,
    error_from_response,
)
from tool_shortlist_client.models import (
    FeedbackResult,
    Registry,
    RegistryInfo,
    Shortlist,
    ToolReport,
)


class AsyncShortlistClient(_Base):
    """The asyncio twin of :class:`ShortlistClient` (same methods, awaited)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        http_client: httpx.AsyncClient | None = None,
        **options: Any,
    ) -> None:
        super().__init__(base_url, **options)
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=self.timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def _send(self, call: Call) -> httpx.Response:
        request = self._request(call)
        policy = self.retry_policy
        attempt = 0
        while True:
            try:
                response = await self._http.request(**request, timeout=self.timeout)
            except httpx.TransportError as exc:
                if not policy.retry_transport(exc, call, attempt):
                    raise TransportError(f"{call.method} {call.path}: {exc!r}") from exc
                await asyncio.sleep(policy.delay(attempt))
            else:
                if response.is_success:
                    return response
                if not policy.retry_status(response, attempt):
                    raise error_from_response(response)
                await asyncio.sleep(policy.delay(attempt, response))
            attempt += 1

    async def _json(self, call: Call) -> Any:
        return (await self._send(call)).json()

    async def shortlist(
        self,
        query: str | None = None,
        *,
        queries: Iterable[str] | None = None,
        allowed_tools: Iterable[str] | None = None,
        registry: str | None = None,
        k: int | None = None,
        max_k: int | None = None,
        policy: str | None = None,
        scorer: str | None = None,
        depth_bias: float | None = None,
        allow_empty: bool = False,
        explain: bool = False,
        called: Sequence[str] = (),
    ) -> Shortlist:
        call = self._shortlist_call(
            query, registry, k=k, max_k=max_k, policy=policy, scorer=scorer,
            depth_bias=depth_bias, allow_empty=allow_empty, explain=explain,
            queries=queries, allowed_tools=allowed_tools, called=called,
        )  # fmt: skip
        return Shortlist.model_validate(await self._json(call))

    async def feedback(
        self,
        shortlist: str | Shortlist,
        used: Iterable[str],
        *,
        success: bool | None = None,
        calls: Iterable[CallSpec] | None = None,
    ) -> FeedbackResult:
        call = self._feedback_call(shortlist, used, success=success, calls=calls)
        return FeedbackResult.model_validate(await self._json(call))

    async def put_registry(
        self, registry: str, tools: ToolsSource, *, equivalents: _Equivalents = None
    ) -> RegistryInfo:
        call = self._put_call(registry, tools, equivalents)
        return await self._written(registry, await self._json(call))

    upload_registry = put_registry

    async def upsert_tools(
        self, registry: str, tools: ToolsSource, *, equivalents: _Equivalents = None
    ) -> RegistryInfo:
        call = self._upsert_call(registry, tools, equivalents)
        return await self._written(registry, await self._json(call))

    async def _written(self, registry: str, data: dict[str, Any]) -> RegistryInfo:
        """The write's result; a large upload answered 202 is polled until its job ends."""
        while _is_job(data):
            if data["state"] not in ("queued", "running"):
                break
            await asyncio.sleep(JOB_POLL_SECONDS)
            data = await self._json(_job_call(registry, data["job"]))
        return _job_result(data)

    async def list_registries(self) -> list[RegistryInfo]:
        data = await self._json(Call("GET", "/registries", "read", idempotent=True))
        return [RegistryInfo.model_validate(item) for item in data["registries"]]

    async def get_registry(self, registry: str) -> Registry:
        call = Call("GET", registry_path(registry), "read", idempotent=True)
        return Registry.model_validate(await self._json(call))

    async def report(self, registry: str) -> ToolReport:
        call = Call("GET", registry_path(registry, "report"), "read", idempotent=True)
        return ToolReport.model_validate(await self._json(call))

    efficiency_report = report

    async def delete_registry(self, registry: str) -> None:
        await self._send(Call("DELETE", registry_path(registry), "admin", idempotent=True))

    async def delete_tool(self, registry: str, name: str) -> None:
        await self._send(self._delete_tool_call(registry, name))

    async def ready(self) -> bool:
        try:
            response = await self._http.get(self.base_url + "/readyz", timeout=self.timeout)
        except httpx.TransportError:
            return False
        return response.is_success

    async def wait_ready(self, timeout: float = 60.0, interval: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not await self.ready():
            if time.monotonic() > deadline:
                raise TransportError(f"{self.base_url} not ready after {timeout} s")
            await asyncio.sleep(interval)

