"""The HTML report's panels agree with each other, checked in a real headless Chromium (the
probe of tests/test_report_browser.py measures what the browser drew): one clock for every
per-frame panel, captured and completed frame rates side by side, on a real run database
judged by soakd."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.analysis import judge_run
from soakd.store import db as store
from tests.conftest import make_run, run_cli
from tests.test_report_browser import _probe, _report
from tests.test_report_browser import pytestmark as browser_marks

pytestmark = browser_marks


def _backlog_db(path: Path, *, duration_s: float = 30.0, fps: float = 20.0) -> str:
    """A run whose model takes 100 ms a frame at 20 fps with an unbounded oldest-first queue:
    each frame waits longer than the last, so it is taken (dispatched) ever later than it
    was captured, and the frames captured in the second half are still queued at the end."""
    conn = store.connect(path)
    cfg = {"workload": {"kind": "synthetic", "device": "cpu"},
           "run": {"warmup_s": 2.0, "max_queue": 4096, "consume": "oldest"}}  # fmt: skip
    rid = make_run(conn, id="backlog", fps=fps, config=cfg, duration_s=duration_s)
    rows, free, i = [], 0.0, 0
    while True:
        cap = i / fps
        dispatch = max(cap, free)
        free = dispatch + 0.1
        if free > duration_s:
            break
        age = (dispatch - cap) * 1000
        waiting = int(dispatch * fps) - i
        rows.append((rid, i, cap, cap, dispatch, free, int(cap < 2.0), 1.0, 2.0, 95.0, 2.0,
                     100.0, waiting, age))  # fmt: skip
        i += 1
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, t_dispatch, t_done, warmup,"
        " grab_ms, pre_ms, infer_ms, decode_ms, total_ms, queue_len, frame_age_ms)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    st = np.arange(0, duration_s, 0.2)
    conn.executemany(
        "INSERT INTO samples (run_id, seq, t, wall, rss_bytes, cpu_pct) VALUES (?,?,?,0,?,50)",
        [(rid, k, float(v), 400 << 20) for k, v in enumerate(st)],
    )
    judge_run(conn, rid)
    conn.close()
    return rid


def _right(p: dict[str, Any], name: str) -> float:
    b = p["series"][name]["box"]
    return float((b[0] + b[2] - p["plot"][0]) / p["plot"][2])  # share of the plot's width


def test_a_backlog_runs_per_frame_panels_share_one_clock_and_say_so(tmp_path: Path) -> None:
    """On a backlog run the stage, queue and frame-age panels end where the model stopped
    working (the run's end, on the dispatch clock), not where the last processed frame was
    captured (half-way); the page names the clock; the frame-rate panel draws the 20 fps
    captured above the 10 fps completed."""
    rid = _backlog_db(tmp_path / "soakd.db")
    report = _report(tmp_path, rid)
    doc = _probe(report, tmp_path)
    age = _right(doc["frame_age"], "window median")
    assert age > 0.9
    for panel, name in (("stages", "total"), ("queue", "window median")):
        assert abs(_right(doc[panel], name) - age) < 0.05, (panel, _right(doc[panel], name))
    assert 'id="clock"' in report.read_text() and "dispatch" in report.read_text()
    fps = doc["fps"]
    (target,) = fps["hlines"]  # the 20 fps target
    bottom = fps["plot"][1] + fps["plot"][3]
    cap, done = fps["series"]["captured per 1 s"]["box"], fps["series"]["completed per 1 s"]["box"]
    assert abs(cap[1] - target[1]) < 2  # captured reads 20 fps
    px = (bottom - target[1]) / 20  # per fps
    # completed reads 10 fps throughout, give or take a frame a window
    assert done[1] >= bottom - 11.2 * px and done[1] + done[3] <= bottom - 8.8 * px


@pytest.fixture(scope="module")
def failing_generator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real generator soak whose content_fps (30) its 2 fps requests cannot meet."""
    db = tmp_path_factory.mktemp("gen") / "soakd.db"
    r = run_cli("run", "--no-live", "--db", str(db), "--duration", "8", "--fps", "2",
                "--set", "workload.kind=generator", "--set", "criteria.content_fps=30",
                "--set", "run.warmup_s=2", timeout=180)  # fmt: skip
    assert r.returncode in (1, 3), r.stderr[-2000:]
    return db


def test_a_generators_failing_content_fps_is_drawn_as_judged(
    failing_generator: Path, tmp_path: Path
) -> None:
    """The output-interval panel draws every interval content_fps judged (one mark each),
    the period it may not pass and the judged p95 labelled with the verdict's own number."""
    report = tmp_path / "g.html"
    r = run_cli("report", "--latest", "--db", str(failing_generator), "-f", "html",
                "-o", str(report))  # fmt: skip
    assert r.returncode == 0, r.stderr
    text = report.read_text()
    doc = _probe(report, tmp_path)
    p = doc["interval"]
    (name,) = [k for k in p["series"] if k.startswith("judged by content_fps: ")]
    n = int(name.split(": ")[1].split()[0])
    assert n > 3 and p["series"][name]["len"] == n
    r = run_cli("report", "--latest", "--db", str(failing_generator), "-f", "json")
    cf = next(c for c in json.loads(r.stdout)["criteria"] if c["criterion"] == "content_fps")
    assert cf["status"] == "fail" and cf["evidence"]["intervals"] == n
    assert f"judged p95 {cf['value']:.4g} ms (FAIL)" in text
    assert f"period {cf['threshold']:.4g} ms" in text and len(p["hlines"]) == 2


def test_show_labels_only_the_verdicts_number_judged_and_lists_criteria_in_judging_order(
    failing_generator: Path,
) -> None:
    """`soakd show` of the generator run prints the number content_fps judged beside the
    whole-run intervals, never a whole-run p95 labelled "(judged)"; its criteria are listed
    in the order the verdict judged them, as `run` and `gate` print them."""
    show = run_cli("show", "--latest", "--db", str(failing_generator))
    assert show.returncode == 0, show.stderr
    r = run_cli("report", "--latest", "--db", str(failing_generator), "-f", "json")
    rows = json.loads(r.stdout)["criteria"]
    cf = next(c for c in rows if c["criterion"] == "content_fps")
    lines = show.stdout.splitlines()
    judged = [ln for ln in lines if "(judged)" in ln or ln.startswith("judged")]
    assert judged and all(f"p95 {cf['value']:.4g}" in ln for ln in judged), judged
    names = {c["criterion"] for c in rows}
    statuses = ("PASS", "FAIL", "INVALID", "N/A")
    cells = [ln.split() for ln in lines]
    listed = [c[0] for c in cells if len(c) > 1 and c[0] in names and c[1] in statuses]
    assert listed == [c["criterion"] for c in rows]


def _auto_db(path: Path, looks: list[tuple[float, list[list[Any]]]], decided: float | None) -> str:
    """A 30 s run (10 fps, healthy) of ``run.duration = "auto"`` with the given look events
    (each look's standings rows: criterion, state, detectable, tolerance, unit, why) and,
    when ``decided`` is set, the decided event at that time."""
    conn = store.connect(path)
    cfg = {"workload": {"kind": "synthetic", "device": "cpu"},
           "run": {"warmup_s": 2.0, "duration": "auto"}}  # fmt: skip
    rid = make_run(conn, id="auto", fps=10, config=cfg, duration_s=30.0)
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, warmup, infer_ms, total_ms,"
        " frame_age_ms) VALUES (?,?,?,?,?,20,25,3)",
        [(rid, i, i / 10, i / 10, int(i < 20)) for i in range(300)],
    )
    conn.executemany(
        "INSERT INTO events (run_id, t, wall, kind, message, data) VALUES (?,?,0,'look',?,?)",
        [(rid, t, "look", json.dumps({"criteria": rows})) for t, rows in looks],
    )
    if decided is not None:
        conn.execute(
            "INSERT INTO events (run_id, t, wall, kind, message) VALUES "
            "(?, ?, 0, 'decided', 'decided: every criterion decided')",
            (rid, decided),
        )
    judge_run(conn, rid)
    conn.close()
    return rid


