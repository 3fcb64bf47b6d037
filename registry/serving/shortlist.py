"""The query path: a request and a registry snapshot in, a :class:`~registry.serving.result.Shortlist`
out.

Steps (timed in ``Shortlist.timings``):

* **embed**: the request, its shorthand spelled out (:mod:`registry.serving.shorthand`), cut into windows when long (:func:`registry.serving.windows.query_windows`),
  and each of its intents when it holds several (:func:`registry.serving.intents.split_request`);
* **search**: rank the registry for the request and for each intent;
* **policy**: fold near-duplicates, choose depths, interleave the intents, pin the tools the
  request names (:mod:`registry.serving.compose`), and with ``allow_empty`` decide whether anything
  fits at all (:mod:`registry.serving.relevance`).

With ``k`` (a fixed depth) the request's own ranking is cut at ``k``, named tools first, and
intents are not split: ``k`` means exactly that many tools.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from itertools import islice

import numpy as np

from registry import bor
from registry.errors import ValidationFailed
from registry.feedback.events import RANKING_TAIL
from registry.feedback.served import new_shortlist_id
from registry.index.embed import Embedder
from registry.index.hybrid import SCORERS, Query, Scorer, best_scores, rank_windows, rank_within
from registry.index.snapshot import Snapshot
from registry.request import FIXED_POLICY, LEARNED_POLICY, ResolvedRequest
from registry.serving.batch import merge_shortlists
from registry.serving.chains import (
    NO_COMPANIONS,
    ScoreFn,
    after_called,
    append_companions,
    append_prerequisites,
    next_steps_first,
)
from registry.serving.compose import Pick, fold_duplicates, interleave
from registry.serving.coverage import CoverageFile, cover
from registry.serving.depth_policies import (
    DepthPolicy,
    TunableDepthPolicy,
    depth_policies,
    first_stop,
    policy_depth_limit,
)
from registry.serving.explore import DepthTrace, Explorer
from registry.serving.features import FEATURE_WINDOW
from registry.serving.intents import Intent, split_request
from registry.serving.needs import request_signals
from registry.serving.relevance import Relevance, RelevanceModel
from registry.serving.replay import (
    ReplayedRanking,
    UsageRerank,
    feature_rows,
    policy_schema,
    query_windows_for,
    replay_ranking,
)
from registry.serving.result import Shortlist, ShortlistItem
from registry.serving.scope import ScopeCache, allows
from registry.serving.stop_rules import PolicyBook
from registry.settings import ServingArgs

__all__ = ["QueryRunner", "UsageRerank"]


def _score_lookup(
    snap: Snapshot, scorer: Scorer, query: list[Query], ranking: tuple[np.ndarray, np.ndarray]
) -> ScoreFn:
    """The request's score of any tools: read from ``ranking`` (mapped only when first asked,
    as most requests name no tool and meet no chain), a tool ranked deeper scored exactly
    once; one lookup serves the named tools and every chain step."""
    known: dict[int, float] = {}

    def score_of(tools: Sequence[int]) -> dict[int, float]:
        if not known:
            known.update((int(t), float(v)) for t, v in zip(*ranking))
        missing = [t for t in tools if t not in known]
        if missing:
            extra = best_scores(scorer, query, snap.dense, snap.lexical, np.asarray(missing))
            known.update({t: float(v) for t, v in zip(missing, extra)})
        return {t: known[t] for t in tools}

    return score_of


class QueryRunner:
    """Answers shortlist requests on snapshots; holds the embedder, the scorers and the depth
    policies by name (the names a request may give: :class:`registry.request.Choices`)."""

    def __init__(
        self,
        serving: ServingArgs,
        embedder: Embedder,
        bor_policy: TunableDepthPolicy,
        relevance: Relevance | None = None,
        *,
        usage: UsageRerank | None = None,
        policy_book: PolicyBook | None = None,
        coverage: CoverageFile | None = None,
    ) -> None:
        self.serving = serving  # the serving group alone: defaults, ranking and depth knobs
        self.embedder = embedder
        self.bor_policy = bor_policy
        self.relevance: Relevance = relevance or RelevanceModel.load(serving.resolved_relevance_model())
        # the assembly passes a file start-up reads; built here (tests, bench) it is read at once
        self.coverage_file = coverage or CoverageFile(serving.coverage_model)
        if coverage is None:
            self.coverage_file.load()
        self.scorers: dict[str, Scorer] = dict(SCORERS)
        self.policies: dict[str, DepthPolicy] = depth_policies(serving, bor_policy)
        self.usage = usage  # the usage memory's lift (learning), when the core has one
        self.policy_book = policy_book or PolicyBook()  # per-registry stop rules
        self.explorer = Explorer(serving.explore_share)
        self._no_explore = Explorer(0.0)
        self.scopes = ScopeCache()

    def run(self, snap: Snapshot, request: ResolvedRequest) -> Shortlist:
        """Answer ``request`` on ``snap`` (already resolved: checked, defaults filled).

        With ``queries`` each request is answered on the same snapshot and the lists merged
        (:func:`registry.serving.batch.merge_shortlists`); a scoped request (``allowed_tools``,
        a token's patterns) is ranked over its allowed tools alone (:mod:`registry.serving.scope`).
        """
        scope = self.scopes.ids(snap, request.allowed_tools, request.token_scope) if request.scoped else None
        if request.queries is None:
            return self._run(snap, request, scope)
        started = time.perf_counter()
        parts = [
            self._run(snap, replace(request, query=text, queries=None), scope, explore=False)
            for text in request.queries
        ]
        merged = merge_shortlists(parts, new_shortlist_id())
        merged.timings["total"] = time.perf_counter() - started
        return merged

    def _run(
        self, snap: Snapshot, request: ResolvedRequest, scope: np.ndarray | None, *, explore: bool = True
    ) -> Shortlist:
        query = request.query
        started = time.perf_counter()
        timings: dict[str, float] = {}
        n = snap.n_tools if scope is None else int(scope.shape[0])  # what ranking and depth see
        adaptive = request.k is None  # depth chosen by a policy: traced (and maybe explored)
        trace = DepthTrace(self.policy_book.active(snap.registry), explore=explore) if adaptive else None
        intents = self._intents(query, request)
        called = self._called(snap, request)
        scorer = self.scorers[request.scorer]

        texts = [query, *(i.text for i in intents)]  # the request's, then each intent's
        t0 = time.perf_counter()
        prepared = [query_windows_for(text, scorer, self.embedder) for text in texts]
        t1 = time.perf_counter()
        timings["embed"] = t1 - t0

        wanted = self._wanted(request)
        rankings = [self._rank(snap, scorer, q, min(wanted, n), scope) for q in prepared]
        if self.usage is not None and prepared[0][0].vector is not None:  # usage lift (learning)
            rankings[0] = self.usage.rerank(snap, prepared[0][0].vector, *rankings[0])
        t2 = time.perf_counter()
        timings["search"] = t2 - t1

        named_ids = snap.names.find(query)
        if scope is not None and named_ids:
            named_ids = [t for t in named_ids if allows(scope, t)]
        score_of = _score_lookup(snap, scorer, prepared[0], rankings[0])  # named tools and chains share it
        named_scores = score_of(named_ids) if named_ids else {}
        named = [(t, named_scores[t]) for t in named_ids]
        confidence = None
        if request.allow_empty:
            confidence = self.relevance.confidence(rankings[0][1])
        if confidence is not None and not named and confidence < self.relevance.threshold:
            picks: list[Pick] = []
        else:
            if request.k is not None:
                picks = after_called(rankings[0], named, (), request.k)  # named first, then the ranking
            else:
                picks = self._compose(snap, n, rankings, [i.step for i in intents], named, request, trace, texts)
            if called:  # the agent holds the tools it called: the list is for what comes next
                picks = after_called(rankings[0], named, called, len(picks))
            picks = self._chains(snap, n, picks, called, score_of, request, scope)
        if scope is not None:  # the last guard: no step may show a tool outside the scope
            picks = [
                replace(p, alternates=tuple(a for a in p.alternates if allows(scope, a)))
                for p in picks
                if allows(scope, p.tool)
            ]
        timings["policy"] = time.perf_counter() - t2

        items = [
            ShortlistItem(
                name=snap.tools[p.tool].name,
                rank=r + 1,
                score=p.score,
                definition=snap.tools[p.tool].definition,
                alternates=tuple(snap.tools[a].name for a in p.alternates),
                intent=p.intent,
                named=p.named,
                reason=p.reason,
            )
            for r, p in enumerate(picks)
        ]
        depth = len(items)
        ranking = self._ranking(snap, items, rankings[0][0])
        p_rand = bor.p_rand(n, 1, depth) if n and depth else 0.0
        timings["total"] = time.perf_counter() - started
        return Shortlist(
            shortlist_id=new_shortlist_id(),
            registry=snap.registry,
            version=snap.version,
            policy=request.policy,
            scorer=request.scorer,
            k=depth,
            n_tools=n,
            p_rand=p_rand,
            bor_max_bits=0.0 - math.log2(p_rand) if p_rand > 0 else 0.0,  # never -0.0
            tools=items,
            timings=timings,
            depth_bias=request.bias,
            intents=tuple(i.text for i in intents),
            confidence=confidence,
            policy_version=trace.rule.version if request.policy == LEARNED_POLICY and trace else request.policy,
            trace=trace,
            ranking=ranking,
        )

    def replay(self, snap: Snapshot, text: str, depth: int) -> ReplayedRanking | None:
        """``text`` ranked on ``snap`` as this runner serves it now, with ``depth`` policy
        states: what a depth refit fits on (:mod:`registry.serving.replay`)."""
        return replay_ranking(
            snap, text, depth, scorer=self.serving.default_scorer, embedder=self.embedder,
            policy=self.bor_policy, usage=self.usage,
        )

    # -- steps ----------------------------------------------------------------------------------

    @staticmethod
    def _rank(
        snap: Snapshot, scorer: Scorer, query: list[Query], depth: int, scope: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        if scope is None:
            return rank_windows(scorer, query, snap.dense, snap.lexical, depth)
        return rank_within(scorer, query, snap.dense, snap.lexical, scope, depth)

    @staticmethod
    def _called(snap: Snapshot, request: ResolvedRequest) -> list[int]:
        """Positions of the called tools (oldest first); an unknown name is refused."""
        unknown = [name for name in request.called if name not in snap.by_name]
        if unknown:
            raise ValidationFailed(
                f"called names tools registry {snap.registry!r} does not hold: {unknown[:10]}",
                [{"field": "called", "message": f"unknown tool {name!r}"} for name in unknown],
            )
        return list(dict.fromkeys(snap.by_name[name] for name in request.called))

    def _chains(
        self,
        snap: Snapshot,
        n: int,
        picks: list[Pick],
        called: list[int],
        score_of: ScoreFn,
        request: ResolvedRequest,
        scope: np.ndarray | None,
    ) -> list[Pick]:
        """The next steps after ``called`` first, then the missing prerequisites and the learned
        companions appended (:mod:`registry.serving.chains`; never to a fixed ``k``: it
        means exactly ``k`` tools); a no-op on a registry without chains. A scoped request's
        steps only add tools of its scope, capped at the depth limit of the scoped count."""
        graph = snap.graph
        learned = self.usage.companions(snap) if self.usage is not None else None
        companions = learned or NO_COMPANIONS
        if not picks or not (graph.edges or companions):
            return picks
        tools = snap.tools

        def name_of(tool: int) -> str:
            return tools[tool].name

        def allowed(tool: int) -> bool:
            return scope is None or allows(scope, tool)

        cap = request.k if request.k is not None else min(request.cap, policy_depth_limit(n))
        if called:
            picks = next_steps_first(
                picks, graph, called, score_of, name_of, cap=cap, allowed=allowed, companions=companions
            )
        if request.k is not None:
            return picks
        picks = append_prerequisites(
            picks, graph, score_of, name_of, cap=cap, called=called, allowed=allowed, companions=companions
        )
        return append_companions(picks, companions, score_of, name_of, cap=cap, called=called, allowed=allowed)

    def _intents(self, query: str, request: ResolvedRequest) -> tuple[Intent, ...]:
        if request.k is not None or not self.serving.multi_intent:
            return ()
        intents = split_request(query)
        return intents if len(intents) > 1 else ()

    def _wanted(self, request: ResolvedRequest) -> int:
        if request.k is not None:  # a called tool's slot passes to the next one
            return request.k + len(request.called)
        if request.policy == LEARNED_POLICY:  # the features read a window of FEATURE_WINDOW scores
            return max(request.cap, FEATURE_WINDOW)
        return request.cap + 1  # gap also looks at the score just past the cap

    def _compose(
        self,
        snap: Snapshot,
        n: int,
        rankings: list[tuple[np.ndarray, np.ndarray]],
        steps: list[bool],
        named: list[tuple[int, float]],
        request: ResolvedRequest,
        trace: DepthTrace | None = None,
        texts: Sequence[str] = (),
    ) -> list[Pick]:
        # names are only read to fold declared equivalents, and only of the ranked tools
        tools = snap.tools
        names = {t: tools[t].name for ids, _ in rankings for t in ids.tolist()} if len(snap.equivalence) else {}
        threshold = self.serving.duplicate_similarity
        folded = [
            fold_duplicates(ids, scores, names, snap.equivalence, snap.dense.embeddings, threshold)
            for ids, scores in rankings
        ]
        cap = min(request.cap, policy_depth_limit(n))  # only k may ask for the whole registry

        # a needs-aware (schema 2) policy reads each ranking's own text
        reads_text = request.policy == LEARNED_POLICY and self.bor_policy.needs_model is not None
        signals = [request_signals(t) for t in texts] if reads_text else []

        def choose(scores: np.ndarray) -> int:
            return self._choose_depth(request, scores, n, cap, trace, signals[0] if signals else None)

        def choose_intent(index: int, scores: np.ndarray) -> int:
            text_signals = signals[index + 1] if len(signals) > index + 1 else None
            return self._choose_depth(request, scores, n, cap, trace, text_signals)

        intents = list(zip(folded[1:], steps, strict=True))
        picks = interleave(folded[0], intents, choose, cap=cap, named=named, intent_depth=choose_intent)
        explored = trace is not None and trace.shown != trace.chosen
        coverage = self.coverage_file.model
        if coverage is None or request.policy != LEARNED_POLICY or explored or not picks:
            return picks
        return cover(coverage, picks, rankings[0], folded[0], n, request_signals(texts[0] if texts else ""),
                     one_intent=not steps, cap=cap)

    @staticmethod
    def _ranking(snap: Snapshot, items: list[ShortlistItem], ids: np.ndarray) -> tuple[str, ...]:
        """The shown names, then up to ``RANKING_TAIL`` more of the request's ranking."""
        shown = [t.name for t in items]
        seen = set(shown)
        tail = (name for name in (snap.tools[int(t)].name for t in ids) if name not in seen)
        rest = list(islice(tail, RANKING_TAIL))  # stops there: the ranking may run far deeper
        return (*shown, *rest)

    def _choose_depth(
        self, request: ResolvedRequest, scores: np.ndarray, n: int, cap: int, trace: DepthTrace | None = None,
        signals: np.ndarray | None = None,
    ) -> int:
        available = int(scores.shape[0])
        if available == 0:
            return 0
        if request.policy == LEARNED_POLICY:  # traced, under the registry's stop rule
            depth = self._bor_depth(request, scores, n, cap, trace, signals)
        else:
            depth = self.policies[request.policy].choose_depth(scores, n, cap)
        depth = min(depth, cap, available)
        if trace is None or trace.done or request.policy == FIXED_POLICY:
            return depth  # intents' rankings, and a fixed depth, are never explored
        explorer = self.explorer if trace.explore else self._no_explore
        shown, trace.propensity = explorer.draw(depth, min(cap, available))
        trace.chosen, trace.shown, trace.done = depth, shown, True
        return shown

    def _bor_depth(
        self, request: ResolvedRequest, scores: np.ndarray, n: int, cap: int, trace: DepthTrace | None,
        signals: np.ndarray | None = None,
    ) -> int:
        """The learned policy's depth under the registry's stop rule (margins and scores of the
        request's own ranking kept in ``trace``, for a refit)."""
        rule = trace.rule if trace is not None else self.policy_book.active("")
        bias = request.bias or 0.0
        limit = min(cap, rule.max_depth or cap)
        policy = self.bor_policy  # only a schema-2 policy reads the signals
        if rule.kind == "bias" and (trace is None or trace.done):
            return int(policy.choose_depth(scores, n, limit, bias=bias + rule.bias_offset, signals=signals))
        q = np.asarray(policy.q_values(scores, n, cap, signals))
        if trace is not None and not trace.done:
            margins = q[:, 0] - q[:, 1]
            trace.margins = tuple(round(float(m), 4) if math.isfinite(m) else 0.0 for m in margins)
            top = np.asarray(scores[:FEATURE_WINDOW], dtype=np.float64)
            trace.scores = tuple(round(float(v), 5) if math.isfinite(v) else 0.0 for v in top)
        q = q[:limit]
        if not rule.reads(policy_schema(self.bor_policy)):  # fitted under another policy's schema
            return first_stop(q, bias)
        return rule.depth(q, lambda: feature_rows(self.bor_policy, np.asarray(scores), n, q.shape[0], signals), bias)

