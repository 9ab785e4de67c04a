"""Session runs measured honestly (issue 11): when the model takes each frame (consume
latency) apart from its next output, a dead generation thread ends the run with its cause,
questions pushed during the run get their answer latency, and the new settings' errors."""

from __future__ import annotations

import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from soakd.analysis.data import load_run_data
from soakd.config import SessionWorkloadSettings, Settings, load_settings
from soakd.records import Frame
from soakd.report.markdown import render_markdown
from soakd.report.summary import summarize
from soakd.run.runner import run_soak
from soakd.workloads.base import SessionFailed, WorkloadContext
from soakd.workloads.session import RealtimeSessionWorkload, downscale, failure_text

from .conftest import soakd_cmd
from .tiny_session import ScriptedModel

pytestmark = pytest.mark.model

FRAME_COST_S = 0.2  # planted: the step after a frame is taken sleeps this long first


@pytest.fixture
def scripted(db_path: Path) -> Callable[..., Settings]:
    """Settings for a short soak of the CI stand-in with the given factory options."""

    def make(options: str, *overrides: str) -> Settings:
        base = [
            f"run.db={str(db_path)!r}",
            "run.duration=3",
            "run.fps=4",
            "run.warmup_s=0.3",
            "run.log_every=0",
            "source.width=64",
            "source.height=48",
            "workload.kind=python",
            "workload.factory='tests.tiny_session:factory'",
            f"workload.options={{{options}}}",
        ]
        return load_settings(overrides=[*base, *overrides])

    return make


def _rows(db_path: Path, run_id: str) -> list[sqlite3.Row]:
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    return conn.execute(
        "SELECT * FROM frames WHERE run_id = ? ORDER BY frame_id", (run_id,)
    ).fetchall()


def _events(db_path: Path, run_id: str, kind: str) -> list[str]:
    conn = sqlite3.connect(db_path)
    q = "SELECT message FROM events WHERE run_id = ? AND kind = ? ORDER BY t"
    return [r[0] for r in conn.execute(q, (run_id, kind))]


@pytest.mark.slow
def test_a_model_that_keeps_talking_has_consume_latency_apart_from_its_next_output(
    scripted: Callable[..., Settings], db_path: Path
) -> None:
    """While the model talks, the next output after a push is just its next token; the
    consume columns time when the model took the frame and its first output after that,
    which includes the frame's planted processing cost."""
    opts = f"talk = true, frame_cost_s = {FRAME_COST_S}, max_tokens_per_turn = 50"
    res = run_soak(scripted(opts), judge=True)
    assert res.status == "completed", res.reason
    taken = [r for r in _rows(db_path, res.run_id) if r["t_consumed"] is not None]
    assert res.summary["session_consumed"] == len(taken)
    rows = [r for r in taken if r["consume_output_ms"] is not None]
    assert len(rows) >= 6 and len(taken) - len(rows) <= 1  # the last may have no output yet
    for r in rows:
        assert r["consume_ms"] == pytest.approx((r["t_consumed"] - r["t_dispatch"]) * 1000)
        assert r["consume_ms"] >= 0
        assert r["consume_output_ms"] >= FRAME_COST_S * 1000  # the planted cost, at least
        assert r["output_kind"] == "text"  # the model never went silent
        # the next output after the push is never later than the first one after the take
        assert r["t_done"] <= r["t_consumed"] + r["consume_output_ms"] / 1000 + 1e-6
    push_to_next = [r["output_latency_ms"] - r["frame_age_ms"] for r in rows]
    assert min(push_to_next) < FRAME_COST_S * 1000  # what "next output" alone would credit
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    summary = summarize(load_run_data(conn, res.run_id), res.verdict)
    assert set(summary.session) == {"next output", "consume", "consume to output"}
    assert summary.session["consume to output"].p50 >= FRAME_COST_S * 1000
    md = render_markdown(load_run_data(conn, res.run_id), res.verdict)
    assert "| consume to output |" in md and "| next output |" in md


@pytest.mark.slow
def test_a_dead_generation_thread_ends_the_run_with_its_cause(
    scripted: Callable[..., Settings], db_path: Path
) -> None:
    """A generation thread that raises on the third frame it takes ends the run aborted
    (INVALID, never PASS) with the planted error as the reason, long before the run's end."""
    settings = scripted("die_on_frame = 3, max_tokens_per_turn = 100", "run.duration=60")
    t0 = time.monotonic()
    res = run_soak(settings, judge=True)
    assert time.monotonic() - t0 < 30
    assert res.status == "aborted"
    assert res.reason is not None and "generation thread died" in res.reason
    assert "ValueError: planted: the vision tower failed on frame 3" in res.reason
    assert res.verdict is not None and res.verdict.status == "INVALID"
    errors = _events(db_path, res.run_id, "error")
    assert any("planted: the vision tower failed on frame 3" in e for e in errors)


