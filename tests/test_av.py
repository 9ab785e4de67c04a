"""Audio-visual Q&A: the rolling window, a real-layout Qwen2.5-Omni checkpoint, and the media
token counts of transformers' own Qwen2_5OmniProcessor on a real tiny thinker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.config import AvWorkloadSettings
from soakd.records import Frame, StageOutput
from soakd.workloads.av import AvStaged, MediaWindow, build, window_frames
from soakd.workloads.base import WorkloadContext, WorkloadError
from soakd.workloads.omni import (
    PREPROCESSOR_7B,
    expected_counts,
    load_processor,
    torchvision_imports,
)
from soakd.workloads.tiny import TinySpec, ensure_tiny_model

RATE = 16000
FPS = 4  # the pace of the test frames
NO_TORCHVISION = "torchvision does not import here (the CPU torch build); see docs/workloads-hf.md"


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("av-models")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2.5-Omni checkpoint in the published layout (tiny random weights), as a user
    would point model_path at it."""
    return ensure_tiny_model(TinySpec("qwen2.5-omni", seed=1), tmp_path_factory.mktemp("ckpt"))


def _workload(
    cache: Path, rate: int | None = RATE, size: tuple[int, int] = (320, 240), **kw: object
) -> AvStaged:
    ctx = WorkloadContext(width=size[0], height=size[1], audio_rate=rate, cache_dir=str(cache))
    w = build(AvWorkloadSettings(**kw), ctx)  # type: ignore[arg-type]
    w.setup()
    return w


