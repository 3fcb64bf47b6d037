"""Split a request into the intents it holds, so a shortlist can cover each of them.

Real tasks chain several tools ("search the web for X, then save a summary to a file and
email it"). A single embedding of the whole request lands near one of them; the others may
rank far down. :func:`split_intents` cuts the request into clauses with plain rules (no
model, microseconds):

* sentences (``.``, ``?``, ``!``, ``;``, line breaks);
* sequencing words: "then", "after that", "afterwards", "also", "as well as",
  "additionally", "finally", "next", "plus", "once done";
* "and" / "or" / a comma when an action verb follows ("find the file **and email** it");
* ", and" / "as well as" between noun phrases of a request ("the channel clips and the
  channel details") when each side has at least :data:`MIN_INTENT_WORDS` words.

Fragments shorter than :data:`MIN_INTENT_WORDS` words join their neighbour. At most
:data:`MAX_INTENTS` intents are returned; a request with one clause returns one intent (the
request itself), and callers then retrieve exactly as before.
"""

from __future__ import annotations

import re

__all__ = ["MAX_INTENTS", "MIN_INTENT_WORDS", "split_intents"]

MAX_INTENTS = 4
MIN_INTENT_WORDS = 2
# Longer requests (pasted documents, logs) are not split: their sentences are content, not
# steps of a task.
MAX_SPLIT_CHARS = 2_000
# A noun phrase after ", and" is its own intent only when it is this long.
MIN_PHRASE_WORDS = 3

# Imperative verbs that start a new step after "and" / "or" / a comma.
ACTION_VERBS = frozenset(
    ["add", "analyse", "analyze", "append", "archive", "ask", "assign", "attach", "book", "browse", "buy", "calculate", "call", "cancel", "check", "clone", "close", "comment", "commit", "compare", "compile", "compute", "convert", "copy", "create", "crop", "delete", "deploy", "describe", "download", "draft", "draw", "edit", "email", "enable", "disable", "estimate", "execute", "explain", "export", "fetch", "fill", "find", "forward", "generate", "get", "give", "grab", "invite", "list", "load", "locate", "log", "look", "make", "merge", "message", "move", "navigate", "notify", "open", "order", "paste", "pay", "pick", "ping", "plot", "post", "print", "publish", "pull", "push", "put", "query", "read", "record", "remember", "remind", "remove", "rename", "reply", "report", "request", "reserve", "resize", "retrieve", "return", "review", "run", "save", "scan", "schedule", "search", "select", "send", "set", "share", "show", "sign", "sort", "start", "stop", "store", "submit", "summarise", "summarize", "switch", "sync", "take", "tell", "text", "track", "translate", "tweet", "update", "upload", "verify", "visit", "watch", "write"]
)

# Sentence ends, blank lines, and line breaks that start a list item ("- ", "2. ", "3) ").
_SENTENCE = re.compile(r"(?<=[.?!;])\s+|\n\s*\n|\n\s*(?=[-*\u2022]\s|\d+[.)]\s)")
_SEQUENCE = re.compile(
    r"(?:,\s*|\s+)(?:and\s+)?(?:then|after\s+that|afterwards|once\s+(?:that(?:'s|\s+is)\s+)?done)"
    r"\b[,:]?\s+|(?:,\s*(?:and\s+)?|\s+and\s+)(?:also|additionally|finally|as\s+well\s+as|plus)"
    r"\b[,:]?\s+",
    re.IGNORECASE,
)
# Openers that carry no request of their own.
_LEADING = re.compile(
    r"^(?:also|additionally|finally|then|next|furthermore|moreover|lastly|and|plus|after\s+that|"
    r"afterwards)\b[,:]?\s*",
    re.IGNORECASE,
)
_PLEASANTRY = re.compile(
    r"^(?:thanks?|thank you|cheers|hi|hello|hey)\b(?:\W+\w+){0,5}\W*$",
    re.IGNORECASE,
)
_JOIN = re.compile(r"(?:,\s*|\s+)(?:and|or)\s+|,\s+", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def _words(text: str) -> int:
    return len(_WORD.findall(text))


def _split_joins(clause: str) -> list[str]:
    """Cut at "and"/"or"/"," where an action verb or a long noun phrase follows."""
    parts: list[str] = []
    start = 0
    for match in _JOIN.finditer(clause):
        rest = clause[match.end() :]
        head = _WORD.match(rest)
        if head is None:
            continue
        verb = head.group(0).lower() in ACTION_VERBS
        comma_and = match.group(0).strip().lower().startswith(",") and "and" in match.group(0)
        if verb or (comma_and and _words(rest) >= MIN_PHRASE_WORDS):
            parts.append(clause[start : match.start()])
            start = match.end()
    parts.append(clause[start:])
    return parts


def _merge_short(parts: list[str]) -> list[str]:
    """Join fragments under MIN_INTENT_WORDS words to the previous part (or the next)."""
    merged: list[str] = []
    for part in parts:
        if merged and _words(part) < MIN_INTENT_WORDS:
            merged[-1] = f"{merged[-1]} {part}"
        else:
            merged.append(part)
    if len(merged) > 1 and _words(merged[0]) < MIN_INTENT_WORDS:
        merged[1] = f"{merged[0]} {merged[1]}"
        merged.pop(0)
    return merged


def split_intents(text: str) -> tuple[str, ...]:
    """The request's intents, in order; ``(text,)`` when it holds one (or is too long to split).

    Args:
        text: the user's request.

    Returns:
        1 to :data:`MAX_INTENTS` non-empty clauses (stripped). With more clauses than that the
        first ones are kept.
    """
    stripped = text.strip()
    if len(stripped) > MAX_SPLIT_CHARS:
        return (stripped,)
    clauses: list[str] = []
    for sentence in _SENTENCE.split(stripped):
        for step in _SEQUENCE.split(sentence):
            clauses.extend(_split_joins(step))
    parts = [_LEADING.sub("", " ".join(c.split()).strip(" ,;:.?!")) for c in clauses]
    parts = _merge_short([p for p in parts if p and not _PLEASANTRY.match(p)])
    unique = list(dict.fromkeys(parts))
    if len(unique) <= 1:
        return (stripped,)
    return tuple(unique[:MAX_INTENTS])
