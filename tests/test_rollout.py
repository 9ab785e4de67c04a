"""Generators as a rollout (one long session per run, a chunk per paced condition): the
rollout driver's records (a frames row per chunk, named stages in chunk_stages, intervals
continuous across chunks, the first output), the real-time criteria (content_fps,
max_first_output_ms), the reports and the diagnosis, and how a rollout can end badly
(an exception, a hang, returning early)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from soakd.analysis import chunks, evaluate, store
from soakd.analysis.data import make_run_data
from soakd.analysis.diagnosis import diagnose
from soakd.analysis.model import RunMeta, Verdict
from soakd.clock import FakeClock
from soakd.config import CriteriaSettings, Settings, load_settings
from soakd.errors import ExitCode, UsageError
from soakd.observers.base import RunResult
from soakd.records import ChunkStage, Emission, FrameRecord
from soakd.report.html import render_html
from soakd.report.json import verdict_dict
from soakd.report.markdown import render_markdown
from soakd.run.drivers import DriverContext, get_driver
from soakd.run.drivers.context import WarmUp
from soakd.run.pacer import UnpacedGrab
from soakd.run.runner import run_soak
from soakd.run.sink import FrameSink
from soakd.workloads.base import RolloutRun, RolloutWorkload, WorkloadContext

from .conftest import run_cli

STAGES = ("context", "denoise", "kv_write", "memory_bank", "vae_decode")


# --- small rollouts (plain Python) reached through kind = "generator" + factory


class _Rollout:
    shape: Literal["rollout"] = "rollout"

    def setup(self) -> None: ...
    def sync(self) -> None: ...
    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None: ...
    def rollout(self, run: RolloutRun) -> None:
        raise NotImplementedError


#: the actions a ``Recording`` rollout was handed, in order (one run at a time)
SEEN: list[dict[str, Any] | None] = []


class Recording(_Rollout):
    def rollout(self, run: RolloutRun) -> None:
        while (c := run.next_condition()) is not None:
            SEEN.append(c.action)
            run.emit(1)


class Failing(_Rollout):
    """Raises in its fourth chunk's denoise stage."""

    def rollout(self, run: RolloutRun) -> None:
        while (c := run.next_condition()) is not None:
            with run.stage("denoise"):
                if c.index == 3:
                    raise RuntimeError("KV cache shape mismatch")
            run.emit(2)


