"""The shortlist request is one value: the HTTP and MCP schemas are checked against it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from registry.errors import ValidationFailed
from registry.feedback import FeedbackRequest
from registry.index.hybrid import SCORERS
from registry.request import MAX_DEPTH_BIAS, MAX_K, ShortlistRequest
from registry.serving.depth_policies import POLICIES, depth_policies
from registry.settings import Settings
from service.mcp import FindToolsArgs
from service.schemas import FeedbackRequest as FeedbackBody
from service.schemas import ShortlistRequest as ShortlistBody

FIELDS = {f.name: f for f in dataclasses.fields(ShortlistRequest)}
HTTP_ONLY = {"explain"}  # shapes the HTTP response, not the shortlist
MCP_ALIASES = {"limit"}  # langgraph-bigtool's name for a cap; the MCP face folds it into max_k
CHOICES = SimpleNamespace(scorers=tuple(SCORERS), policies=POLICIES)  # what a runner offers


def test_the_http_body_declares_exactly_the_request_fields_with_the_same_defaults():
    body = ShortlistBody.model_fields
    assert set(body) - HTTP_ONLY == set(FIELDS)
    for name, field in FIELDS.items():
        if field.default is not dataclasses.MISSING:
            assert body[name].default == field.default, name
        else:
            assert body[name].is_required(), name


def test_the_mcp_arguments_are_request_fields_with_the_same_defaults():
    args = FindToolsArgs.model_fields
    assert set(args) - MCP_ALIASES <= set(FIELDS)
    for name, field in args.items():
        if name == "registry" or name in MCP_ALIASES:  # the face fills these in
            continue
        if FIELDS[name].default is dataclasses.MISSING:
            assert field.is_required(), name
        else:
            assert field.default == FIELDS[name].default, name


def test_the_schemas_share_the_request_ranges_and_names():
    schema = ShortlistBody.model_json_schema()["properties"]
    k = schema["k"]["anyOf"][0]
    assert (k["minimum"], k["maximum"]) == (1, MAX_K)
    bias = schema["depth_bias"]["anyOf"][0]
    assert (bias["minimum"], bias["maximum"]) == (-MAX_DEPTH_BIAS, MAX_DEPTH_BIAS)
    assert tuple(schema["policy"]["anyOf"][0]["enum"]) == POLICIES
    assert tuple(schema["scorer"]["anyOf"][0]["enum"]) == tuple(SCORERS)


def test_the_http_body_converts_to_the_request_whole():
    body = ShortlistBody.model_validate(
        {"registry": "r", "query": "q", "max_k": 7, "policy": "gap", "scorer": "bm25",
         "allow_empty": True, "explain": True}
    )
    assert body.to_request() == ShortlistRequest(
        registry="r", query="q", max_k=7, policy="gap", scorer="bm25", allow_empty=True
    )


def test_resolve_fills_the_settings_defaults():
    settings = Settings(default_max_k=9, depth_bias=0.5)
    resolved = ShortlistRequest("r", "weather").resolve(settings, CHOICES)
    assert (resolved.policy, resolved.scorer, resolved.cap, resolved.k, resolved.bias) == (
        "bor", "hybrid", 9, None, 0.5
    )
    fixed = ShortlistRequest("r", "weather", k=3).resolve(settings, CHOICES)
    assert (fixed.policy, fixed.k, fixed.bias) == ("fixed", 3, None)


def test_resolve_names_every_invalid_field_at_once():
    request = ShortlistRequest("r", " ", k=0, max_k=MAX_K + 1, policy="nope", scorer="x", depth_bias=99.0)
    with pytest.raises(ValidationFailed) as caught:
        request.resolve(Settings(), CHOICES)
    fields = [p["field"] for p in caught.value.details]
    assert fields == ["query", "k", "max_k", "policy", "scorer", "k", "depth_bias"]


def test_the_names_a_request_may_give_are_the_ones_the_runner_offers():
    narrow = SimpleNamespace(scorers=("bm25",), policies=("gap", "bor"))
    with pytest.raises(ValidationFailed) as caught:
        ShortlistRequest("r", "q", scorer="hybrid", policy="gap").resolve(Settings(), narrow)
    assert caught.value.details == [{"field": "scorer", "message": "unknown scorer 'hybrid'; use one of ['bm25']"}]
    resolved = ShortlistRequest("r", "q", scorer="bm25", policy="gap").resolve(Settings(), narrow)
    assert (resolved.scorer, resolved.policy) == ("bm25", "gap")


def test_scorers_and_depth_policies_are_registered_under_the_names_they_give_themselves(bor_policy):
    assert list(SCORERS) == ["dense", "bm25", "hybrid"]  # the API's order
    assert all(scorer.name == name for name, scorer in SCORERS.items())
    policies = depth_policies(Settings(fixed_k=3, threshold=0.5), bor_policy)
    assert tuple(policies) == POLICIES == ("bor", "fixed", "gap", "threshold")
    assert policies["bor"] is bor_policy
    assert all(policy.name == name for name, policy in policies.items())
    assert (policies["fixed"].k, policies["threshold"].threshold) == (3, 0.5)


def _without(schema: dict, *keys: str) -> dict:
    return {k: v for k, v in schema.items() if k not in keys}


def test_the_faces_declare_each_shared_field_with_the_same_type_bounds_and_doc():
    http = ShortlistBody.model_json_schema()["properties"]
    mcp = FindToolsArgs.model_json_schema()["properties"]
    shared = set(http) & set(mcp)
    assert shared == set(mcp) - MCP_ALIASES and len(shared) >= 9
    for name in shared - {"registry"}:
        assert mcp[name] == http[name], name
    # registry: required over HTTP, the server's default over MCP; the same string otherwise
    assert mcp["registry"]["anyOf"][0] == _without(http["registry"], "description", "title")
    assert mcp["registry"]["description"] == http["registry"]["description"]
    assert _without(mcp["limit"], "description", "title") == _without(mcp["max_k"], "description", "title")


@pytest.mark.parametrize(
    ("field", "value"),
    [("k", True), ("k", "5"), ("max_k", 2.0), ("depth_bias", "0.5"), ("depth_bias", False),
     ("allow_empty", 0), ("allow_empty", "yes")],
)
def test_both_faces_refuse_a_value_of_the_wrong_json_type(field, value):
    """MCP once took depth_bias "0.5" and allow_empty 0 (its fields lacked strict=True)."""
    with pytest.raises(ValueError):
        ShortlistBody.model_validate({"registry": "r", "query": "q", field: value})
    with pytest.raises(ValueError):
        FindToolsArgs.model_validate({"query": "q", field: value})


def test_the_feedback_body_converts_to_the_feedback_request_whole():
    """Both faces (POST /feedback, MCP report_tool_use) validate this body and hand the core one value."""
    body = FeedbackBody.model_validate(
        {"shortlist_id": "s1", "used": ["a"], "success": True, "calls": [{"tool": "a", "useful": False}]}
    )
    assert body.to_request() == FeedbackRequest("s1", ("a",), [{"tool": "a", "useful": False}], True)
    assert FeedbackBody.model_validate({"shortlist_id": "s1", "used": ["a"]}).to_request() == FeedbackRequest(
        "s1", ("a",)
    )
