"""``run.streams = N``: N paced sources into one workload, a stream id on every row, a
verdict per stream and together, and the sweep's knee. Real CLI runs of the synthetic
workload, real SQLite."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.analysis.data import make_run_data
from soakd.analysis.losses import count_losses
from soakd.analysis.model import RunMeta
from soakd.analysis.streams import overall_view, stream_view
from soakd.records import Frame
from soakd.run.queue import StreamQueues
from tests.conftest import SYNTH_CLI, error_lines, run_cli

# 6 s: on a host loaded to twice its cores, 3 s left a healthy stream too few windows to
# test a trend (INVALID, and the run with it)
FPS, DURATION, STREAMS = 10, 6, 3


class _Session:
    """A session workload that does nothing: its shape is what the test is about."""

    shape = "session"

    def setup(self) -> None: ...
    def start(self) -> None: ...
    def push(self, frame: Frame) -> None: ...
    def poll(self, timeout_s: float) -> list[Any]:
        return []

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None: ...


def session_factory(options: dict[str, Any], ctx: Any) -> _Session:
    return _Session()


def _rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def _streams_evidence(db: Path) -> list[dict[str, Any]]:
    (ev,) = _rows(db, "SELECT evidence FROM verdicts WHERE criterion = 'streams'")[0]
    return json.loads(ev)["streams"]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A 3-stream soak whose stream 1 raises on every other frame: (database, exit code)."""
    db = tmp_path_factory.mktemp("streams") / "soakd.db"
    proc = run_cli(
        "run", *SYNTH_CLI, "--db", str(db), "--no-live",
        "--set", f"run.streams={STREAMS}", "--set", f"run.fps={FPS}",
        "--set", f"run.duration={DURATION}", "--set", "workload.infer_ms=5",
        "--set", "workload.error_stream=1", "--set", "workload.error_every=2",
    )  # fmt: skip
    return db, proc.returncode


def test_every_row_has_its_stream_and_each_stream_runs_at_fps(faulty: tuple[Path, int]) -> None:
    """Each stream stores ~fps x duration rows, frame k of stream s is id k * N + s."""
    db, _ = faulty
    per = dict(_rows(db, "SELECT stream, count(*) FROM frames GROUP BY stream"))
    assert sorted(per) == list(range(STREAMS))
    for n in per.values():
        assert abs(n - FPS * DURATION) <= 3
    bad = _rows(db, "SELECT count(*) FROM frames WHERE frame_id % ? != stream", STREAMS)
    assert bad == [(0,)]


def test_a_faulty_stream_fails_its_verdict_and_the_run(faulty: tuple[Path, int]) -> None:
    """Stream 1's errors fail stream 1 and the run (exit 1); streams 0 and 2 pass."""
    db, code = faulty
    evidence = _streams_evidence(db)
    assert code == 1, evidence
    status = {r["stream"]: (r["status"], r["failed"]) for r in evidence}
    assert status == {0: ("PASS", []), 1: ("FAIL", ["errors"]), 2: ("PASS", [])}, evidence
    assert _rows(db, "SELECT verdict FROM runs") == [("FAIL",)]


def test_show_report_export_and_merge_carry_the_streams(
    faulty: tuple[Path, int], tmp_path: Path
) -> None:
    """show and the JSON report list each stream's verdict; export and merge keep the column."""
    db, _ = faulty
    show = json.loads(run_cli("show", "--latest", "--db", str(db), "--format", "json").stdout)
    assert [s["status"] for s in show["streams"]] == ["PASS", "FAIL", "PASS"]
    rep = run_cli("report", "--latest", "--db", str(db), "--format", "json")
    block = json.loads(rep.stdout)["streams"]
    assert (block["count"], block["fps_each"]) == (STREAMS, FPS)
    assert [s["status"] for s in block["per_stream"]] == ["PASS", "FAIL", "PASS"]
    md = run_cli("report", "--latest", "--db", str(db), "--format", "md").stdout
    assert "### Streams" in md
    csv = run_cli("export", "--latest", "--db", str(db)).stdout.splitlines()
    assert "stream" in csv[0].split(",")
    out = tmp_path / "merged.db"
    assert run_cli("merge", str(out), str(db)).returncode == 0
    assert _rows(out, "SELECT DISTINCT stream FROM frames ORDER BY 1") == [(0,), (1,), (2,)]