class Hanging(_Rollout):
    """Hangs inside its third chunk until closed (a pipeline that stops answering)."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()

    def rollout(self, run: RolloutRun) -> None:
        while (c := run.next_condition()) is not None:
            if c.index == 2:
                self.closed.wait(30)
            run.emit(2)


class Quitting(_Rollout):
    """Returns after two chunks although the run goes on."""

    def rollout(self, run: RolloutRun) -> None:
        for _ in range(2):
            if run.next_condition() is None:
                return
            run.emit(1)


def factory(options: dict[str, Any], ctx: WorkloadContext) -> RolloutWorkload:
    kinds = {"recording": Recording, "failing": Failing, "hanging": Hanging, "quitting": Quitting}
    return kinds[options["kind"]]()


# --- settings and one shared run of the tiny torch rollout


def _settings(db: Path, *overrides: str) -> Settings:
    base = [
        f"run.db={str(db)!r}",
        "run.duration=3",
        "run.fps=6",
        "run.warmup_s=0.5",
        "run.log_every=0",
        "source.width=64",
        "source.height=48",
        "workload.kind=generator",
        "workload.width=32",
        "workload.height=32",
        "criteria.min_duration_s=1",
        "criteria.min_frames=5",
        "criteria.max_memory_growth_mb_per_min=1000",
    ]
    return load_settings(overrides=[*base, *overrides])


@pytest.fixture(scope="module")
def slow_bank(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[sqlite3.Connection, RunResult]]:
    """A 3 s rollout of the tiny torch generator with a planted 60 ms memory_bank stage."""
    db = tmp_path_factory.mktemp("rollout") / "soakd.db"
    settings = _settings(db, "workload.slow_stage='memory_bank'", "workload.slow_stage_ms=60")
    res = run_soak(settings, judge=False)
    assert res.status == "completed", res.reason
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    yield conn, res
    conn.close()


def _judge(run: tuple[sqlite3.Connection, RunResult], **criteria: Any) -> Verdict:
    conn, res = run
    base = {
        "min_duration_s": 1,
        "min_frames": 5,
        "max_memory_growth_mb_per_min": 1000,
        "min_headroom_hours": 0,
    }
    return evaluate(conn, res.run_id, CriteriaSettings(**{**base, **criteria}))[1]


@pytest.mark.model
def test_a_rollout_stores_a_row_per_chunk_and_its_named_stages(
    slow_bank: tuple[sqlite3.Connection, RunResult],
) -> None:
    """Every chunk is one frames row (4 frames emitted) with context, denoise, kv_write,
    memory_bank and vae_decode rows in chunk_stages that fit inside its wall time; the
    planted stage takes its 60 ms."""
    conn, res = slow_bank
    rows = conn.execute(
        "SELECT frame_id, total_ms, emitted, first_emit_ms FROM frames WHERE run_id = ?",
        (res.run_id,),
    ).fetchall()
    assert len(rows) >= 8
    for r in rows:
        stages = dict(
            conn.execute(
                "SELECT name, ms FROM chunk_stages WHERE run_id = ? AND frame_id = ?",
                (res.run_id, r["frame_id"]),
            ).fetchall()
        )
        assert sorted(stages) == sorted(STAGES)
        assert all(ms > 0 for ms in stages.values())
        assert sum(stages.values()) <= r["total_ms"] + 1e-6
        assert 60 <= stages["memory_bank"] < 200
        assert r["emitted"] == 4 and 0 < r["first_emit_ms"] <= r["total_ms"]
    assert res.summary["rollout_chunks"] == len(rows)


@pytest.mark.model
def test_rollout_intervals_run_on_across_chunks(
    slow_bank: tuple[sqlite3.Connection, RunResult],
) -> None:
    """One session: only the run's first emit has NULL intervals; a chunk's first emit is
    the gap since the previous chunk's last, amortised over its frames; the first output
    (rollout start to first emit) is in the summary."""
    conn, res = slow_bank
    ems = conn.execute(
        "SELECT frame_id, idx, t_emit, interval_ms, chunk_frames FROM emissions"
        " WHERE run_id = ? ORDER BY t_emit, idx",
        (res.run_id,),
    ).fetchall()
    assert [e["interval_ms"] is None for e in ems[:5]] == [True] * 4 + [False]
    assert all(e["interval_ms"] is not None for e in ems[4:])
    for prev, e in zip(ems[3::4], ems[4::4], strict=False):  # chunk boundaries
        gap_ms = (e["t_emit"] - prev["t_emit"]) * 1000
        assert e["interval_ms"] == pytest.approx(gap_ms / e["chunk_frames"], abs=1e-3)
    first = res.summary["first_output_ms"]
    assert first is not None and first >= 60  # the first chunk waits on its memory bank


@pytest.mark.model
def test_content_fps_fails_when_the_interval_p95_is_too_slow_and_passes_when_fast(
    slow_bank: tuple[sqlite3.Connection, RunResult],
) -> None:
    """generator_interval = "per_frame": interval p95 <= 1000 / content_fps: 6 chunks/s x 4
    frames gives ~42 ms intervals (~83 ms across a skipped tick), too slow for 60 fps, fast
    enough for 8 fps; unset, it is not judged."""
    per_frame = {"generator_interval": "per_frame"}
    v60 = _judge(slow_bank, content_fps=60, **per_frame)
    fail = v60.get("content_fps")
    ok = _judge(slow_bank, content_fps=8, **per_frame).get("content_fps")
    unset = _judge(slow_bank, **per_frame).get("content_fps")
    assert fail is not None and ok is not None and unset is not None
    assert (fail.status, ok.status, unset.status) == ("fail", "pass", "n/a")
    assert fail.value is not None and 1000 / 60 < fail.value <= 1000 / 8
    assert fail.threshold == pytest.approx(1000 / 60)
    assert fail in v60.failed  # what else a loaded host fails (drops, jitter) is not the point
    assert fail.evidence["basis"] == "per_frame"


@pytest.mark.model
def test_content_fps_judges_the_presentation_interval_by_default(
    slow_bank: tuple[sqlite3.Connection, RunResult],
) -> None:
    """By default content_fps judges the wait between visible updates: each chunk's 4
    frames come out at once every ~167 ms (6 chunks/s), so 8 fps (125 ms), which the
    per-frame average (~42 ms) passes, fails; 4 fps (250 ms) passes."""
    fail = _judge(slow_bank, content_fps=8).get("content_fps")
    ok = _judge(slow_bank, content_fps=4).get("content_fps")
    assert fail is not None and ok is not None
    assert (fail.status, ok.status) == ("fail", "pass")
    assert fail.evidence["basis"] == "presentation"
    assert fail.value is not None and 125 < fail.value < 250
    assert fail.detail.startswith("presentation interval p95")


@pytest.mark.model
def test_max_first_output_ms_judges_the_first_emission(
    slow_bank: tuple[sqlite3.Connection, RunResult],
) -> None:
    """The first output (from the rollout's start, >= the 60 ms first chunk) FAILs a
    limit below it and PASSes one above it."""
    first = slow_bank[1].summary["first_output_ms"]
    low = _judge(slow_bank, max_first_output_ms=first / 2).get("first_output")
    high = _judge(slow_bank, max_first_output_ms=first * 2).get("first_output")
    assert low is not None and high is not None
    assert (low.status, high.status) == ("fail", "pass")
    assert low.value == pytest.approx(first)


@pytest.mark.model
def test_jitter_judges_the_presentation_interval_or_the_chunk_times(
    slow_bank: tuple[sqlite3.Connection, RunResult],
) -> None:
    """By default the jitter rule judges a rollout's waits between visible updates (~167 ms
    at 6 chunks/s); with generator_interval = "per_frame" each chunk's wall time (a frames
    row, > 60 ms with its memory bank)."""
    j = _judge(slow_bank).get("jitter")
    assert j is not None and j.status == "pass" and j.title == "Presentation interval jitter"
    assert j.evidence["source"] == "presentation_ms" and 120 < j.evidence["median_ms"] < 220
    j = _judge(slow_bank, generator_interval="per_frame").get("jitter")
    assert j is not None and j.status == "pass" and j.title == "Chunk time jitter"
    assert j.evidence["source"] == "total_ms" and j.evidence["median_ms"] > 60


@pytest.mark.model
def test_the_diagnosis_names_the_planted_slow_memory_bank_stage(
    slow_bank: tuple[sqlite3.Connection, RunResult],
) -> None:
    """A 60 ms memory_bank stage dominates the chunk and the diagnosis says so, naming it
    as the stage to shorten when playback fails."""
    hints = _judge(slow_bank, content_fps=60).hints
    named = [h for h in hints if "memory_bank dominates" in h]
    assert len(named) == 1 and "content_fps failed: shorten memory_bank first" in named[0]


@pytest.mark.model
def test_reports_show_first_output_intervals_their_tail_and_the_stage_table(
    slow_bank: tuple[sqlite3.Connection, RunResult],
) -> None:
    """Markdown, HTML, JSON and `soakd show` carry the first output, interval
    p50/p95/p99/max, the interval tail by chunk and p50/p95/p99/max per named stage."""
    conn, res = slow_bank
    data, v = evaluate(conn, res.run_id)
    md = render_markdown(data, v)
    assert "**First output:**" in md and "p99" in md and "**Interval tail:**" in md
    for name in STAGES:
        assert f"| {name} |" in md
    html = render_html(data, v)
    assert 'id="chunk-stages"' in html and 'id="interval-tail"' in html
    assert all(f'data-panel="stage-{name}"' in html for name in STAGES)
    g = verdict_dict(data, v)["summary"]["generator"]
    assert {"p50", "p95", "p99", "max"} <= set(g["interval"])
    assert g["first_output_ms"] == pytest.approx(res.summary["first_output_ms"])
    assert sum(g["tail"]["tail_by_position"].values()) == g["tail"]["tail_intervals"] > 0
    db = conn.execute("PRAGMA database_list").fetchone()[2]
    shown = run_cli("show", res.run_id, "--db", db, "--format", "json")
    assert shown.returncode == 0, shown.stderr
    bank = json.loads(shown.stdout)["chunk_stages"]["memory_bank"]
    assert bank["p50"] >= 60 and bank["n"] >= 5


@pytest.mark.model
def test_reports_show_the_presentation_interval_beside_the_per_frame_average(
    slow_bank: tuple[sqlite3.Connection, RunResult], tmp_path: Path
) -> None:
    """Markdown, HTML, JSON (summary.generator) and `soakd show` give the presentation
    interval (4 frames out at once: 3 in 4 are 0, the max is the largest chunk gap, 4x the
    per-frame average's) beside the per-frame average, and say which one was judged. `show`
    prints the run summary's intervals (every frame, "(whole run)") and labels "(judged)"
    only the verdict's own number: none for this unjudged run, and once content_fps has
    judged it, the "judged (content_fps ...)" line with the verdict's presentation p95 (over
    the waits between visible updates after the warm-up, not the whole-run figure)."""
    conn, res = slow_bank
    data, v = evaluate(conn, res.run_id)
    g = verdict_dict(data, v)["summary"]["generator"]
    pr, pf = g["presentation"], g["interval"]
    assert g["judged_on"] == "presentation" and pr["n"] == pf["n"] and pr["p50"] == 0
    assert pr["max"] == pytest.approx(4 * pf["max"], rel=1e-6)
    judged = "**presentation interval** (judged: criteria.generator_interval)"
    assert judged in render_markdown(data, v)
    html = render_html(data, v)
    assert 'id="intervals"' in html and "presentation interval (judged" in html
    db = conn.execute("PRAGMA database_list").fetchone()[2]
    shown = run_cli("show", res.run_id, "--db", db)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    line = next(ln for ln in lines if "presentation interval" in ln)
    assert "(whole run)" in line and f"max {pr['max']:.4g}" in line, line
    assert not [ln for ln in lines if "(judged)" in ln or ln.startswith("judged")], lines
    # the same run judged with content_fps set (in a copy: the fixture's run stays unjudged)
    copy = sqlite3.connect(tmp_path / "judged.db")
    conn.backup(copy)
    crit = CriteriaSettings(
        min_duration_s=1, min_frames=5, max_memory_growth_mb_per_min=1000, content_fps=2
    )
    _, jv = evaluate(copy, res.run_id, crit)
    store(copy, jv)
    copy.close()
    cf = jv.get("content_fps")
    assert cf is not None and cf.status in ("pass", "fail") and cf.value is not None, cf
    assert cf.evidence["basis"] == "presentation"
    shown = run_cli("show", res.run_id, "--db", str(tmp_path / "judged.db"))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    judged_lines = [ln for ln in lines if "(judged)" in ln or ln.startswith("judged")]
    assert any(ln.startswith(f"judged (content_fps {cf.status.upper()})") for ln in judged_lines)
    assert all(f"p95 {cf.value:.4g}" in ln for ln in judged_lines), judged_lines
    line = next(ln for ln in lines if ln.startswith("presentation interval"))
    doc = run_cli("show", res.run_id, "--db", str(tmp_path / "judged.db"), "--format", "json")
    whole = json.loads(doc.stdout)["run"]["summary"]["presentation_ms"]["p95"]
    assert ("(judged)" in line) == (whole == cf.value), (line, cf.value)


@pytest.mark.model
def test_merge_export_and_prune_carry_the_chunk_stages(
    slow_bank: tuple[sqlite3.Connection, RunResult], tmp_path: Path
) -> None:
    """chunk_stages rows travel with their run: merged into another database, exported
    with --table chunk_stages, deleted by prune."""
    conn, res = slow_bank
    src, out = tmp_path / "copy.db", tmp_path / "merged.db"
    with sqlite3.connect(src) as dst:
        conn.backup(dst)
    count = "SELECT count(*) FROM chunk_stages WHERE run_id = ?"
    (n,) = conn.execute(count, (res.run_id,)).fetchone()
    merged = run_cli("merge", str(out), str(src))
    assert merged.returncode == 0, merged.stderr
    with sqlite3.connect(out) as m:
        assert m.execute(count, (res.run_id,)).fetchone()[0] == n >= 5 * len(STAGES)
    exported = run_cli(
        "export", res.run_id, "--db", str(out), "--table", "chunk_stages", "-f", "jsonl"
    )
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert len(rows) == n and {r["name"] for r in rows} == set(STAGES)
    assert set(rows[0]) == {"frame_id", "name", "ms"}
    pruned = run_cli("prune", "--db", str(out), "--keep-runs", "0")
    assert pruned.returncode == 0, pruned.stderr
    with sqlite3.connect(out) as m:
        assert m.execute(count, (res.run_id,)).fetchone()[0] == 0


def test_a_stage_that_grows_over_the_run_is_named() -> None:
    """The diagnosis names a named stage whose window medians rise over the run."""
    n = 600  # 60 s at 10 chunks/s
    t = np.arange(n) / 10.0
    frames = {"t_capture": t, "total_ms": np.full(n, 100.0), "warmup": (t < 1).astype(float)}
    stages = {"denoise": np.full(n, 30.0), "memory_bank": 5.0 + 0.5 * t}
    data = make_run_data(RunMeta("g", shape="rollout", fps=10.0), frames=frames, stages=stages)
    v = Verdict(run_id="g", status="PASS", exit_code=ExitCode.PASS, reason="", criteria=[])
    v.window = {"t0": 1.0, "t1": 60.0}
    hints = diagnose(data, v, CriteriaSettings())
    assert any(h.startswith("stage memory_bank rose") for h in hints)
    assert not any(h.startswith("stage denoise rose") for h in hints)


@pytest.mark.parametrize(("share", "named"), [(0.32, False), (0.34, True)])
def test_a_stage_is_named_dominant_only_from_a_third_of_the_chunk(
    share: float, named: bool
) -> None:
    """The diagnosis says a stage "dominates the chunk" only when its median share of the
    chunk's wall time is a third or more."""
    n = 100
    t = np.arange(n) / 10.0
    frames = {"t_capture": t, "total_ms": np.full(n, 100.0), "warmup": (t < 1).astype(float)}
    stages = {"denoise": np.full(n, 10.0), "memory_bank": np.full(n, 100.0 * share)}
    data = make_run_data(RunMeta("g", shape="rollout", fps=10.0), frames=frames, stages=stages)
    v = Verdict(run_id="g", status="PASS", exit_code=ExitCode.PASS, reason="", criteria=[])
    v.window = {"t0": 1.0, "t1": 10.0}
    hints = diagnose(data, v, CriteriaSettings())
    assert any(h.startswith("stage memory_bank dominates") for h in hints) == named
    assert not any(h.startswith("stage denoise dominates") for h in hints)


