"""Prepared writes: parsed and embedded off the lock, stored tools reused across versions, group commits.

A write is *prepared* first (payload parsed and validated: a bad tool is refused before
anything is accepted), then *run*. Between the two, :meth:`PreparedWrite.embed` embeds the
texts the registry has never seen, in batches written to the store's embedding cache, outside
the registry's write lock: the commit that follows finds every vector cached and only derives
the new snapshot from the current one (:func:`registry.index.snapshot.build_snapshot`). A
prepared write with many new texts can run as a durable background job
(:mod:`registry.writes.write_jobs`; HTTP: 202 and a job to poll).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from registry.errors import ShortlistError
from registry.index.embed import Embedder
from registry.index.graph_edits import NO_EDITS, EdgeEdits
from registry.index.snapshot import Snapshot, embed_tools
from registry.snapshots import RegistryChange
from registry.store.base import Store
from registry.tools import Tool, ToolLimits, parse_tools

log = logging.getLogger(__name__)

JobState = Literal["queued", "running", "done", "failed", "superseded"]


def new_tools(tools: Sequence[Tool], current: Snapshot | None) -> list[Tool]:
    """The tools whose text ``current`` does not hold (their vectors may still be cached)."""
    known = set(current.content_hashes) if current is not None else set()
    fresh: dict[str, Tool] = {}
    for tool in tools:
        content_hash = tool.content_hash()
        if content_hash not in known:
            fresh.setdefault(content_hash, tool)
    return list(fresh.values())


def _name_hint(definition: Any) -> Any:
    if not isinstance(definition, dict):
        return None
    function = definition.get("function")
    if isinstance(function, dict):
        return function.get("name")
    return definition.get("name")


def stored_tools(definitions: list[Any], current: Snapshot | None, limits: ToolLimits) -> list[Tool]:
    """Parse a stored version's tools, reusing ``current``'s parsed tool for every definition
    equal to one it holds: a replica catching up with a one-tool change parses one tool, not
    the registry (parsing 4,000 tools takes ~0.4 s). Same result as ``parse_tools``. Names
    that newer rules refuse at upload stay readable (:meth:`ToolLimits.for_stored`).
    """
    limits = limits.for_stored()
    if current is None or len(definitions) > limits.max_tools:
        return parse_tools(definitions, limits)
    out: list[Tool | None] = []
    fresh_rows: list[int] = []
    for row, definition in enumerate(definitions):
        name = _name_hint(definition)
        position = current.by_name.get(name) if isinstance(name, str) else None
        if position is not None and current.tools[position].definition == definition:
            out.append(current.tools[position])
        else:
            out.append(None)
            fresh_rows.append(row)
    try:
        parsed = parse_tools([definitions[row] for row in fresh_rows], limits)
    except ShortlistError:
        return parse_tools(definitions, limits)  # the full parse reports the right indexes
    for row, tool in zip(fresh_rows, parsed):
        out[row] = tool
    tools = [tool for tool in out if tool is not None]
    if len({tool.name for tool in tools}) != len(tools):
        return parse_tools(definitions, limits)  # a duplicate name: let the parser say where
    return tools


@dataclass
class PreparedWrite:
    """A validated write, not applied yet.

    Attributes:
        registry: the registry written.
        fresh: tools whose text the registry's current version does not hold.
        apply: commits the write (takes the registry's lock); returns the new version's info
            or None when there was nothing to write.
        guard: called before the change is applied, inside every commit attempt (under the
            registry's lock, after syncing with the store); raises to refuse the commit. A
            write job's guard refuses it once a later write superseded it.
    """

    registry: str
    fresh: list[Tool]
    apply: Callable[[], Any]
    embedder: Embedder
    store: Store
    guard: Callable[[], None] | None = None

    @property
    def new_texts(self) -> int:
        return len(self.fresh)

    def announcing(self, listener: Callable[[RegistryChange], None]) -> PreparedWrite:
        """This write, telling ``listener`` about the version it commits (the core's registry
        listeners: a face counts the registry's tools)."""
        run = self.apply

        def apply() -> Any:
            info = run()
            if info is not None:
                listener(RegistryChange(info.registry, info))
            return info

        self.apply = apply
        return self

    def uncached(self) -> int:
        """Drop the fresh tools whose vectors the store already caches; returns how many are
        left (the texts the embedder will really see)."""
        if self.fresh:
            found = self.store.get_embeddings(
                self.embedder.model_id, [tool.content_hash() for tool in self.fresh]
            )
            self.fresh = [tool for tool in self.fresh if tool.content_hash() not in found]
        return len(self.fresh)

    def embed(self) -> None:
        """Embed the fresh texts the store has not cached, in batches, into the cache."""
        if self.fresh:
            embed_tools(self.fresh, self.embedder, self.store)

    def run(self) -> Any:
        """Embed what is missing (outside any lock), then commit."""
        self.embed()
        self.fresh = []  # the texts are cached now; drop the references
        return self.apply()


class RegistryState(Protocol):
    """What a write's ``change`` reads of the version it applies to: a :class:`Snapshot`, or
    a :class:`Draft` (the result of the writes before it in the same group commit)."""

    @property
    def tools(self) -> tuple[Tool, ...]: ...

    @property
    def by_name(self) -> dict[str, int]: ...

    @property
    def equivalents(self) -> tuple[tuple[str, ...], ...]: ...

    @property
    def edits(self) -> EdgeEdits: ...


@dataclass(frozen=True)
class Draft:
    """A registry's tools after some writes of a group commit, before it is committed."""

    tools: tuple[Tool, ...]
    by_name: dict[str, int]
    equivalents: tuple[tuple[str, ...], ...]
    edits: EdgeEdits = NO_EDITS

    @classmethod
    def of(cls, tools: Sequence[Tool], equivalents: Any, edits: EdgeEdits = NO_EDITS) -> Draft:
        by_name = {tool.name: i for i, tool in enumerate(tools)}
        return cls(
            tuple(tools),
            by_name,
            tuple(tuple(group) for group in equivalents),
            edits.kept(by_name) if edits else edits,
        )


Change = Callable[[RegistryState | None], tuple[list[Tool], Any] | tuple[list[Tool], Any, EdgeEdits] | None]
"""A write: ``(tools, equivalents)``, or with the graph's admin edits as a third item (else
the edits of the version it applies to are kept, less those naming a removed tool)."""


class PendingWrite:
    """One write waiting for its registry's lock; settled by whoever commits its group."""

    __slots__ = ("change", "done", "error", "result")

    def __init__(self, change: Change) -> None:
        self.change = change
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.done = result, error, True


class GroupCommit:
    """Writes to one registry that queue behind each other are committed together.

    A writer enqueues its change, then takes the registry's lock. Whoever holds the lock takes
    every change queued so far and commits them as one version (``commit_group``), settling
    each; a writer whose change was committed by another finds it settled and returns. Under
    N concurrent writers a replica then makes about one commit per lock hand-over instead of
    N, so a write waits for at most about two commits, not N.
    """

    def __init__(self, lock_for: Callable[[str], threading.Lock]) -> None:
        self._lock_for = lock_for
        self._queues: dict[str, list[PendingWrite]] = {}
        self._guard = threading.Lock()

    def write(
        self,
        registry: str,
        change: Change,
        commit_group: Callable[[str, list[PendingWrite]], None],
    ) -> Any:
        mine = PendingWrite(change)
        with self._guard:
            self._queues.setdefault(registry, []).append(mine)
        with self._lock_for(registry):
            if not mine.done:
                with self._guard:
                    group = self._queues.pop(registry, [])
                try:
                    commit_group(registry, group)
                except BaseException as exc:
                    for pending in group:
                        if not pending.done:
                            pending.settle(error=exc)
        if mine.error is not None:
            raise mine.error
        return mine.result


def apply_group(
    current: RegistryState | None, group: list[PendingWrite]
) -> tuple[Draft | None, list[tuple[PendingWrite, bool | ShortlistError | None]]]:
    """Apply the group's changes in order, each to the result of the ones before.

    Returns the final draft (None when no change wrote anything) and per write: True (it
    wrote), None (nothing to write) or the domain error it raised (it is left out; the
    others still apply).
    """
    state: RegistryState | None = current
    draft: Draft | None = None
    outcomes: list[tuple[PendingWrite, bool | ShortlistError | None]] = []
    for pending in group:
        try:
            changed = pending.change(state)
        except ShortlistError as exc:
            outcomes.append((pending, exc))
            continue
        if changed is None:
            outcomes.append((pending, None))
            continue
        edits = changed[2] if len(changed) == 3 else state.edits if state is not None else NO_EDITS
        draft = Draft.of(changed[0], changed[1], edits)
        state = draft
        outcomes.append((pending, True))
    return draft, outcomes
