"""Frame sources against real files written by OpenCV, a real HTTP stream and real (absent)
devices."""

from __future__ import annotations

import functools
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from soakd.config import SourceSettings, load_settings
from soakd.errors import ExitCode, SourceError
from soakd.redact import url as redact_url
from soakd.sources import Source, SourceEnded, build_source, native, open_source
from soakd.sources.images import natural_key
from soakd.sources.opencv import NATIVE_GRACE_S, LiveSource, VideoFileSource
from soakd.sources.synthetic import SyntheticSource, frame_index
from tests.silent_server import silent_listener

NATIVE_FPS = 10
N_FRAMES = 20  # 2 s of video
LEVEL = 12  # frame i is a flat grey of i * LEVEL: survives MJPEG compression


def level_of(img: np.ndarray) -> int:
    return round(float(img.mean()) / LEVEL)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2 s, 10 fps, 64x48 MJPEG .avi whose frame i is grey level i * LEVEL."""
    path = tmp_path_factory.mktemp("video") / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), NATIVE_FPS, (64, 48))
    assert writer.isOpened(), "this OpenCV build cannot write MJPG .avi"
    for i in range(N_FRAMES):
        writer.write(np.full((48, 64, 3), i * LEVEL, np.uint8))
    writer.release()
    return path


def fake_now(times: list[float]) -> Callable[[], float]:
    it = iter(times)
    return lambda: next(it)


def video(path: Path, **kw: Any) -> SourceSettings:
    return SourceSettings(kind="video", path=str(path), **kw)


# -- video file ---------------------------------------------------------------------------


def test_video_is_sampled_at_the_target_rate_not_its_native_rate(clip: Path) -> None:
    """At 4 fps the frame read at elapsed t is video frame floor(t * 10) mod 20, looping."""
    times = [k * 0.25 for k in range(12)]
    src = open_source(video(clip), fps=4, now_s=fake_now(times))
    got = [src.read() for _ in times]
    want = [int(t * NATIVE_FPS + 1e-9) % N_FRAMES for t in times]
    assert [level_of(img) for img, _ in got] == want
    assert [ts for _, ts in got] == pytest.approx([i / NATIVE_FPS for i in want])
    assert src.describe()["loops"] == 1
    src.close()


def test_video_faster_than_native_repeats_frames_and_wraps(clip: Path) -> None:
    """Reads closer together than a video frame return the same frame; past the end it loops."""
    times = [0.0, 0.35, 0.36, 1.95, 2.05, 4.31]
    src = open_source(video(clip), fps=30, now_s=fake_now(times))
    assert [level_of(src.read()[0]) for _ in times] == [0, 3, 3, 19, 0, 3]
    assert src.describe()["loops"] == 2
    src.close()


def test_video_end_without_loop_raises_source_ended(clip: Path) -> None:
    """With loop = false the first read past the end raises SourceEnded naming the file."""
    src = open_source(video(clip, loop=False), fps=10, now_s=fake_now([0.0, 1.95, 2.0]))
    src.read()
    assert level_of(src.read()[0]) == 19
    with pytest.raises(SourceEnded, match=r"clip\.avi: end of file after 20 frames"):
        src.read()


def test_video_describe_reports_native_rate_size_and_count(clip: Path) -> None:
    """describe() stores the file's native fps, size, frame count and duration."""
    src = open_source(video(clip), fps=2)
    d = src.describe()
    assert d["kind"] == "video" and d["path"] == str(clip.resolve())
    assert d["native_fps"] == pytest.approx(NATIVE_FPS)
    assert d["native_size"] == [64, 48]
    assert d["frame_count"] == N_FRAMES and d["duration_s"] == pytest.approx(2.0)
    src.close()


def test_video_resize_option_applies_to_every_frame(clip: Path) -> None:
    """resize = true returns frames at width x height whatever the file's size."""
    src = open_source(video(clip, resize=True, width=32, height=24), fps=5)
    img, _ = src.read()
    assert img.shape == (24, 32, 3) and img.dtype == np.uint8
    src.close()


