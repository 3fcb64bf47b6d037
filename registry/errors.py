"""Domain exceptions. The HTTP layer maps each class to a status code in one place."""

from __future__ import annotations

from typing import Any


class ShortlistError(Exception):
    """Base class of every error the domain raises on purpose."""

    error_type = "internal"

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(ShortlistError):
    error_type = "not_found"


class RegistryNotFound(NotFound):
    def __init__(self, registry: str) -> None:
        super().__init__(f"registry {registry!r} does not exist", {"registry": registry})


class ToolNotFound(NotFound):
    def __init__(self, registry: str, name: str) -> None:
        super().__init__(
            f"tool {name!r} does not exist in registry {registry!r}",
            {"registry": registry, "tool": name},
        )


class ShortlistNotFound(NotFound):
    """Feedback quotes a shortlist id the service never served or no longer remembers."""

    def __init__(self, shortlist_id: str) -> None:
        super().__init__(
            f"shortlist {shortlist_id!r} is unknown or has expired",
            {"shortlist_id": shortlist_id},
        )


class ShortlistExpired(ShortlistError):
    """Feedback quotes a shortlist this service served, whose record was lost before its
    retention ended: the process restarted without a graceful shutdown, or the shared store
    lost its data. ``details`` says when it was served and what lost it."""

    error_type = "shortlist_expired"

    def __init__(self, shortlist_id: str, served_at: float, lost_at: float, why: str) -> None:
        super().__init__(
            f"shortlist {shortlist_id!r} was served at {served_at:.0f} (Unix time), before {why} "
            f"at {lost_at:.0f}, which lost the record of it: feedback for it cannot be recorded "
            "any more; ask for a new shortlist",
            {"shortlist_id": shortlist_id, "served_at": served_at, "lost_at": lost_at, "reason": why},
        )


class ValidationFailed(ShortlistError):
    """Input is well-formed JSON but breaks a rule; ``details`` lists every problem."""

    error_type = "validation"


class ScopeForbidden(ShortlistError):
    """The caller's token is bound to tool patterns (an admin's scope) that match no tool of
    the registry it asked about: it may be shown nothing there."""

    error_type = "forbidden"


class InvalidToolDefinition(ValidationFailed):
    """One or more uploaded tools are invalid.

    ``details`` is a list of ``{"index": int | None, "tool": str | None, "field": str, "message": str}``.
    """


class InvalidRegistryName(ValidationFailed):
    pass


class PayloadTooLarge(ShortlistError):
    error_type = "payload_too_large"


class PolicySchemaMismatch(ShortlistError):
    """A depth-policy artifact was built for another feature schema: refuse to serve it."""

    error_type = "configuration"


class ArtifactError(ShortlistError):
    """A model artifact (embedder, policy) is missing or unreadable."""

    error_type = "configuration"


class NotReady(ShortlistError):
    """The core is still loading its models and registries (or failed to: the message says)."""

    error_type = "unhealthy"


class StoreUnavailable(ShortlistError):
    """The durable store (e.g. Redis) cannot be reached; in-memory snapshots still serve reads."""

    error_type = "unavailable"


class VersionConflict(ShortlistError):
    """A shared store refused a registry version: another replica wrote that version first.

    ``latest`` is the newest version the store has assigned for the registry (0 if none).
    The writer resynchronises and retries; the client sees this only if retries run out.
    """

    error_type = "conflict"

    def __init__(self, registry: str, version: int, latest: int) -> None:
        super().__init__(
            f"registry {registry!r} changed concurrently: version {version} was refused, "
            f"the store is at version {latest}; retry the request",
            {"registry": registry, "version": version, "latest": latest},
        )
        self.registry = registry
        self.version = version
        self.latest = latest


class StorageUnavailable(ShortlistError):
    """The local data directory cannot be written or read (an I/O error): nothing was changed,
    the registries keep their previous versions and queries are still answered."""

    error_type = "storage_unavailable"


class StorageFull(StorageUnavailable):
    """No space (or quota) left on the device holding the data directory: nothing was changed."""

    error_type = "storage_full"
