"""The prerequisite graph of a registry: which tool yields what another tool needs.

Most multi-tool tasks are chains: a lookup yields the id a later tool needs (``search_films``
-> ``get_film_cast(film_id)``). The graph is read from the tools alone, at upload, with rules a
reader can check (each edge carries its evidence):

* **needs**: a tool's *required* parameters that name an entity by an id-like word
  (``film_id``, ``customerId``, ``token``, a bare ``id`` on ``get_film``: the entity is the
  word before the id, or the tool's own noun) -> the entity (``film``);
* **provides**: a tool whose name pairs a lookup or create verb (search, find, list, get,
  create, login, ...) with the entity's word, whose MCP ``outputSchema`` declares an id of
  it, or whose description says it returns one; a tool that itself needs that id is never
  its provider (``get_film(film_id)`` does not find films);
* **named in a parameter**: a required parameter whose description names another tool's
  verb phrase after a cue ("can be extracted from the Search Airport API") -> that tool.

An edge ``provider -> consumer`` reads "call the provider first". Providers of one need are
capped (:data:`MAX_PROVIDERS`), strongest evidence first, so a registry of 10,000 tools keeps
a bounded graph. Per-tool facts are computed once per tool text and reused by the next version
(:meth:`ToolGraph.build` with ``previous``), so a one-tool upsert re-reads one tool.

Admin edits (added or removed edges, :mod:`registry.index.graph_edits`) are applied on top, by
name, and travel with the registry's version.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

from registry.index.graph_edits import NO_EDITS, EdgeEdits
from registry.tools import Tool

__all__ = [
    "MAX_PROVIDERS", "Edge", "EdgeSource", "ToolFacts", "ToolGraph", "tool_facts",
]

MAX_PROVIDERS = 4  # providers kept per need, strongest evidence first
_CANDIDATES = 16  # providers of one entity compared for a need (strongest, then registry order)
_STRENGTH = {"output": 0, "description": 1, "schema": 2}
EdgeSource = Literal["schema", "output", "description", "parameter", "admin"]

_ID_WORDS = frozenset({"id", "ids", "uuid", "guid", "token", "identifier", "key"})
# a bare word that is itself the entity (a token comes from a login, not from "a token tool")
_SELF_ENTITIES = frozenset({"token"})
_LOOKUP_VERBS = frozenset(
    {
        "search", "find", "list", "get", "lookup", "look", "query", "fetch", "retrieve",
        "locate", "scan", "browse", "discover", "resolve", "check", "read", "show",
        "create", "add", "register", "open", "login", "signin", "authenticate",
        "auth", "generate", "upload", "identify", "detect",
    }
)
# what a tool does to its entity: never the entity itself (``monitor_update(id)`` names a monitor)
_ACTIONS = frozenset(
    {"update", "delete", "remove", "patch", "modify", "edit", "set", "cancel", "stop", "run",
     "send", "reply", "complete", "change", "move", "rename", "close", "archive", "status"}
)
_WEAK_WORDS = _ACTIONS | frozenset(
    {"the", "a", "an", "of", "by", "for", "to", "in", "on", "and", "or", "api", "tool", "new",
     "user's", "s", "data", "info", "information", "details", "item", "items", "value", "name",
     "is", "has", "can", "with", "from", "all", "any", "this", "that", "its", "their", "your", "my"}
)
_CUES = ("from", "returned by", "obtained", "extracted", "output of", "result of", "provided by",
         "given by", "using")
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z]|\d|\b|_)|[A-Z]?[a-z]+|[A-Z]+|\d+")


def words(text: str) -> list[str]:
    """``originSkyId`` -> ``[origin, sky, id]``; ``slack_get_users`` -> ``[slack, get, users]``."""
    return [w.lower() for w in _WORD.findall(text)]


def singular(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@dataclass(frozen=True, slots=True)
class ToolFacts:
    """What one tool needs and provides, read from its definition alone (cached per text)."""

    needs: tuple[tuple[str, str], ...]  # (required parameter, entity it names)
    provides: tuple[tuple[str, EdgeSource, str], ...]  # (entity, source, evidence)
    name_words: frozenset[str]  # the name's words past its namespace, singular
    cited: tuple[tuple[str, tuple[str, ...]], ...]  # (required parameter, its description's words)
    phrases: tuple[tuple[str, str], ...] = ()  # word pairs of the name holding a lookup verb


def _short_name(name: str) -> str:
    return re.split(r"[./:]", name)[-1]


def _properties(schema: Any) -> dict[str, Any]:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def _id_entity(param: str, own_nouns: Sequence[str]) -> str | None:
    """The entity an id-like parameter names, or None when it is not id-like."""
    parts = [singular(w) for w in words(param)]
    if not parts or parts[-1] not in _ID_WORDS:
        return None
    if len(parts) == 1:
        if parts[0] in _SELF_ENTITIES:
            return parts[0]
        entity = own_nouns[-1] if own_nouns else None  # get_film(id): the tool's own noun
    else:
        entity = parts[-2]
    # "is_id", "x_id": no entity a tool could find
    return entity if entity is not None and len(entity) > 2 and entity not in _WEAK_WORDS else None


def tool_facts(tool: Tool) -> ToolFacts:
    """Read one tool's needs and provisions (see the module docstring)."""
    name_words = tuple(singular(w) for w in words(_short_name(tool.name)))
    verbs = [w for w in name_words if w in _LOOKUP_VERBS]
    nouns = [w for w in name_words if w not in _LOOKUP_VERBS and w not in _WEAK_WORDS]
    props = _properties(tool.parameters)
    required = tool.parameters.get("required") if isinstance(tool.parameters, dict) else None
    required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    needs: list[tuple[str, str]] = []
    cited: list[tuple[str, tuple[str, ...]]] = []
    for param in required:
        entity = _id_entity(param, nouns)
        if entity is not None:
            needs.append((param, entity))
        spec = props.get(param)
        described = spec.get("description") if isinstance(spec, dict) else None
        if not isinstance(described, str):
            continue
        lowered = described.lower()
        if any(cue in lowered for cue in _CUES):
            cited.append((param, tuple(singular(w) for w in words(described))))
    needed = {entity for _, entity in needs}
    provides: dict[str, tuple[EdgeSource, str]] = {}
    output = tool.definition.get("outputSchema") if isinstance(tool.definition, dict) else None
    for prop in _properties(output):
        entity = _id_entity(prop, nouns)
        if entity is not None and entity not in needed:
            provides.setdefault(entity, ("output", f"its outputSchema returns {prop!r}"))
    if verbs:
        for noun in nouns:
            if noun not in needed:
                provides.setdefault(noun, ("schema", f"its name {verbs[0]}s {noun}"))
    text = tool.description[:2000]
    lowered = text.lower()
    # only a description that says it returns, yields, gives or provides can name an id it returns
    says = any(verb in lowered for verb in ("return", "yield", "give", "provide"))
    description = words(text) if says and ("id" in lowered or "token" in lowered) else []
    for i in range(len(description) - 1):
        if description[i + 1] in ("id", "ids", "token") and description[i] in ("return", "returns"):
            continue
        if description[i + 1] in ("id", "ids", "token"):
            entity = singular(description[i]) if description[i + 1] != "token" else "token"
            if entity not in needed and entity not in _WEAK_WORDS and any(
                w in ("return", "returns", "yield", "yields", "give", "gives", "provide", "provides")
                for w in description[max(0, i - 8) : i]
            ):
                provides.setdefault(entity, ("description", f"its description returns {entity} {description[i + 1]}"))
    return ToolFacts(
        needs=tuple(needs),
        provides=tuple((entity, source, why) for entity, (source, why) in provides.items()),
        name_words=frozenset(name_words),
        cited=tuple(cited),
        phrases=tuple(p for p in pairwise(name_words) if p[0] in _LOOKUP_VERBS or p[1] in _LOOKUP_VERBS),
    )