def test_missing_video_fails_before_the_run_naming_the_path(tmp_path: Path) -> None:
    """A video path that does not exist raises SourceError (exit code 2) naming it."""
    missing = tmp_path / "nope.mp4"
    with pytest.raises(SourceError, match=r"video file not found: .*nope\.mp4") as err:
        open_source(video(missing), fps=2)
    assert err.value.exit_code == ExitCode.USAGE


def test_file_that_is_not_a_video_raises_source_error(tmp_path: Path) -> None:
    """A file OpenCV cannot decode raises a one-line SourceError naming the file."""
    bogus = tmp_path / "bogus.mp4"
    bogus.write_bytes(b"this is not a video" * 100)
    with pytest.raises(SourceError, match=r"bogus\.mp4") as err:
        open_source(video(bogus), fps=2)
    assert "\n" not in str(err.value)


def test_open_is_idempotent(clip: Path) -> None:
    """A second open() keeps the same capture and position."""
    src = VideoFileSource(video(clip), fps=10, now_s=fake_now([0.0, 0.5]))
    src.open()
    src.read()
    cap = src._cap
    src.open()
    assert src._cap is cap
    assert level_of(src.read()[0]) == 5
    src.close()


# -- image folder ---------------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Twelve 40x30 PNGs img1..img12, image i a flat grey of i * LEVEL."""
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(1, 13):
        assert cv2.imwrite(str(d / f"img{i}.png"), np.full((30, 40, 3), i * LEVEL, np.uint8))
    (d / "notes.txt").write_text("not an image, ignored by suffix")
    return d


def test_image_folder_is_read_in_natural_order_and_loops(folder: Path) -> None:
    """Images come in natural name order (img2 before img10) and loop at the end."""
    src = open_source(SourceSettings(kind="images", path=str(folder)), fps=5)
    levels = [level_of(src.read()[0]) for _ in range(14)]
    assert levels == [*range(1, 13), 1, 2]
    assert src.describe()["count"] == 12 and src.describe()["loops"] == 1


def test_image_folder_without_loop_ends(folder: Path) -> None:
    """loop = false: after the last image, read raises SourceEnded naming the folder."""
    src = open_source(SourceSettings(kind="images", path=str(folder), loop=False), fps=5)
    for _ in range(12):
        src.read()
    with pytest.raises(SourceEnded, match="end after 12 images"):
        src.read()


def test_grey_image_is_delivered_as_bgr(tmp_path: Path) -> None:
    """A single-channel image comes back HxWx3 uint8 like every other frame."""
    cv2.imwrite(str(tmp_path / "g.png"), np.full((10, 12), 77, np.uint8))
    img, ts = open_source(SourceSettings(kind="images", path=str(tmp_path)), fps=1).read()
    assert img.shape == (10, 12, 3) and int(img[0, 0, 2]) == 77 and ts is None


def test_empty_image_folder_raises_source_error(tmp_path: Path) -> None:
    """A folder with no images fails before the run with a SourceError naming it."""
    with pytest.raises(SourceError, match=rf"{tmp_path}: no images"):
        open_source(SourceSettings(kind="images", path=str(tmp_path)), fps=1)


def test_non_image_file_in_folder_is_named(folder: Path) -> None:
    """A .png that is not an image fails open() with an error naming that file."""
    (folder / "img5b.png").write_bytes(b"garbage" * 50)
    with pytest.raises(SourceError, match=r"img5b\.png is not an image"):
        open_source(SourceSettings(kind="images", path=str(folder)), fps=1)


def test_image_that_breaks_mid_run_ends_the_run_naming_it(folder: Path) -> None:
    """An image truncated after open() ends the run with SourceEnded naming the file."""
    src = open_source(SourceSettings(kind="images", path=str(folder)), fps=1)
    png = (folder / "img2.png").read_bytes()
    (folder / "img2.png").write_bytes(png[:20])
    src.read()
    with pytest.raises(SourceEnded, match=r"img2\.png"):
        src.read()