def test_the_convergence_panel_of_a_run_decided_at_its_second_look(tmp_path: Path) -> None:
    """Decided at its second look: each trend is drawn (one seen at a single look as a mark,
    not an empty path), frame age at 0 x tolerance throughout is not drawn as a flat line
    but named under the panel with why, and the 'decided' marker's label is whole."""

    def row(name: str, ratio: float | None, state: str = "decided") -> list[Any]:
        return [name, state, None if ratio is None else ratio * 1.5, 1.5, "MB/min", ""]

    looks = [
        (10.0, [row("memory_rss", 3.0, "undecided"), row("memory_gpu", None, "undecided"),
                ["frame_age", "decided", 0.0, 50.0, "ms/min", ""]]),
        (20.0, [row("memory_rss", 0.8), row("memory_gpu", 0.6),
                ["frame_age", "decided", 0.0, 50.0, "ms/min", ""]]),
    ]  # fmt: skip
    rid = _auto_db(tmp_path / "soakd.db", looks, decided=20.0)
    report = _report(tmp_path, rid)
    p = _probe(report, tmp_path)["convergence"]
    assert set(p["series"]) == {"memory_rss", "memory_gpu"}
    assert all(s["len"] > 0 for s in p["series"].values()), p["series"]
    assert [v["label"] for v in p["vlines"]] == ["decided"]
    note = report.read_text().split('id="convergence-note">')[1].split("</p>")[0]
    assert note.startswith("frame_age: 0 x tolerance at every look")
    assert "every criterion decided at the last look (20 s)" in note


def test_the_convergence_panel_says_why_a_run_went_on_with_every_trend_under_1(
    tmp_path: Path,
) -> None:
    """Every trend under 1 at the last look while another criterion was still undecided:
    the note names it and why (its words once, never "undecided (undecided)")."""
    looks = [
        (10.0, [["memory_rss", "decided", 0.6, 1.5, "MB/min", ""],
                ["drops", "undecided", None, None, None, "too short to judge"],
                ["jitter", "undecided", None, None, None, "undecided"]]),
    ]  # fmt: skip
    rid = _auto_db(tmp_path / "soakd.db", looks, decided=None)
    text = _report(tmp_path, rid).read_text()
    note = text.split('id="convergence-note">')[1].split("</p>")[0]
    assert note == (
        "at the last look (10 s) the run still waited on: drops undecided (too short to "
        "judge); jitter undecided."
    )