@dataclass(frozen=True, slots=True)
class Edge:
    """``provider`` -> ``consumer``: call the provider first; ``param`` is what it fills."""

    provider: str
    consumer: str
    param: str  # the consumer's parameter ("" for an admin edge)
    source: EdgeSource
    evidence: str

    def to_json(self) -> dict[str, str]:
        return {
            "provider": self.provider,
            "consumer": self.consumer,
            "param": self.param,
            "source": self.source,
            "evidence": self.evidence,
        }


Provider = tuple[int, int, EdgeSource, str]  # (evidence strength, position, source, evidence)


@dataclass(frozen=True, slots=True)
class _Index:
    """What a graph was joined from, kept so that the next version, when it only appends tools,
    re-joins only the tools the new ones can change (a one-tool upsert into 10,000 tools)."""

    hashes: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    providers: Mapping[str, tuple[Provider, ...]] = field(default_factory=dict)  # entity ->
    by_phrase: Mapping[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)
    joined: Mapping[int, tuple[tuple[int, Edge], ...]] = field(default_factory=dict)  # consumer ->


@dataclass(frozen=True, slots=True)
class ToolGraph:
    """The prerequisite graph of one registry version (positions index the snapshot's tools).

    ``needs[c]`` lists, per need of tool ``c``, ``(param, providers)`` with providers as
    positions, strongest evidence first; ``successors[p]`` the tools ``p`` is a prerequisite of.
    """

    edges: tuple[Edge, ...] = ()
    needs: Mapping[int, tuple[tuple[str, tuple[int, ...]], ...]] = field(default_factory=dict)
    successors: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    facts: Mapping[str, ToolFacts] = field(default_factory=dict)  # content hash -> facts
    edits: EdgeEdits = NO_EDITS
    index: _Index = field(default_factory=_Index, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"edges": [e.to_json() for e in self.edges], "edits": self.edits.to_json()}

    @classmethod
    def build(
        cls,
        tools: Sequence[Tool],
        hashes: Sequence[str] | None = None,
        *,
        edits: EdgeEdits = NO_EDITS,
        previous: ToolGraph | None = None,
    ) -> ToolGraph:
        """The graph of ``tools`` (facts of unchanged texts reused from ``previous``; when the
        new version only appends tools, only the joins the new tools can change are redone)."""
        hashes = tuple(hashes) if hashes is not None else tuple(t.content_hash() for t in tools)
        names = tuple(t.name for t in tools)
        cache = previous.facts if previous is not None else {}
        facts = [cache.get(h) or tool_facts(t) for t, h in zip(tools, hashes)]
        before = previous.index if previous is not None else _Index()
        start = len(before.hashes)
        if previous is not None and start and start <= len(hashes) and (
            before.hashes == hashes[:start] and before.names == names[:start]
        ):
            providers, by_phrase = _indexed(facts, start, dict(before.providers), dict(before.by_phrase))
            entities = {e for f in facts[start:] for e, _, _ in f.provides}
            pairs = {pair for f in facts[start:] for pair in f.phrases}
            joined = dict(before.joined)
            redo = [c for c in before.joined if _touched(facts[c], entities, pairs)]
            redo += [c for c in range(start, len(facts)) if facts[c].needs or facts[c].cited]
        else:
            providers, by_phrase = _indexed(facts, 0, {}, {})
            joined = {}
            redo = [c for c, f in enumerate(facts) if f.needs or f.cited]
        for c in redo:
            joined[c] = _join(c, facts, names, providers, by_phrase)
        found = {(p, c): edge for c, pairs_ in joined.items() for p, edge in pairs_}
        position = {name: i for i, name in enumerate(names)} if edits else {}
        edits = edits.kept(position) if edits else edits  # a deleted tool takes its edits with it
        for provider, consumer in edits.removed:
            found.pop((position[provider], position[consumer]), None)
        for provider, consumer in edits.added:
            found[(position[provider], position[consumer])] = Edge(
                provider, consumer, "", "admin", "added by an admin"
            )
        edges = sorted(found.items(), key=lambda item: (item[0][1], item[0][0]))
        needs: dict[int, dict[str, list[int]]] = {}
        successors: dict[int, list[int]] = {}
        for (p, c), edge in edges:
            needs.setdefault(c, {}).setdefault(edge.param or names[p], []).append(p)
            successors.setdefault(p, []).append(c)
        return cls(
            edges=tuple(edge for _, edge in edges),
            needs={c: tuple((param, tuple(ps)) for param, ps in per.items()) for c, per in needs.items()},
            successors={p: tuple(cs) for p, cs in successors.items()},
            facts=dict(zip(hashes, facts)),
            edits=edits,
            index=_Index(hashes, names, providers, by_phrase, joined),
        )


