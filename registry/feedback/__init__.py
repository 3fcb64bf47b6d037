"""Feedback on served shortlists: which tools the agent used, and how useful each call was.

An agent quotes the ``shortlist_id`` of a shortlist it was served and reports the tools it
used (and optionally each call with its marginal-utility sign and the task outcome). From that
the service keeps two families of numbers.

Live presentation rate and Bits-over-Random. A shortlist *presented* the answer when it showed
at least one used tool. Under random selection of ``K`` out of ``N`` tools with ``R`` used
ones, that happens with probability ``P_rand(N, R, K)`` (:func:`registry.bor.p_rand`), so over
a sliding window of events::

    rate = presented / events        BoR = log2(rate / mean(P_rand))    bits

Two variants are kept side by side, as ToolEq recommends reporting both. *exact*: a used tool
was shown, ``R = |used|``. *equivalent*: a used tool or any declared equivalent of one was
shown (max over equivalents: any valid alternative earns the credit) and, to stay
chance-corrected, ``R = |union of the equivalence classes of the used tools|``.

Tool efficiency (marginal tool utility). Each reported call carries the sign of its marginal
utility (``useful`` is ``Delta > 0``; ``Delta <= 0`` counts as not useful). Per tool::

    aggregate_utility = useful_calls - useless_calls      (the sum of the signs)
    efficiency        = useful_calls / (useful_calls + useless_calls)

and per trajectory (one feedback event) ``useful calls / calls``, averaged over events that
report calls. Tools with non-positive aggregate utility, or shown often and never used, are
pruning candidates.

Everything here is thread-safe: the HTTP layer calls in from worker threads.
"""

from registry.feedback.counts import LiveWindow, ToolEfficiency, WindowStats
from registry.feedback.equivalents import EquivalenceClasses, validate_equivalents
from registry.feedback.events import (
    MATCHES,
    MAX_CALLS,
    MAX_CALLS_BYTES,
    FeedbackEvent,
    FeedbackRequest,
    RememberedShortlists,
    ShortlistMemory,
    ShownShortlist,
    ToolCall,
    build_event,
    check_event_size,
    event_line,
    parse_feedback,
)
from registry.feedback.log import LocalFeedbackLog
from registry.feedback.log_protocol import (
    CHECKPOINT_FORMAT,
    CompactableFeedbackLog,
    FeedbackLog,
    LogCompacted,
    SharedFeedbackLog,
    parse_checkpoint,
)
from registry.feedback.recorder import FeedbackListener, FeedbackRecorder

__all__ = [
    "CHECKPOINT_FORMAT",
    "MATCHES",
    "MAX_CALLS",
    "MAX_CALLS_BYTES",
    "CompactableFeedbackLog",
    "EquivalenceClasses",
    "FeedbackEvent",
    "FeedbackListener",
    "FeedbackLog",
    "FeedbackRecorder",
    "FeedbackRequest",
    "LiveWindow",
    "LocalFeedbackLog",
    "LogCompacted",
    "RememberedShortlists",
    "SharedFeedbackLog",
    "ShortlistMemory",
    "ShownShortlist",
    "ToolCall",
    "ToolEfficiency",
    "WindowStats",
    "build_event",
    "check_event_size",
    "event_line",
    "parse_checkpoint",
    "parse_feedback",
    "validate_equivalents",
]
