"""What both clients share: settings, call construction and the write-job helpers (no I/O)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx

from tool_shortlist_client._core import (
    DEFAULT_TIMEOUT,
    DEFAULT_URL,
    Call,
    RetryPolicy,
    Tokens,
    ToolsSource,
    feedback_body,
    registry_path,
    shortlist_body,
    tools_body,
)
from tool_shortlist_client.errors import (
    error_from_job,
)
from tool_shortlist_client.models import (
    RegistryInfo,
    Shortlist,
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

    def _shortlist_call(self, query: str | None, registry: str | None, **options: Any) -> Call:
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
    if data["state"] != "done":  # failed, or superseded by a later write (ConflictError)
        raise error_from_job(data.get("error"))
    return RegistryInfo.model_validate(data["result"])