# --- how a rollout ends


def test_an_exception_in_rollout_ends_the_run_invalid_with_its_cause(db_path: Path) -> None:
    """rollout() raising: the run aborts with the exception as its reason, the chunk in
    flight keeps the error, the verdict is INVALID (exit 3)."""
    s = _settings(
        db_path,
        "workload.factory='tests.test_rollout:factory'",
        "workload.options={kind = 'failing'}",
    )
    res = run_soak(s)
    assert res.status == "aborted"
    assert res.reason == "rollout raised RuntimeError: KV cache shape mismatch"
    assert res.verdict is not None and res.verdict.status == "INVALID"
    assert int(res.exit_code) == 3
    conn = sqlite3.connect(db_path)
    errors = conn.execute("SELECT error FROM frames WHERE error IS NOT NULL").fetchall()
    assert errors == [("RuntimeError: KV cache shape mismatch",)]


def test_a_hung_rollout_is_a_stall_not_a_hang(db_path: Path) -> None:
    """A rollout that stops emitting and asking for conditions ends the run as aborted
    ('stalled') within response_timeout_s, with a stall event, instead of hanging."""
    s = _settings(
        db_path,
        "run.duration=60",
        "workload.factory='tests.test_rollout:factory'",
        "workload.options={kind = 'hanging'}",
        "workload.response_timeout_s=0.5",
    )
    t0 = time.monotonic()
    res = run_soak(s, judge=False)
    assert time.monotonic() - t0 < 15
    assert (res.status, res.reason) == ("aborted", "stalled")
    conn = sqlite3.connect(db_path)
    stalls = [r[0] for r in conn.execute("SELECT message FROM events WHERE kind = 'stall'")]
    assert len(stalls) == 1 and "chunk 2" in stalls[0]
    assert conn.execute("SELECT count(*) FROM frames").fetchone()[0] == 2


