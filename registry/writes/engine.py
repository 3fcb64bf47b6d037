"""The shortlist engine: registries in, adaptive shortlists out. No HTTP in here."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
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
from registry.index.graph import EdgeEdits, edge_list_problems
from registry.index.snapshot import Snapshot
from registry.names import validate_registry_name
from registry.request import ShortlistRequest
from registry.serving.depth_policies import TunableDepthPolicy
from registry.serving.relevance import RelevanceModel
from registry.serving.shortlist import QueryRunner, Shortlist, ShortlistItem, UsageRerank
from registry.serving.stop_rules import PolicyBook
from registry.settings import EngineArgs, ServingArgs
from registry.store.base import SharedStore, Store
from registry.tools import Tool, ToolLimits, parse_tools
from registry.writes.commits import CommitPath, RegistryChange, RegistryInfo, RegistryListener
from registry.writes.jobs import (
    GroupCommit,
    PreparedWrite,
    RegistryState,
    new_tools,
)

log = logging.getLogger(__name__)

__all__ = [
    "RegistryChange",
    "RegistryInfo",
    "Shortlist",
    "ShortlistEngine",
    "ShortlistItem",
]


def _equivalents_field(payload: Any) -> Any:
    return payload.get("equivalents") if isinstance(payload, dict) else None


class ShortlistEngine(CommitPath):
    """Owns the registry snapshots and answers shortlist queries.

    Reads take the current snapshot reference once and never lock; writes to one registry are
    serialised, build a new snapshot off to the side, persist it, then swap the reference.

    With a :class:`~registry.store.base.SharedStore` several engines (replicas) share the
    registries: a write first catches up with the store's current version, and a write that
    loses a version race resynchronises and retries; :meth:`refresh` (called by
    :class:`registry.writes.sync.StoreSync`) installs what other replicas wrote. The commit path
    (sync, derive, persist, install) is :class:`registry.writes.commits.CommitPath`; prepared writes,
    group commit and write jobs are in :mod:`registry.writes.jobs`.
    """

    def __init__(
        self,
        settings: EngineArgs,
        store: Store,
        embedder: Embedder,
        bor_policy: TunableDepthPolicy,
        relevance: RelevanceModel | None = None,
        *,
        usage: UsageRerank | None = None,
        policy_book: PolicyBook | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.embedder = embedder
        self.bor_policy = bor_policy
        self.queries = QueryRunner(
            ServingArgs.of(settings), embedder, bor_policy, relevance, usage=usage, policy_book=policy_book
        )
        self.limits = ToolLimits(
            max_tools=settings.max_tools_per_registry,
            max_tool_bytes=settings.max_tool_bytes,
            max_description_chars=settings.max_description_chars,
        )
        self._snapshots: dict[str, Snapshot] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._group = GroupCommit(self._lock)  # queued writes to a registry commit together
        self._swap_lock = threading.Lock()  # writers of different registries; readers never lock
        self._shared = isinstance(store, SharedStore)
        self._listeners: list[RegistryListener] = []
        self._unloadable: dict[str, int] = {}  # registry -> stored version that failed to load

    # -- loading ------------------------------------------------------------------------------

    def load_all(self) -> int:
        """Load every stored registry (latest version) into memory; returns how many."""
        for name in self.store.list_registries():
            record = self.store.load(name)
            if record is None:
                continue
            tools = parse_tools(record.tools, self.limits.for_stored())
            snap = self._build(name, record.version, tools, record.equivalents, EdgeEdits.from_json(record.edges))
            self._install(replace(snap, written_at=record.written_at))
        return len(self._snapshots)

    def add_listener(self, listener: RegistryListener) -> None:
        """Call ``listener`` for every change installed from the store (see RegistryChange)."""
        self._listeners.append(listener)

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
        for name in sorted(set(stored) | set(self._snapshots)):
            snap = self._snapshots.get(name)
            wanted = stored.get(name)
            if (snap.version if snap else None) == wanted:
                continue
            if wanted is not None and self._unloadable.get(name) == wanted:
                continue
            try:
                change = self.sync_from_store(name)
            except StoreUnavailable:
                raise
            except ShortlistError as exc:
                self._unloadable[name] = wanted or 0
                log.error("cannot load registry %r version %s from the store: %s", name, wanted, exc)
                continue
            if change is not None:
                changes.append(change)
        return changes

    def sync_from_store(self, registry: str) -> RegistryChange | None:
        """Bring one registry in line with the store; None when it already was.

        Raises:
            StoreUnavailable: the store cannot be reached.
            ShortlistError: the stored version cannot be parsed under this engine's limits.
        """
        with self._lock(registry):
            return self._sync_locked(registry)

    # -- reads ----------------------------------------------------------------------------------

    def list_registries(self) -> list[RegistryInfo]:
        snapshots = self._snapshots
        return [
            RegistryInfo(s.registry, s.version, s.n_tools, s.written_at)
            for s in sorted(snapshots.values(), key=lambda s: s.registry)
        ]

    def snapshot(self, registry: str) -> Snapshot:
        snap = self._snapshots.get(registry)
        if snap is None:
            raise RegistryNotFound(registry)
        return snap

    def current(self, registry: str) -> Snapshot | None:
        """The registry's current snapshot, or None."""
        return self._snapshots.get(registry)

    def has_registry(self, registry: str) -> bool:
        return registry in self._snapshots

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
        return self._write(registry, lambda current: None if current is not None else (tools, equivalents))

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
        fresh = new_tools(incoming, self._snapshots.get(registry))
        prepared = PreparedWrite(registry, fresh, lambda: None, self.embedder, self.store)

        def guarded(current: RegistryState | None) -> tuple[list[Tool], Any]:
            if prepared.guard is not None:  # checked per attempt, after the sync
                prepared.guard()
            return change(current)

        prepared.apply = lambda: self._apply(registry, guarded)
        return prepared

    def delete_registry(self, registry: str) -> None:
        with self._lock(registry):
            if registry not in self._snapshots and self._shared:
                self._sync_locked(registry)  # another replica may have created it just now
            if registry not in self._snapshots:
                raise RegistryNotFound(registry)
            self.store.delete(registry)
            self._remove(registry)

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

        return self._apply(registry, change)

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

        return self._apply(registry, change)

    # -- queries --------------------------------------------------------------------------------

    def shortlist(
        self, request: ShortlistRequest, token_scope: Sequence[str] | None = None
    ) -> Shortlist:
        """Rank the registry's tools for the request's query and cut the list where the policy says.

        The request is checked first (every invalid field at once, see
        :meth:`~registry.request.ShortlistRequest.resolve`), then the registry's snapshot is read
        once. A request holding several intents gets each of them covered, tools it names
        verbatim come first, near-duplicates share one slot (:mod:`registry.serving.shortlist`).
        ``token_scope``: the tool patterns an admin bound to the caller's token, which
        ``allowed_tools`` can only narrow (:mod:`registry.serving.scope`).
        """
        resolved = request.resolve(self.settings, self.queries, token_scope)
        return self.queries.run(self.snapshot(request.registry), resolved)

    # -- internals ------------------------------------------------------------------------------
