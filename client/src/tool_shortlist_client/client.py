"""Sync and async clients of the tool-shortlist HTTP API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Self

import httpx

from tool_shortlist_client._core import (
    DEFAULT_TIMEOUT,
    DEFAULT_URL,
    Call,
    CallSpec,
    RetryPolicy,
    Tokens,
    ToolsSource,
    feedback_body,
    registry_path,
    shortlist_body,
    tools_body,
)
from tool_shortlist_client.errors import (
    APIError,
    TransportError,
    error_from_job,
    error_from_response,
)
from tool_shortlist_client.models import (
    FeedbackResult,
    Registry,
    RegistryInfo,
    Shortlist,
    ToolReport,
)


class _Base:
    """Settings and call construction shared by both clients (no I/O here)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        admin_token: str | None = None,
        registry: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retries: int = 3,
        backoff: float = 0.25,
        max_backoff: float = 4.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """
        Args:
            base_url: The service, e.g. ``http://127.0.0.1:8080``.
            token: Query token (``SHORTLIST_QUERY_TOKEN``) for /shortlist, /feedback and reads.
            admin_token: Admin token (``SHORTLIST_ADMIN_TOKEN``) for registry writes; used for
                queries too when no query token is given.
            registry: Default registry for :meth:`shortlist` when the call names none.
            timeout: Seconds (or an ``httpx.Timeout``) per HTTP attempt.
            retries: Retries after the first attempt, on 503 and transport errors.
            backoff: First retry delay in seconds; doubles each retry, capped at ``max_backoff``.
            headers: Extra headers sent with every request.
        """
        self.base_url = base_url.rstrip("/")
        self.registry = registry
        self.timeout = timeout
        self.retry_policy = RetryPolicy(retries=retries, backoff=backoff, max_backoff=max_backoff)
        self._tokens = Tokens(query=token, admin=admin_token)
        self._headers = dict(headers or {})

    def _request(self, call: Call) -> dict[str, Any]:
        headers = {**self._headers, **self._tokens.headers(call.access)}
        request: dict[str, Any] = {
            "method": call.method,
            "url": self.base_url + call.path,
            "headers": headers,
        }
        if call.body is not None:
            request["json"] = call.body
        if call.params is not None:
            request["params"] = dict(call.params)
        return request

    def _registry(self, registry: str | None) -> str:
        name = registry or self.registry
        if not name:
            raise ValueError("no registry: pass registry= or set one on the client")
        return name

    # -- calls ---------------------------------------------------------------------------------

    def _shortlist_call(self, query: str, registry: str | None, **options: Any) -> Call:
        body = shortlist_body(self._registry(registry), query, **options)
        return Call("POST", "/shortlist", "query", idempotent=True, body=body)

    @staticmethod
    def _feedback_call(shortlist: str | Shortlist, used: Iterable[str], **options: Any) -> Call:
        # Idempotent: the service acknowledges a resend as a duplicate and counts it once.
        body = feedback_body(shortlist, used, **options)
        return Call("POST", "/feedback", "query", idempotent=True, body=body)

    @staticmethod
    def _put_call(registry: str, tools: ToolsSource, equivalents: Any) -> Call:
        body = tools_body(tools, equivalents)
        return Call("PUT", registry_path(registry), "admin", idempotent=True, body=body)

    @staticmethod
    def _upsert_call(registry: str, tools: ToolsSource, equivalents: Any) -> Call:
        # Not idempotent for retries after a lost answer: each write bumps the version.
        body = tools_body(tools, equivalents)
        return Call("POST", registry_path(registry, "tools"), "admin", idempotent=False, body=body)

    @staticmethod
    def _delete_tool_call(registry: str, name: str) -> Call:
        path = registry_path(registry, "tools")
        return Call("DELETE", path, "admin", idempotent=True, params={"name": name})


_Equivalents = Iterable[Sequence[str]] | None
JOB_POLL_SECONDS = 0.5  # a large upload answered 202 (a write job) is polled this often


def _is_job(data: dict[str, Any]) -> bool:
    return "job" in data and "state" in data


def _job_call(registry: str, job: str) -> Call:
    return Call("GET", registry_path(registry, "jobs", job), "admin", idempotent=True)


def _job_result(data: dict[str, Any]) -> RegistryInfo:
    if not _is_job(data):
        return RegistryInfo.model_validate(data)
    if data["state"] == "failed":
        raise error_from_job(data.get("error"))
    return RegistryInfo.model_validate(data["result"])


