"""JSON bodies written by hand (the shortlist route, MCP results): strict JSON, never ``NaN``.

``json.dumps`` writes non-finite floats as the bare words ``NaN`` / ``Infinity`` by default,
which no JSON parser accepts. The domain keeps scores finite (damaged cached vectors are
refused where a version is built); should a non-finite value still reach a body, it is written
as ``null`` and logged, never as invalid JSON and never as a 500.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

__all__ = ["dumps"]

log = logging.getLogger(__name__)


def dumps(content: Any, *, ensure_ascii: bool = False) -> str:
    """``content`` as compact strict JSON (``allow_nan=False``); non-finite floats become null."""
    try:
        return json.dumps(content, separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False)
    except ValueError:
        log.error("a response held a non-finite number; written as null")
        return json.dumps(_finite(content), separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
