"""Sync and async clients of the tool-shortlist HTTP API: :class:`ShortlistClient` here,
:class:`AsyncShortlistClient` in :mod:`tool_shortlist_client.async_client`."""

from __future__ import annotations

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
from tool_shortlist_client.async_client import AsyncShortlistClient
from tool_shortlist_client.errors import (
    APIError,
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

__all__ = ["APIError", "AsyncShortlistClient", "ShortlistClient"]


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
        """The tools to show for ``query`` (``POST /shortlist``); see the README for each option.

        ``queries``: up to 16 requests instead of ``query``, answered as one shortlist whose
        tools say which requests brought them (``tool.queries``); ``allowed_tools``: only these
        tool names or glob patterns (``"github/*"``) are ranked, cut and shown. ``called``: the
        tools the agent already called in this task, oldest first (the list is then for what
        comes next).
        """
        call = self._shortlist_call(
            query, registry, k=k, max_k=max_k, policy=policy, scorer=scorer,
            depth_bias=depth_bias, allow_empty=allow_empty, explain=explain,
            queries=queries, allowed_tools=allowed_tools, called=called,
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
            if data["state"] not in ("queued", "running"):
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
