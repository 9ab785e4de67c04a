"""Stand-in of ``diffsynth/core/data/nonlocal_memory_context.py``."""

from __future__ import annotations


def rolling_anchor_source_position(
    *,
    local_chunk_idx: int,
    frames_per_chunk: int,
    window_chunks: int,
    initial_anchor_source_position: int = 0,
) -> int:
    """Mirrors ``rolling_anchor_source_position``: the rolling anchor's source frame."""
    evicted = max(0, int(local_chunk_idx) - max(0, int(window_chunks) - 1))
    if evicted == 0:
        return int(initial_anchor_source_position)
    return evicted * int(frames_per_chunk)
