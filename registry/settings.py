"""The domain's settings, grouped by concern. Read once at start-up and passed down; nothing reads
the environment elsewhere.

Each concern is a frozen group (``ServingArgs``, ``FeedbackArgs``, ``LearningArgs``, ...) that
declares its fields once, with their bounds and descriptions; :class:`Settings` is all of them
read from ``SHORTLIST_*`` variables (flat names, so operators' deployments never change). A part
is handed the group it reads, ``ServingArgs.of(settings)``, as infinity's engine is handed its
``EngineArgs``: its constructor says what it depends on, and it cannot read anything else.

The HTTP, MCP, access-token and logging settings belong to the web layer
(:class:`service.settings.ServiceSettings`, which adds them to these); docs/configuration.md is
generated from both (``python -m service.settings_doc``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, TypeVar, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from registry.request import MAX_DEPTH_BIAS, MAX_K
from registry.tool_checks import ToolLimits

# The query/tool embedders (registry.index.minilm_export makes their ONNX files).
EmbedderName = Literal["minilm", "minilm-int8", "tuned", "tuned-int8"]
EMBEDDERS: tuple[str, ...] = get_args(EmbedderName)  # the one list of embedder names

# Artifacts ship beside the packages (models/, examples/); settings can point elsewhere.
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


def empty_is_none(value: object) -> object:
    """An empty variable (``SHORTLIST_REDIS_URL=``) means unset."""
    return None if value == "" else value


G = TypeVar("G", bound="SettingsGroup")


class SettingsGroup(BaseModel):
    """A concern's settings: frozen, so the part it is handed to cannot change what others read."""

    model_config = ConfigDict(frozen=True)

    @classmethod
    def of(cls: type[G], settings: BaseModel) -> G:
        """This group's values out of ``settings`` (any object with its fields, e.g. :class:`Settings`)."""
        # Copied, not validated again: the values are the settings' own (checked when read).
        return cast(G, cls.model_construct(**settings.model_dump(include=set(cls.model_fields))))


class DataDir(SettingsGroup):
    """Data directory: where registries, caches and logs live (the store and the embedder cache read it)."""

    data_dir: Path = Field(Path("./data"), description="Where registries (registries/<name>/v*.json), the embedding cache and the "
        "exported embedder live.",
    )


class EmbedderChoice(SettingsGroup):
    """Embedder choice: the sentence embedder, read by its loader and by the relevance gate fitted on its scores."""

    embedder: EmbedderName = Field(
        "tuned",
        description="Sentence embedder: 'tuned' (all-MiniLM-L6-v2 fine-tuned on tool retrieval, "
        "models/tuned-embedder, fp32; composed into the embedder cache at first start), "
        "'minilm' (plain all-MiniLM-L6-v2, fp32), or either's int8 quantisation ('tuned-int8', "
        "'minilm-int8': faster per query at a small quality cost, measured in docs/ranking.md). "
        "Registries are re-embedded when it changes.",
    )


class EmbedderArgs(DataDir, EmbedderChoice):
    """Embedder: its artifact, cache and threads (registry.index.embedders, the query cache)."""

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
    embed_threads: int = Field(1, ge=1, description="ONNX Runtime intra-op threads per request.")
    query_cache_size: int = Field(
        10_000,
        ge=0,
        description="Query embeddings kept in an LRU cache (repeated messages and intents skip "
        "the model); 0 disables it. /metrics counts lookups in "
        "shortlist_query_embedding_cache_lookups_total{result}.",
    )

    _empty_cache = field_validator("embedder_cache_dir", mode="before")(empty_is_none)

    def resolved_embedder_cache(self) -> Path:
        """Where the exported ONNX embedder is cached: the setting, else ``<data_dir>/cache/embedder``."""
        return self.embedder_cache_dir or (self.data_dir / "cache" / "embedder")


class ArtifactArgs(SettingsGroup):
    """Artifacts: the depth policy and the demo registry loaded at start-up (registry.startup)."""

    policy_dir: Path = Field(
        _PROJECT_ROOT / "models" / "default",
        description="Directory of the 'bor' depth policy (manifest.json + policy.onnx).",
    )
    demo_registry: Path | None = Field(
        _PROJECT_ROOT / "examples" / "demo_tools.json",
        description="Tool JSON loaded as registry 'demo' at start-up if it does not exist; "
        "empty to disable.",
    )

    _empty_demo = field_validator("demo_registry", mode="before")(empty_is_none)