class ShortlistClient(_Base):
    """Blocking client. Use as a context manager, or call :meth:`close`.

    >>> with ShortlistClient("http://127.0.0.1:8080", registry="demo") as client:
    ...     shortlist = client.shortlist("weather in Paris tomorrow?")
    ...     client.feedback(shortlist, used=[shortlist.names[0]], success=True)
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        http_client: httpx.Client | None = None,
        **options: Any,
    ) -> None:
        super().__init__(base_url, **options)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=self.timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def _send(self, call: Call) -> httpx.Response:
        request = self._request(call)
        policy = self.retry_policy
        attempt = 0
        while True:
            try:
                response = self._http.request(**request, timeout=self.timeout)
            except httpx.TransportError as exc:
                if not policy.retry_transport(exc, call, attempt):
                    raise TransportError(f"{call.method} {call.path}: {exc!r}") from exc
                time.sleep(policy.delay(attempt))
            else:
                if response.is_success:
                    return response
                if not policy.retry_status(response, attempt):
                    raise error_from_response(response)
                time.sleep(policy.delay(attempt, response))
            attempt += 1

    def _json(self, call: Call) -> Any:
        return self._send(call).json()

    # -- agents ----------------------------------------------------------------------------------

    def shortlist(
        self,
        query: str,
        *,
        registry: str | None = None,
        k: int | None = None,
        max_k: int | None = None,
        policy: str | None = None,
        scorer: str | None = None,
        depth_bias: float | None = None,
        allow_empty: bool = False,
        explain: bool = False,
    ) -> Shortlist:
        """The tools to show for ``query`` (``POST /shortlist``); see the README for each option."""
        call = self._shortlist_call(
            query, registry, k=k, max_k=max_k, policy=policy, scorer=scorer,
            depth_bias=depth_bias, allow_empty=allow_empty, explain=explain,
        )  # fmt: skip
        return Shortlist.model_validate(self._json(call))

    def feedback(
        self,
        shortlist: str | Shortlist,
        used: Iterable[str],
        *,
        success: bool | None = None,
        calls: Iterable[CallSpec] | None = None,
    ) -> FeedbackResult:
        """Report the tools the agent used for a shortlist (``POST /feedback``).

        ``calls``: the trajectory's calls, each a :class:`ToolCall`, ``{"tool", "useful"}`` or
        ``(tool, useful)``.
        """
        call = self._feedback_call(shortlist, used, success=success, calls=calls)
        return FeedbackResult.model_validate(self._json(call))

    # -- registries --------------------------------------------------------------------------------

    def put_registry(
        self, registry: str, tools: ToolsSource, *, equivalents: _Equivalents = None
    ) -> RegistryInfo:
        """Replace (or create) a registry from a JSON file path, a list of tools or a
        ``{"tools": [...]}`` dict (``PUT /registries/{registry}``)."""
        return self._written(registry, self._json(self._put_call(registry, tools, equivalents)))

    upload_registry = put_registry

    def upsert_tools(
        self, registry: str, tools: ToolsSource, *, equivalents: _Equivalents = None
    ) -> RegistryInfo:
        """Add or replace tools by name, keeping the rest (``POST /registries/{registry}/tools``)."""
        call = self._upsert_call(registry, tools, equivalents)
        return self._written(registry, self._json(call))

    def _written(self, registry: str, data: dict[str, Any]) -> RegistryInfo:
        """The write's result; a large upload answered 202 is polled until its job ends."""
        while _is_job(data):
            if data["state"] in ("done", "failed"):
                break
            time.sleep(JOB_POLL_SECONDS)
            data = self._json(_job_call(registry, data["job"]))
        return _job_result(data)

    def list_registries(self) -> list[RegistryInfo]:
        data = self._json(Call("GET", "/registries", "read", idempotent=True))
        return [RegistryInfo.model_validate(item) for item in data["registries"]]

    def get_registry(self, registry: str) -> Registry:
        call = Call("GET", registry_path(registry), "read", idempotent=True)
        return Registry.model_validate(self._json(call))

    def report(self, registry: str) -> ToolReport:
        """The tool-efficiency report from agents' feedback."""
        call = Call("GET", registry_path(registry, "report"), "read", idempotent=True)
        return ToolReport.model_validate(self._json(call))

    efficiency_report = report

    def delete_registry(self, registry: str) -> None:
        self._send(Call("DELETE", registry_path(registry), "admin", idempotent=True))

    def delete_tool(self, registry: str, name: str) -> None:
        """Remove one tool; its name travels in the query string, so no name (``..``,
        ``a/../b``) can be resolved into another route."""
        self._send(self._delete_tool_call(registry, name))

    # -- operations --------------------------------------------------------------------------------

    def ready(self) -> bool:
        """True once the service has loaded its model, policy and registries."""
        try:
            return self._http.get(self.base_url + "/readyz", timeout=self.timeout).is_success
        except httpx.TransportError:
            return False

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise TransportError(f"{self.base_url} not ready after {timeout} s")
            time.sleep(interval)


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
        query: str,
        *,
        registry: str | None = None,
        k: int | None = None,
        max_k: int | None = None,
        policy: str | None = None,
        scorer: str | None = None,
        depth_bias: float | None = None,
        allow_empty: bool = False,
        explain: bool = False,
    ) -> Shortlist:
        call = self._shortlist_call(
            query, registry, k=k, max_k=max_k, policy=policy, scorer=scorer,
            depth_bias=depth_bias, allow_empty=allow_empty, explain=explain,
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
            if data["state"] in ("done", "failed"):
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


__all__ = ["APIError", "AsyncShortlistClient", "ShortlistClient"]