def test_natural_key_orders_numbers_by_value() -> None:
    """Embedded numbers sort by value and names without numbers still sort."""
    names = ["f10.png", "f2.png", "a.png", "f1.png", "f02b.png"]
    assert sorted(names, key=natural_key) == ["a.png", "f1.png", "f2.png", "f02b.png", "f10.png"]


# -- camera and stream --------------------------------------------------------------------


def test_missing_camera_fails_fast_naming_the_index() -> None:
    """Camera index 99 does not exist: SourceError naming it, well within open_timeout_s."""
    t = time.monotonic()
    with pytest.raises(SourceError, match="camera index 99"):
        open_source(SourceSettings(kind="camera", index=99, open_timeout_s=5), fps=2)
    assert time.monotonic() - t < 5


def test_unreachable_stream_fails_fast_naming_the_url() -> None:
    """An RTSP URL nobody serves raises SourceError naming the URL (password redacted)."""
    url = "rtsp://user:secret@127.0.0.1:1/live"
    t = time.monotonic()
    with pytest.raises(SourceError, match=r"rtsp://user:\*\*\*@127\.0\.0\.1:1/live") as err:
        open_source(SourceSettings(kind="stream", url=url, open_timeout_s=5), fps=2)
    assert "secret" not in str(err.value)
    assert time.monotonic() - t < 5


@pytest.mark.parametrize("scheme", ["rtsp", "http"])
def test_silent_stream_open_times_out_leaving_no_thread_inside_ffmpeg(scheme: str) -> None:
    """A server that accepts and never answers: SourceError naming open_timeout_s once
    FFmpeg's own open timeout fired, and no thread is left inside the native call (one left
    there aborts the process at exit)."""
    with silent_listener() as port:
        settings = SourceSettings(
            kind="stream", url=f"{scheme}://127.0.0.1:{port}/x", open_timeout_s=1
        )
        t = time.monotonic()
        with pytest.raises(SourceError, match=r"not opened within open_timeout_s = 1 s"):
            open_source(settings, fps=2)
        assert time.monotonic() - t < 1 + NATIVE_GRACE_S
    assert native.alive() == []
    assert not [t for t in threading.enumerate() if t.name == "soakd-source-open"]


def test_url_with_unknown_scheme_is_rejected() -> None:
    """A URL that is not rtsp/http(s)/... is refused before any connection is tried."""
    with pytest.raises(SourceError, match=r"source\.url: 'ftp://host/x' is not a stream URL"):
        build_source(SourceSettings(kind="stream", url="ftp://host/x"), fps=2)