def test_close_names_the_error_of_a_thread_that_died_between_pushes() -> None:
    """A generation thread that died after the last push makes close() raise SessionFailed
    naming its cause (the runner records it and aborts the run)."""
    model = ScriptedModel(die_on_frame=1)
    wl = RealtimeSessionWorkload(
        SessionWorkloadSettings(max_tokens_per_turn=100),
        WorkloadContext(),
        model=model,
        processor=model.processor,
    )
    wl.setup()
    wl.start()
    model.gate.clear()  # the thread waits before it takes the frame
    image = np.zeros((48, 64, 3), np.uint8)
    t = time.perf_counter_ns()
    assert wl.push(Frame(0, t, t, 0, image)).dropped is False
    session = model.sessions[0]
    model.gate.set()
    session._thread.join(20.0)  # type: ignore[union-attr]
    assert not session.active
    with pytest.raises(SessionFailed, match="caused by ValueError: planted") as err:
        wl.close()
    assert str(err.value).startswith("session close failed: RuntimeError: MOSS-VL")
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_questions_get_their_answer_latency(
    scripted: Callable[..., Settings], db_path: Path
) -> None:
    """A question pushed at 1 s into a session that is otherwise silent is answered by the
    first text chunk after it: its answer latency is stored in the summary and an event."""
    settings = scripted(
        "script = 's', max_tokens_per_turn = 100, "
        "questions = [{at_s = 1, text = 'Is anyone there?'}]"
    )
    res = run_soak(settings, judge=False)
    assert res.status == "completed", res.reason
    (q,) = res.summary["session_questions"]
    assert q["text"] == "Is anyone there?" and q["at_s"] == 1
    assert q["t_asked"] >= 1 and q["answer"] == "Yes, I see it."
    assert q["answer_ms"] is not None and q["answer_ms"] >= 0
    assert _events(db_path, res.run_id, "question") == ["Is anyone there?"]
    assert len(_events(db_path, res.run_id, "answer")) == 1
    assert res.summary["session_outputs"]["text"] == 1  # only the answer was text


def test_frames_are_downscaled_to_max_pixels_keeping_the_aspect() -> None:
    """max_pixels bounds width x height; smaller frames pass unchanged."""
    rgb = np.zeros((480, 640, 3), np.uint8)
    small = downscale(rgb, 640 * 480 // 4)
    assert small.shape == (240, 320, 3)
    assert downscale(rgb, None) is rgb and downscale(rgb, 640 * 480) is rgb


def test_failure_text_names_the_cause_chain() -> None:
    """failure_text follows `raise ... from` to the error worth reading, on one line."""
    try:
        try:
            raise ValueError("bad frame\nsecond line")
        except ValueError as inner:
            raise RuntimeError("generation failed") from inner
    except RuntimeError as exc:
        text = failure_text(exc)
    assert text == "RuntimeError: generation failed; caused by ValueError: bad frame"


def test_settings_reach_create_realtime_session() -> None:
    """system_prompt and generate_kwargs are passed to create_realtime_session as given."""
    model = ScriptedModel()
    settings = SessionWorkloadSettings(
        system_prompt="Be brief.", generate_kwargs={"temperature": 0.7, "top_p": 0.9}
    )
    ctx = WorkloadContext()
    wl = RealtimeSessionWorkload(settings, ctx, model=model, processor=model.processor)
    wl.setup()
    wl.start()
    try:
        s = model.sessions[0]
        assert s.system_prompt == "Be brief."
        assert s.generate_kwargs["temperature"] == 0.7 and s.generate_kwargs["top_p"] == 0.9
        assert wl.describe()["consume_tracking"] == "frame_queue"
    finally:
        wl.close()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("workload.generate_kwargs={do_sample = true}", "'do_sample' is a setting of its own"),
        (
            "workload.questions=[{at_s = 3, text = 'a'}, {at_s = 1, text = 'b'}]",
            "questions must be in time order",
        ),
        ("workload.questions=[{at_s = 1, text = ''}]", "workload.questions.0.text"),
        ("workload.torch_threads=0", "workload.torch_threads: must be >= 1"),
        ("workload.max_pixels=10", "workload.max_pixels: must be >= 1024"),
    ],
)
def test_bad_session_settings_are_one_line_exit_2(
    setting: str, message: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """Each new session key's bad value is a one-line error and exit 2."""
    proc = subprocess.run(
        soakd_cmd(
            "run",
            "--db",
            str(tmp_path / "s.db"),
            "--duration",
            "1s",
            "--no-live",
            "--set",
            "workload.kind=session",
            "--set",
            setting,
        ),
        capture_output=True,
        text=True,
        env=subprocess_env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("soakd: error:") and message in lines[0]


@pytest.mark.slow
def test_the_silence_the_loop_inserts_with_a_question_is_not_an_answer(
    scripted: Callable[..., Settings], db_path: Path
) -> None:
    """A question drained together with frames makes the loop put <|round_start|> and
    <|silence|> itself (as MOSS-VL-Realtime does): both are counted as inserted, neither
    counts as the model's output (silence ratio) nor as the frames' first output."""
    settings = scripted(
        "script = 't', start_after_pushes = 3, max_tokens_per_turn = 100, "
        "questions = [{at_s = 0, text = 'Who is there?'}]"
    )
    res = run_soak(settings, judge=False)
    assert res.status == "completed", res.reason
    sm = res.summary
    assert sm["session_inserted"] == {"text": 0, "silence": 1, "control": 1}
    said = sm["session_outputs"]
    assert said["silence"] == 1  # its first token only (the prompt's prefill, as upstream)
    assert sm["silence_ratio"] == pytest.approx(1 / (1 + said["text"]), abs=1e-6)
    # the three frames pushed before the loop started were drained with the question: the
    # first output after they were taken is the model's (after its step on them), not the
    # <|silence|> the loop put right after taking them
    for r in _rows(db_path, res.run_id)[:3]:
        assert r["consume_output_ms"] >= r["pre_ms"] + r["infer_ms"] + r["decode_ms"] > 0
    (q,) = sm["session_questions"]
    assert q["answer"] == "Yes, I see it."
