"""Reading a request before retrieval: long-text windows, intents, tool names in the text."""

from registry.query.intents import MAX_INTENTS, Intent, split_intents, split_request
from registry.query.names import NameIndex
from registry.query.windows import MAX_QUERY_WINDOWS, WINDOW_WORDS, query_windows

__all__ = [
    "MAX_INTENTS",
    "MAX_QUERY_WINDOWS",
    "WINDOW_WORDS",
    "Intent",
    "NameIndex",
    "query_windows",
    "split_intents",
    "split_request",
]