def test_redact_url_hides_only_the_password() -> None:
    """Credentials in a stream URL keep the user and hide the password."""
    assert redact_url("rtsp://cam:pw@10.0.0.2:554/a") == "rtsp://cam:***@10.0.0.2:554/a"
    assert redact_url("http://host/a@b") == "http://host/a@b"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_base(clip: Path) -> Iterator[str]:
    """A real HTTP server on localhost serving the clip's folder."""
    handler = functools.partial(_QuietHandler, directory=str(clip.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_http_stream_delivers_newest_frames_then_ends_without_hanging(
    http_base: str, clip: Path
) -> None:
    """A stream that reaches EOF raises SourceEnded after read_timeout_s, never hangs."""
    settings = SourceSettings(
        kind="stream", url=f"{http_base}/{clip.name}", read_timeout_s=0.5, open_timeout_s=5
    )
    src = open_source(settings, fps=10)
    assert isinstance(src, LiveSource)
    assert any(t.name == "soakd-source-grab" for t in threading.enumerate())
    levels = []
    t = time.monotonic()
    with pytest.raises(SourceEnded, match=r"stream http://127\.0\.0\.1:\d+/clip\.avi: no frame"):
        for _ in range(N_FRAMES + 1):
            levels.append(level_of(src.read()[0]))
    assert time.monotonic() - t < 5  # ~0.5 s of waiting after the last frame
    assert levels and levels == sorted(levels) and len(set(levels)) == len(levels)
    d = src.describe()
    assert d["frames_grabbed"] == N_FRAMES
    assert d["overwritten"] == N_FRAMES - len(levels)
    src.close()
    assert not any(t.name == "soakd-source-grab" for t in threading.enumerate())


def test_close_wakes_a_read_waiting_for_a_frame(http_base: str, clip: Path) -> None:
    """close() during a read that waits on a silent stream ends it at once, not after the
    read timeout (shutdown is never held up by a dead device)."""
    settings = SourceSettings(kind="stream", url=f"{http_base}/{clip.name}", read_timeout_s=30)
    src = open_source(settings, fps=10)
    assert isinstance(src, LiveSource)
    with src._cond:
        assert src._cond.wait_for(lambda: src._seq == N_FRAMES, 10)
    src.read()  # the newest frame; the next read has nothing to wait for but EOF
    ended: list[BaseException] = []

    def reader() -> None:
        try:
            src.read()
        except SourceEnded as exc:
            ended.append(exc)

    thread = threading.Thread(target=reader, name="test-reader")
    t = time.monotonic()
    thread.start()
    src.close()
    thread.join(10)
    assert time.monotonic() - t < 5 and not thread.is_alive()
    assert len(ended) == 1 and str(ended[0]).endswith(": closed")


def test_missing_http_resource_fails_open(http_base: str) -> None:
    """A 404 on the stream URL is an unopenable source, not a run that waits forever."""
    settings = SourceSettings(kind="stream", url=f"{http_base}/absent.avi", open_timeout_s=5)
    with pytest.raises(SourceError, match=r"absent\.avi"):
        open_source(settings, fps=2)


# -- synthetic ----------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["bars", "noise", "gradient"])
def test_synthetic_is_deterministic_and_moves(pattern: str) -> None:
    """Frame n depends only on (seed, n, size): two sources agree, and the pattern moves."""
    settings = SourceSettings(pattern=pattern, width=96, height=64)
    a = open_source(settings, fps=30, seed=7)
    b = SyntheticSource(settings, fps=30, seed=7)
    frames = [a.read()[0] for _ in range(5)]
    assert all(np.array_equal(f, b.render(i)) for i, f in enumerate(frames))
    assert frames[0].shape == (64, 96, 3) and frames[0].dtype == np.uint8
    body = slice(8, None)  # below the frame-number stamp
    assert not np.array_equal(frames[0][body], frames[1][body])
    assert [frame_index(f) for f in frames] == [0, 1, 2, 3, 4]


def test_synthetic_seed_and_size_change_the_pattern() -> None:
    """Another seed gives another pattern; width and height set the frame size."""
    s = SourceSettings(pattern="noise", width=320, height=240)
    a = SyntheticSource(s, fps=1, seed=1).render(3)
    b = SyntheticSource(s, fps=1, seed=2).render(3)
    assert not np.array_equal(a, b)
    big = SyntheticSource(SourceSettings(width=1280, height=720), fps=1).render(0)
    assert big.shape == (720, 1280, 3)


def test_synthetic_frame_number_survives_large_n_and_ts_is_n_over_fps() -> None:
    """The stamp encodes frame numbers past 2**20 and the source time is n / fps."""
    src = SyntheticSource(SourceSettings(), fps=25, seed=0)
    assert frame_index(src.render(1_234_567)) == 1_234_567
    src.read()
    _, ts = src.read()
    assert ts == pytest.approx(1 / 25)


def _window_and_stamp(src: SyntheticSource, n: int) -> np.ndarray:
    """Frame ``n`` by definition: the strip's window at ``n * step`` (mod the period), its top
    4 rows overwritten with n's 32 bits as black/white blocks of width // 32 pixels."""
    assert src._strip is not None
    off = (n * src.step) % src._period
    out = src._strip[:, off : off + src.width].copy()
    bw = src.width // 32
    if bw:
        bits = ((n >> np.repeat(np.arange(32), bw)) & 1).astype(np.uint8) * 255
        out[:4, : 32 * bw] = bits[None, :, None]
    return out


@pytest.mark.parametrize(
    ("width", "height", "pattern"),
    [
        (64, 48, "bars"),
        (100, 8, "noise"),
        (31, 20, "gradient"),
        (1000, 16, "bars"),
        (1280, 720, "bars"),
    ],
)
def test_synthetic_frame_is_the_pattern_window_with_the_number_stamped(
    width: int, height: int, pattern: str
) -> None:
    """Every frame is its window of the pattern with n stamped over the top rows, whatever
    the size (blocks spanning the width or not, too narrow to stamp, windows too large to
    keep: 1280x720), for small and large n, and is the caller's to write."""
    src = SyntheticSource(SourceSettings(pattern=pattern, width=width, height=height), fps=30)
    src.open()
    for n in (0, 1, 2, 255, 256, 257, 70_000, 2**31 + 5, *range(3, 200, 7)):
        frame = src.render(n)
        assert np.array_equal(frame, _window_and_stamp(src, n)), n
        assert frame_index(frame) == (n % 2**32 if width >= 32 else None)
    frame[0, 0, 0] = 7  # writable, and a copy: the next render of n is unchanged
    assert np.array_equal(src.render(n), _window_and_stamp(src, n))


def test_synthetic_read_is_cheap_enough_for_240_fps() -> None:
    """240 reads of 640x480 take far less than a second: a no-op run is not capture-bound."""
    src = open_source(SourceSettings(width=640, height=480), fps=240)
    t = time.perf_counter()
    for _ in range(240):
        src.read()
    assert time.perf_counter() - t < 0.5


def test_every_source_kind_satisfies_the_protocol(clip: Path, folder: Path) -> None:
    """Each built source is a Source and describes itself with its kind."""
    for settings in (
        SourceSettings(),
        video(clip),
        SourceSettings(kind="images", path=str(folder)),
        SourceSettings(kind="camera", index=3),
        SourceSettings(kind="stream", url="rtsp://h/x"),
    ):
        src = build_source(settings, fps=2)
        assert isinstance(src, Source)
        if settings.kind in ("synthetic", "video", "images"):
            src.open()
            assert src.describe()["kind"] == settings.kind
            src.close()


def test_source_settings_from_config_open_the_video(clip: Path) -> None:
    """[source] keys set through load_settings reach the source."""
    settings = load_settings(
        overrides=["source.kind=video", f"source.path={clip}", "source.loop=false"]
    )
    src = open_source(settings.source, fps=settings.run.fps)
    assert src.describe()["loop"] is False
    src.close()


# -- end to end -------------------------------------------------------------------------------


@pytest.mark.slow
def test_stream_that_ends_mid_run_aborts_the_run_with_reason(
    synthetic: Callable[..., Any], db_path: Path, http_base: str, clip: Path
) -> None:
    """A real run on an HTTP stream that hits EOF ends aborted with a source_end event."""
    import sqlite3

    from soakd.run.runner import run_soak

    settings = synthetic(
        'source.kind="stream"',
        f"source.url={http_base + '/' + clip.name!r}",
        "source.read_timeout_s=0.5",
        "run.duration=30",
        "workload.infer_ms=1",
    )
    t = time.monotonic()
    res = run_soak(settings, judge=False)
    assert time.monotonic() - t < 15  # ended by the source, far before the 30 s duration
    assert res.status == "aborted" and res.reason and "no frame for read_timeout_s" in res.reason
    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute(
            "SELECT message FROM events WHERE run_id = ? AND kind = 'source_end'", (res.run_id,)
        ).fetchall()
        (n_samples,) = conn.execute(
            "SELECT count(*) FROM samples WHERE run_id = ? AND rss_bytes IS NOT NULL"
            " AND gpu_mem_used_bytes IS NULL",
            (res.run_id,),
        ).fetchone()
    finally:
        conn.close()
    assert len(rows) == 1 and "clip.avi" in rows[0][0]
    assert n_samples >= 1  # telemetry ran beside it, GPU columns NULL on this machine
