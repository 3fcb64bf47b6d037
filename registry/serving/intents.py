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
from typing import NamedTuple

__all__ = ["MAX_INTENTS", "MIN_INTENT_WORDS", "Intent", "split_intents", "split_request"]

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
_INTEREST = re.compile(
    r"^i(?:'m|\s+am)\s+(?:also\s+)?(?:interested\s+in|curious\s+about|looking\s+for)\b|"
    r"^i(?:'d|\s+would)\s+(?:also\s+)?(?:like|love)\s+(?:to\s+(?:know|see|get|find|have|read)|some)\b",
    re.IGNORECASE,
)
# How a sentence that asks for something of its own starts (after any leading connective):
# "Send ...", "Please send ...", "Can you also send ...", "I'd like you to send ...".
_ASKS = re.compile(
    r"^(?:please\s+|kindly\s+)?(?:(?:can|could|would|will)\s+you\s+(?:also\s+|please\s+|then\s+)?|"
    r"i(?:'d|\s+would)\s+(?:also\s+)?like\s+(?:you\s+)?to\s+|"
    r"i\s+(?:also\s+)?(?:need|want)\s+(?:you\s+)?to\s+|"
    r"(?:let's|lets)\s+)?(?P<verb>[a-z]+)\b",
    re.IGNORECASE,
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def _words(text: str) -> int:
    return len(_WORD.findall(text))


class Intent(NamedTuple):
    """One intent of a request. ``step``: it was introduced as a step of its own (a sequencing
    word, "and" + an action verb, an imperative sentence, a list item), not merely as a further
    question or noun phrase, which readers treat as weaker evidence of a separate tool."""

    text: str
    step: bool


def _split_joins(clause: str, step: bool) -> list[Intent]:
    """Cut at "and"/"or"/"," where an action verb or a long noun phrase follows."""
    parts: list[Intent] = []
    start = 0
    for match in _JOIN.finditer(clause):
        rest = clause[match.end() :]
        head = _WORD.match(rest)
        if head is None:
            continue
        verb = head.group(0).lower() in ACTION_VERBS
        comma_and = match.group(0).strip().lower().startswith(",") and "and" in match.group(0)
        if verb or (comma_and and _words(rest) >= MIN_PHRASE_WORDS):
            parts.append(Intent(clause[start : match.start()], step))
            start, step = match.end(), verb
    parts.append(Intent(clause[start:], step))
    return parts


def _imperative(sentence: str) -> bool:
    """Does the sentence open with an action verb (maybe politely, or after "also"/"then")?"""
    stripped = sentence.strip()
    match = _ASKS.match(_LEADING.sub("", stripped))
    verb = match is not None and match.group("verb").lower() in ACTION_VERBS
    return verb or _LEADING.match(stripped) is not None


def _asks(sentence: str) -> bool:
    """Does the sentence ask for something of its own: an action verb (maybe politely), a
    question, or a stated interest ("I'm also interested in ...")?"""
    text = _LEADING.sub("", sentence.strip())
    return _imperative(sentence) or text.endswith("?") or _INTEREST.match(text) is not None


def _sentences(text: str) -> list[Intent]:
    """Sentences that ask for something of their own, each with the context around it.

    A sentence that does not ask ("It should have 2 bedrooms.", "I'm planning a trip.") joins
    the asking sentence before it, or the first one after it when none came before.
    """
    merged: list[Intent] = []
    context: list[str] = []
    for sentence in _SENTENCE.split(text):
        if _asks(sentence):
            merged.append(Intent(" ".join([*context, sentence]), _imperative(sentence)))
            context = []
        elif merged:
            merged[-1] = Intent(f"{merged[-1].text} {sentence}", merged[-1].step)
        else:
            context.append(sentence)
    if context:
        merged.append(Intent(" ".join(context), False))
    return merged


def _merge_short(parts: list[Intent]) -> list[Intent]:
    """Join fragments under MIN_INTENT_WORDS words to the previous part (or the next)."""
    merged: list[Intent] = []
    for part in parts:
        if merged and _words(part.text) < MIN_INTENT_WORDS:
            merged[-1] = Intent(f"{merged[-1].text} {part.text}", merged[-1].step)
        else:
            merged.append(part)
    if len(merged) > 1 and _words(merged[0].text) < MIN_INTENT_WORDS:
        merged[1] = Intent(f"{merged[0].text} {merged[1].text}", merged[1].step)
        merged.pop(0)
    return merged


def split_request(text: str) -> tuple[Intent, ...]:
    """The request's intents, in order, each marked as a step or not; one intent (the request
    itself) when it holds one or is too long to split.

    Args:
        text: the user's request.

    Returns:
        1 to :data:`MAX_INTENTS` intents with non-empty, stripped text. With more clauses than
        that the first ones are kept.
    """
    stripped = text.strip()
    if len(stripped) > MAX_SPLIT_CHARS:
        return (Intent(stripped, False),)
    clauses: list[Intent] = []
    for sentence in _sentences(stripped):
        for index, piece in enumerate(_SEQUENCE.split(sentence.text)):
            clauses.extend(_split_joins(piece, sentence.step or index > 0))
    parts = [
        Intent(_LEADING.sub("", " ".join(c.text.split()).strip(" ,;:.?!")), c.step) for c in clauses
    ]
    parts = _merge_short([p for p in parts if p.text and not _PLEASANTRY.match(p.text)])
    unique = list({p.text: p for p in reversed(parts)}.values())[::-1]  # first of each text
    if len(unique) <= 1:
        return (Intent(stripped, False),)
    return tuple(unique[:MAX_INTENTS])


def split_intents(text: str) -> tuple[str, ...]:
    """The texts of :func:`split_request`'s intents."""
    return tuple(intent.text for intent in split_request(text))
