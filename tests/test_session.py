"""The session workload kind: the realtime-session semantics (bounded frame queue that drops
its oldest frame, silence versus text), the adapter, the session driver's records (session
drops, pending frames, output kind and latency, silence ratio), hang detection and bad
checkpoints. The real MOSS-VL-Realtime model is not run here."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import subprocess
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from soakd.analysis import RunData, RunMeta, judge, make_run_data
from soakd.analysis.data import load_run_data
from soakd.config import CriteriaSettings, SessionWorkloadSettings, Settings, load_settings
from soakd.errors import UsageError
from soakd.records import Frame
from soakd.report.markdown import render_markdown
from soakd.report.summary import summarize
from soakd.run.runner import run_soak
from soakd.workloads.base import WorkloadContext, WorkloadError
from soakd.workloads.session import RealtimeSessionWorkload, build, check_checkpoint, classify_chunk
from soakd.workloads.tiny_session import SILENCE, TinyRealtimeModel

from .conftest import soakd_cmd
from .tiny_session import ScriptedModel

pytestmark = pytest.mark.model

WAIT_S = 20.0  # generous bound for one tiny-model turn (a wait, never a retry)


def _img(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)


def _frame(i: int, image: np.ndarray) -> Frame:
    t = time.perf_counter_ns()
    return Frame(i, t, t, 0, image)


def test_chunks_are_classified_as_text_silence_or_control() -> None:
    """Visible text wins; <|silence|> alone is silence; other control tokens are control."""
    assert classify_chunk("a dog runs") == "text"
    assert classify_chunk(SILENCE) == "silence"
    assert classify_chunk(f" {SILENCE}\n") == "silence"
    assert classify_chunk("<|im_end|>") == "control"
    assert classify_chunk(f"{SILENCE}a cat") == "text"


def test_tiny_session_drops_its_oldest_pending_frame_when_full() -> None:
    """push_frame returns True exactly when the queue of frame_queue_size was full, and
    pending_frames never exceeds it; once started, the kept frames are all answered."""
    model = TinyRealtimeModel(silence_threshold=0.0)
    s = model.create_realtime_session(model.processor, frame_queue_size=3, max_tokens_per_turn=4)
    try:
        dropped = [s.push_frame(_img(i), i * 0.5) for i in range(5)]
        assert dropped == [False, False, False, True, True]
        assert s.pending_frames == 3
        s.start()
        outs = [s.poll_output(WAIT_S) for _ in range(3)]
        assert all(o is not None and 1 <= len(o) <= 4 for o in outs)
        assert s.poll_output(0.05) is None
        assert s.pending_frames == 0
    finally:
        s.close()
    assert s._thread is not None and not s._thread.is_alive()


def test_tiny_session_is_silent_when_the_picture_has_not_changed() -> None:
    """The tiny model answers <|silence|> for a frame equal to the previous one and text for
    a changed one."""
    model = TinyRealtimeModel(silence_threshold=1.0)
    s = model.create_realtime_session(model.processor, frame_queue_size=8, max_tokens_per_turn=6)
    s.start()
    try:
        a, b = _img(1), _img(2)
        for i, image in enumerate([a, a, b]):
            s.push_frame(image, float(i))
        outs = [s.poll_output(WAIT_S) for _ in range(3)]
    finally:
        s.close()
    assert [classify_chunk(o or "") for o in outs] == ["text", "silence", "text"]


def test_the_stand_in_has_every_session_call_the_upstream_check_compares() -> None:
    """bench/upstream_check.py --moss compares these with the authors' modeling_moss_vl.py:
    each call the session workload makes is in tests/tiny_session.py."""
    from bench.upstream_check import MOSS_SIGNATURES, signature

    here = Path(__file__).parent
    missing = [m for _, m in MOSS_SIGNATURES if signature(here, "tiny_session.py", m) is None]
    assert missing == []


def test_stand_in_runs_one_realtime_loop_per_model_as_upstream() -> None:
    """As MossVLRealtimeSession.start(): a second session is refused while the model's loop
    runs (continue_generating), and close() stops that loop so a new one may start."""
    model = ScriptedModel(talk=True)
    first = model.create_realtime_session(model.processor).start()
    try:
        first.push_frame(_img(0))
        assert first.poll_output(WAIT_S) is not None
        second = model.create_realtime_session(model.processor)
        with pytest.raises(RuntimeError, match="already has an active realtime"):
            second.start()
    finally:
        first.close()
    assert not model.continue_generating and not first.active
    third = model.create_realtime_session(model.processor).start()
    third.close()


def test_adapter_reports_session_drops_and_pending_frames() -> None:
    """The session workload passes the session's drop flag and pending count through, and
    its outputs come back classified."""
    model = ScriptedModel(script="ts", start_after_pushes=5)
    wl = RealtimeSessionWorkload(
        SessionWorkloadSettings(frame_queue_size=2),
        WorkloadContext(),
        model=model,
        processor=model.processor,
    )
    wl.setup()
    wl.start()
    try:
        res = [wl.push(_frame(i, _img(i))) for i in range(5)]
        assert [r.dropped for r in res] == [False, False, True, True, True]
        assert [r.pending for r in res] == [1, 2, 2, 2, 2]
        kinds = []
        while len(kinds) < 3:
            got = wl.poll(WAIT_S)
            assert got, "the session did not answer"
            kinds += [o.kind for o in got]
    finally:
        wl.close()
    assert kinds == ["silence", "text", "silence"]  # its first token, then the two frames


def test_a_model_without_a_realtime_session_is_rejected() -> None:
    """kind = 'session' over a model without create_realtime_session is a WorkloadError."""
    wl = RealtimeSessionWorkload(SessionWorkloadSettings(), WorkloadContext(), model=object())
    with pytest.raises(WorkloadError, match="has no create_realtime_session"):
        wl.setup()


# --- bad checkpoints, before anything loads


def test_missing_checkpoint_path_is_named(tmp_path: Path) -> None:
    """A model_path that does not exist is a one-line WorkloadError naming it."""
    missing = tmp_path / "moss-vl-realtime"
    with pytest.raises(WorkloadError, match=rf"workload.model_path: {missing} does not exist"):
        build(SessionWorkloadSettings(model_path=str(missing)), WorkloadContext())


def test_folder_without_config_is_not_a_checkpoint(tmp_path: Path) -> None:
    """A folder without config.json is rejected as not a transformers checkpoint."""
    with pytest.raises(WorkloadError, match=r"has no config\.json"):
        check_checkpoint(str(tmp_path), trust_remote_code=True)


def _remote_code_checkpoint(root: Path) -> Path:
    ckpt = root / "ckpt"
    ckpt.mkdir()
    cfg = {
        "model_type": "moss_vl_realtime_test",
        "auto_map": {"AutoModelForCausalLM": "modeling_moss_vl.MossVLForCausalLM"},
    }
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return ckpt


def test_custom_code_needs_trust_remote_code(tmp_path: Path) -> None:
    """A checkpoint that ships its own model code is refused while trust_remote_code is off,
    with the key to change named, and accepted by the check once it is on."""
    ckpt = _remote_code_checkpoint(tmp_path)
    with pytest.raises(WorkloadError) as err:
        check_checkpoint(str(ckpt), trust_remote_code=False)
    msg = str(err.value)
    assert msg.startswith("workload.trust_remote_code:") and "\n" not in msg
    assert "moss_vl_realtime_test" in msg
    assert check_checkpoint(str(ckpt), trust_remote_code=True) == ckpt


def test_cli_exits_2_on_a_missing_checkpoint(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """`soakd run` with a session model_path that does not exist exits 2 with a one-line
    error naming the path, before any run is started."""
    missing = tmp_path / "nope"
    proc = subprocess.run(
        soakd_cmd(
            "run",
            "--db",
            str(tmp_path / "s.db"),
            "--duration",
            "2s",
            "--no-live",
            "--set",
            "workload.kind=session",
            "--set",
            f"workload.model_path={str(missing)!r}",
        ),
        capture_output=True,
        text=True,
        env=subprocess_env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{missing} does not exist" in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "does not exist" in ln]
    assert len(lines) == 1


# --- end to end, through the runner and a real SQLite file


@pytest.fixture
def session_settings(db_path: Path) -> Callable[..., Settings]:
    def make(*overrides: str) -> Settings:
        base = [
            f"run.db={str(db_path)!r}",
            "run.duration=2.5",
            "run.fps=8",
            "run.warmup_s=0.3",
            "run.log_every=0",
            "source.width=64",
            "source.height=48",
            "workload.kind=session",
            "workload.max_tokens_per_turn=4",
        ]
        return load_settings(overrides=[*base, *overrides])

    return make


def _frames(db_path: Path, run_id: str) -> list[sqlite3.Row]:
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    return conn.execute(
        "SELECT * FROM frames WHERE run_id = ? ORDER BY frame_id", (run_id,)
    ).fetchall()


@pytest.mark.slow
def test_soak_of_the_tiny_session_records_what_it_can_see(
    session_settings: Callable[..., Settings], db_path: Path
) -> None:
    """A short soak of the built-in tiny session stores, per pushed frame, the push time,
    pending frames, the next output's kind and latency, and the stages soakd times (the
    processor call, model steps and detokenisation between the model taking the frame and
    its first output after it); with a threshold no change reaches, every answer after the
    first is silence."""
    res = run_soak(session_settings("workload.silence_threshold=1000"), judge=False)
    assert res.status == "completed", res.reason
    rows = _frames(db_path, res.run_id)
    assert len(rows) >= 10
    answered = [r for r in rows if r["output_kind"] is not None]
    assert len(answered) >= len(rows) - 2  # at most the frames still in flight at the end
    for r in rows:
        assert r["t_dispatch"] is not None and r["pending"] is not None
    for r in answered:
        assert r["output_latency_ms"] == pytest.approx((r["t_done"] - r["t_capture"]) * 1000)
        assert r["output_latency_ms"] > 0
        assert r["pre_ms"] > 0 and r["infer_ms"] > 0 and r["decode_ms"] > 0
        # all three happen after the model took the frame and before its first output
        spent = r["pre_ms"] + r["infer_ms"] + r["decode_ms"]
        assert spent <= r["consume_output_ms"] + 0.01
    assert rows[0]["output_kind"] == "text"
    assert {r["output_kind"] for r in answered[1:]} <= {"silence", "text"}
    outs = res.summary["session_outputs"]
    assert outs["text"] == 1 and outs["silence"] >= 5
    assert res.summary["silence_ratio"] == pytest.approx(outs["silence"] / (outs["silence"] + 1))
    assert res.summary["session_staged"] == len(answered)


@pytest.mark.slow
def test_a_tiny_session_run_is_judged_on_the_stages_soakd_times(
    session_settings: Callable[..., Settings], db_path: Path
) -> None:
    """A session run's report has pre / infer / decode percentiles and its jitter criterion
    judges the model step (infer_ms, k x its median), not n/a and not output latency."""
    settings = session_settings("criteria.min_duration_s=2", "criteria.min_frames=5")
    res = run_soak(settings, judge=True)
    assert res.status == "completed", res.reason
    assert res.verdict is not None
    jitter = res.verdict.get("jitter")
    # judged (pass or fail; invalid only when this busy machine's contention made the spikes)
    assert jitter is not None and jitter.status in ("pass", "fail", "invalid"), jitter
    if jitter.status == "invalid":
        assert jitter.detail.startswith("the host was contended"), jitter.detail
    assert jitter.evidence["source"] == "infer_ms"
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    data = load_run_data(conn, res.run_id)
    summary = summarize(data, res.verdict)
    measured = [r for r in _frames(db_path, res.run_id) if not r["warmup"] and r["infer_ms"]]
    assert summary.stages["infer"].n == len(measured) >= 5
    median = float(np.median([r["infer_ms"] for r in measured]))
    assert summary.stages["infer"].p50 == pytest.approx(median, rel=1e-3)
    assert jitter.evidence["median_ms"] == pytest.approx(median, rel=1e-3)
    md = render_markdown(data, res.verdict)
    for stage in ("pre", "infer", "decode"):
        assert f"| {stage} | {len(measured)} |" in md


@pytest.mark.slow
def test_soak_of_a_scripted_session_counts_drops_and_silence(
    session_settings: Callable[..., Settings], db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through kind = 'python', a session that starts consuming only after 6 pushes with a
    queue of 2 drops 4 frames on pushes 3..6 (session_dropped climbs 1..4), and a
    text/silence script of 'ts' gives a silence ratio of one half."""
    settings = session_settings(
        "workload.kind=python",
        "workload.factory='tests.tiny_session:factory'",
        "workload.options={script = 'ts', start_after_pushes = 6, frame_queue_size = 2,"
        " max_tokens_per_turn = 100}",
    )
    res = run_soak(settings, judge=False)
    assert res.status == "completed", res.reason
    rows = _frames(db_path, res.run_id)
    assert [r["session_dropped"] for r in rows[:6]] == [0, 0, 1, 2, 3, 4]
    # later drops depend on how fast turns run; the counter only climbs, by one per drop
    dropped = [r["session_dropped"] for r in rows]
    assert all(0 <= b - a <= 1 for a, b in pairwise(dropped))
    assert res.summary["session_dropped"] == dropped[-1]
    assert max(r["pending"] for r in rows) == 2
    outs = res.summary["session_outputs"]
    said = outs["text"] + outs["silence"]
    assert said >= 8
    assert abs(res.summary["silence_ratio"] - 0.5) <= 1 / said