def _indexed(
    facts: Sequence[ToolFacts],
    start: int,
    providers: dict[str, tuple[Provider, ...]],
    by_phrase: dict[tuple[str, str], tuple[int, ...]],
) -> tuple[dict[str, tuple[Provider, ...]], dict[tuple[str, str], tuple[int, ...]]]:
    """``providers`` and ``by_phrase`` extended with the tools from ``start`` on (new tuples
    for the keys they touch: the previous version's index is shared, never changed)."""
    grown: dict[str, list[Provider]] = {}
    phrased: dict[tuple[str, str], list[int]] = {}
    for i in range(start, len(facts)):
        f = facts[i]
        for entity, source, why in f.provides:
            grown.setdefault(entity, []).append((_STRENGTH[source], i, source, why))
        for pair in f.phrases:
            phrased.setdefault(pair, []).append(i)
    for entity, extra in grown.items():
        providers[entity] = tuple(sorted((*providers.get(entity, ()), *extra)))
    for pair, more in phrased.items():
        by_phrase[pair] = (*by_phrase.get(pair, ()), *more)
    return providers, by_phrase


def _touched(f: ToolFacts, entities: set[str], pairs: set[tuple[str, str]]) -> bool:
    """Whether new providers of ``entities`` or tools named by ``pairs`` can change ``f``'s edges."""
    if any(entity in entities for _, entity in f.needs):
        return True
    return bool(pairs) and any(pair in pairs for _, said in f.cited for pair in pairwise(said))


