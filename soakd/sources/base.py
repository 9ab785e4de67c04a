"""The frame-source protocol and what every source shares.

A source is four methods (see ``Source``). ``open`` fails fast with ``SourceError`` (exit
code 2, before the run starts); ``read`` raises ``SourceEnded`` when the source stops during
the run (end of file without looping, camera unplugged, stream dead, no frame within
``read_timeout_s``), which the runner records as an event and turns into an aborted run.
Frames are HxWx3 ``uint8`` BGR arrays, the layout OpenCV uses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import cv2
import numpy as np

from soakd.config import SourceSettings
from soakd.errors import SourceError
from soakd.sources import native

T = TypeVar("T")
Resize = Callable[[np.ndarray], np.ndarray]


class SourceEnded(Exception):
    """The source stopped delivering frames mid-run; ``reason`` is one line saying why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@runtime_checkable
class Source(Protocol):
    """Where frames come from.

    * ``open()``: idempotent; raises ``SourceError`` naming the path/index/url within
      ``open_timeout_s``.
    * ``read()``: the next frame (HxWx3 uint8 BGR) and its position in the source in
      seconds (None when the source has no clock); raises ``SourceEnded`` when the source
      stops, never blocking longer than ``read_timeout_s``.
    * ``close()``: release the device or file; safe to call twice.
    * ``describe()``: what is stored with the run (kind, path, native fps and size...).
    """

    def open(self) -> None: ...
    def read(self) -> tuple[np.ndarray, float | None]: ...
    def close(self) -> None: ...
    def describe(self) -> dict[str, Any]: ...


def make_resize(settings: SourceSettings) -> Resize:
    """The per-frame resize, resolved once: identity unless ``settings.resize``."""
    if not settings.resize:
        return _identity
    size = (settings.width, settings.height)

    def resize(img: np.ndarray) -> np.ndarray:
        if img.shape[1] == size[0] and img.shape[0] == size[1]:
            return img
        return cv2.resize(img, size, interpolation=cv2.INTER_AREA)

    return resize


def _identity(img: np.ndarray) -> np.ndarray:
    return img


def as_bgr(img: np.ndarray) -> np.ndarray:
    """Grey or BGRA images (some cameras, PNGs with alpha) as 3-channel BGR uint8."""
    if img.dtype != np.uint8:  # e.g. 16-bit frames: keep the high byte
        if not np.issubdtype(img.dtype, np.integer):
            raise ValueError(f"unsupported frame dtype {img.dtype}")
        img = cv2.convertScaleAbs(img, alpha=255.0 / float(np.iinfo(img.dtype).max))
    if img.ndim == 2:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    if img.shape[2] == 4:
        return cv2.cvtColor(img, cv2.COLOR_BGRA2BGR)
    if img.shape[2] == 1:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    return img


def call_with_timeout(
    fn: Callable[[], T], timeout_s: float, what: str, *, grace_s: float = 0.0
) -> T:
    """Run ``fn`` (a blocking open) in a helper thread and give up after ``timeout_s``.

    ``grace_s`` is extra time for a call that has its own native timeout of ``timeout_s``
    (FFmpeg's open timeout): waiting for it to return by itself leaves no thread behind.
    OpenCV's open calls cannot be interrupted; a hung one is left to finish in its daemon
    thread (handed to ``soakd.sources.native.track``, so the process can still exit cleanly)
    while the caller gets a ``SourceError`` naming ``what``.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=target, name="soakd-source-open", daemon=True)
    thread.start()
    thread.join(timeout_s + grace_s)
    if thread.is_alive():
        native.track(thread)
        raise SourceError(f"{what}: not opened within open_timeout_s = {timeout_s:g} s")
    if "error" in box:
        err = box["error"]
        if isinstance(err, SourceError):
            raise err
        raise SourceError(f"{what}: {type(err).__name__}: {err}") from err
    return box["value"]  # type: ignore[no-any-return]
