"""The edge of ``/mcp`` the MCP SDK leaves open: request ids it would take for notifications,
and the plain-text errors it answers with.

The SDK reads a message whose ``id`` is an object, an array, a fraction or null as a
notification and answers 202 with nothing: the client waits for an answer that never comes.
MCP requires a string or an integer id, so such a message gets a JSON-RPC ``Invalid Request``
error here. Its transport answers some failures (413, 400 for a bad Content-Type, 406) in
plain text; those are rewritten in the service's JSON error shape.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Receive, Send

from registry.name_checks import json_type
from service.errors import error_body

INVALID_REQUEST = -32600
MAX_CHECKED_BYTES = 8 * 1024 * 1024  # past this the SDK's own body limit answers (413)

ERROR_TYPES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


async def read_body(receive: Receive) -> tuple[bytes, bool]:
    """The whole request body and whether the client is still there."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), True


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands ``body`` over once, then defers to the real one."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def _id_problem(message: Any) -> str | None:
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    value = message["id"]
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return None
    kind = "a fraction" if isinstance(value, float) else json_type(value)
    return f"Invalid Request: id must be a string or an integer, got {kind}"


def invalid_request(body: bytes) -> bytes | None:
    """A JSON-RPC error for a message (or batch) whose ``id`` MCP forbids, else None (the
    SDK handles everything else, malformed JSON included)."""
    if len(body) > MAX_CHECKED_BYTES or b'"id"' not in body:
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    for message in parsed if isinstance(parsed, list) else [parsed]:
        problem = _id_problem(message)
        if problem is not None:
            error = {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": problem}}
            return json.dumps(error, separators=(",", ":")).encode()
    return None


def json_errors(send: Send) -> Send:
    """``send`` with the SDK's non-JSON error answers rewritten as ``{"error": {...}}``."""
    held: Message | None = None
    chunks: list[bytes] = []

    async def wrapped(message: Message) -> None:
        nonlocal held
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers") or ())
            json_body = headers.get(b"content-type", b"").startswith(b"application/json")
            if message["status"] >= 400 and not json_body:
                held = message
                return
        elif message["type"] == "http.response.body" and held is not None:
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            status = held["status"]
            text = b"".join(chunks).decode("utf-8", "replace").strip()[:500] or "request refused"
            body = json.dumps(
                error_body(ERROR_TYPES.get(status, "bad_request"), f"MCP: {text}"), separators=(",", ":")
            ).encode()
            kept = [
                (k, v) for k, v in held.get("headers") or () if k.lower() not in (b"content-type", b"content-length")
            ]
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        *kept,
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await send(message)

    return wrapped