_TOOL_LIMITS = ToolLimits()  # the parser's limits declare the defaults of the settings below


class RegistryLimits(SettingsGroup):
    """Registry limits: sizes checked by tool parsing, and the index kind (registry.tools, registry.writes)."""

    max_tools_per_registry: int = Field(
        _TOOL_LIMITS.max_tools, ge=1, description="Most tools in one registry (413 past it)."
    )
    max_tool_bytes: int = Field(
        _TOOL_LIMITS.max_tool_bytes, ge=256, description="Largest JSON size of one tool definition (422 past it)."
    )
    max_description_chars: int = Field(
        _TOOL_LIMITS.max_description_chars, ge=16, description="Longest tool description (422 past it)."
    )
    hnsw_min_tools: int = Field(
        20_000, ge=1, description="Registries with at least this many tools use an HNSW index (M=32) instead of "
        "exact search; a write extends the previous version's graph."
    )


class ServingArgs(EmbedderChoice):
    """Serving: a request's defaults, the ranking and depth knobs (registry.request, the QueryRunner)."""

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
    explore_share: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="Share of adaptive shortlists served 1-3 tools deeper than the policy chose "
        "(the propensity is logged), so feedback shows where a used tool sat past the cut; "
        "never with k. Costs about share x 2 tools of mean K.",
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

    _empty_models = field_validator("coverage_model", "relevance_model", mode="before")(empty_is_none)

    def resolved_relevance_model(self) -> Path:
        """``relevance_model``, else the model of ``relevance_dir`` fitted for the embedder's family."""
        if self.relevance_model is not None:
            return self.relevance_model
        name = "relevance-minilm.json" if self.embedder.startswith("minilm") else "relevance.json"
        return self.relevance_dir / name


class EngineArgs(RegistryLimits, ServingArgs):
    """What the engine reads: the registries' limits (its writes) and the serving group (its queries)."""


class WriteArgs(SettingsGroup):
    """Large writes: asynchronous uploads and their queue (registry.writes.write_jobs)."""

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


class FeedbackArgs(SettingsGroup):
    """Feedback: remembered shortlists, live window, log compaction, pruning (the FeedbackRecorder)."""

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


class LearningArgs(SettingsGroup):
    """Learning: usage-augmented ranking (the UsageLearner)."""

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


class RefitArgs(SettingsGroup):
    """Refits: per-registry depth refits and their queue (the PolicyManager)."""

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
    refit_queue_max: int = Field(
        16,
        ge=1,
        description="Most depth refits queued or running per process (one runs at a time); "
        "past it a refit gets 429 with Retry-After.",
    )


class StoreArgs(DataDir):
    """Store and replicas: the shared Redis, sync, job leases, the caller key (registry.store)."""

    store_backend: str | None = Field(
        None,
        min_length=1,
        description="Where every store lives, by backend name (registry.assembly.STORE_BACKENDS: "
        "local, redis); unset = redis when SHORTLIST_REDIS_URL is set, else local.",
    )
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
    job_lease_seconds: float = Field(
        30.0,
        gt=0,
        description="Redis: how long the jobs of a replica that died stay claimed before "
        "another replica resumes them.",
    )
    caller_key: SecretStr | None = Field(
        None,
        description="Secret that keys the caller hashes (learning reports, feedback log); unset: a "
        "random key made once and kept in <data_dir>/caller.key or in Redis.",
    )

    _empty_url = field_validator("redis_url", mode="before")(empty_is_none)

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


class Settings(
    ArtifactArgs,
    EmbedderArgs,
    EngineArgs,
    WriteArgs,
    FeedbackArgs,
    LearningArgs,
    RefitArgs,
    StoreArgs,
    BaseSettings,
):
    """The domain's configuration: every group, read from ``SHORTLIST_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="SHORTLIST_", extra="ignore", frozen=False)

    def callers_required(self) -> bool:
        """Whether usage learning counts only events that name their caller. The domain knows no
        credentials; the service requires callers once query tokens identify them."""
        return False
