"""OpenCV sources: a video file, a camera index, an RTSP/HTTP stream.

**Video file.** Sampled at the run's rate, not the file's: the frame returned at elapsed
time ``t`` (since the first ``read``, on the injectable ``now_s`` clock) is video frame
``floor((t mod duration) * native_fps)``. Frames in between are skipped with ``grab()``
(decoded but not converted); when the target rate is above the native one the same video
frame is returned again. At the end of the file the video loops (it is reopened), or, with
``loop = false``, ``read`` raises ``SourceEnded``. A frame count the container gets wrong is
corrected when the real end is reached.

**Camera and stream.** A grabber thread (``soakd-source-grab``) reads the device as fast as
it delivers and keeps only the newest frame; ``read`` returns the newest frame it has not
returned yet, waiting at most ``read_timeout_s`` for one, then raises ``SourceEnded``
(camera unplugged, stream ended or stalled). Frames the grabber replaced before anyone read
them are counted (``describe()["overwritten"]``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np

from soakd import redact
from soakd.config import SourceSettings
from soakd.errors import SourceError
from soakd.sources import native
from soakd.sources.base import SourceEnded, as_bgr, call_with_timeout, make_resize

NowFn = Callable[[], float]
# FFmpeg's own open/read timeouts are set to open_timeout_s/read_timeout_s; soakd waits this
# much longer for the native call to return by itself, so no thread is left inside FFmpeg.
NATIVE_GRACE_S = 1.5

STREAM_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "http", "https", "udp", "tcp", "srt")


def quiet_native_logs() -> None:
    """OpenCV's warnings and FFmpeg's messages below quiet: a source that cannot be opened
    is one ``SourceError`` line. Setting ``OPENCV_LOG_LEVEL`` or ``OPENCV_FFMPEG_LOGLEVEL``
    in the environment keeps the native logs (FFmpeg reads its variable at its first open)."""
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET
    if "OPENCV_LOG_LEVEL" not in os.environ:
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)


quiet_native_logs()


def _positive(value: float) -> float | None:
    return value if math.isfinite(value) and value > 0 else None


class VideoFileSource:
    """A video file, sampled at the target rate and looped at its end."""

    def __init__(self, settings: SourceSettings, *, fps: float, now_s: NowFn | None = None) -> None:
        if not settings.path:
            raise SourceError("source.path: required for a video file")
        self.settings = settings
        self.path = settings.path
        self.fps = fps
        self.what = f"video file {self.path}"
        self._now = now_s or time.perf_counter
        self._resize = make_resize(settings)
        self._cap: Any = None
        self.native_fps: float | None = None
        self.frame_count: int | None = None  # None: unknown until the end is reached
        self.native_size: tuple[int, int] | None = None
        self.loops = 0  # times the video has wrapped around so far
        self._t_start: float | None = None
        self._next = 0  # index the next grab()/read() returns
        self._last = -1  # index of the cached frame
        self._last_img: np.ndarray | None = None

    # -- opening ----------------------------------------------------------------------

    def _capture(self) -> Any:
        cap = cv2.VideoCapture(self.path)
        if not cap.isOpened():
            cap.release()
            raise SourceError(f"{self.what}: OpenCV cannot open it (not a video it can decode)")
        return cap

    def open(self) -> None:
        if self._cap is not None:
            return
        if not Path(self.path).is_file():
            raise SourceError(f"source.path: video file not found: {self.path}")
        cap = call_with_timeout(self._capture, self.settings.open_timeout_s, self.what)
        ok, img = cap.read()
        if not ok or img is None:
            cap.release()
            raise SourceError(f"{self.what}: opened but no frame could be decoded")
        self._cap = cap
        self.native_fps = _positive(cap.get(cv2.CAP_PROP_FPS))
        count = _positive(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        self.frame_count = int(count) if count else None
        self.native_size = (img.shape[1], img.shape[0])
        self._next, self._last, self._last_img = 1, 0, self._resize(as_bgr(img))

    def _rewind(self) -> None:
        """Back to frame 0 by reopening: exact on every container, unlike seeking."""
        self._cap.release()
        self._cap = call_with_timeout(self._capture, self.settings.open_timeout_s, self.what)
        self._next, self._last, self._last_img = 0, -1, None

    # -- reading ----------------------------------------------------------------------

    def _target(self) -> int:
        now = self._now()
        if self._t_start is None:
            self._t_start = now
        elapsed = now - self._t_start
        return int(elapsed * (self.native_fps or self.fps) + 1e-9)

    def _end(self) -> SourceEnded:
        n = self.frame_count
        return SourceEnded(f"{self.what}: end of file after {n} frames (loop = false)")

    def _wrap(self, target: int) -> int:
        """``target`` within the file; raises ``SourceEnded`` past the end without looping."""
        n = self.frame_count
        if n is None or target < n:
            return target
        if not self.settings.loop:
            raise self._end()
        self.loops = max(self.loops, target // n)
        return target % n

    def _seek_forward(self, target: int) -> bool:
        """Decode up to ``target``; False when the file ended first (frame_count is fixed)."""
        cap = self._cap
        while self._next < target:
            if not cap.grab():
                self.frame_count = self._next
                return False
            self._next += 1
        ok, img = cap.read()
        if not ok or img is None:
            self.frame_count = self._next
            return False
        self._next += 1
        self._last, self._last_img = target, self._resize(as_bgr(img))
        return True

    def read(self) -> tuple[np.ndarray, float | None]:
        if self._cap is None:
            self.open()
        target = self._target()
        for _ in range(3):  # at most: wrap, discover the real end, wrap again
            target = self._wrap(target)
            if target == self._last and self._last_img is not None:
                break
            if target < self._last:
                self._rewind()
            if self._seek_forward(target):
                break
            if self.frame_count == 0:
                raise SourceEnded(f"{self.what}: no frame could be decoded after reopening")
        else:  # pragma: no cover - only with a file that shrinks while it is read
            raise SourceEnded(f"{self.what}: cannot find frame {target}")
        assert self._last_img is not None
        return self._last_img, target / (self.native_fps or self.fps)

    def close(self) -> None:
        if self._cap is not None:
            self._cap.release()
            self._cap = None

    def describe(self) -> dict[str, Any]:
        fps = self.native_fps
        n = self.frame_count
        return {
            "kind": "video",
            "path": str(Path(self.path).resolve()),
            "native_fps": fps,
            "native_size": list(self.native_size) if self.native_size else None,
            "frame_count": n,
            "duration_s": n / fps if n and fps else None,
            "loop": self.settings.loop,
            "loops": self.loops,
            "sampled_fps": self.fps,
            "resize": [self.settings.width, self.settings.height] if self.settings.resize else None,
        }


class LiveSource:
    """A camera index or a network stream, read by a grabber thread that keeps the newest
    frame only."""

    def __init__(
        self, settings: SourceSettings, *, kind: Literal["camera", "stream"], fps: float
    ) -> None:
        self.settings = settings
        self.kind = kind
        self.fps = fps
        if kind == "stream":
            url = settings.url or ""
            scheme = url.split("://", 1)[0].lower() if "://" in url else ""
            if scheme not in STREAM_SCHEMES:
                raise SourceError(
                    f"source.url: {redact.url(url)!r} is not a stream URL "
                    f"(expected one of {', '.join(s + '://' for s in STREAM_SCHEMES)})"
                )
            self.what = f"stream {redact.url(url)}"
        else:
            self.what = f"camera index {settings.index}"
        self._resize = make_resize(settings)
        self._cap: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._latest: tuple[np.ndarray, float | None] | None = None
        self._seq = 0  # frames the grabber has delivered
        self._seen = 0  # seq of the frame read() returned last
        self._failures = 0  # consecutive failed device reads
        self._error: BaseException | None = None
        self.overwritten = 0
        self.native_fps: float | None = None
        self.native_size: tuple[int, int] | None = None

    def _capture(self) -> Any:
        s = self.settings
        start = time.monotonic()
        if self.kind == "stream":
            params = [
                cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, int(s.open_timeout_s * 1000),
                cv2.CAP_PROP_READ_TIMEOUT_MSEC, int(s.read_timeout_s * 1000),
            ]  # fmt: skip
            cap = cv2.VideoCapture(s.url or "", cv2.CAP_FFMPEG, params)
        else:
            cap = cv2.VideoCapture(s.index)
        if not cap.isOpened():
            cap.release()
            if time.monotonic() - start >= s.open_timeout_s:  # FFmpeg's open timeout fired
                raise SourceError(
                    f"{self.what}: not opened within open_timeout_s = {s.open_timeout_s:g} s "
                    "(no answer)"
                )
            raise SourceError(f"{self.what}: cannot open it (no such device or not reachable)")
        return cap

    def open(self) -> None:
        if self._cap is not None:
            return
        timeout = self.settings.open_timeout_s
        start = time.monotonic()
        grace = NATIVE_GRACE_S if self.kind == "stream" else 0.0
        self._cap = call_with_timeout(self._capture, timeout, self.what, grace_s=grace)
        self.native_fps = _positive(self._cap.get(cv2.CAP_PROP_FPS))
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._grab_loop, name="soakd-source-grab", daemon=True
        )
        self._thread.start()
        with self._cond:
            remaining = timeout - (time.monotonic() - start)
            self._cond.wait_for(
                lambda: self._seq > 0 or self._error is not None, max(remaining, 0.0)
            )
            got = self._latest
        if got is None:
            self.close()
            raise SourceError(
                f"{self.what}: opened but delivered no frame within open_timeout_s = {timeout:g} s"
            )
        self.native_size = (got[0].shape[1], got[0].shape[0])

    def _grab_loop(self) -> None:
        cap, stop, cond = self._cap, self._stop, self._cond
        stream = self.kind == "stream"
        try:
            while not stop.is_set():
                ok, img = cap.read()
                if not ok or img is None:
                    self._failures += 1
                    stop.wait(0.005)  # a dead device answers at once: do not spin hot
                    continue
                pos = cap.get(cv2.CAP_PROP_POS_MSEC) if stream else 0.0
                ts = pos / 1000.0 if pos > 0 else None
                with cond:
                    if self._seq > self._seen:
                        self.overwritten += 1
                    self._latest = (img, ts)
                    self._seq += 1
                    self._failures = 0
                    cond.notify_all()
        except BaseException as exc:  # handed to read() as SourceEnded
            with cond:
                self._error = exc
                cond.notify_all()

    def _ended(self) -> SourceEnded:
        if self._error is not None:
            err = self._error
            return SourceEnded(f"{self.what}: capture failed: {type(err).__name__}: {err}")
        why = (
            "the device reports no more frames"
            if self._failures
            else "the device stopped responding"
        )
        return SourceEnded(
            f"{self.what}: no frame for read_timeout_s = {self.settings.read_timeout_s:g} s ({why})"
        )

    def read(self) -> tuple[np.ndarray, float | None]:
        if self._cap is None:
            self.open()
        timeout = self.settings.read_timeout_s
        with self._cond:
            fresh = self._cond.wait_for(
                lambda: self._seq > self._seen or self._error is not None or self._stop.is_set(),
                timeout,
            )
            if self._stop.is_set():
                raise SourceEnded(f"{self.what}: closed")
            if not fresh or self._seq <= self._seen or self._latest is None:
                raise self._ended()
            img, ts = self._latest
            self._seen = self._seq
        return self._resize(as_bgr(img)), ts

    def close(self) -> None:
        """Stop the grabber (a read waiting for a frame ends at once) and release."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.settings.read_timeout_s + 1.0)
            if thread.is_alive():  # stuck inside the driver: releasing now could crash
                native.track(thread)
                return
        self._thread = None
        if self._cap is not None:
            self._cap.release()
            self._cap = None

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.kind == "stream":
            d["url"] = redact.url(self.settings.url or "")
        else:
            d["index"] = self.settings.index
        d.update(
            {
                "native_fps": self.native_fps,
                "native_size": list(self.native_size) if self.native_size else None,
                "frames_grabbed": self._seq,
                "overwritten": self.overwritten,
                "resize": [self.settings.width, self.settings.height]
                if self.settings.resize
                else None,
            }
        )
        return d
