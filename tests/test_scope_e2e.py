"""allowed_tools, tokens bound to tool patterns and several queries in one call, on a real server
(real MiniLM, real ONNX policy) through every face: HTTP, MCP with the official SDK client, and
the Python client. Bad input is refused naming the field and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from registry.request import MAX_QUERIES
from tests.test_mcp import with_session
from tool_shortlist_client import ForbiddenError, InvalidRequestError, ShortlistClient

pytestmark = pytest.mark.e2e

QUERY_TOKEN = "query-token-for-scope-tests-0123"
ADMIN_TOKEN = "admin-token-for-scope-tests-4567"
SCOPED_TOKEN = "scoped-token-for-scope-tests-89ab"  # bound to github/* and fs/read_*
BOUND = ["github/*", "fs/read_*"]

TOOLS = [
    ("github/create_issue", "Open a new issue in a GitHub repository."),
    ("github/close_issue", "Close an issue in a GitHub repository."),
    ("github/list_issues", "List the open issues of a GitHub repository."),
    ("github/create_pull_request", "Open a pull request to merge a branch."),
    ("github/merge_pull_request", "Merge a pull request into the base branch."),
    ("github/comment", "Comment on an issue or a pull request."),
    ("fs/read_file", "Read a text file from the local disk."),
    ("fs/read_dir", "List the files in a directory on the local disk."),
    ("fs/write_file", "Write text to a file on the local disk."),
    ("fs/delete_file", "Delete a file from the local disk."),
    ("slack/post_message", "Post a message to a Slack channel."),
    ("slack/list_channels", "List the Slack channels of the workspace."),
    ("get_weather", "Current weather for a city."),
    ("convert_currency", "Convert an amount of money between two currencies."),
    ("send_email", "Send an email to a recipient."),
]
ISSUE_QUERY = "open a new issue in the repository about the login bug"
FILE_QUERY = "read the config file from disk"


def payload() -> list[dict[str, Any]]:
    return [
        {"name": n, "description": d, "parameters": {"type": "object", "properties": {}}}
        for n, d in TOOLS
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path):
    from tests.server import Servers

    servers = Servers(tmp_path_factory.mktemp("scope"), minilm_cache)
    started = servers.start(
        query_token=QUERY_TOKEN, admin_token=ADMIN_TOKEN,
        query_token_scopes=json.dumps({SCOPED_TOKEN: BOUND}), explore_share="0",
    )  # fmt: skip
    with ShortlistClient(started.url, token=ADMIN_TOKEN) as admin:
        admin.put_registry("tools", payload())
        admin.put_registry("chat", [{"name": "slack/post", "description": "Post to Slack."},
                                    {"name": "email/send", "description": "Send an email."}])  # fmt: skip
    yield started
    servers.close()


def post(server, body: dict[str, Any], token: str = QUERY_TOKEN) -> httpx.Response:
    return httpx.post(
        f"{server.url}/shortlist",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def names(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [tool["name"] for tool in response.json()["tools"]]


def served_total(server) -> float:
    metrics = httpx.get(
        f"{server.url}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    ).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("shortlist_requests_total{")
    )


def test_http_allowed_tools_apply_before_the_cap(server):
    whole = names(post(server, {"registry": "tools", "query": ISSUE_QUERY, "k": 4}))
    assert all(n.startswith("github/") for n in whole)  # a filter after the cap would leave none
    body = post(
        server,
        {
            "registry": "tools",
            "query": ISSUE_QUERY,
            "k": 4,
            "allowed_tools": ["fs/*", "send_email"],
        },
    )
    assert len(names(body)) == 4 and set(names(body)) <= {
        t for t, _ in TOOLS if t.startswith("fs/")
    } | {"send_email"}
    assert body.json()["n_tools"] == 5 and body.json()["p_rand"] == pytest.approx(4 / 5)
    adaptive = post(
        server, {"registry": "tools", "query": FILE_QUERY, "allowed_tools": ["fs/read_*"]}
    )
    assert names(adaptive)[0] == "fs/read_file" and set(names(adaptive)) <= {
        "fs/read_file",
        "fs/read_dir",
    }
    # a tool the request names verbatim is still kept out when not allowed
    named = post(
        server,
        {"registry": "tools", "query": "run get_weather for Paris", "allowed_tools": ["fs/*"]},
    )
    assert "get_weather" not in names(named) and all(n.startswith("fs/") for n in names(named))


def test_http_bad_allowed_tools_are_refused_and_change_nothing(server):
    before = served_total(server)
    for allowed, field in (
        ([], "allowed_tools"),
        (["jira/*"], "allowed_tools"),
        ([""], "allowed_tools.0"),
    ):
        response = post(
            server, {"registry": "tools", "query": FILE_QUERY, "allowed_tools": allowed}
        )
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["type"] == "validation" and [d["field"] for d in error["details"]] == [
            field
        ], error
    unmatched = post(
        server, {"registry": "tools", "query": FILE_QUERY, "allowed_tools": ["fs/*", "jira/*"]}
    )
    assert "'jira/*' matches no tool of registry 'tools'" in unmatched.json()["error"]["message"]
    assert unmatched.json()["error"]["details"][0]["pattern"] == "jira/*"
    assert served_total(server) == before  # nothing was served or remembered


def test_http_a_bound_token_is_narrowed_never_widened(server):
    seen = names(
        post(
            server,
            {"registry": "tools", "query": "email the weather report", "k": 20},
            SCOPED_TOKEN,
        )
    )
    assert set(seen) == {t for t, _ in TOOLS if t.startswith(("github/", "fs/read_"))}
    narrowed = post(
        server, {"registry": "tools", "query": FILE_QUERY, "allowed_tools": ["fs/*"]}, SCOPED_TOKEN
    )
    assert set(names(narrowed)) <= {"fs/read_file", "fs/read_dir"}
    widened = post(
        server,
        {"registry": "tools", "query": FILE_QUERY, "allowed_tools": ["fs/write_file"]},
        SCOPED_TOKEN,
    )
    assert widened.status_code == 422
    assert "none of the tools this token may use" in widened.json()["error"]["message"]
    other = post(server, {"registry": "chat", "query": "post to slack"}, SCOPED_TOKEN)
    assert other.status_code == 403 and other.json()["error"]["type"] == "forbidden"
    # the unbound query token still sees everything
    assert "fs/write_file" in names(
        post(server, {"registry": "tools", "query": "write text to a file", "k": 3})
    )


def test_http_queries_make_one_shortlist_with_feedback(server):
    one = names(post(server, {"registry": "tools", "query": ISSUE_QUERY, "k": 2}))
    two = names(post(server, {"registry": "tools", "query": FILE_QUERY, "k": 2}))
    response = post(server, {"registry": "tools", "queries": [ISSUE_QUERY, FILE_QUERY], "k": 2})
    body = response.json()
    assert names(response) == [one[0], two[0], one[1], two[1]]
    assert [t["queries"] for t in body["tools"]] == [[0], [1], [0], [1]]
    assert body["k"] == 4 and [t["rank"] for t in body["tools"]] == [1, 2, 3, 4]
    single = post(server, {"registry": "tools", "query": FILE_QUERY, "k": 1}).json()
    assert "queries" not in single["tools"][0]  # a single query's tools carry no tags

    feedback = httpx.post(
        f"{server.url}/feedback",
        json={"shortlist_id": body["shortlist_id"], "used": [two[0]], "success": True},
        headers={"Authorization": f"Bearer {QUERY_TOKEN}"},
    )
    assert feedback.status_code == 200, feedback.text
    assert feedback.json()["presented"] == {"exact": True, "equivalent": True}
    assert feedback.json()["p_rand"]["exact"] == pytest.approx(4 / len(TOOLS))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"queries": [FILE_QUERY] * (MAX_QUERIES + 1)}, "queries"),
        ({"queries": []}, "queries"),
        ({"queries": [FILE_QUERY, ""]}, "queries.1"),
        ({"queries": [FILE_QUERY, "   "]}, "queries[1]"),
        ({"query": FILE_QUERY, "queries": [FILE_QUERY]}, "query"),
        ({}, "query"),
    ],
)
def test_http_bad_queries_are_refused_naming_the_field(server, body, field):
    before = served_total(server)
    response = post(server, {"registry": "tools", **body})
    assert response.status_code == 422, response.text
    assert [d["field"] for d in response.json()["error"]["details"]] == [field]
    assert served_total(server) == before


def test_mcp_find_tools_with_allowed_tools_and_queries(server):
    async def use(session) -> list[Any]:
        return [
            await session.call_tool("find_tools", {"registry": "tools", "query": ISSUE_QUERY, "k": 3,
                                                   "allowed_tools": ["fs/*"]}),
            await session.call_tool("find_tools", {"registry": "tools", "queries": [ISSUE_QUERY, FILE_QUERY],
                                                   "k": 1}),
            await session.call_tool("find_tools", {"registry": "tools", "query": FILE_QUERY,
                                                   "allowed_tools": ["nope/*"]}),
            await session.call_tool("find_tools", {"registry": "tools", "queries": []}),
            await session.call_tool("find_tools", {"registry": "chat", "query": "post to slack"}),
        ]  # fmt: skip

    scoped, batch, unmatched, empty, forbidden = with_session(server.url, SCOPED_TOKEN, use)
    listed = [t["name"] for t in scoped.structured_content["tools"]]
    assert len(listed) == 2 and set(listed) == {"fs/read_file", "fs/read_dir"}  # token ∩ request
    tools = batch.structured_content["tools"]
    assert [t["queries"] for t in tools] == [[0], [1]]
    assert tools[0]["name"].startswith("github/") and tools[1]["name"] == "fs/read_file"
    assert "[queries 1]" in batch.content[1].text
    assert (
        unmatched.is_error
        and unmatched.structured_content["error"]["details"][0]["pattern"] == "nope/*"
    )
    assert empty.is_error and empty.structured_content["error"]["details"][0]["field"] == "queries"
    assert forbidden.is_error and forbidden.content[0].text.startswith("forbidden: ")


def test_the_client_sends_both_fields(server):
    with ShortlistClient(server.url, registry="tools", token=QUERY_TOKEN) as client:
        batch = client.shortlist(
            queries=[ISSUE_QUERY, FILE_QUERY], k=1, allowed_tools=["fs/*", "github/*"]
        )
        assert [t.queries for t in batch.tools] == [[0], [1]]
        assert batch.names[1] == "fs/read_file"
        ack = client.feedback(batch, used=["fs/read_file"])
        assert ack.presented.exact
        with pytest.raises(InvalidRequestError) as caught:
            client.shortlist(FILE_QUERY, allowed_tools=["jira/*"])
        assert caught.value.details[0]["pattern"] == "jira/*"
    with (
        ShortlistClient(server.url, registry="chat", token=SCOPED_TOKEN) as scoped,
        pytest.raises(ForbiddenError),
    ):
        scoped.shortlist("post to slack")