def _join(
    c: int,
    facts: Sequence[ToolFacts],
    names: Sequence[str],
    providers: Mapping[str, tuple[Provider, ...]],
    by_phrase: Mapping[tuple[str, str], tuple[int, ...]],
) -> tuple[tuple[int, Edge], ...]:
    """Tool ``c``'s incoming edges: per need, its best providers; per cited tool, the tool."""
    f = facts[c]
    found: dict[int, Edge] = {}
    for param, entity in f.needs:
        # strongest evidence first, then the most name words shared (the same API's tools),
        # then the name; a common entity's first candidates only, so a need costs the same in
        # a registry of 100 or 10,000 tools
        ranked = sorted(
            (rank, -len(f.name_words & facts[p].name_words), names[p], p, source, why)
            for rank, p, source, why in providers.get(entity, ())[:_CANDIDATES]
            if p != c
        )
        for _, _, _, p, source, why in ranked[:MAX_PROVIDERS]:
            found.setdefault(p, Edge(names[p], names[c], param, source, f"{param!r} names {entity}; {why}"))
    for param, said in f.cited:
        hits: list[int] = []
        for pair in pairwise(said):
            hits.extend(p for p in by_phrase.get(pair, ()) if p != c and p not in hits)
        for p in hits[:MAX_PROVIDERS]:
            found.setdefault(
                p, Edge(names[p], names[c], param, "parameter", f"{param!r}'s description names {names[p]}")
            )
    return tuple(found.items())
