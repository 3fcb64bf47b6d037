"""Which slots of a previous index a derived index keeps (shared by the dense and BM25 indexes)."""

from __future__ import annotations

import numpy as np

__all__ = ["claim_previous_slots"]


def claim_previous_slots(
    reuse: np.ndarray, slot_tool: np.ndarray, n_previous: int
) -> np.ndarray:
    """Validate ``reuse`` (per new tool, the previous tool it keeps, or -1) and let each previous
    tool serve one new tool: a later new tool reusing the same one is set to -1 here (in place),
    so it gets a slot of its own. Returns, per previous tool, its slot in the previous index
    (``slot_tool`` maps slot -> tool, -1 for a dead slot).

    Raises:
        ValueError: ``reuse`` points past the previous index.
    """
    if reuse.size and reuse.max() >= n_previous:
        raise ValueError("reuse points past the previous index")
    kept_rows = np.flatnonzero(reuse >= 0)
    _, first = np.unique(reuse[kept_rows], return_index=True)
    duplicate = np.ones(kept_rows.size, dtype=bool)
    duplicate[first] = False
    reuse[kept_rows[duplicate]] = -1
    prev_tool_slot = np.full(n_previous, -1, dtype=np.int64)
    live = slot_tool >= 0
    prev_tool_slot[slot_tool[live]] = np.flatnonzero(live)
    return prev_tool_slot