def _frames(n: int, fps: int = FPS, size: tuple[int, int] = (320, 240)) -> list[Frame]:
    rng = np.random.default_rng(0)
    period = 1_000_000_000 // fps
    return [
        Frame(
            id=i,
            t_sched_ns=0,
            t_capture_ns=i * period,
            grab_ns=0,
            image=rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8),
            audio=(0.1 * rng.standard_normal(RATE // fps)).astype(np.float32),
            stream_ns=i * period,
        )
        for i in range(n)
    ]


def _last_request(w: AvStaged, n: int, fps: int, size: tuple[int, int] = (320, 240)) -> Any:
    req = None
    for f in _frames(n, fps, size):
        req = w.preprocess(f)
    return req


def _feed(w: AvStaged, n: int, fps: int = FPS) -> StageOutput:
    """Push n frames paced at ``fps`` with their audio; the last one through all three
    stages (the earlier ones only fill the window)."""
    return w.decode(w.infer(_last_request(w, n, fps)))


def _real_settings() -> dict[str, Any]:
    """What the real processor uses for a video: its own video size (the class default it
    passes to the video processor) and the checkpoint's patch and audio settings."""
    from transformers.models.qwen2_5_omni import Qwen2_5OmniProcessor

    size = Qwen2_5OmniProcessor.videos_kwargs["size"]
    return {
        **PREPROCESSOR_7B,
        "min_pixels": size["shortest_edge"],
        "max_pixels": size["longest_edge"],
    }


# -- the window (no model)


def test_window_samples_frames_at_video_fps() -> None:
    """At 4 fps capture and video_fps 2, every second frame is kept, at most the window."""
    win = MediaWindow(video_fps=2, size=3, max_audio_seconds=1, audio_rate=None)
    kept = [win.add_frame(np.full((2, 2, 3), i, np.uint8), i * 250_000_000) for i in range(10)]
    assert kept == [True, False] * 5
    assert [int(f[0, 0, 0]) for f in win.frames] == [4, 6, 8]


def test_window_tolerates_pacing_jitter() -> None:
    """A frame a little early (within 10 % of the period) still counts as due."""
    win = MediaWindow(video_fps=1, size=8, max_audio_seconds=1, audio_rate=None)
    assert win.add_frame(np.zeros((1, 1, 3), np.uint8), 0)
    assert win.add_frame(np.zeros((1, 1, 3), np.uint8), 950_000_000)
    assert not win.add_frame(np.zeros((1, 1, 3), np.uint8), 1_500_000_000)


def test_window_keeps_the_last_audio_seconds_in_order() -> None:
    """The audio window holds exactly the newest max_audio_seconds of samples, in order."""
    win = MediaWindow(video_fps=1, size=1, max_audio_seconds=0.5, audio_rate=10)
    assert win.audio().size == 0
    win.add_audio(np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(win.audio(), [0, 1, 2])
    win.add_audio(np.arange(3, 7, dtype=np.float32))
    np.testing.assert_array_equal(win.audio(), [2, 3, 4, 5, 6])
    win.add_audio(np.arange(10, 22, dtype=np.float32))  # longer than the window
    np.testing.assert_array_equal(win.audio(), [17, 18, 19, 20, 21])
    win.add_audio(None)
    assert win.audio().size == 5


def test_window_frames_are_fps_times_seconds_capped_by_max_frames() -> None:
    """A window holds video_fps x window_seconds frames, at least one, at most max_frames."""
    assert [window_frames(f, 4.0, 64) for f in (1, 2, 4)] == [4, 8, 16]
    assert window_frames(4, 4.0, 10) == 10
    assert window_frames(0.1, 4.0, 64) == 1


# -- the checkpoint as published


@pytest.mark.model
def test_published_layout_does_not_load_as_image_text_to_text(checkpoint: Path) -> None:
    """The checkpoint is laid out as the 7B is (qwen2_5_omni, thinker weights, processor
    files), and AutoModelForImageTextToText does not know it: the reason for the thinker."""
    from transformers import AutoModelForImageTextToText

    cfg = json.loads((checkpoint / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_5_omni" and "thinker_config" in cfg
    assert {"preprocessor_config.json", "chat_template.json", "tokenizer.json"} <= {
        p.name for p in checkpoint.iterdir()
    }
    with pytest.raises(ValueError, match="Qwen2_5OmniConfig"):
        AutoModelForImageTextToText.from_pretrained(checkpoint)


@pytest.mark.model
def test_checkpoint_with_thinker_config_loads_the_thinker(checkpoint: Path, cache: Path) -> None:
    """model_path at the published layout loads Qwen2_5OmniThinkerForConditionalGeneration
    and transformers' Qwen2_5OmniProcessor, and answers with media tokens counted."""
    w = _workload(cache, rate=None, model_path=str(checkpoint), video_fps=2, window_seconds=1)
    d = w.describe()
    assert d["model_class"] == "Qwen2_5OmniThinkerForConditionalGeneration"
    assert d["model_type"] == "qwen2_5_omni_thinker" and d["builtin"] is False
    assert d["processor"].startswith("Qwen2_5OmniProcessor")
    out = _feed(w, 3)
    assert out.tokens == 8 and (out.vision_tokens or 0) > 0


@pytest.mark.model
def test_model_class_names_the_class_to_load(checkpoint: Path, cache: Path) -> None:
    """model_class picks the class; an unknown name or one that cannot load the checkpoint is
    a one-line error naming it."""
    thinker = "Qwen2_5OmniThinkerForConditionalGeneration"
    w = _workload(cache, rate=None, model_path=str(checkpoint), model_class=thinker)
    assert w.describe()["model_class"] == thinker
    with pytest.raises(WorkloadError, match=r"model_class 'NoSuchModel': not a model class"):
        _workload(cache, rate=None, model_path=str(checkpoint), model_class="NoSuchModel")
    with pytest.raises(WorkloadError, match=r"cannot load the model: ValueError: .*Qwen2_5Omni"):
        _workload(
            cache, rate=None, model_path=str(checkpoint), model_class="AutoModelForImageTextToText"
        )


@pytest.mark.model
def test_class_selection_reads_the_config(checkpoint: Path, tmp_path: Path) -> None:
    """A config with a thinker_config selects the thinker (for av and hf alike); any other
    selects AutoModelForImageTextToText."""
    from transformers import AutoModelForImageTextToText
    from transformers.models.qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

    from soakd.workloads.hf import model_class_for

    assert model_class_for(checkpoint) is Qwen2_5OmniThinkerForConditionalGeneration
    (tmp_path / "config.json").write_text('{"model_type": "llava"}')
    assert model_class_for(tmp_path) is AutoModelForImageTextToText


def test_missing_checkpoint_is_named(tmp_path: Path) -> None:
    """An av model_path that does not exist fails at build, naming the path."""
    with pytest.raises(WorkloadError, match=r"gone.*no such directory"):
        build(AvWorkloadSettings(model_path=str(tmp_path / "gone")), WorkloadContext())


# -- the tiny default counts what the real processor counts


@pytest.mark.model
def test_tiny_counts_match_the_real_processor_settings(cache: Path) -> None:
    """8 frames of 320x240 and 2 s of audio: one video raised to the processor's min_pixels
    (280x392, grid 4x20x28, 560 tokens) and 128-bin features padded to 300 s (50 tokens), as
    computed from the real processor's own settings."""
    w = _workload(cache, video_fps=4, window_seconds=2)
    out = _feed(w, 8)
    want = expected_counts(8, 240, 320, 2 * RATE, _real_settings())
    assert out.extra is not None
    assert tuple(out.extra["video_grid_thw"]) == want.video_grid_thw == (4, 20, 28)
    assert out.vision_tokens == want.video_tokens == 560
    assert out.audio_tokens == want.audio_tokens == 50
    assert tuple(out.extra["audio_features"]) == want.audio_features == (128, 30000)
    d = w.describe()
    assert (d["audio_mel_bins"], d["audio_padded_seconds"]) == (128, 300.0)
    assert d["video_min_pixels"] == 128 * 28 * 28
    assert (d["video_fps"], d["window_seconds"], d["window_frames"]) == (4.0, 2.0, 8)
    assert d["use_audio_in_video"] is False and d["min_new_tokens"] == d["max_new_tokens"]


@pytest.mark.model
def test_default_size_is_the_sources_and_the_processor_counts_it(cache: Path) -> None:
    """With short_side unset, a 640x480 stream reaches the processor at 640x480: 391 video
    tokens per grid step (2 frames), the count transformers' own Qwen2-VL code gives that
    frame at the size Qwen2_5OmniProcessor passes its video processor (a 56-pixel short side
    would be raised to 280x392: 140)."""
    from transformers.models.qwen2_5_omni import Qwen2_5OmniProcessor

    w = _workload(cache, None, (640, 480), video_fps=FPS, window_seconds=0.5, max_new_tokens=1)
    out = w.decode(w.infer(_last_request(w, 2, FPS, (640, 480))))
    images = w.processor.image_processor
    size = Qwen2_5OmniProcessor.videos_kwargs["size"]
    per_frame = images.get_number_of_image_patches(480, 640, {"size": size})
    assert out.extra is not None and out.extra["video_grid_thw"] == [1, 34, 46]
    assert out.vision_tokens == per_frame // images.merge_size**2 == 391
    assert w.describe()["short_side"] is None


@pytest.mark.model
def test_loading_the_tiny_thinker_is_silent(checkpoint: Path, cache: Path) -> None:
    """Every special-token id of the tiny thinker's config lies inside its vocabulary, and
    loading the checkpoint (processor, thinker, the setup check) logs no transformers warning
    and raises no Python warning."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    cfg = json.loads((checkpoint / "config.json").read_text())["thinker_config"]
    vocab = cfg["text_config"]["vocab_size"]
    ids = {k: v for k, v in cfg.items() if k.endswith(("_token_id", "_token_index"))}
    assert ids and all(0 <= v < vocab for v in ids.values()), (vocab, ids)
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep(logging.WARNING)
    root = logging.getLogger("transformers")
    hf_logging.warning_once.cache_clear()  # warnings already given once in this process
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _workload(cache, rate=None, model_path=str(checkpoint))
    finally:
        root.removeHandler(handler)
    assert [r.getMessage() for r in seen] == [] and [str(c.message) for c in caught] == []


@pytest.mark.model
def test_audio_tokens_grow_with_audio_then_cap(cache: Path) -> None:
    """Audio tokens grow with the audio received, up to max_audio_seconds (25 per second)."""
    w = _workload(cache, video_fps=1, window_seconds=1, max_audio_seconds=2.0)
    seen = [_feed(w, 1).audio_tokens]  # 0.25 s
    seen.append(_feed(w, 1, fps=1).audio_tokens)  # 1.25 s
    seen.append(_feed(w, 2, fps=1).audio_tokens)  # 3.25 s: beyond the 2 s window
    assert seen[0] is not None and seen[1] is not None
    assert seen[0] < seen[1] <= seen[2] == 50  # type: ignore[operator]


@pytest.mark.model
def test_without_audio_source_only_vision_counts(cache: Path) -> None:
    """With no audio configured the request carries no audio tokens and no features."""
    w = _workload(cache, rate=None, video_fps=2, window_seconds=1)
    out = _feed(w, 3)
    assert out.audio_tokens == 0 and (out.vision_tokens or 0) > 0
    assert out.extra is not None and "audio_features" not in out.extra
    assert w.describe()["audio_rate"] is None


@pytest.mark.skipif(not torchvision_imports(), reason=NO_TORCHVISION)
@pytest.mark.model
def test_pil_video_processor_matches_the_real_one(checkpoint: Path) -> None:
    """Where torchvision imports, the PIL stand-in gives the real Qwen2VLVideoProcessor's
    input ids, grid and features, and its pixels up to resampling differences."""
    import torch

    from soakd.workloads import omni

    real = load_processor(checkpoint)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(omni, "torchvision_imports", lambda: False)
        pil = load_processor(checkpoint)
    assert type(real.video_processor).__name__ == "Qwen2VLVideoProcessor"
    assert type(pil.video_processor).__name__ == "PilVideoProcessor"
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (5, 240, 320, 3), dtype=np.uint8)
    audio = (0.1 * rng.standard_normal(RATE)).astype(np.float32)
    content = [{"type": "video"}, {"type": "audio"}, {"type": "text", "text": "What?"}]
    outs = []
    for p in (real, pil):
        text = p.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        outs.append(p(text=[text], videos=[frames], audio=[audio], return_tensors="pt", fps=4.0))
    a, b = outs
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert torch.equal(a["video_grid_thw"], b["video_grid_thw"])
    assert torch.equal(a["input_features"], b["input_features"])
    assert (a["pixel_values_videos"] - b["pixel_values_videos"]).abs().mean() < 0.01


# -- video fps and audio in video reach the processor and generate


@pytest.mark.model
def test_video_fps_sets_the_temporal_positions(cache: Path) -> None:
    """At video_fps 4 a temporal grid step is 0.5 s, 12.5 positions (25 per second); at 2 fps
    it is 1 s, 25 positions: the fps reaches the processor and the rope index."""
    steps = {}
    for fps in (2, 4):
        w = _workload(cache, rate=None, video_fps=fps, window_seconds=8 / fps)
        req = _last_request(w, 8, fps)
        inputs = req.inputs
        model = w.model.model
        pos, _ = model.get_rope_index(
            inputs["input_ids"],
            video_grid_thw=inputs["video_grid_thw"],
            attention_mask=inputs["attention_mask"],
            second_per_grids=inputs["video_second_per_grid"],
        )
        video = inputs["input_ids"][0] == w.processor.video_token_id
        t = sorted(set(pos[0, 0][video].tolist()))
        steps[fps] = (req.media["seconds_per_grid"], np.diff(t).tolist())
    assert steps[2] == (1.0, [25, 25, 25])
    assert steps[4] == (0.5, [12, 13, 12])


@pytest.mark.model
def test_use_audio_in_video_interleaves_and_reaches_generate(cache: Path) -> None:
    """With use_audio_in_video the audio is interleaved with the video in 2 s chunks inside
    one placeholder, and generate is called with use_audio_in_video=True."""
    w = _workload(cache, video_fps=1, window_seconds=4, use_audio_in_video=True)
    seen: list[Any] = []
    real_generate = w.model.generate

    def spy(**kwargs: Any) -> Any:
        seen.append(kwargs.get("use_audio_in_video"))
        return real_generate(**kwargs)

    w.model.generate = spy
    req = _last_request(w, 4, fps=1)  # 4 s: 4 video frames (2 grid steps), 4 s of audio
    ids = req.inputs["input_ids"][0].tolist()
    kinds = [{w.processor.video_token_id: "v", w.processor.audio_token_id: "a"}.get(i) for i in ids]
    runs = [k for i, k in enumerate(kinds) if k and (i == 0 or kinds[i - 1] != k)]
    assert runs == ["v", "a", "v", "a"]  # two 2 s chunks, video then audio in each
    assert ids.count(w.processor.audio_token_id) == 100
    out = w.decode(w.infer(req))
    assert seen == [True] and out.audio_tokens == 100


def test_use_audio_in_video_without_audio_is_an_error(cache: Path) -> None:
    """use_audio_in_video with no audio source fails at setup with a one-line reason."""
    with pytest.raises(WorkloadError, match="use_audio_in_video needs an audio source"):
        _workload(cache, rate=None, use_audio_in_video=True)


# -- window_seconds: the video_fps sweep changes the steady-state tokens


@pytest.mark.model
def test_video_fps_changes_steady_state_vision_tokens(cache: Path) -> None:
    """Over a full 2 s window, video_fps 1, 2, 4 hold 2, 4, 8 frames: vision tokens 140, 280,
    560, and each frame records its grid and seconds per grid."""
    seen = {}
    for fps in (1, 2, 4):
        w = _workload(cache, rate=None, video_fps=fps, window_seconds=2)
        out = _feed(w, 9)  # 2.25 s at 4 fps: every window is full
        assert out.extra is not None
        seen[fps] = (
            out.extra["window_frames"],
            out.vision_tokens,
            out.extra["video_grid_thw"],
            out.extra["seconds_per_grid"],
        )
        assert w.describe()["window_frames"] == out.extra["window_frames"]
    assert seen[1] == (2, 140, [1, 20, 28], 2.0)
    assert seen[2] == (4, 280, [2, 20, 28], 1.0)
    assert seen[4] == (8, 560, [4, 20, 28], 0.5)


@pytest.mark.model
def test_window_is_capped_by_max_frames(cache: Path) -> None:
    """max_frames caps a window that video_fps x window_seconds would make longer."""
    w = _workload(cache, rate=None, video_fps=4, window_seconds=4, max_frames=4)
    out = _feed(w, 6)
    assert out.extra is not None and out.extra["window_frames"] == 4
    assert out.vision_tokens == 280


@pytest.mark.slow
@pytest.mark.model
def test_av_run_through_the_runner_records_media_per_frame(cache: Path, tmp_path: Path) -> None:
    """configs/av-qa.toml run by the runner (unpaced, tone audio) stores each frame's media
    token counts, video grid, seconds per grid and audio feature shape."""
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
    rows = sqlite3.connect(db).execute(
        "SELECT out_tokens, vision_tokens, audio_tokens, extra FROM frames ORDER BY frame_id"
    )
    rows = rows.fetchall()
    assert len(rows) == 5
    for out_tokens, vision, audio, extra in rows:
        media = json.loads(extra)
        assert out_tokens == 8 and audio > 0
        assert vision == media["video_grid_thw"][0] * 140
        assert media["seconds_per_grid"] == 1.0 and media["audio_features"] == [128, 30000]


@pytest.mark.slow
@pytest.mark.model
def test_sweep_over_video_fps_reports_media_tokens_and_time(cache: Path, tmp_path: Path) -> None:
    """`sweep --vary workload.video_fps=1,2,4` on the AV config with a 2 s window: frames back
    to back still see the stream at run.fps, so steady-state vision tokens double with
    video_fps; each point has times."""
    from soakd.config import load_settings
    from soakd.studies.sweep import sweep

    settings = load_settings(
        "configs/av-qa.toml",
        overrides=[
            f'run.db="{tmp_path / "sw.db"}"',
            f'workload.cache_dir="{cache}"',
            "workload.window_seconds=2",
            'audio.kind="none"',
        ],
    )
    res = sweep(settings, "workload.video_fps", [1, 2, 4], frames=20)
    pts = [p for p in res.points if p.status == "ok"]
    assert [p.vision_tokens for p in pts] == [140, 280, 560]
    assert all(p.total_median_ms and p.total_median_ms > 0 for p in pts)
    md = res.to_markdown()
    assert "vision tokens" in md and "audio tokens" in md
