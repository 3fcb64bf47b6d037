"""What the sync and async clients share: request building, token choice, retry policy."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx

from tool_shortlist_client.errors import ToolsFileError
from tool_shortlist_client.models import Shortlist, ToolCall

Access = Literal["query", "read", "admin"]
ToolsSource = str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any]
CallSpec = ToolCall | Mapping[str, Any] | tuple[str, bool]

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class Call:
    """One API call: where, what, with which token, and whether resending it is harmless."""

    method: str
    path: str
    access: Access
    idempotent: bool
    body: Any = None
    params: Mapping[str, str] | None = None  # the query string (httpx encodes every value)


@dataclass(frozen=True)
class RetryPolicy:
    """Retries with capped exponential backoff and jitter.

    Retried: a 503 (not ready yet, storage unavailable: nothing was done), a connection that
    could not be opened, and for idempotent calls any other transport error (the request may
    have been sent; resending it changes nothing). ``Retry-After`` is honoured up to
    ``max_backoff``.
    """

    retries: int = 3
    backoff: float = 0.25
    max_backoff: float = 4.0
    statuses: frozenset[int] = field(default_factory=lambda: frozenset({503}))

    def delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        if response is not None:
            after = _retry_after(response.headers.get("retry-after"))
            if after is not None:
                return min(after, self.max_backoff)
        base: float = min(self.backoff * 2.0**attempt, self.max_backoff)
        return base * (0.5 + random.random() / 2)

    def retry_status(self, response: httpx.Response, attempt: int) -> bool:
        return attempt < self.retries and response.status_code in self.statuses

    def retry_transport(self, exc: httpx.TransportError, call: Call, attempt: int) -> bool:
        if attempt >= self.retries:
            return False
        never_sent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
        return never_sent or call.idempotent


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    from datetime import datetime

    return max(0.0, (when - datetime.now(UTC)).total_seconds())


@dataclass(frozen=True)
class Tokens:
    """Bearer tokens: ``query`` for /shortlist and /feedback, ``admin`` for registry writes.

    Either one stands in for the other when only one is given (an admin token may query).
    """

    query: str | None = None
    admin: str | None = None

    def headers(self, access: Access) -> dict[str, str]:
        token = (self.query or self.admin) if access == "query" else (self.admin or self.query)
        return {"Authorization": f"Bearer {token}"} if token else {}


def registry_path(registry: str, *rest: str) -> str:
    """``/registries/<registry>/<rest>...``, each part one percent-encoded segment (``/`` too).

    Raises:
        ValueError: a part is empty, ``.`` or ``..``: URL resolution would turn the path into
            another route (``/registries/..`` is ``/``). Tool names never go in the path: they
            travel in the query string (:meth:`ShortlistClient.delete_tool`).
    """
    parts = [registry, *rest]
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(f"{part!r} cannot be a URL path segment (registry {registry!r})")
    return "/registries/" + "/".join(quote(part, safe="") for part in parts)


def read_tools_file(path: Path) -> Any:
    """The JSON in ``path``.

    Raises:
        ToolsFileError: The file cannot be read, is not UTF-8 or is not JSON.
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ToolsFileError(str(path), f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    except UnicodeDecodeError as exc:
        raise ToolsFileError(str(path), f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise ToolsFileError(str(path), exc.strerror or str(exc)) from exc


def tools_body(
    source: ToolsSource, equivalents: Iterable[Sequence[str]] | None = None
) -> dict[str, Any]:
    """The ``{"tools": [...], "equivalents": [...]}`` body from a JSON file path, a list of tool
    definitions, or a dict (``{"tools": [...]}``, optionally with ``equivalents``)."""
    data: Any = source
    if isinstance(source, (str, os.PathLike)):
        data = read_tools_file(Path(source))
    if isinstance(data, Mapping):
        if "tools" not in data:
            raise ValueError("a registry dict needs a 'tools' list")
        body = dict(data)
        body["tools"] = list(body["tools"])
    elif isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        body = {"tools": list(data)}
    else:
        raise TypeError(f"tools must be a file path, a list or a dict, not {type(data).__name__}")
    if equivalents is not None:
        body["equivalents"] = [list(group) for group in equivalents]
    return body


def _listed(values: Iterable[str] | None) -> Any:
    """A list for the body; a bare string is sent as it is, for the service to refuse by name."""
    return values if values is None or isinstance(values, str) else list(values)


def shortlist_body(
    registry: str,
    query: str | None,
    *,
    k: int | None,
    max_k: int | None,
    policy: str | None,
    scorer: str | None,
    depth_bias: float | None,
    allow_empty: bool,
    explain: bool = False,
    queries: Iterable[str] | None = None,
    allowed_tools: Iterable[str] | None = None,
    called: Sequence[str] = (),
) -> dict[str, Any]:
    body: dict[str, Any] = {"registry": registry}
    optional = {
        "query": query,
        "queries": _listed(queries),
        "allowed_tools": _listed(allowed_tools),
        "k": k,
        "max_k": max_k,
        "policy": policy,
        "scorer": scorer,
        "depth_bias": depth_bias,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    if allow_empty:
        body["allow_empty"] = True
    if explain:
        body["explain"] = True
    if called:
        body["called"] = list(called)
    return body


def feedback_body(
    shortlist: str | Shortlist,
    used: Iterable[str],
    *,
    success: bool | None,
    calls: Iterable[CallSpec] | None,
) -> dict[str, Any]:
    shortlist_id = shortlist.shortlist_id if isinstance(shortlist, Shortlist) else shortlist
    body: dict[str, Any] = {"shortlist_id": shortlist_id, "used": list(used)}
    if success is not None:
        body["success"] = success
    if calls is not None:
        body["calls"] = [_call(c).model_dump() for c in calls]
    return body


def _call(spec: CallSpec) -> ToolCall:
    if isinstance(spec, ToolCall):
        return spec
    if isinstance(spec, tuple):
        return ToolCall(tool=spec[0], useful=spec[1])
    return ToolCall.model_validate(spec)