def test_a_rollout_that_returns_early_is_invalid(db_path: Path) -> None:
    """rollout() returning while the run goes on: aborted, 'rollout ended after 2 chunks'."""
    s = _settings(
        db_path,
        "workload.factory='tests.test_rollout:factory'",
        "workload.options={kind = 'quitting'}",
    )
    res = run_soak(s)
    assert (res.status, res.reason) == ("aborted", "rollout ended after 2 chunks")
    assert res.verdict is not None and res.verdict.status == "INVALID"


def test_conditions_from_a_json_lines_file_reach_the_rollout_in_order_cycled(
    db_path: Path, tmp_path: Path
) -> None:
    """Each chunk gets the next line of workload.conditions, starting over at the end;
    each chunk's row keeps its action."""
    lines = [{"keyboard": "w", "mouse": [0.1, 0]}, {"keyboard": "a"}, {"camera": [[1, 0], [0, 1]]}]
    path = tmp_path / "actions.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    s = _settings(
        db_path,
        "run.duration=1.5",
        "run.fps=8",
        "workload.factory='tests.test_rollout:factory'",
        "workload.options={kind = 'recording'}",
        f"workload.conditions={str(path)!r}",
    )
    SEEN.clear()
    res = run_soak(s, judge=False)
    assert res.status == "completed", res.reason
    assert len(SEEN) >= 5
    assert [lines[i % 3] for i in range(len(SEEN))] == SEEN
    conn = sqlite3.connect(db_path)
    stored = [json.loads(r[0]) for r in conn.execute("SELECT extra FROM frames ORDER BY frame_id")]
    assert [x["action"] for x in stored] == SEEN[: len(stored)]
    assert [x["chunk"] for x in stored] == list(range(len(stored)))