def test_interleaved_per_stream_drop_counters_are_summed_not_read_as_resets() -> None:
    """Stream 0 drops 6 and stream 1 drops 2 after the warm-up: 8 in all, 6 and 2 each."""
    n = 40
    stream = np.arange(n) % 2
    k = np.arange(n) // 2  # each stream's capture index
    drops = np.where(stream == 0, k * 6 // 19, k * 2 // 19).astype(float)
    data = make_run_data(
        RunMeta("r", fps=10.0, config={"run": {"streams": 2}}, summary={}),
        frames={
            "frame_id": np.arange(n, dtype=float),
            "stream": stream,
            "t_capture": np.arange(n) / 20.0,
            "warmup": (np.arange(n) < 2).astype(float),
            "drop_count": drops,
        },
    )
    post = data.frames["warmup"] == 0
    assert count_losses(data, post).counts["dropped"] == 8
    whole = overall_view(data)
    assert count_losses(whole, whole.frames["warmup"] == 0).counts["dropped"] == 8
    for s, want in ((0, 6), (1, 2)):
        v = stream_view(data, s)
        assert count_losses(v, v.frames["warmup"] == 0).counts["dropped"] == want


def test_one_consumer_serves_the_stream_queues_round_robin() -> None:
    """With every queue full, gets take stream 0, 1, 2, 0, ...: no stream waits twice."""
    qs = StreamQueues(3, maxlen=4, consume="oldest")
    for k in range(2):
        for s, q in enumerate(qs.queues):
            q.put(Frame(k * 3 + s, 0, 0, 0, np.zeros(1), stream=s))
    qs.queues[0].put(Frame(6, 0, 0, 0, np.zeros(1), stream=0))
    got = [qs.get(0)[0].stream for _ in range(7)]  # type: ignore[index]
    assert got == [0, 1, 2, 0, 1, 2, 0]
    assert qs.get(0) is None


def test_the_streams_sweep_knee_is_where_one_model_stops_holding_them(tmp_path: Path) -> None:
    """7 ms a frame, 20 fps a stream: 1, 2 and 4 streams (56 % busy) pass, 8 (112 %) do
    not; knee 8, usable 4. 4.5 s at 20 fps: each stream has the 7 frame-age windows of a
    trend test, so a loaded host's noise cannot leave it untested."""
    db = tmp_path / "soakd.db"
    proc = run_cli(
        "sweep", "--vary", "run.streams=1,2,4,8", *SYNTH_CLI, "--db", str(db), "-f", "json",
        "--set", "run.fps=20", "--set", "run.duration=4.5", "--set", "workload.infer_ms=7",
        "--set", "workload.pre_ms=0", "--set", "workload.decode_ms=0",
        "--set", "workload.jitter=0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    verdicts = [(p["value"], p["verdict"], p["streams_passed"]) for p in doc["points"]]
    why = _rows(db, "SELECT run_id, criterion, detail FROM verdicts WHERE status != 'pass'")
    assert verdicts[:3] == [(1, "PASS", 1), (2, "PASS", 2), (4, "PASS", 4)], why
    assert verdicts[3][1] != "PASS"
    assert doc["points"][doc["knee_index"]]["value"] == 8
    assert doc["usable_until"] == 4
    # overloaded, every stream loses frames, each counted on its own stream's rows
    (rid,) = _rows(db, "SELECT id FROM runs WHERE config LIKE '%\"streams\": 8%'")[0]
    summary = json.loads(_rows(db, "SELECT summary FROM runs WHERE id = ?", rid)[0][0])
    tops = dict(_rows(db, "SELECT stream, max(drop_count) FROM frames WHERE run_id = ? "
                          "GROUP BY stream", rid))  # fmt: skip
    for s in summary["streams"]:
        assert 0 < tops[s["stream"]] <= s["drops"]
    assert sum(s["drops"] for s in summary["streams"]) == summary["drops"]


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["run.streams=0"], "run.streams: must be >= 1"),
        (["run.streams=two"], "run.streams: must be a valid integer"),
        (["workload.kind=session", "run.streams=2"], "run.streams: 2 streams need a staged"),
        (["workload.kind=generator", "run.streams=4"], "run.streams: 4 streams need a staged"),
    ],
)
def test_a_bad_streams_setting_is_a_one_line_config_error(sets: list[str], needle: str) -> None:
    """A bad run.streams, or several streams for a one-stream shape: exit 2, one line."""
    args = [a for s in sets for a in ("--set", s)]
    proc = run_cli("run", "--set", "run.duration=1", *args, "--db", "/nonexistent/x.db")
    assert proc.returncode == 2
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("soakd: error: ") and needle in lines[0]


def test_a_python_workload_of_one_stream_shape_refuses_streams(tmp_path: Path) -> None:
    """Known only once built: a python session workload with run.streams = 2 is exit 2,
    one line naming the key, and no run row is written."""
    db = tmp_path / "soakd.db"
    proc = run_cli(
        "run", "--set", "workload.kind=python", "--set", "run.streams=2", "--db", str(db),
        "--set", "run.duration=1",
        "--set", "workload.factory='tests.test_streams:session_factory'",
    )  # fmt: skip
    assert proc.returncode == 2
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("soakd: error: run.streams: 2 streams need")
    assert "session workload" in lines[0]
    assert not db.exists() or _rows(db, "SELECT count(*) FROM runs") == [(0,)]
