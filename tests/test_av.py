"""Audio-visual Q&A: rolling media window and media token counts on a real tiny thinker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from soakd.config import AvWorkloadSettings
from soakd.records import Frame, StageOutput
from soakd.workloads.av import AvStaged, MediaWindow, build
from soakd.workloads.base import WorkloadContext, WorkloadError

RATE = 16000
FPS = 4  # the pace of the test frames


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("av-models")


def _workload(cache: Path, rate: int | None = RATE, **kw: object) -> AvStaged:
    ctx = WorkloadContext(width=320, height=240, audio_rate=rate, cache_dir=str(cache))
    w = build(AvWorkloadSettings(**kw), ctx)  # type: ignore[arg-type]
    w.setup()
    return w


def _feed(w: AvStaged, n: int, audio_per_frame: int = RATE // FPS) -> StageOutput:
    """Push n frames paced at FPS with their audio chunks; return the last output."""
    rng = np.random.default_rng(0)
    out = StageOutput()
    for i in range(n):
        img = rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)
        audio = (0.1 * rng.standard_normal(audio_per_frame)).astype(np.float32)
        f = Frame(
            id=i,
            t_sched_ns=0,
            t_capture_ns=i * 1_000_000_000 // FPS,
            grab_ns=0,
            image=img,
            audio=audio,
            stream_ns=i * 1_000_000_000 // FPS,
        )
        out = w.decode(w.infer(w.preprocess(f)))
    return out


# -- the window (no model)


def test_window_samples_frames_at_video_fps() -> None:
    """At 4 fps capture and video_fps 2, every second frame is kept, at most max_frames."""
    win = MediaWindow(video_fps=2, max_frames=3, max_audio_seconds=1, audio_rate=None)
    kept = [win.add_frame(np.full((2, 2, 3), i, np.uint8), i * 250_000_000) for i in range(10)]
    assert kept == [True, False] * 5
    assert [int(f[0, 0, 0]) for f in win.frames] == [4, 6, 8]


def test_window_tolerates_pacing_jitter() -> None:
    """A frame a little early (within 10 % of the period) still counts as due."""
    win = MediaWindow(video_fps=1, max_frames=8, max_audio_seconds=1, audio_rate=None)
    assert win.add_frame(np.zeros((1, 1, 3), np.uint8), 0)
    assert win.add_frame(np.zeros((1, 1, 3), np.uint8), 950_000_000)
    assert not win.add_frame(np.zeros((1, 1, 3), np.uint8), 1_500_000_000)


def test_window_keeps_the_last_audio_seconds_in_order() -> None:
    """The audio window holds exactly the newest max_audio_seconds of samples, in order."""
    win = MediaWindow(video_fps=1, max_frames=1, max_audio_seconds=0.5, audio_rate=10)
    assert win.audio().size == 0
    win.add_audio(np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(win.audio(), [0, 1, 2])
    win.add_audio(np.arange(3, 7, dtype=np.float32))
    np.testing.assert_array_equal(win.audio(), [2, 3, 4, 5, 6])
    win.add_audio(np.arange(10, 22, dtype=np.float32))  # longer than the window
    np.testing.assert_array_equal(win.audio(), [17, 18, 19, 20, 21])
    win.add_audio(None)
    assert win.audio().size == 5


# -- the tiny thinker


@pytest.mark.model
def test_media_tokens_grow_with_video_fps(cache: Path) -> None:
    """The video_fps 1, 2, 4 sweep: more frames in the window, more vision tokens."""
    counts = []
    for fps in (1, 2, 4):
        w = _workload(cache, video_fps=fps, max_frames=8)
        out = _feed(w, 8)
        counts.append((out.vision_tokens, out.extra and out.extra["window_frames"]))
        assert out.tokens == 8
        w.close()
    assert [c[1] for c in counts] == [2, 4, 8]
    assert counts[0][0] < counts[1][0] < counts[2][0]  # type: ignore[operator]
    assert counts[2][0] == 4 * counts[0][0]  # type: ignore[operator]


@pytest.mark.model
def test_media_tokens_are_capped_by_max_frames(cache: Path) -> None:
    """A smaller max_frames window holds fewer frames and so fewer vision tokens."""
    small = _feed(_workload(cache, video_fps=4, max_frames=2), 6)
    large = _feed(_workload(cache, video_fps=4, max_frames=6), 6)
    assert small.vision_tokens is not None and large.vision_tokens is not None
    assert large.vision_tokens == 3 * small.vision_tokens


@pytest.mark.model
def test_audio_tokens_grow_with_audio_then_cap(cache: Path) -> None:
    """Audio tokens grow with the audio received, up to max_audio_seconds (25 per second)."""
    w = _workload(cache, video_fps=1, max_frames=1, max_audio_seconds=2.0)
    seen = [_feed(w, 1).audio_tokens]
    seen.append(_feed(w, 3).audio_tokens)  # 1 s of audio more in total
    seen.append(_feed(w, 8).audio_tokens)  # far beyond the 2 s window
    assert seen[0] is not None and seen[1] is not None
    assert seen[0] < seen[1] <= seen[2] == 50  # type: ignore[operator]


@pytest.mark.model
def test_without_audio_source_only_vision_counts(cache: Path) -> None:
    """With no audio configured the request carries no audio tokens."""
    w = _workload(cache, rate=None, video_fps=2, max_frames=2)
    out = _feed(w, 3)
    assert out.audio_tokens == 0 and (out.vision_tokens or 0) > 0
    assert w.describe()["audio_rate"] is None


@pytest.mark.model
def test_describe_records_the_window_settings(cache: Path) -> None:
    """describe() stores video_fps, max_frames, max_audio_seconds and the model facts."""
    d = _workload(cache, video_fps=2, max_frames=4, max_audio_seconds=3).describe()
    assert (d["video_fps"], d["max_frames"], d["max_audio_seconds"]) == (2.0, 4, 3.0)
    assert d["model_class"] == "Qwen2_5OmniThinkerForConditionalGeneration"
    assert d["builtin"] is True and d["min_new_tokens"] == d["max_new_tokens"]


def test_missing_checkpoint_is_named(tmp_path: Path) -> None:
    """An av model_path that does not exist fails at build, naming the path."""
    with pytest.raises(WorkloadError, match=r"gone.*no such directory"):
        build(AvWorkloadSettings(model_path=str(tmp_path / "gone")), WorkloadContext())


@pytest.mark.slow
@pytest.mark.model
def test_av_run_through_the_runner_records_media_tokens(cache: Path, tmp_path: Path) -> None:
    """configs/av-qa.toml run by the runner (unpaced, tone audio) stores media token counts."""
    import sqlite3

    from soakd.config import load_settings
    from soakd.run.runner import run_soak

    db = tmp_path / "av.db"
    settings = load_settings(
        "configs/av-qa.toml",
        overrides=[f'run.db="{db}"', f'workload.cache_dir="{cache}"', "run.warmup_s=0"],
    )
    result = run_soak(settings, max_frames=5, paced=False, judge=False)
    assert result.summary["errors"] == 0 and result.summary["frames_done"] == 5
    rows = sqlite3.connect(db).execute("SELECT out_tokens, vision_tokens, audio_tokens FROM frames")
    rows = rows.fetchall()
    assert len(rows) == 5
    for out_tokens, vision, audio in rows:
        assert out_tokens == 8 and vision > 0 and audio > 0


@pytest.mark.slow
@pytest.mark.model
def test_sweep_over_video_fps_reports_media_tokens_and_time(cache: Path, tmp_path: Path) -> None:
    """`sweep --vary workload.video_fps=1,2,4` on the AV default: frames back to back still
    see the stream at run.fps, so vision tokens grow with video_fps; each point has times."""
    from soakd.config import load_settings
    from soakd.studies.sweep import sweep

    settings = load_settings(
        "configs/av-qa.toml",
        overrides=[f'run.db="{tmp_path / "sw.db"}"', f'workload.cache_dir="{cache}"'],
    )
    res = sweep(settings, "workload.video_fps", [1, 2, 4], frames=10)
    pts = [p for p in res.points if p.status == "ok"]
    assert len(pts) == 3
    vision = [p.vision_tokens for p in pts]
    assert all(v is not None for v in vision)
    assert vision[0] < vision[1] < vision[2]  # type: ignore[operator]
    assert all(p.audio_tokens and p.total_median_ms and p.total_median_ms > 0 for p in pts)
    md = res.to_markdown()
    assert "vision tokens" in md and "audio tokens" in md
