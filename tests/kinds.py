"""What kind each test file is: the one mapping ``tests/conftest.py`` marks tests from.

- ``unit``: fast, in-process, fakes allowed (the hashing embedder), no HTTP.
- ``api``: the real app in-process through ``TestClient`` (or the MCP face on it).
- ``e2e``: real programs: a server process, the real MiniLM or ONNX export, a real Redis, the
  browser, docker, promtool, or the CLI in a subprocess.

A test marked itself (``@pytest.mark.e2e``) keeps its own kind; every other test takes its
file's. ``pytest -m unit`` runs the fast ones; ``make test`` runs them all. ``tests/test_kinds.py``
fails when a test file is in no kind, or in two.
"""

from __future__ import annotations

KINDS: dict[str, frozenset[str]] = {
    "unit": frozenset({
        "test_architecture", "test_assembly", "test_bench_imports", "test_bor", "test_carve", "test_companions",
        "test_compose", "test_core", "test_corpus", "test_coverage", "test_dense_index",
        "test_depth", "test_depth_training", "test_engine", "test_feedback", "test_feedback_log",
        "test_feedback_stats", "test_graph", "test_k8s", "test_kinds",
        "test_learning_neighbourhood", "test_learning_profiles", "test_learning_usage",
        "test_loso_report", "test_mcp_data", "test_name_checks", "test_needs", "test_query",
        "test_refit_replay", "test_request", "test_scope", "test_settings_doc", "test_store",
        "test_tool_errors", "test_tool_text", "test_tools",
    }),
    "api": frozenset({
        "test_api", "test_auth", "test_console", "test_disk_full_admin", "test_error_bounds",
        "test_feedback_learning_fields", "test_fuzz", "test_host_guard", "test_incremental_writes",
        "test_learning_api", "test_limits", "test_metrics_bound", "test_odd_input", "test_policies",
        "test_provider_names", "test_query_cache", "test_tool_names",
    }),
    "e2e": frozenset({
        "test_adapters", "test_api_docs", "test_bigtool", "test_chains_e2e", "test_cli_edges",
        "test_client", "test_client_doc", "test_client_retry", "test_companions_e2e", "test_coverage_e2e",
        "test_companions_redis", "test_console_browser", "test_crash", "test_dashboard",
        "test_deploy", "test_depth_features", "test_disk_full", "test_docker", "test_e2e",
        "test_embed", "test_embed_int8", "test_embed_integrity", "test_evaluate",
        "test_feedback_bounds", "test_feedback_compaction", "test_feedback_e2e", "test_finetune",
        "test_hot_path", "test_install", "test_integrity", "test_jobs", "test_jobs_crash",
        "test_langchain_middleware", "test_learning_e2e", "test_learning_profiles_e2e",
        "test_learning_redis", "test_learning_wipe", "test_logging", "test_mcp", "test_mcp_streams",
        "test_minilm_graph", "test_named_misses_e2e", "test_needs_e2e",
        "test_openai_agents_example", "test_operator_fixes", "test_policies_redis_e2e",
        "test_quickstart", "test_readonly_start", "test_redis_cluster_e2e", "test_redis_e2e",
        "test_redis_store", "test_redis_wipe", "test_scope_e2e", "test_server_harness",
        "test_server_limits", "test_shorthand", "test_slow_bodies", "test_superseded_jobs",
        "test_system_deps", "test_tool_names_e2e", "test_tuned_e2e", "test_tuned_embedder",
        "test_workloads_e2e",
    }),
}


def kind_of(module: str) -> str | None:
    """The kind of the test file named ``module`` (``test_api``), None if it is in none."""
    return next((kind for kind, modules in KINDS.items() if module in modules), None)
