"""Provider-safe tool names: one reversible mapping from registry names to the names OpenAI and
Anthropic accept (``^[a-zA-Z0-9_-]{1,64}$``).

Registry names may hold ``/`` and ``.`` (``filesystem/read_file``, ``github.create_issue``, MCP
gateways' ``server.tool``), unicode, or up to 256 characters; the providers answer 400 to any of
these. The mapping has three disjoint classes, told apart by their underscores alone:

- **verbatim**: a name that already fits the pattern and holds no ``__`` is sent as it is
  (``get_weather``);
- **readable**: a name that fits except for ``/`` and ``.`` separators (none adjacent to another
  separator or to ``_``, no ``__`` of its own, 64 characters once encoded) gets ``/`` -> ``__`` and
  ``.`` -> ``___`` (``filesystem__read_file``, ``github___create_issue``). Runs of exactly two or
  three underscores decode back without any table;
- **hashed**: anything else becomes its sanitised prefix, ``____`` and 40 bits of its SHA-256
  (``caf_____3b1f0c9a2e``). Four underscores never occur in the other two classes, so no hashed
  name equals a verbatim or readable one; decoding it needs the name to have gone out through
  the same :class:`ProviderNames` (the adapters record every name they send).

So the mapping is stable across calls and processes (a pure function of the name), and
collision-free: distinct names in the first two classes encode distinctly by construction, and
:class:`ProviderNames` refuses a hashed collision instead of confusing two tools.
"""

from __future__ import annotations

import hashlib
import re
import threading

PROVIDER_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""The tool-name pattern OpenAI's and Anthropic's APIs document."""
MAX_PROVIDER_NAME = 64
SEPARATORS = {"/": "__", ".": "___"}
_HASH_MARK = "____"
_HASH_HEX = 10
_DECODE = {len(code): sep for sep, code in SEPARATORS.items()}
_UNDERSCORE_RUN = re.compile(r"_+")
_INVALID_RUN = re.compile(r"[^a-zA-Z0-9_-]+")
_ALLOWED = re.compile(r"^[a-zA-Z0-9_\-/.]+$")


class UnknownProviderName(ValueError):
    """A hashed provider name this mapping never sent (so it cannot say which tool it was)."""


def _readable(name: str) -> str | None:
    """The separator encoding of ``name``, or None when it would not decode back uniquely."""
    if not _ALLOWED.match(name) or "__" in name:
        return None
    for i, char in enumerate(name):
        if char in SEPARATORS:
            neighbours = name[i - 1 : i] + name[i + 1 : i + 2]
            if any(n in SEPARATORS or n == "_" for n in neighbours):
                return None
    encoded = "".join(SEPARATORS.get(char, char) for char in name)
    return encoded if len(encoded) <= MAX_PROVIDER_NAME else None


def _hashed(name: str) -> str:
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX]
    prefix = _INVALID_RUN.sub("_", name)[: MAX_PROVIDER_NAME - len(_HASH_MARK) - _HASH_HEX]
    return f"{prefix}{_HASH_MARK}{digest}"


def provider_name(name: str) -> str:
    """The provider-safe name of a registry tool name (a pure function: same name, same result)."""
    if PROVIDER_NAME_PATTERN.match(name) and "__" not in name:
        return name
    readable = _readable(name)
    return readable if readable is not None else _hashed(name)


def decode_readable(provider: str) -> str | None:
    """The registry name behind a verbatim or readable provider name; None for a hashed one."""
    if _HASH_MARK in provider:
        return None

    def separator(match: re.Match[str]) -> str:
        run = match.group(0)
        return _DECODE.get(len(run), run)

    return _UNDERSCORE_RUN.sub(separator, provider)


class ProviderNames:
    """The mapping both ways, remembering the hashed names it has sent so it can undo them.

    One instance per application is enough (the adapters share :data:`PROVIDER_NAMES` unless
    given another); thread-safe.
    """

    def __init__(self) -> None:
        self._hashed: dict[str, str] = {}
        self._lock = threading.Lock()

    def to_provider(self, name: str) -> str:
        """The name to send to the provider for registry tool ``name``."""
        provider = provider_name(name)
        if _HASH_MARK in provider:
            with self._lock:
                known = self._hashed.setdefault(provider, name)
            if known != name:
                raise ValueError(
                    f"tool names {known!r} and {name!r} map to the same provider name "
                    f"{provider!r}; rename one of them"
                )
        return provider

    def to_registry(self, provider: str) -> str:
        """The registry tool name behind a provider name (a model's tool call, a reference)."""
        decoded = decode_readable(provider)
        if decoded is not None:
            return decoded
        with self._lock:
            name = self._hashed.get(provider)
        if name is None:
            raise UnknownProviderName(
                f"provider tool name {provider!r} was not sent through this mapping: map the "
                "registry's tools with the same ProviderNames before reading the model's calls"
            )
        return name


PROVIDER_NAMES = ProviderNames()
"""The mapping the adapters use by default."""
