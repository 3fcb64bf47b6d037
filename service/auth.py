"""Bearer tokens: admin tokens guard registry writes, query tokens guard queries and reads.

Which routes need which token is decided once, in :func:`service.app.create_app`:

- ``PUT/POST/DELETE /registries...``: an admin token, when ``SHORTLIST_ADMIN_TOKEN`` is set.
- ``POST /shortlist`` and ``POST /feedback``: a query or an admin token, when
  ``SHORTLIST_QUERY_TOKEN`` is set.
- ``GET /registries...`` (the report too): a query or an admin token when query tokens are
  set, else an admin token when admin tokens are set. Tool definitions and usage are not public.
- A query token bound to tool patterns (``SHORTLIST_QUERY_TOKEN_SCOPES``) is a query token whose
  shortlists see only the tools those patterns match (:func:`token_scope`).
- ``GET /metrics``: a metrics, query or admin token when any token is configured (it names
  every registry); ``SHORTLIST_METRICS_TOKEN`` gives a scraper a token that opens nothing else.
- ``/healthz``, ``/readyz``, ``/docs``: open (probes carry no tokens).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Sequence

from fastapi.requests import HTTPConnection
from fastapi.security import HTTPBearer
from pydantic import SecretStr

from service.errors import Unauthorized
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

SHORT_TOKEN_CHARS = 16  # below this a token is guessable enough to warn about


class BearerScheme(HTTPBearer):
    """Documents the bearer scheme in OpenAPI and hands over the raw ``Authorization`` header.

    The header is checked by :func:`authenticate`, which needs to tell a missing header from a
    malformed one from a wrong token; ``HTTPBearer`` itself folds all three into ``None``.
    """

    def __init__(self, scheme_name: str, description: str) -> None:
        super().__init__(scheme_name=scheme_name, description=description, auto_error=False)

    async def __call__(self, request: HTTPConnection) -> str | None:  # type: ignore[override]
        return request.headers.get("Authorization")


_OWS = " \t"  # RFC 9110 optional whitespace


def _digest(token: bytes) -> bytes:
    # Equal-length digests: compare_digest then leaks neither content nor length.
    return hashlib.sha256(token).digest()


def token_matches(presented: str, accepted: Sequence[SecretStr]) -> bool:
    """True when ``presented`` equals one of ``accepted``, in time independent of which one.

    Every configured token is compared (no early exit), each through ``hmac.compare_digest``.
    """
    # Starlette decodes header bytes as latin-1; encoding back recovers the bytes on the wire.
    given = _digest(presented.encode("latin-1", errors="replace"))
    found = False
    for token in accepted:
        found |= hmac.compare_digest(given, _digest(token.get_secret_value().encode("utf-8")))
    return found


CALLER_HEADER = "X-Caller-Id"
MAX_CALLER_ID_CHARS = 200


def caller_hash(
    authorization: str | None, settings: ServiceSettings, caller_id: str | None = None, key: bytes = b""
) -> str | None:
    """Who sent a request, for the learning loop's evidence rule: ``<token>`` or, with an
    ``X-Caller-Id`` header (an end-user or agent id), ``<token>.<id>``, each part a short HMAC
    under ``key`` (the core's caller key, :mod:`registry.store.caller_key`).

    The token part is what the rate and share limits count (rotating ids under one token does
    not escape them); the id part only splits the decay of repeated claims, so agents sharing a
    token do not dampen each other. A token holder can claim any id under its own token, never
    another token's. Without tokens the header alone names the caller (self-declared: see
    docs/security.md, "Poisoned feedback"). ``None``: nothing identifies it. Keyed, so a holder of a query
    token who reads the hashes (``caller_shares``) cannot test guesses of other tokens offline;
    ids longer than :data:`MAX_CALLER_ID_CHARS` are cut there."""
    given = (caller_id or "").strip(_OWS)[:MAX_CALLER_ID_CHARS]
    token = ""
    if (settings.query_token or settings.admin_token) and authorization:
        scheme, _, token = authorization.strip(_OWS).partition(" ")
        token = token.strip(_OWS) if scheme.lower() == "bearer" else ""
    if not token and not given:
        return None
    raw = b"tool-shortlist caller\0" + token.encode("latin-1", errors="replace")
    principal = hmac.new(key, raw, hashlib.sha256).hexdigest()[:16]
    if not given:
        return principal
    named = hmac.new(key, raw + b"\0id\0" + given.encode("utf-8", errors="replace"), hashlib.sha256)
    if not token:
        return named.hexdigest()[:16]
    return f"{principal}.{named.hexdigest()[:12]}"


def token_scope(authorization: str | None, settings: ServiceSettings) -> tuple[str, ...] | None:
    """The tool patterns an admin bound to the request's bearer token
    (``SHORTLIST_QUERY_TOKEN_SCOPES``), or None for an unbound token or none.

    Every bound token is compared (no early exit), as in :func:`token_matches`; the route has
    already authenticated the token, this only says what it may be shown.
    """
    scopes = settings.query_token_scopes
    if not scopes or not authorization:
        return None
    scheme, _, token = authorization.strip(_OWS).partition(" ")
    if scheme.lower() != "bearer":
        return None
    given = _digest(token.strip(_OWS).encode("latin-1", errors="replace"))
    found: tuple[str, ...] | None = None
    for secret, patterns in scopes:
        if hmac.compare_digest(given, _digest(secret.get_secret_value().encode("utf-8"))):
            found = patterns
    return found


def authenticate(authorization: str | None, accepted: Sequence[SecretStr], needs: str) -> None:
    """Raise :class:`Unauthorized` unless ``authorization`` is ``Bearer <one of accepted>``.

    Args:
        authorization: The raw ``Authorization`` header, or ``None``.
        accepted: Tokens that open this route (empty: nothing does).
        needs: What the route needs, for the message, e.g. ``"an admin token"``.
    """
    if authorization is None or not authorization.strip():
        raise Unauthorized(
            f"missing credentials: this route needs {needs}; "
            "send it as 'Authorization: Bearer <token>'",
            {"reason": "missing_token", "needs": needs},
            challenge='Bearer realm="tool-shortlist"',
        )
    # Only HTTP's own whitespace (space, tab) surrounds a token: str.strip() would also drop
    # NBSP or NEL, and accept "s3cret\xa0" as "s3cret".
    scheme, _, token = authorization.strip(_OWS).partition(" ")
    token = token.strip(_OWS)
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized(
            f"malformed Authorization header: expected 'Bearer <token>' with {needs}",
            {"reason": "malformed_header", "needs": needs},
            challenge='Bearer realm="tool-shortlist", error="invalid_request"',
        )
    if not token_matches(token, accepted):
        raise Unauthorized(
            f"invalid token: this route needs {needs}",
            {"reason": "invalid_token", "needs": needs},
            challenge='Bearer realm="tool-shortlist", error="invalid_token"',
        )


def metrics_tokens(settings: ServiceSettings) -> tuple[SecretStr, ...]:
    """The tokens that open ``/metrics``: every configured token; none (open) when there are none."""
    return (*settings.metrics_token, *settings.query_token, *settings.admin_token)


def log_access_mode(settings: ServiceSettings) -> None:
    """Say at start-up which routes are open; a WARNING when registry writes are."""
    if settings.query_token and not settings.admin_token:
        # A token is set, so the operator may think the service is closed: say what is open.
        log.warning(
            "only SHORTLIST_QUERY_TOKEN is set: queries and reads need a token, but every write "
            "is open (registry uploads and deletes, policy refits and activation, learning "
            "switches and wipes); set SHORTLIST_ADMIN_TOKEN to guard them"
        )
    elif not settings.admin_token:
        log.warning(
            "SHORTLIST_ADMIN_TOKEN is not set: registry writes (PUT/POST/DELETE /registries) "
            "are unauthenticated; anyone who can reach this port can change or delete registries"
        )
    else:
        log.info("registry writes need one of %d admin token(s)", len(settings.admin_token))
    if settings.query_token:
        log.info("queries and reads need one of %d query token(s)", len(settings.query_token))
    else:
        log.info("SHORTLIST_QUERY_TOKEN is not set: /shortlist and /feedback are open")
    tokens = (*settings.admin_token, *settings.query_token)
    if any(len(t.get_secret_value()) < SHORT_TOKEN_CHARS for t in tokens):
        log.warning("a configured token is shorter than %d characters", SHORT_TOKEN_CHARS)
