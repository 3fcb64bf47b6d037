"""Long requests: cut into windows the embedder reads whole.

MiniLM reads 256 tokens and silently drops the rest, so a long message (a pasted log, a
conversation, a task with its context) used to be embedded by its first ~200 words only, or
refused. :func:`query_windows` cuts a long text into windows of at most :data:`WINDOW_WORDS`
words, following its paragraphs: short paragraphs are packed together, a long one is cut into
overlapping runs of words. A request stated in its own paragraph ("Please save this log to
a file") thus gets a window of its own instead of being diluted by the text around it. The
scorer takes, for each tool, the best cosine over the windows ("does any part of the message
ask for this tool?"). With more than :data:`MAX_QUERY_WINDOWS` windows the first one and the
last ones are kept: a request is usually stated at the start of a message or at its end (the
latest turn), and the cost stays bounded (one embedding per window).
"""

from __future__ import annotations

import re

__all__ = ["MAX_QUERY_WINDOWS", "WINDOW_OVERLAP_WORDS", "WINDOW_WORDS", "query_windows"]

WINDOW_WORDS = 160  # ~200-220 MiniLM tokens of English: under its 256-token limit
WINDOW_OVERLAP_WORDS = 32
MAX_QUERY_WINDOWS = 8

_PARAGRAPH = re.compile(r"\n\s*\n")


def _runs(words: list[str]) -> list[list[str]]:
    """Overlapping runs of WINDOW_WORDS words covering ``words``."""
    step = WINDOW_WORDS - WINDOW_OVERLAP_WORDS
    starts = range(0, max(len(words) - WINDOW_OVERLAP_WORDS, 1), step)
    return [words[s : s + WINDOW_WORDS] for s in starts]


def query_windows(text: str) -> list[str]:
    """``[text]`` when it fits one window, else up to :data:`MAX_QUERY_WINDOWS` windows.

    Paragraphs (split at blank lines) are packed greedily into windows of at most
    :data:`WINDOW_WORDS` words; a longer paragraph becomes runs overlapping by
    :data:`WINDOW_OVERLAP_WORDS` words. With more windows than the maximum, the first and the
    last ``MAX_QUERY_WINDOWS - 1`` are returned, in text order.
    """
    if len(text.split()) <= WINDOW_WORDS:
        return [text]
    windows: list[list[str]] = []
    packed: list[str] = []
    for paragraph in _PARAGRAPH.split(text):
        words = paragraph.split()
        if not words:
            continue
        if len(words) > WINDOW_WORDS:
            if packed:
                windows.append(packed)
                packed = []
            windows.extend(_runs(words))
        elif len(packed) + len(words) > WINDOW_WORDS:
            windows.append(packed)
            packed = list(words)
        else:
            packed.extend(words)
    if packed:
        windows.append(packed)
    if len(windows) > MAX_QUERY_WINDOWS:
        windows = windows[:1] + windows[-(MAX_QUERY_WINDOWS - 1) :]
    return [" ".join(w) for w in windows]
