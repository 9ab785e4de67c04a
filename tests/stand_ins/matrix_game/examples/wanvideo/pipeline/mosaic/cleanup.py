"""Stand-in of ``examples/wanvideo/pipeline/mosaic/cleanup.py``."""

from __future__ import annotations

import gc


def _rank_local_cuda_device():
    """Mirrors ``_rank_local_cuda_device``: None without CUDA."""
    return None


def _release_cached_memory():
    """Mirrors ``_release_cached_memory``."""
    gc.collect()
