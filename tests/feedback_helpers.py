"""Feedback-recorder helpers shared by the compaction and byte-bound tests.

A recorder whose live window and clock are one (fake) clock, and a shortlist that is served
(remembered in the recorder's own memory, as the service does) and then reported on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from registry.feedback import (
    EquivalenceClasses,
    FeedbackLog,
    FeedbackRecorder,
    LiveWindow,
    RememberedShortlists,
    ShownShortlist,
    ToolEfficiency,
)

SHOWN = ("get_weather", "send_email")


def clocked_recorder(
    memory: RememberedShortlists, log: FeedbackLog, clock: Callable[[], float], **options: Any
) -> FeedbackRecorder:
    """A recorder with a one-hour live window, both on ``clock``; ``options`` go to the recorder."""
    return FeedbackRecorder(
        memory, log, LiveWindow(3600, clock=clock), ToolEfficiency(), clock=clock, **options
    )


def submit_served(rec: FeedbackRecorder, sid: str, calls: int = 1) -> None:
    """Serve ``sid`` (get_weather, send_email on registry ``r``), then report get_weather used
    with ``calls`` useful calls of it."""
    rec.remember(ShownShortlist(sid, "r", 1, 20, 2, SHOWN, time.time()))
    rec.submit(sid, ["get_weather"], [{"tool": "get_weather", "useful": True}] * calls, True,
               known_tools=lambda r: set(SHOWN), equivalence=lambda r: EquivalenceClasses())


def assert_close_waits(close: Callable[[], None], started: threading.Event, release: threading.Event) -> None:
    """``close`` blocks while a compaction is held up (``started`` and not yet ``release``d),
    and returns once it is released."""
    assert started.wait(10)
    closer = threading.Thread(target=close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # waiting for the compaction
    release.set()
    closer.join(10)
    assert not closer.is_alive()
