"""Frame sources: synthetic pattern, video file, camera, stream, image folder.

``open_source(settings, fps=...)`` builds the source the ``[source]`` table asks for and
opens it, so a source that cannot be opened fails before the run starts (``SourceError``,
exit code 2). See ``soakd.sources.base.Source`` for the protocol and docs/sources-telemetry.md
for each kind's keys.
"""

from __future__ import annotations

from collections.abc import Callable

from soakd.config import SourceSettings
from soakd.sources.base import Source, SourceEnded
from soakd.sources.synthetic import SyntheticSource

__all__ = ["Source", "SourceEnded", "build_source", "open_source"]


def build_source(
    settings: SourceSettings,
    *,
    fps: float,
    seed: int = 0,
    now_s: Callable[[], float] | None = None,
) -> Source:
    """The source for ``settings.kind``, not yet opened. ``now_s`` (seconds, monotonic) is
    the clock a video file is sampled on; default ``time.perf_counter``."""
    kind = settings.kind
    if kind == "synthetic":
        return SyntheticSource(settings, fps=fps, seed=seed)
    # the other kinds need cv2, a heavy import: only for the runs that use it
    if kind == "video":
        from soakd.sources.opencv import VideoFileSource

        return VideoFileSource(settings, fps=fps, now_s=now_s)
    if kind in ("camera", "stream"):
        from soakd.sources.opencv import LiveSource

        return LiveSource(settings, kind=kind, fps=fps)
    if kind == "images":
        from soakd.sources.images import ImageFolderSource

        return ImageFolderSource(settings, fps=fps)
    raise ValueError(f"source.kind: unknown source kind {kind!r}")  # pragma: no cover


def open_source(
    settings: SourceSettings,
    *,
    fps: float,
    seed: int = 0,
    now_s: Callable[[], float] | None = None,
) -> Source:
    """Build and open the configured source; raises ``SourceError`` (one line naming the
    path, index or URL) when it cannot be opened within ``open_timeout_s``."""
    source = build_source(settings, fps=fps, seed=seed, now_s=now_s)
    source.open()
    return source
