"""Reading a request: intents, tools named verbatim, long-text windows (pure functions)."""

from __future__ import annotations

import pytest

from registry.index.named_tools import NameIndex, identifier_like
from registry.serving.intents import MAX_INTENTS, split_intents
from registry.serving.windows import MAX_QUERY_WINDOWS, WINDOW_WORDS, query_windows


@pytest.mark.parametrize(
    "text, intents",
    [
        (
            "search the web for X, then save a summary to a file and email it",
            ("search the web for X", "save a summary to a file", "email it"),
        ),
        ("find the report and send it to Bob", ("find the report", "send it to Bob")),
        (
            "Get the weather in Oslo. Also, book a table for two tonight.",
            ("Get the weather in Oslo", "book a table for two tonight"),
        ),
        (
            "List my open pull requests; after that post the count to #dev",
            ("List my open pull requests", "post the count to #dev"),
        ),
        (
            "Can you give me the channel clips, and the channel details?",
            ("Can you give me the channel clips", "the channel details"),
        ),
    ],
)
def test_split_intents_cuts_steps(text, intents):
    assert split_intents(text) == intents


@pytest.mark.parametrize(
    "text",
    [
        "tell the #backend channel that the deploy is done",
        "what is the weather in paris and london",  # "and" joining nouns is one intent
        "Find the area of a triangle with a base of 10 units and height of 5 units.",
        "Find flights for next week",  # "next" as a word, not a step
        "I am also curious about the score",  # "also" inside a clause
        "Please list the Flixbus stations. Thank you for your help!",  # pleasantries dropped
        "convert 20 euros to yen",
    ],
)
def test_split_intents_keeps_one_intent_whole(text):
    assert split_intents(text) == (text.strip(),)


def test_split_intents_is_bounded():
    many = ". ".join(f"send message number {i} to the team" for i in range(10))
    assert len(split_intents(many)) == MAX_INTENTS
    long_text = "find the file and email it. " * 200  # a pasted document is not split
    assert split_intents(long_text) == (long_text.strip(),)


def test_identifier_like():
    assert all(map(identifier_like, ["get_ticker_info", "slack-post", "math.factorial", "createIssue", "v2"]))
    assert not any(map(identifier_like, ["search", "timeport", "Weather"]))


def test_name_index_finds_identifiers_segments_and_quoted_words():
    names = ["yahoo.get_ticker_info", "search", "fs/read_file", "createIssue", "send_email", "math.factorial"]
    index = NameIndex(names)
    assert index.find("run get_ticker_info for AAPL") == [0]
    assert index.find("run YAHOO.GET_TICKER_INFO for AAPL") == [0]  # any case
    assert index.find("please search the web") == []  # a plain word is language
    assert index.find("use `search` for it") == [1]
    assert index.find('call "search"') == [1]
    assert index.find("read_file config.yaml, then send_email.") == [2, 4]
    assert index.find("createIssue now") == [3]
    assert index.find("compute the factorial of 5") == []  # plain segment: not a name
    assert index.find("call math.factorial(5)") == [5]
    assert index.find("send_emails to all") == []  # whole tokens only


def test_name_index_shared_segment_names_every_owner():
    index = NameIndex(["github/create_issue", "gitlab/create_issue", "slack_post"])
    assert index.find("create_issue for the crash") == [0, 1]


def test_name_index_ignores_pasted_lists():
    names = [f"tool_{i}" for i in range(100)]
    assert NameIndex(names).find(" ".join(names)) == []


def test_query_windows_short_text_is_one_window():
    assert query_windows("find the weather") == ["find the weather"]


def test_query_windows_follow_paragraphs_and_stay_bounded():
    log = " ".join(f"w{i}" for i in range(5000))
    request = "Write this log to a file called out.log"
    windows = query_windows(f"{log}\n\n{request}")
    assert len(windows) == MAX_QUERY_WINDOWS
    assert windows[-1] == request  # the request's own paragraph is its own window
    assert windows[0].split()[0] == "w0"  # the start is kept
    assert all(len(w.split()) <= WINDOW_WORDS for w in windows)
    packed = query_windows("\n\n".join(["alpha beta gamma"] * 100))
    assert len(packed) == 2 and all(len(w.split()) <= WINDOW_WORDS for w in packed)


def test_split_request_marks_steps_apart_from_further_questions():
    from registry.serving.intents import split_request

    steps = split_request("search the web for X, then save a summary to a file and email it")
    assert [i.step for i in steps[1:]] == [True, True]
    asked = split_request("Get the weather in Oslo. What is the time in Tokyo?")
    assert [(i.text, i.step) for i in asked][1:] == [("What is the time in Tokyo", False)]
    phrase = split_request("Can you give me the channel clips, and the channel details?")
    assert phrase[1].step is False


def test_context_sentences_join_the_request_they_belong_to():
    assert split_intents("I am planning a trip. It should be cheap.") == (
        "I am planning a trip. It should be cheap.",
    )
    assert split_intents("This is ridiculous. I need to find a clinical trial ASAP") == (
        "This is ridiculous. I need to find a clinical trial ASAP",
    )
    assert split_intents("I am planning a trip. Book a flight to Rome. Then find a hotel.") == (
        "I am planning a trip. Book a flight to Rome",
        "find a hotel",
    )
