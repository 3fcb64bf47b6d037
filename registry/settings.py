"""The one settings class. Built once at start-up and passed down; nothing reads the environment elsewhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from registry.request import MAX_DEPTH_BIAS, MAX_K

# Comma-separated in the environment; SecretStr keeps every token out of reprs and logs.
Tokens = Annotated[tuple[SecretStr, ...], NoDecode]
HostNames = Annotated[tuple[str, ...], NoDecode]
# A JSON object {token: [tool name or pattern, ...]} in the environment, parsed by the validator
# below (never by pydantic-settings, whose errors would print the tokens).
TokenScopes = Annotated[tuple[tuple[SecretStr, tuple[str, ...]], ...], NoDecode]
_MALFORMED_SCOPES = "<not {token: [patterns]} JSON; value hidden>"

# The query/tool embedders (registry.index.minilm_export makes their ONNX files).
EmbedderName = Literal["minilm", "minilm-int8", "tuned", "tuned-int8"]
EMBEDDERS: tuple[str, ...] = get_args(EmbedderName)  # the one list of embedder names

# Artifacts ship beside the packages (models/, examples/); settings can point elsewhere.
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    """Service configuration, read from ``SHORTLIST_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="SHORTLIST_", extra="ignore")

    # -- HTTP face: address, body and connection limits (service.server, service.middleware) -------
    host: str = Field("127.0.0.1", description="Address the HTTP server binds.")
    port: int = Field(8080, ge=1, le=65535, description="Port the HTTP server listens on.")
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Largest request body (413 past it); the default takes a 10,000-tool registry of "
        "about 20 MB in one upload.",
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest request head (request line and header fields) in bytes; larger "
        "gets 431 and the connection is closed.",
    )
    max_header_count: int = Field(
        100, ge=8, le=10_000, description="Most header fields in one request; more gets 431."
    )
    header_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="A request head must arrive within this many seconds of the connection "
        "opening (or of the previous response); else 408 and the connection is closed.",
    )
    body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="Longest pause while a request body is arriving; a body stalled longer "
        "gets 408 and the connection is closed.",
    )
    body_min_bytes_per_second: int = Field(
        1024,
        ge=1,
        description="Slowest average rate a request body may arrive at: a body still arriving "
        "body_timeout_seconds + (bytes received / this rate) seconds after its head gets 408 "
        "and the connection is closed, however steadily it trickles in.",
    )
    probe_connections: int = Field(
        16,
        ge=0,
        le=1024,
        description="Connections past max_connections kept for GET /healthz and /readyz, so "
        "probes answer while slow clients hold every slot; any other request on them gets 503.",
    )
    keep_alive_seconds: int = Field(
        5, ge=1, description="An idle keep-alive connection is closed after this many seconds."
    )
    max_connections: int = Field(
        2048,
        ge=1,
        description="Open connections per process; one more gets 503 and is closed at once "
        "(lowered to fit the open-file limit, whose soft value is raised to the hard one).",
    )
    mcp_max_streams: int = Field(
        64,
        ge=1,
        description="Open GET /mcp event streams per process, counted apart from "
        "max_connections (an idle stream never takes a request's slot); one more gets 503 "
        "too_many_streams with Retry-After.",
    )
    mcp_stream_idle_seconds: float = Field(
        300.0,
        gt=0,
        description="A GET /mcp event stream that has sent no event (keep-alive comments aside) "
        "for this long is closed; the client may open another.",
    )
    worker_threads: int = Field(
        16, ge=1, le=1000, description="Requests handled at once (anyio worker threads); more only queue on the CPU "
        "and cost memory."
    )
    allowed_hosts: HostNames = Field(
        ("localhost", "127.0.0.1", "::1"),
        description="Host names (comma-separated, ports ignored) this server answers to; any "
        "other Host gets 421, and a request whose Origin names another host gets 403 (DNS "
        "rebinding). '*' answers every name: set it (or the names clients use) when the "
        "service is reached through a proxy, a load balancer or a container network.",
    )

    # -- access tokens (service.auth) --------------------------------------------------------------
    admin_token: Tokens = Field(
        (),
        description="Bearer token(s), comma-separated, for registry writes (PUT/POST/DELETE "
        "/registries...); unset = writes are open.",
    )
    query_token: Tokens = Field(
        (),
        description="Bearer token(s), comma-separated, for POST /shortlist and /feedback (admin "
        "tokens work too); unset = queries are open.",
    )
    query_token_scopes: TokenScopes = Field(
        (),
        description="Tools a query token may be shown: a JSON object {token: [tool name or "
        "pattern, ...]} ('github/*', 'fs/read_*'). Each such token is a query token (added to "
        "SHORTLIST_QUERY_TOKEN); its shortlists (POST /shortlist, MCP find_tools) rank and cap "
        "only the tools its patterns match, and a request's allowed_tools can only narrow them.",
    )
    metrics_token: Tokens = Field(
        (),
        description="Bearer token(s), comma-separated, for GET /metrics (query and admin tokens "
        "work too). /metrics needs a token whenever any token is configured; open otherwise.",
    )

    # -- data and artifacts: where registries, models and caches live ------------------------------
    data_dir: Path = Field(Path("./data"), description="Where registries (registries/<name>/v*.json), the embedding cache and the "
        "exported embedder live.",
    )
    policy_dir: Path = Field(
        _PROJECT_ROOT / "models" / "default",
        description="Directory of the 'bor' depth policy (manifest.json + policy.onnx).",
    )
    relevance_model: Path | None = Field(
        None,
        description="Calibrated 'does any tool fit' model used by allow_empty requests (default: "
        "the one in relevance_dir fitted on the embedder's scores).",
    )
    relevance_dir: Path = Field(
        _PROJECT_ROOT / "models",
        description="Where the relevance models live, one per embedder family: relevance.json "
        "(tuned, tuned-int8) and relevance-minilm.json (minilm, minilm-int8).",
    )
    coverage_model: Path | None = Field(
        None,
        description="Coverage refinement of adaptive shortlists (registry.serving.coverage): a "
        "learned per-tool 'needed' probability that trims a one-intent list's unlikely tools and "
        "appends likely ones; empty or unset: off. Built by bench/studies/coverage_loso.py --export.",
    )
    embedder: EmbedderName = Field(
        "tuned",
        description="Sentence embedder: 'tuned' (all-MiniLM-L6-v2 fine-tuned on tool retrieval, "
        "models/tuned-embedder, fp32; composed into the embedder cache at first start), "
        "'minilm' (plain all-MiniLM-L6-v2, fp32), or either's int8 quantisation ('tuned-int8', "
        "'minilm-int8': faster per query at a small quality cost, measured in docs/ranking.md). "
        "Registries are re-embedded when it changes.",
    )
    tuned_embedder_dir: Path = Field(
        _PROJECT_ROOT / "models" / "tuned-embedder",
        description="The artifact of the 'tuned' / 'tuned-int8' embedders: manifest.json + the "
        "MiniLM fine-tune's encoder-delta.safetensors (or a tool adapter's adapter.npy), made by "
        "shortlist train-embedder.",
    )
    embedder_cache_dir: Path | None = Field(
        None,
        description="Where the exported MiniLM ONNX file is cached (default: <data_dir>/cache/embedder).",
    )
    demo_registry: Path | None = Field(
        _PROJECT_ROOT / "examples" / "demo_tools.json",
        description="Tool JSON loaded as registry 'demo' at start-up if it does not exist; "
        "empty to disable.",
    )

    # -- requests: the defaults a ShortlistRequest is resolved with (registry.request) -------------
    default_registry: str = Field(
        "demo", description="Registry the MCP find_tools tool searches when a call names none."
    )
    default_policy: str = Field("bor", description="Depth policy used when a request names none.")
    default_scorer: str = Field("hybrid", description="Scorer used when a request names none.")
    default_max_k: int = Field(20, ge=1, le=MAX_K, description="Cap on the policy's depth.")
    fixed_k: int = Field(5, ge=1, le=MAX_K, description="Depth of the 'fixed' policy when no k is sent.")
    threshold: float = Field(0.35, description="Score cut-off of the 'threshold' policy.")
    depth_bias: float = Field(
        0.0,
        ge=-MAX_DEPTH_BIAS,
        le=MAX_DEPTH_BIAS,
        description="Operating knob of the 'bor' policy, in bits: it stops only where STOP beats "
        "CONTINUE by at least this much. > 0 gives longer lists, < 0 shorter; a request's "
        "depth_bias overrides it.",
    )
    max_query_chars: int = Field(
        262_144,
        ge=16,
        description="Longest query string (a whole user message; 422 past it); longer than ~160 "
        "words is read in windows, the best window per tool.",
    )
    multi_intent: bool = Field(
        True,
        description="Split a request holding several intents ('find X, then email it') and "
        "cover each of them in the shortlist.",
    )
    duplicate_similarity: float = Field(
        0.97,
        ge=0.0,
        le=2.0,
        description="Cosine between two tools' embeddings from which they fold into one slot "
        "(the other listed as an alternate); above 1 disables it (declared equivalents still fold).",
    )

    # -- registries and writes: sizes, async uploads, indexes (registry.writes, registry.index) ----
    max_tools_per_registry: int = Field(50_000, ge=1, description="Most tools in one registry (413 past it).")
    max_tool_bytes: int = Field(
        256 * 1024, ge=256, description="Largest JSON size of one tool definition (422 past it)."
    )
    max_description_chars: int = Field(
        32_768, ge=16, description="Longest tool description (422 past it)."
    )
    async_write_min_texts: int = Field(
        500,
        ge=0,
        description="A PUT or POST tools with more new texts to embed than this answers 202 with "
        "a job to poll (GET /registries/{r}/jobs/{id}) instead of waiting; 0: always synchronous.",
    )
    write_queue_max: int = Field(
        8,
        ge=1,
        description="Most large uploads (202 jobs) queued or running per process; past it a "
        "write that would answer 202 gets 429 with Retry-After (each holds its payload).",
    )
    refit_queue_max: int = Field(
        16,
        ge=1,
        description="Most depth refits queued or running per process (one runs at a time); "
        "past it a refit gets 429 with Retry-After.",
    )
    job_lease_seconds: float = Field(
        30.0,
        gt=0,
        description="Redis: how long the jobs of a replica that died stay claimed before "
        "another replica resumes them.",
    )
    hnsw_min_tools: int = Field(
        20_000, ge=1, description="Registries with at least this many tools use an HNSW index (M=32) instead of "
        "exact search; a write extends the previous version's graph."
    )
    embed_threads: int = Field(1, ge=1, description="ONNX Runtime intra-op threads per request.")
    query_cache_size: int = Field(
        10_000,
        ge=0,
        description="Query embeddings kept in an LRU cache (repeated messages and intents skip "
        "the model); 0 disables it. /metrics counts lookups in "
        "shortlist_query_embedding_cache_lookups_total{result}.",
    )

    # -- feedback: memory, live window, log compaction, pruning (registry.feedback) ----------------
    feedback_retention_seconds: float = Field(
        3600.0, gt=0, description="How long a shortlist id accepts feedback."
    )
    max_remembered_shortlists: int = Field(
        200_000, ge=1, description="Most shortlists remembered for feedback (oldest evicted)."
    )
    live_window_seconds: float = Field(
        3600.0, gt=0, description="Sliding window of the live presentation-rate and BoR gauges."
    )
    feedback_compact_events: int = Field(
        200_000,
        ge=1,
        description="Compact the feedback log (fold events older than the live window into a "
        "checkpoint of their counts) once it holds more than this many events.",
    )
    feedback_compact_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Compact the feedback log as well once the events past its checkpoint take "
        "more than this many bytes (a few large events fill a disk long before the event count; "
        "Redis: the stream's MEMORY USAGE).",
    )
    max_feedback_body_bytes: int = Field(
        128 * 1024, ge=1024, description="Largest POST /feedback body (413 past it)."
    )
    max_feedback_event_bytes: int = Field(
        256 * 1024,
        ge=4096,
        description="Largest feedback event as stored in the log (the report plus what the "
        "shortlist logged with it); a larger one is refused with 422 naming its largest fields.",
    )
    feedback_compact_interval_seconds: float = Field(
        300.0, ge=0, description="Least time between two feedback-log compactions."
    )
    feedback_archive: bool = Field(
        True,
        description="Local mode: keep the events a compaction cuts, gzipped, in "
        "<data_dir>/feedback/archive/ (training data); false drops them (their counts stay).",
    )
    feedback_compact_margin_seconds: float = Field(
        600.0,
        ge=0,
        description="Compaction keeps every event younger than the live window plus this margin "
        "(clock skew between replicas and Redis).",
    )
    prune_min_calls: int = Field(
        5, ge=1, description="Calls before a tool with utility <= 0 becomes a prune candidate."
    )
    prune_min_shown: int = Field(
        20, ge=1, description="Times shown (with feedback) before a never-used tool is a prune candidate."
    )

    # -- learning: exploration and per-registry depth refits (registry.serving.explore, registry.learning) ---
    explore_share: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="Share of adaptive shortlists served 1-3 tools deeper than the policy chose "
        "(the propensity is logged), so feedback shows where a used tool sat past the cut; "
        "never with k. Costs about share x 2 tools of mean K.",
    )
    refit_min_events: int = Field(
        200, ge=10, description="Feedback events a registry needs before a depth refit is tried."
    )
    refit_margin: float = Field(
        0.0,
        ge=0.0,
        description="A refit ships only when the bootstrap lower bound of its gain over the "
        "current policy exceeds this (found rate per query above plain top-K's trade-off).",
    )
    refit_confidence: float = Field(
        0.95, gt=0.5, lt=1.0, description="Confidence of that one-sided bootstrap bound."
    )
    refit_max_mean_k: float = Field(
        2.0,
        ge=1.0,
        description="A candidate whose held-out mean K exceeds the current one's times this is "
        "refused unless its extra found rate beats what fixed top-K buys for the same extra "
        "depth (feedback alone cannot push lists long).",
    )
    refit_review_factor: float = Field(
        1.5,
        gt=1.0,
        description="A refit that would change mean K by more than this factor (either way) is "
        "stored as a candidate version, not activated: an admin activates it.",
    )

    # -- learning: usage-augmented ranking (registry.learning.usage) -------------------------------
    learning: bool = Field(
        True,
        description="Learn from agents' feedback: a query close to past queries whose agents "
        "used a tool lifts that tool (usage memory). Off: no lift, nothing folded. Per "
        "registry: PUT /registries/{r}/learning.",
    )
    learning_beta: float = Field(
        0.3, ge=0.0, le=2.0, description="Most score a tool can gain from usage evidence."
    )
    learning_similarity: float = Field(
        0.8,
        ge=0.0,
        lt=1.0,
        description="Cosine from which a past query counts as evidence for a new one (its weight "
        "grows linearly from 0 there to 1 at identical queries); a refit replaces it with the "
        "registry's own fitted value.",
    )
    learning_candidates: int = Field(
        10,
        ge=1,
        le=1000,
        description="Only this many best tools of the base ranking can be lifted: usage alone "
        "never brings in a tool the query does not match.",
    )
    learning_per_tool: int = Field(
        64, ge=1, description="Most remembered queries per tool (near-identical ones count up)."
    )
    learning_per_registry: int = Field(
        20_000, ge=1, description="Most remembered queries per registry."
    )
    learning_caller_share: float = Field(
        0.2,
        gt=0.0,
        le=1.0,
        description="Share of a registry's counted evidence one caller may hold: its events count "
        "only up to that share, and at least 5% of their weight (never locks learning; applies "
        "once two callers have counted evidence). 1 disables it.",
    )
    learning_save_interval_seconds: float = Field(
        30.0, gt=0, description="How often changed usage memories are saved to the store."
    )
    learning_half_life: float = Field(
        4.0,
        gt=0.0,
        description="Evidence decay: a caller's j-th event for one tool weighs 1 / (1 + j / this).",
    )
    learning_caller_events_per_minute: int = Field(
        600,
        ge=1,
        description="Most feedback events one token (all its X-Caller-Ids together; without tokens, "
        "one X-Caller-Id) counts for learning per minute; more are logged but not learned from "
        "(rate_limited).",
    )

    caller_key: SecretStr | None = Field(
        None,
        description="Secret that keys the caller hashes (learning reports, feedback log); unset: a "
        "random key made once and kept in <data_dir>/caller.key or in Redis.",
    )

    # -- replicas: the shared Redis (registry.backends, registry.writes.sync) ----------------------
    redis_url: SecretStr | None = Field(
        None,
        description="Redis shared by every replica (redis://[:password@]host:6379/0); "
        "unset = the embedded local store under data_dir.",
    )
    redis_prefix: str = Field(
        "shortlist:", min_length=1, description="Prefix of every Redis key and channel."
    )
    redis_cluster: bool = Field(
        False,
        description="SHORTLIST_REDIS_URL names a node of a Redis Cluster (as does a redis+cluster:// "
        "URL); each registry's keys then carry their own hash tag ({shortlist:reg:<name>}...), the others the prefix's ({shortlist:}...).",
    )
    sync_interval_seconds: float = Field(
        1.0, gt=0, le=60, description="Fallback poll of the shared store for other replicas' writes."
    )

    # -- metrics: the Prometheus label bound (service.metrics) ---------------------------------------
    metrics_max_registries: int = Field(
        100,
        ge=0,
        description="Registries with their own registry-labelled series on /metrics (the first "
        "this process loads or sees); the rest are summed under registry=\"~other\" and counted "
        "by shortlist_metrics_folded_registries, so a scrape stays small at any registry count.",
    )

    # -- logging (service.logging_setup) -----------------------------------------------------------
    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log lines on stderr: 'text' (time level logger: message [request id]) or "
        "'json' (one object per line with ts, level, logger, message, request_id).",
    )

    @field_validator("admin_token", "query_token", "metrics_token", mode="before")
    @classmethod
    def _split_tokens(cls, value: object) -> object:
        # Never raise with the value in hand: a validation error would print the token.
        if isinstance(value, (str, SecretStr)):
            value = (value,)
        if isinstance(value, (list, tuple)):
            raw = (v.get_secret_value() if isinstance(v, SecretStr) else str(v) for v in value)
            return tuple(SecretStr(t.strip()) for v in raw for t in v.split(",") if t.strip())
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, (list, tuple)):
            return tuple(h.strip().lower().strip("[]") for h in value if str(h).strip())
        return value

    @field_validator("query_token_scopes", mode="before")
    @classmethod
    def _parse_scopes(cls, value: object) -> object:
        # Never raise with the value in hand: a bad value becomes a message without it.
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError:
                return _MALFORMED_SCOPES
        if isinstance(value, dict):
            value = list(value.items())
        if not isinstance(value, (list, tuple)):
            return _MALFORMED_SCOPES
        scopes = []
        for pair in value:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                return _MALFORMED_SCOPES
            token, patterns = pair
            token = token.get_secret_value() if isinstance(token, SecretStr) else token
            well_formed = isinstance(patterns, (list, tuple)) and patterns and all(
                isinstance(p, str) and p.strip() for p in patterns
            )
            if not (isinstance(token, str) and token.strip() and well_formed):
                return _MALFORMED_SCOPES
            scopes.append((SecretStr(token.strip()), tuple(patterns)))
        return tuple(scopes)

    @model_validator(mode="after")
    def _scoped_tokens_query(self) -> Settings:
        """A token bound to tool patterns is a query token: listing it once is enough."""
        known = {t.get_secret_value() for t in self.query_token}
        extra = tuple(t for t, _ in self.query_token_scopes if t.get_secret_value() not in known)
        if extra:
            self.query_token = (*self.query_token, *extra)
        return self

    @field_validator(
        "demo_registry", "embedder_cache_dir", "redis_url", "coverage_model", "relevance_model", mode="before"
    )
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    def resolved_relevance_model(self) -> Path:
        """``relevance_model``, else the model of ``relevance_dir`` fitted for the embedder's family."""
        if self.relevance_model is not None:
            return self.relevance_model
        name = "relevance-minilm.json" if self.embedder.startswith("minilm") else "relevance.json"
        return self.relevance_dir / name

    def redis_cluster_mode(self) -> bool:
        """Redis Cluster: the setting, or a ``redis+cluster://`` / ``rediss+cluster://`` URL."""
        url = self.redis_url.get_secret_value() if self.redis_url is not None else ""
        return self.redis_cluster or url.split("://", 1)[0].endswith("+cluster")

    def redis_key_prefix(self) -> str:
        """What the deployment's Redis keys start with: the prefix, as a hash tag in cluster mode
        (each registry's keys have their own tag: :class:`~registry.store.redis.RedisStore`)."""
        prefix = self.redis_prefix
        if self.redis_cluster_mode() and "{" not in prefix:
            return "{" + prefix + "}"
        return prefix

    def resolved_embedder_cache(self) -> Path:
        return self.embedder_cache_dir or (self.data_dir / "cache" / "embedder")
