"""soakd compare and baselines: config diff, noise-aware metrics, regression gate, CLI."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from collections.abc import Callable
from html import escape
from pathlib import Path

import numpy as np
import pytest

from soakd.analysis import judge_run
from soakd.config import Settings
from soakd.errors import UsageError
from soakd.records import Emission, FrameRecord
from soakd.store import db as store
from soakd.store import profiling_queries as q
from soakd.store import runs
from soakd.studies.compare import (
    THEIL,
    Comparison,
    _fmt,
    _fmt_p,
    _fmt_pct,
    compare,
    config_diff,
    flatten,
    floor_slope,
)

from .conftest import make_run, run_cli, soakd_cmd

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def md_tables_consistent(text: str) -> int:
    """Check every Markdown table has the same cell count on each row; return the count of
    tables (a malformed one raises AssertionError)."""
    tables = 0
    block: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            assert re.fullmatch(r"\|(---\|)+", block[1]), block[:2]
            widths = {len(re.split(r"(?<!\\)\|", row)) for row in block}
            assert len(widths) == 1, block
            tables += 1
            block = []
    return tables


# --- pure parts


def test_config_diff_ignores_name_db_duration_and_flattens() -> None:
    """The diff lists dotted keys that differ and ignores run.name/db/duration and service."""
    a = {
        "run": {"name": "x", "db": "a.db", "duration": 10, "fps": 2},
        "workload": {"kind": "synthetic", "infer_ms": 20, "options": {}},
        "service": {"notify": True},
    }
    b = {
        "run": {"name": "y", "db": "b.db", "duration": 99, "fps": 2},
        "workload": {"kind": "synthetic", "infer_ms": 30, "options": {"k": 1}},
        "service": {"notify": False},
    }
    diff = config_diff(a, b)
    assert [(d.key, d.a, d.b) for d in diff] == [
        ("workload.infer_ms", 20, 30),
        ("workload.options", {}, None),
        ("workload.options.k", None, 1),
    ]
    assert flatten({"a": {"b": {"c": 1}}, "d": []}) == {"a.b.c": 1, "d": []}


def test_floor_slope_sees_a_leak_under_a_sawtooth_but_not_the_sawtooth() -> None:
    """Window floors make a sawtooth flat and a leak under it a positive MB/min slope."""
    t = np.arange(0, 120, 0.1)
    saw = (t % 5.0) / 5.0 * 50 * (1 << 20)
    base = 200.0 * (1 << 20)
    flat = floor_slope(t, base + saw, 10.0, 0.01)
    leak = floor_slope(t, base + saw + t / 60.0 * 10 * (1 << 20), 10.0, 0.01)
    assert flat is not None and leak is not None
    assert abs(flat[0]) < 0.5
    assert 9.0 < leak[0] < 11.0
    assert floor_slope(t[:20], base + saw[:20], 10.0, 0.01) is None  # fewer than 3 windows


# --- runs in a real database


def _insert_run(
    conn: object,
    rid: str,
    settings: Settings,
    *,
    mode: str = "soak",
    verdicts: dict[str, str] | None = None,
) -> None:
    make_run(conn, id=rid, mode=mode, config=settings)  # type: ignore[arg-type]
    for crit, status in (verdicts or {}).items():
        conn.execute(  # type: ignore[attr-defined]
            "INSERT INTO verdicts (run_id, criterion, status, value, unit) VALUES (?,?,?,?,?)",
            (rid, crit, status, 1.0, "ms"),
        )


def _write(db_path: Path, rid: str, records: list[object]) -> None:
    w = store.StoreWriter(db_path, rid, flush_interval_s=0.05)
    w.start()
    for r in records:
        w.put(r)  # type: ignore[arg-type]
    w.close()
    assert w.error is None


def _frames(infer: np.ndarray, *, warm: int = 5, drops_at_end: int = 0) -> list[object]:
    out: list[object] = []
    n = len(infer)
    for i, v in enumerate(infer):
        out.append(
            FrameRecord(
                frame_id=i,
                t_sched=i * 0.05,
                t_capture=i * 0.05,
                t_dispatch=i * 0.05,
                t_done=i * 0.05 + v / 1000,
                lateness_ms=0.0,
                grab_ms=0.5,
                pre_ms=2.0,
                infer_ms=float(v),
                decode_ms=2.0,
                total_ms=4.5 + float(v),
                frame_age_ms=1.0,
                drop_count=drops_at_end if i == n - 1 else 0,
                first=i == 0,
                warmup=i < warm,
            )
        )
    return out


def test_compare_on_stored_runs_flags_regression_drops_and_criteria(
    db_path: Path, synthetic: Callable[..., Settings]
) -> None:
    """Planted per-frame data: +50 % infer is beyond noise, drops are tested with Fisher,
    criteria outcomes line up, outputs are valid JSON and Markdown."""
    rng = np.random.default_rng(1)
    conn = store.connect(db_path)
    sa, sb = synthetic(), synthetic("workload.infer_ms=30")
    _insert_run(conn, "A", sa, verdicts={"errors": "pass", "memory": "pass"})
    _insert_run(conn, "B", sb, verdicts={"errors": "pass", "memory": "fail"})
    _write(db_path, "A", _frames(20 + rng.normal(0, 1, 200)))
    _write(db_path, "B", _frames(30 + rng.normal(0, 1, 200), drops_at_end=60))
    c = compare(conn, "A", "B")
    assert [d.key for d in c.config_diff] == ["workload.infer_ms"]
    assert not any("explains neither" in w for w in c.warnings)
    infer = c.metric("infer_ms.p50")
    assert infer.beyond_noise is True and infer.p is not None and infer.p < 1e-6
    assert 40 < (infer.change_pct or 0) < 60
    assert c.metric("infer_ms.max").test == "no test"
    assert c.metric("grab_ms.p50").beyond_noise is False  # identical constant values
    drops = c.metric("drop_fraction")
    assert drops.a == 0 and drops.b == pytest.approx(60 / 255)
    assert drops.beyond_noise is True
    memory = next(r for r in c.criteria if r.criterion == "memory")
    assert (memory.a_status, memory.b_status, memory.changed) == ("pass", "fail", True)
    assert c.regression("total_ms.p50", 10).failed
    assert not c.regression("total_ms.p50", 60).failed
    with pytest.raises(UsageError, match="not a metric"):
        c.metric("nope")
    d = json.loads(json.dumps(c.to_dict()))
    assert d["schema"] == "soakd.compare/1"
    assert md_tables_consistent(c.to_markdown()) == 5


def test_compare_warns_when_more_than_one_variable_differs(
    db_path: Path, synthetic: Callable[..., Settings]
) -> None:
    """Two changed keys give the 'explains neither' warning, in the Markdown too."""
    conn = store.connect(db_path)
    _insert_run(conn, "A", synthetic())
    _insert_run(conn, "B", synthetic("workload.infer_ms=30", "run.fps=10"))
    rng = np.random.default_rng(2)
    _write(db_path, "A", _frames(20 + rng.normal(0, 1, 50)))
    _write(db_path, "B", _frames(30 + rng.normal(0, 1, 50)))
    c = compare(conn, "A", "B")
    assert {d.key for d in c.config_diff} == {"workload.infer_ms", "run.fps"}
    assert any("2 configuration variables differ" in w for w in c.warnings)
    assert "explains neither" in c.to_markdown()


def test_generator_runs_report_first_output_and_intervals_apart(
    db_path: Path, synthetic: Callable[..., Settings]
) -> None:
    """First-output latency and inter-output intervals are separate metrics; each request's
    first emission (NULL interval) never enters the interval statistics."""
    conn = store.connect(db_path)
    gen = synthetic("workload.kind='generator'")
    for rid, iv in (("A", 10.0), ("B", 15.0)):
        _insert_run(conn, rid, gen)
        recs: list[object] = []
        for f in range(30):
            recs.append(
                FrameRecord(
                    frame_id=f,
                    t_sched=f,
                    t_capture=f,
                    t_dispatch=f,
                    t_done=f + 0.5,
                    lateness_ms=0,
                    grab_ms=0.1,
                    first_emit_ms=400.0,
                    emitted=4,
                    warmup=f < 2,
                    first=f == 0,
                )
            )
            for k in range(4):
                recs.append(
                    Emission(
                        frame_id=f,
                        idx=k,
                        t_emit=f + k * iv / 1000,
                        interval_ms=None if k == 0 else iv + 0.01 * (f % 3),
                        chunk=k,
                        chunk_frames=1,
                        chunk_ms=iv,
                    )
                )
        _write(db_path, rid, recs)
    c = compare(conn, "A", "B")
    iv50 = c.metric("interval_ms.p50")
    assert iv50.a == pytest.approx(10.01) and iv50.b == pytest.approx(15.01)
    assert iv50.beyond_noise is True
    assert c.metric("interval_ms.max").b == pytest.approx(15.02)
    fe = c.metric("first_emit_ms.p50")
    assert fe.a == fe.b == 400.0 and fe.beyond_noise is False
    assert q.emission_intervals(conn, "A").size == 28 * 3  # warm-up requests left out


def test_baselines_resolve_by_name_prefix_and_fail_clearly(
    db_path: Path, synthetic: Callable[..., Settings]
) -> None:
    """A baseline resolves as baseline:NAME or a bare name; unknown refs raise one line."""
    conn = store.connect(db_path)
    _insert_run(conn, "20260101T000000-aaaaaa", synthetic())
    _insert_run(conn, "20260101T000000-bbbbbb", synthetic())
    runs.set_baseline(conn, "release", "20260101T000000-aaaaaa")
    assert runs.resolve(conn, "baseline:release") == "20260101T000000-aaaaaa"
    assert runs.resolve(conn, "release") == "20260101T000000-aaaaaa"
    assert runs.resolve(conn, "20260101T000000-b") == "20260101T000000-bbbbbb"
    runs.set_baseline(conn, "release", "20260101T000000-bbbbbb")  # re-marking replaces
    assert [b["run_id"] for b in runs.list_baselines(conn)] == ["20260101T000000-bbbbbb"]
    with pytest.raises(UsageError, match="ambiguous"):
        runs.resolve(conn, "2026")
    with pytest.raises(UsageError, match="no baseline named 'nope'"):
        runs.resolve(conn, "baseline:nope")
    with pytest.raises(UsageError, match="no run or baseline"):
        runs.resolve(conn, "zzz")


# --- end to end: real synthetic runs and the real CLI


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Two runs of one config and one with infer_ms 20 -> 30, in one real database. The two
    of one config run at the same time, so host load (the rest of the suite beside them)
    shifts both alike: what differs between them is the config's noise, not the load's."""
    db = tmp_path_factory.mktemp("cmp") / "soakd.db"
    base = [
        "workload.kind=synthetic",
        f"run.db={str(db)!r}",
        "run.duration=2.5",
        "run.fps=25",
        "run.warmup_s=0.3",
        "run.log_every=0",
        "source.width=64",
        "source.height=48",
        "workload.pre_ms=1",
        "workload.decode_ms=1",
        "criteria.min_duration_s=1",
        "criteria.min_frames=5",
    ]
    sets = [arg for kv in base for arg in ("--set", kv)]
    same = [
        subprocess.Popen(soakd_cmd("run", "--no-live", *sets), stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for p in same:
        _, err = p.communicate(timeout=120)
        assert p.returncode in (0, 1, 3), err[-2000:]  # completed; its verdict is not the point
    slower = run_cli("run", "--no-live", *sets, "--set", "workload.infer_ms=30")
    assert slower.returncode in (0, 1, 3), slower.stderr[-2000:]
    with sqlite3.connect(db) as conn:
        ids = [r for (r,) in conn.execute("SELECT id FROM runs ORDER BY started_unix, id")]
    assert len(ids) == 3
    return db, ids


@pytest.mark.slow
def test_compare_detects_planted_regression_but_not_noise(
    three_runs: tuple[Path, list[str]],
) -> None:
    """Synthetic infer 20 -> 30 ms is a significant regression; two runs of one config are
    not beyond noise and pass a 10 % gate."""
    db, (a1, a2, b) = three_runs
    conn = store.connect(db)
    same = compare(conn, a1, a2)
    assert same.config_diff == []
    assert same.metric("infer_ms.p50").beyond_noise is False
    assert same.metric("total_ms.p50").beyond_noise is False
    assert not same.regression("total_ms.p50", 10).failed
    worse = compare(conn, a1, b)
    assert [d.key for d in worse.config_diff] == ["workload.infer_ms"]
    m = worse.metric("infer_ms.p50")
    assert m.beyond_noise is True and 35 < (m.change_pct or 0) < 65
    assert worse.regression("infer_ms.p50", 20).failed
    assert isinstance(worse, Comparison)


@pytest.mark.slow
def test_cli_compare_gate_exit_codes_and_baselines(three_runs: tuple[Path, list[str]]) -> None:
    """`soakd compare --fail-on-regression` exits 1 on the planted regression and 0 on
    noise; `baseline set/list` work and compare accepts baseline:NAME; bad refs exit 2."""
    db, (a1, a2, b) = three_runs
    r = run_cli("baseline", "set", a1, "--name", "good", "--db", str(db))
    assert r.returncode == 0, r.stderr
    r = run_cli("baseline", "list", "--json", "--db", str(db))
    assert json.loads(r.stdout.splitlines()[0])["run_id"] == a1
    r = run_cli("compare", "baseline:good", b, "--fail-on-regression", "10", "--db", str(db))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "REGRESSION total_ms.p50" in r.stderr
    md_tables_consistent(r.stdout)
    r = run_cli("compare", "good", a2, "--json", "--fail-on-regression", "10", "--db", str(db))
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    assert d["regression"]["failed"] is False and d["run_a"]["id"] == a1
    r = run_cli("compare", "nope", b, "--db", str(db))
    assert r.returncode == 2 and "nope" in r.stderr
    r = run_cli("compare", a1, b, "--metric", "bogus", "--fail-on-regression", "5", "--db", str(db))
    assert r.returncode == 2 and "bogus" in r.stderr


@pytest.mark.slow
def test_a_significant_improvement_reads_better_not_red_and_one_drop_fraction_per_run(
    three_runs: tuple[Path, list[str]],
) -> None:
    """Compared the other way (infer 30 -> 20 ms), the faster run's change is beyond noise
    and reads "better" (green in HTML), never "worse" (red); each run's drop_fraction metric
    is the number its drops criterion shows in the Criteria table."""
    db, (a1, _a2, b) = three_runs
    c = compare(store.connect(db), b, a1)
    m = c.metric("infer_ms.p50")
    assert m.beyond_noise is True and (m.change_pct or 0) < 0
    page = c.to_html()
    row = re.search(r"<tr><td>infer</td><td>p50</td>.*?</tr>", page)
    assert row and '<td class="better">better</td>' in row.group(0), row
    assert "worse" not in row.group(0)
    md = c.to_markdown()
    assert re.search(r"\| infer \| p50 \|.*\| better \|", md)
    drops = c.metric("drop_fraction")
    crit = next(r for r in c.criteria if r.criterion == "drops")
    assert (drops.a, drops.b) == (pytest.approx(crit.a_value), pytest.approx(crit.b_value))


# --- readable output and the verdict's floor windows


def _short_leaky_run(conn: sqlite3.Connection, rid: str, leak_mb_per_min: float) -> None:
    """A judged 30 s run (10 fps, 5 s warm-up) whose RSS grows by ``leak_mb_per_min``: too
    short for 10 s floor windows, so the verdict shortens them (floor_window_s)."""
    cfg = {"criteria": {}, "workload": {"kind": "synthetic", "device": "cpu"},
           "run": {"warmup_s": 5.0}}  # fmt: skip
    make_run(conn, id=rid, fps=10, config=cfg, duration_s=30)
    rng = np.random.default_rng(len(rid))
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, warmup, grab_ms, pre_ms,"
        " infer_ms, decode_ms, total_ms, frame_age_ms) VALUES (?,?,?,?,?,1,2,?,2,?,1)",
        [(rid, i, i / 10, i / 10, int(i < 50), 20 + rng.normal(), 25.0) for i in range(300)],
    )
    t = np.arange(0, 30, 0.1)
    rss = 400 * MIB + leak_mb_per_min * MIB * t / 60 + rng.normal(0, 0.05 * MIB, t.size)
    conn.executemany(
        "INSERT INTO samples (run_id, seq, t, wall, rss_bytes) VALUES (?,?,?,0,?)",
        [(rid, i, float(t[i]), int(rss[i])) for i in range(t.size)],
    )
    judge_run(conn, rid)


def test_compare_floor_slope_uses_the_verdicts_floor_windows(db_path: Path) -> None:
    """On a short run the verdict judged, compare tests the memory floors (no "fewer than 3
    floor windows") and its slope is the verdict's, window for window."""
    conn = store.connect(db_path)
    _short_leaky_run(conn, "A", 0.0)
    _short_leaky_run(conn, "B", 30.0)
    c = compare(conn, "A", "B")
    m = c.metric("rss.floor_slope")
    assert m.test == THEIL
    stored = q.verdict_rows(conn, "B")["memory_rss"]
    # judged on shortened windows: INVALID "too short to judge", its slope still measured
    assert stored["status"] == "invalid" and stored["value"] is not None
    assert m.b == pytest.approx(stored["value"], rel=1e-6)
    assert m.beyond_noise is True


def _two_runs(db_path: Path, synthetic: Callable[..., Settings]) -> Comparison:
    rng = np.random.default_rng(3)
    conn = store.connect(db_path)
    _insert_run(conn, "A", synthetic(), verdicts={"errors": "pass"})
    _insert_run(conn, "B", synthetic("workload.infer_ms=30"), verdicts={"errors": "fail"})
    _write(db_path, "A", _frames(20 + rng.normal(0, 1, 200)))
    _write(db_path, "B", _frames(30 + rng.normal(0, 1, 200)))
    return compare(conn, "A", "B")


def test_markdown_puts_stage_percentiles_side_by_side(
    db_path: Path, synthetic: Callable[..., Settings]
) -> None:
    """to_markdown has a row per stage and percentile (p50, p95, p99) with A, B, the change
    and whether it is significant, then the config diff."""
    c = _two_runs(db_path, synthetic)
    md = c.to_markdown()
    assert "| stage | percentile | A | B | change | p | significant |" in md
    for qn in ("p50", "p95", "p99"):
        m = c.metric(f"infer_ms.{qn}")
        row = f"| infer | {qn} | {_fmt(m.a)} | {_fmt(m.b)} | {_fmt_pct(m.change_pct)} |"
        assert row in md and m.beyond_noise is True
    assert "| grab | p50 |" in md and md.index("### Stage percentiles") < md.index(
        "### Configuration diff"
    )
    assert "| `workload.infer_ms` | 20.00 | 30.00 |" in md


def test_to_html_is_one_page_with_percentiles_config_diff_and_criteria(
    db_path: Path, synthetic: Callable[..., Settings]
) -> None:
    """to_html: a self-contained page (no script, nothing fetched) with both runs' p50/p95/p99
    side by side, the p-value, the config diff and the criteria."""
    c = _two_runs(db_path, synthetic)
    page = c.to_html()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and "http" not in page.replace('lang="en"', "")
    p99 = c.metric("infer_ms.p99")
    assert f"<td>infer</td><td>p99</td><td>{_fmt(p99.a)}</td><td>{_fmt(p99.b)}</td>" in page
    p50 = c.metric("infer_ms.p50")
    assert f"<td>{_fmt_pct(p50.change_pct)}</td><td>{escape(_fmt_p(p50.p))}</td>" in page
    assert "<td>workload.infer_ms</td><td>20.00</td><td>30.00</td>" in page
    assert "<td>errors</td><td>pass</td><td>fail</td>" in page


@pytest.mark.slow
def test_compare_counts_the_frames_the_verdict_measured_and_prints_percentiles_once(
    tmp_path: Path,
) -> None:
    """On a real soak whose workload raises on every 7th frame, `compare -f json` says as
    many measured frames as the verdict's run criterion (post-warm-up, errors included);
    `-f md` shows each stage percentile and max once, in the stage table, and the metrics
    table keeps drops and memory."""
    db = tmp_path / "c.db"
    sets = ["workload.kind=synthetic", "workload.error_every=7", "run.log_every=0",
            "run.warmup_s=0.5", "criteria.min_duration_s=1"]  # fmt: skip
    args = [x for kv in sets for x in ("--set", kv)]
    p = run_cli("run", "--db", str(db), "--duration", "2", "--fps", "20", "--no-live", *args)
    assert p.returncode in (0, 1, 3), p.stderr[-2000:]
    report = json.loads(run_cli("report", "--latest", "-f", "json", "--db", str(db)).stdout)
    (run,) = [c for c in report["criteria"] if c["criterion"] == "run"]
    rid = report["run"]["id"]
    cmp = run_cli("compare", rid, rid, "-f", "json", "--db", str(db))
    doc = json.loads(cmp.stdout)
    sql = "SELECT count(*) FROM frames WHERE run_id = ? AND warmup = 0 AND error IS NOT NULL"
    (errors,) = store.connect(db).execute(sql, (rid,)).fetchone()
    assert errors > 0 and run["evidence"]["measured_frames"] > errors
    assert doc["run_a"]["measured_frames"] == run["evidence"]["measured_frames"]
    md = run_cli("compare", rid, rid, "--db", str(db)).stdout
    assert f"| measured frames | {run['evidence']['measured_frames']} |" in md
    for stage in ("grab", "pre", "infer", "decode", "total", "frame_age"):
        for qn in ("p50", "p95", "p99", "max") if stage != "frame_age" else ("p50", "p95", "p99"):
            assert md.count(f"| {stage} | {qn} |") == 1, (stage, qn)
            assert f"| {stage}_ms.{qn} |" not in md, (stage, qn)
    assert "| drop_fraction |" in md and "| rss.floor_slope |" in md
    assert md_tables_consistent(md) == 4  # runs, stages, metrics, criteria: no config diff