@pytest.mark.slow
def test_a_session_that_stops_answering_aborts_the_run(
    session_settings: Callable[..., Settings], db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session that stops producing output after 4 turns is a 'stall' event within
    response_timeout_s and the run ends as aborted ('stalled'), not a hang."""
    settings = session_settings(
        "run.duration=60",
        "workload.kind=python",
        "workload.factory='tests.tiny_session:factory'",
        # under the runner's own 5 s stall floor (soakd.run.runner.STALL_FLOOR_S), over a
        # loaded host's turn
        "workload.options={stall_after = 4, response_timeout_s = 4}",
    )
    t0 = time.monotonic()
    res = run_soak(settings, judge=False)
    assert time.monotonic() - t0 < 40
    assert (res.status, res.reason) == ("aborted", "stalled")
    conn = sqlite3.connect(db_path)
    stalls = conn.execute(
        "SELECT message FROM events WHERE run_id = ? AND kind = 'stall'", (res.run_id,)
    ).fetchall()
    assert len(stalls) == 1 and "no output for 4 s" in stalls[0][0]
    rows = _frames(db_path, res.run_id)
    answered = [r for r in rows if r["output_kind"] is not None]
    # its first token, four answers, then none
    assert sum(res.summary["session_outputs"].values()) == 5
    # each output ends the frames pushed before it; two read in one poll end one run
    assert 1 <= len({r["t_done"] for r in answered}) <= 5
    waiting = [r for r in rows if r["output_kind"] is None]
    assert waiting and all(r["t_done"] is None for r in waiting)
    assert waiting[0]["frame_id"] > answered[-1]["frame_id"]


def test_missing_checkpoint_fails_the_run_before_it_starts(
    session_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """Through the runner, a missing checkpoint is a UsageError (exit 2)."""
    settings = session_settings(f"workload.model_path={str(tmp_path / 'absent')!r}")
    with pytest.raises(UsageError, match="does not exist") as err:
        run_soak(settings, judge=False)
    assert int(err.value.exit_code) == 2


@pytest.mark.parametrize("name", ["session.toml", "moss-vl-realtime.toml"])
def test_shipped_session_configs_are_valid(name: str) -> None:
    """configs/session.toml and configs/moss-vl-realtime.toml load and validate."""
    from .conftest import REPO

    s = load_settings(REPO / "configs" / name)
    assert isinstance(s.workload, SessionWorkloadSettings)
    if name.startswith("moss"):
        assert s.workload.trust_remote_code and s.workload.device == "cuda"


def _session_run(late_ms: float, baseline_p95_ms: float | None) -> RunData:
    """60 s of a session run at 4 fps whose pacer woke ``late_ms`` late (small noise), with
    a pacing baseline of that p95 measured before the model thread started."""
    t = np.arange(0, 60, 0.25)
    rng = np.random.default_rng(0)
    base = None if baseline_p95_ms is None else {"ticks": 50, "p95_ms": baseline_p95_ms}
    meta = RunMeta("s", duration_s=60, fps=4, shape="session", summary={"pacing_baseline": base})
    frames = {
        "t_capture": t,
        "warmup": (t < 5).astype(float),
        "output_latency_ms": 40 + rng.gamma(2, 1, t.size),
        "lateness_ms": late_ms + rng.uniform(0, 0.05, t.size),
    }
    return make_run_data(meta, frames=frames, samples={"t": np.arange(0, 60, 0.1)})


def _pacing_hint(data: RunData) -> list[str]:
    return [h for h in judge(data, CriteriaSettings()).hints if "pacer woke late" in h]


def test_pacer_lateness_over_the_pre_model_baseline_is_flagged() -> None:
    """The diagnosis flags a session run whose pacer lateness p95 exceeds both 2x and 1 ms
    over the baseline measured before the model thread started; not one within it, nor a
    run without a baseline."""
    assert _pacing_hint(_session_run(0.1, 0.08)) == []
    assert _pacing_hint(_session_run(1.0, 0.08)) == []  # 2x, but within 1 ms
    assert _pacing_hint(_session_run(6.0, None)) == []
    (hint,) = _pacing_hint(_session_run(6.0, 0.08))
    assert "p95 6.0" in hint and "p95 0.08 ms" in hint and "GIL" in hint


@pytest.mark.slow
def test_a_busy_waiting_session_thread_is_flagged_for_late_pacing(
    session_settings: Callable[..., Settings],
) -> None:
    """A session whose idle loop busy-waits holding the GIL (MOSS-VL-Realtime's after
    <|silence|>) makes soakd's pacer late against its own pre-model baseline, and the
    diagnosis says so."""
    settings = session_settings(
        "run.warmup_s=0.6",
        "criteria.min_duration_s=2",
        "criteria.min_frames=5",
        "workload.kind=python",
        "workload.factory='tests.tiny_session:factory'",
        "workload.options={script = 's', busy_wait = true, max_tokens_per_turn = 1000}",
    )
    res = run_soak(settings, judge=True)
    assert res.status == "completed", res.reason
    base = res.summary["pacing_baseline"]
    assert base["ticks"] >= 50 and base["p95_ms"] is not None
    assert res.verdict is not None
    assert any("pacer woke late" in h for h in res.verdict.hints), res.verdict.hints


def test_attention_auto_resolves_as_the_authors_runner() -> None:
    """attn_implementation = "auto" is eager off CUDA and flash_attention_2 on CUDA, which
    without the flash_attn package is a one-line WorkloadError naming the fix."""
    from soakd.workloads.session import attention_backend

    assert attention_backend(SessionWorkloadSettings(device="cpu")) == "eager"
    assert attention_backend(SessionWorkloadSettings(attn_implementation=None)) is None
    cuda = SessionWorkloadSettings(device="cuda")
    if importlib.util.find_spec("flash_attn") is not None:
        assert attention_backend(cuda) == "flash_attention_2"
        return
    with pytest.raises(WorkloadError, match="flash_attn is not installed") as err:
        attention_backend(cuda)
    assert "\n" not in str(err.value) and "attn_implementation = 'sdpa'" in str(err.value)
