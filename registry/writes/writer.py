"""The write path of the registries: load, replicate and change them.

:class:`RegistryWriter` validates every write (raising its errors before anything is accepted)
and hands the change to its :class:`~registry.writes.commits.CommitPath`, which commits it and
swaps the new snapshot into the :class:`~registry.snapshots.Snapshots` map queries read. It
never answers a query: that is :class:`registry.serving.shortlist.QueryRunner`, which reads the
same map; the core (:class:`registry.core.Shortlister`) holds both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from registry.errors import (
    PayloadTooLarge,
    RegistryNotFound,
    ShortlistError,
    StoreUnavailable,
    ToolNotFound,
    ValidationFailed,
)
from registry.feedback import validate_equivalents
from registry.index.embed import Embedder
from registry.index.graph_edits import EdgeEdits, edge_list_problems
from registry.name_checks import validate_registry_name
from registry.settings import EngineArgs
from registry.snapshots import RegistryChange, RegistryInfo, RegistryListener, Snapshots
from registry.store.base import SharedStore, Store
from registry.tools import Tool, ToolLimits, parse_tools
from registry.writes.commits import CommitPath
from registry.writes.prepared import PreparedWrite, RegistryState, new_tools

log = logging.getLogger(__name__)

__all__ = ["RegistryWriter"]


def _equivalents_field(payload: Any) -> Any:
    return payload.get("equivalents") if isinstance(payload, dict) else None


class RegistryWriter:
    """Loads, replicates and changes the registries of one replica.

    Writes to one registry are serialised, build a new snapshot off to the side, persist it,
    then swap the reference; readers never lock. With a
    :class:`~registry.store.base.SharedStore` several replicas share the registries: a write
    first catches up with the store's current version, and a write that loses a version race
    resynchronises and retries; :meth:`refresh` (called by :class:`registry.writes.sync.StoreSync`)
    installs what other replicas wrote.

    Args:
        settings: the tool limits and ``hnsw_min_tools``.
        store: where versions are persisted.
        embedder: embeds the texts a write brings (outside the registry lock).
        snapshots: the map this writer installs into (default: a new one).
    """

    def __init__(
        self, settings: EngineArgs, store: Store, embedder: Embedder, snapshots: Snapshots | None = None
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.snapshots = snapshots if snapshots is not None else Snapshots()
        self.limits = ToolLimits(
            max_tools=settings.max_tools_per_registry,
            max_tool_bytes=settings.max_tool_bytes,
            max_description_chars=settings.max_description_chars,
        )
        self.commits = CommitPath(settings, store, embedder, self.snapshots, self.limits)

    # -- loading ------------------------------------------------------------------------------

    def load_all(self) -> int:
        """Load every stored registry (latest version) into memory; returns how many."""
        for name in self.store.list_registries():
            record = self.store.load(name)
            if record is None:
                continue
            tools = parse_tools(record.tools, self.limits.for_stored())
            snap = self.commits.build(name, record.version, tools, record.equivalents, EdgeEdits.from_json(record.edges))
            self.snapshots.install(replace(snap, written_at=record.written_at))
        return len(self.snapshots)

    def add_listener(self, listener: RegistryListener) -> None:
        """Call ``listener`` for every change installed from the store (see RegistryChange)."""
        self.commits.listeners.append(listener)

    def refresh(self) -> list[RegistryChange]:
        """Install every registry version the store holds that differs from ours; drop the
        registries the store no longer has.

        Snapshots are built here, off the request path; queries keep reading the old snapshot
        until the new one is swapped in. A stored version that cannot be loaded (e.g. it breaks
        this replica's limits) is logged once and skipped until the store moves on.

        Returns:
            The changes installed, in registry-name order.

        Raises:
            StoreUnavailable: the store cannot be reached; nothing was changed.
        """
        if isinstance(self.store, SharedStore):
            stored = self.store.versions()
        else:
            stored = {}
            for name in self.store.list_registries():
                record = self.store.load(name)
                if record is not None:
                    stored[name] = record.version
        changes = []
        for name in sorted(set(stored) | set(self.snapshots.names())):
            snap = self.snapshots.current(name)
            wanted = stored.get(name)
            if (snap.version if snap else None) == wanted:
                continue
            if wanted is not None and self.commits.unloadable.get(name) == wanted:
                continue
            try:
                change = self.sync_from_store(name)
            except StoreUnavailable:
                raise
            except ShortlistError as exc:
                self.commits.unloadable[name] = wanted or 0
                log.error("cannot load registry %r version %s from the store: %s", name, wanted, exc)
                continue
            if change is not None:
                changes.append(change)
        return changes

    def sync_from_store(self, registry: str) -> RegistryChange | None:
        """Bring one registry in line with the store; None when it already was.

        Raises:
            StoreUnavailable: the store cannot be reached.
            ShortlistError: the stored version cannot be parsed under this replica's limits.
        """
        with self.commits.lock(registry):
            return self.commits.sync_locked(registry)

    # -- writes ---------------------------------------------------------------------------------

    def put_registry(self, registry: str, payload: Any) -> RegistryInfo:
        """Replace the registry's tools and equivalents (creating it if needed).

        ``payload`` is a tool array or ``{"tools": [...], "equivalents": [[names], ...]}``;
        the version increases.
        """
        info: RegistryInfo = self.prepare_put(registry, payload).run()
        return info

    def prepare_put(self, registry: str, payload: Any) -> PreparedWrite:
        """Validate a :meth:`put_registry` (raising its errors now); ``.run()`` applies it."""
        validate_registry_name(registry)
        tools = parse_tools(payload, self.limits)
        equivalents = validate_equivalents(_equivalents_field(payload), {t.name for t in tools})
        return self._prepared(registry, tools, lambda current: (tools, equivalents))

    def create_registry(self, registry: str, payload: Any) -> RegistryInfo | None:
        """Like :meth:`put_registry`, but only if the registry does not exist yet, on this
        replica or in the shared store (replicas racing to create it: one wins, at version 1).

        Returns:
            The new registry, or ``None`` when it already existed (nothing is written).
        """
        validate_registry_name(registry)
        tools = parse_tools(payload, self.limits)
        equivalents = validate_equivalents(_equivalents_field(payload), {t.name for t in tools})

        # decided after the sync inside _write: a replica may have created it meanwhile
        return self.commits.write(registry, lambda current: None if current is not None else (tools, equivalents))

    def upsert_tools(self, registry: str, payload: Any) -> RegistryInfo:
        """Add or replace tools by name, keeping the others; creates the registry if missing.

        Existing equivalence groups are kept; groups in the payload are merged into them.
        """
        info: RegistryInfo = self.prepare_upsert(registry, payload).run()
        return info

    def prepare_upsert(self, registry: str, payload: Any) -> PreparedWrite:
        """Validate a :meth:`upsert_tools` (raising its errors now); ``.run()`` applies it.
        Errors that depend on the registry's tools at commit time (too many tools, unknown
        names in equivalents) are raised by ``.run()``."""
        validate_registry_name(registry)
        incoming = parse_tools(payload, self.limits)

        def change(current: RegistryState | None) -> tuple[list[Tool], Any]:
            merged: dict[str, Tool] = {t.name: t for t in current.tools} if current else {}
            for tool in incoming:
                merged[tool.name] = tool
            tools = list(merged.values())
            added = validate_equivalents(_equivalents_field(payload), merged)
            if len(tools) > self.limits.max_tools:
                raise PayloadTooLarge(
                    f"registry {registry!r} would hold {len(tools)} tools; "
                    f"the limit is {self.limits.max_tools}",
                    {"tools": len(tools), "limit": self.limits.max_tools},
                )
            kept = [list(g) for g in current.equivalents] if current else []
            equivalents = validate_equivalents(kept + added, merged) if added else kept
            return tools, equivalents

        return self._prepared(registry, incoming, change)

    def _prepared(
        self,
        registry: str,
        incoming: list[Tool],
        change: Callable[[RegistryState | None], tuple[list[Tool], Any]],
    ) -> PreparedWrite:
        fresh = new_tools(incoming, self.snapshots.current(registry))
        prepared = PreparedWrite(registry, fresh, lambda: None, self.embedder, self.store)

        def guarded(current: RegistryState | None) -> tuple[list[Tool], Any]:
            if prepared.guard is not None:  # checked per attempt, after the sync
                prepared.guard()
            return change(current)

        prepared.apply = lambda: self.commits.apply(registry, guarded)
        return prepared

    def delete_registry(self, registry: str) -> None:
        with self.commits.lock(registry):
            if not self.snapshots.has_registry(registry) and self.commits.shared:
                self.commits.sync_locked(registry)  # another replica may have created it just now
            if not self.snapshots.has_registry(registry):
                raise RegistryNotFound(registry)
            self.store.delete(registry)
            self.snapshots.remove(registry)

    def delete_tool(self, registry: str, name: str) -> RegistryInfo:
        def change(current: RegistryState | None) -> tuple[list[Tool], Any]:
            if current is None:
                raise RegistryNotFound(registry)
            if name not in current.by_name:
                raise ToolNotFound(registry, name)
            tools = [t for t in current.tools if t.name != name]
            equivalents = tuple(
                kept
                for group in current.equivalents
                if len(kept := tuple(n for n in group if n != name)) > 1
            )
            return tools, equivalents

        return self.commits.apply(registry, change)

    def edit_graph(self, registry: str, add: Any = None, remove: Any = None) -> RegistryInfo:
        """Add or remove prerequisite edges (``[[provider, consumer], ...]``): a write, so the
        version increases and the edits travel with it (kept by later writes, dropped with a
        deleted tool). An unknown tool name refuses the whole edit, naming it (nothing changes).
        """
        problems = edge_list_problems("add", add) + edge_list_problems("remove", remove)
        if problems:
            raise ValidationFailed("invalid graph edit: " + "; ".join(p["message"] for p in problems), problems)
        added = [(str(a), str(b)) for a, b in add or ()]
        removed = [(str(a), str(b)) for a, b in remove or ()]

        def change(current: RegistryState | None) -> tuple[list[Tool], Any, EdgeEdits]:
            if current is None:
                raise RegistryNotFound(registry)
            unknown = sorted({n for edge in (*added, *removed) for n in edge if n not in current.by_name})
            if unknown:
                raise ValidationFailed(
                    f"graph edit names tools registry {registry!r} does not hold: {unknown[:10]}",
                    [{"field": "edges", "message": f"unknown tool {name!r}"} for name in unknown],
                )
            return list(current.tools), current.equivalents, current.edits.changed(added, removed)

        return self.commits.apply(registry, change)