def test_a_bad_conditions_file_is_a_usage_error_naming_the_line(
    db_path: Path, tmp_path: Path
) -> None:
    """A line of workload.conditions that is not a JSON object stops the run before it
    starts (exit 2), naming the file and line."""
    path = tmp_path / "actions.jsonl"
    path.write_text('{"keyboard": "w"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(UsageError, match=r"actions.jsonl:2: a line must be a JSON object") as e:
        run_soak(_settings(db_path, f"workload.conditions={str(path)!r}"))
    assert int(e.value.exit_code) == 2
    assert "\n" not in str(e.value)


# --- the driver on a fake clock: exact numbers


class Scripted(_Rollout):
    """Per chunk: denoise twice (20 + 10 ms), kv_write 5 ms, then two emits of 2 frames
    30 ms apart; between chunks the clock moves 50 ms inside next_condition's wait."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def rollout(self, run: RolloutRun) -> None:
        adv = self.clock.advance
        while run.next_condition() is not None:
            for ms in (20, 10):
                with run.stage("denoise"):
                    adv(ms * 1_000_000)
            with run.stage("kv_write"):
                adv(5_000_000)
            run.emit(2)
            adv(30_000_000)
            run.emit(2)
            adv(50_000_000)


def test_the_driver_times_stages_and_continues_intervals_exactly() -> None:
    """A repeated stage adds up; a chunk is next_condition to next_condition; intervals
    amortise each gap over its frames, across chunks; first output is the first emit."""
    clock = FakeClock(start_ns=10**9)
    records: list[Any] = []
    ctx: DriverContext[Any] = DriverContext(
        settings=load_settings(overrides=["workload.kind=generator"]),
        workload=Scripted(clock),
        clock=clock,
        t0_ns=clock.now_ns(),
        stop=threading.Event(),
        sink=FrameSink(records.extend, clock.now_ns(), batch=1),
        emit=records.append,
        event=lambda e: None,
        queue=None,
        grab=UnpacedGrab(
            lambda: (np.zeros((8, 8, 3)), None), fps=30, clock=clock, on_end=lambda e: None
        ),
        warm=WarmUp(0),
        max_frames=3,
    )
    get_driver("rollout")(ctx)
    rows = [r for r in records if isinstance(r, FrameRecord)]
    stages = [(s.frame_id, s.name, s.ms) for s in records if isinstance(s, ChunkStage)]
    ems = [e for e in records if isinstance(e, Emission)]
    assert [r.frame_id for r in rows] == [0, 1, 2]
    assert stages == [
        (f, n, ms) for f in range(3) for n, ms in (("denoise", 30.0), ("kv_write", 5.0))
    ]
    assert [r.total_ms for r in rows] == [pytest.approx(115.0)] * 3
    assert [r.first_emit_ms for r in rows] == [pytest.approx(35.0)] * 3
    assert [r.frame_age_ms for r in rows] == [pytest.approx(35.0)] * 3
    # run's first emit: no interval; then 30 / 2, then (50 + 35) / 2 across the boundary
    assert [e.interval_ms for e in ems[:6]] == [None, None, 15.0, 15.0, 42.5, 42.5]
    assert ctx.summary["first_output_ms"] == pytest.approx(35.0)
    assert ctx.summary["rollout_chunks"] == 3 and ctx.summary["generator_frames_emitted"] == 12
    # as they become visible: each emit's first frame waited its whole gap, the second 0
    data = make_run_data(
        RunMeta("s", shape="rollout"),
        emissions={
            "frame_id": [e.frame_id for e in ems],
            "idx": [e.idx for e in ems],
            "t_emit": [e.t_emit for e in ems],
            "interval_ms": [np.nan if e.interval_ms is None else e.interval_ms for e in ems],
            "chunk": [e.chunk for e in ems],
        },
    )
    shown = [30.0, 0.0, 85.0, 0.0, 30.0, 0.0, 85.0, 0.0, 30.0, 0.0]
    assert chunks.presentation_intervals(data, 0.0).ms.tolist() == pytest.approx(shown)
    assert chunks.judged_intervals(data, 0.0, "presentation").ms.tolist() == pytest.approx(
        [30.0, 85.0, 30.0, 85.0, 30.0]
    )
    assert chunks.judged_intervals(data, 0.0, "per_frame").ms.tolist() == pytest.approx(
        [15.0, 15.0, 42.5, 42.5, 15.0, 15.0, 42.5, 42.5, 15.0, 15.0]
    )
    assert ctx.summary["presentation_ms"]["max"] == pytest.approx(85.0)
    assert ctx.summary["presentation_ms"]["n"] == 8  # chunk 0 is the warm-up
