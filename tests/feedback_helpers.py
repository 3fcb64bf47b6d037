"""Helpers shared by the feedback tests.

Served shortlists and feedback events over twenty tools ``t0``..``t19`` on a fake clock; and,
for the compaction and byte-bound tests, a recorder whose live window and clock are one (fake)
clock, and a shortlist that is served (remembered in the recorder's own memory, as the service
does) and then reported on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from registry.feedback import (
    EquivalenceClasses,
    FeedbackEvent,
    FeedbackLog,
    FeedbackRecorder,
    FeedbackRequest,
    LiveWindow,
    RememberedShortlists,
    ShownShortlist,
    ToolCall,
    ToolEfficiency,
    build_event,
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
    report = FeedbackRequest(sid, ["get_weather"], [{"tool": "get_weather", "useful": True}] * calls, True)
    rec.submit(report, known_tools=lambda r: set(SHOWN), equivalence=lambda r: EquivalenceClasses())


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


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


TOOLS = [f"t{i}" for i in range(20)]


def shortlist(
    sid: str = "s1",
    shown: Sequence[str] = ("t0", "t1", "t2"),
    *,
    registry: str = "reg",
    n_tools: int = 20,
    k: int | None = None,
    created: float = 1_000_000.0,
) -> ShownShortlist:
    return ShownShortlist(
        shortlist_id=sid,
        registry=registry,
        version=1,
        n_tools=n_tools,
        k=len(shown) if k is None else k,
        shown=tuple(shown),
        created=created,
    )


def make_event(
    sid: str,
    received: float,
    *,
    registry: str = "reg",
    shown: Sequence[str] = ("t0", "t1", "t2"),
    used: Sequence[str] = ("t1",),
    calls: Sequence[ToolCall] = (),
) -> FeedbackEvent:
    return build_event(
        shortlist(sid, shown, registry=registry),
        list(used),
        list(calls),
        None,
        TOOLS,
        EquivalenceClasses(),
        received,
    )
