"""k6-style thresholds in ``criteria.thresholds``: the grammar, how a bad one is refused,
each threshold judged as its own criterion on a real run, and ``abort_on_fail``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from soakd.analysis import evaluate
from soakd.analysis.criteria import thresholds as thresholds_criterion
from soakd.analysis.criteria.base import Live
from soakd.analysis.thresholds import ABORT_MIN_VALUES, can_no_longer_pass
from soakd.config import (
    THRESHOLD_FRAME_COLUMNS,
    THRESHOLD_SAMPLE_COLUMNS,
    ConfigError,
    CriteriaSettings,
    Settings,
    load_settings,
    parse_threshold,
)
from soakd.observers.base import Progress
from soakd.records import Event, FrameRecord
from soakd.report import render
from soakd.run.early_stop import EarlyStop
from soakd.run.runner import run_soak
from soakd.store.rundata import FRAME_FIELDS, SAMPLE_METRICS

from .conftest import SYNTH_CLI, run_cli


def _bad(expr: str) -> str:
    with pytest.raises(ValueError) as info:
        parse_threshold(expr)
    return str(info.value)


@pytest.mark.parametrize(
    ("expr", "stat", "column", "op", "limit"),
    [
        ("p95(total_ms) < 80", "p95", "total_ms", "<", 80.0),
        ("p99.9(frame_age_ms)<=250", "p99.9", "frame_age_ms", "<=", 250.0),
        ("max(gpu_mem_used_bytes) < 70e9", "max", "gpu_mem_used_bytes", "<", 70e9),
        ("rate(drops) < 0.01", "rate", "drops", "<", 0.01),
        ("AVG(infer_ms) >= 1", "avg", "infer_ms", ">=", 1.0),
        ("count(total_ms) > 100", "count", "total_ms", ">", 100.0),
    ],
)
def test_parser_accepts_stat_column_op_number(
    expr: str, stat: str, column: str, op: str, limit: float
) -> None:
    th = parse_threshold(expr)
    assert (th.stat, th.column, th.op, th.limit) == (stat, column, op, limit)


def test_the_criterion_id_is_the_expression_without_spaces() -> None:
    assert parse_threshold("p95( total_ms ) <  80").id == "threshold:p95(total_ms)<80"


def test_an_unknown_column_is_refused_with_close_matches() -> None:
    assert "unknown column 'total_sm' (did you mean total_ms" in _bad("p95(total_sm) < 80")


def test_an_unknown_statistic_is_refused() -> None:
    assert "unknown statistic 'q95'" in _bad("q95(total_ms) < 80")
    assert "unknown statistic 'p100'" in _bad("p100(total_ms) < 80")


def test_an_operator_other_than_lt_le_gt_ge_is_refused() -> None:
    assert "bad operator '=='" in _bad("p95(total_ms) == 80")
    assert "bad operator '(none)'" in _bad("p95(total_ms) 80")


def test_a_limit_that_is_not_a_finite_number_is_refused() -> None:
    assert "expected a number after '<', got 'fast'" in _bad("p95(total_ms) < fast")
    assert "finite number" in _bad("p95(total_ms) < inf")


def test_a_missing_call_is_refused_with_the_grammar() -> None:
    assert "expected STAT(COLUMN) OP NUMBER" in _bad("total_ms < 80")


def test_rate_takes_only_the_counted_columns_and_they_take_only_rate() -> None:
    assert "use rate(drops)" in _bad("p95(drops) < 1")
    assert "rate() takes one of drops, stale, errors" in _bad("rate(total_ms) < 1")


def test_the_error_names_the_expression() -> None:
    assert _bad("p95(total_sm) < 80").startswith("'p95(total_sm) < 80': ")


def test_the_threshold_columns_are_columns_the_analysis_loads() -> None:
    assert set(THRESHOLD_FRAME_COLUMNS) <= set(FRAME_FIELDS)
    assert set(THRESHOLD_SAMPLE_COLUMNS) <= set(SAMPLE_METRICS)


def test_config_takes_strings_and_tables_with_abort_on_fail() -> None:
    s = load_settings(
        overrides=['criteria.thresholds=["p95(total_ms) < 80", '
                   '{expr = "max(rss_bytes) < 1e9", abort_on_fail = true}]']
    )  # fmt: skip
    parsed = [t.parsed() for t in s.criteria.thresholds]
    assert [(t.expr, t.abort_on_fail) for t in parsed] == [
        ("p95(total_ms) < 80", False),
        ("max(rss_bytes) < 1e9", True),
    ]


def test_config_load_error_names_the_key_and_the_expression() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(overrides=['criteria.thresholds=["p95(total_ms) < 80", "p9(x_ms) < 1"]'])
    msg = str(info.value)
    assert msg.startswith("criteria.thresholds.1.expr: 'p9(x_ms) < 1': unknown column 'x_ms'")
    assert "\n" not in msg


def test_a_table_item_with_an_unknown_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^criteria\.thresholds\.0\.abort: unknown key"):
        load_settings(overrides=['criteria.thresholds=[{expr = "max(total_ms) < 1", abort = 1}]'])


def test_cli_bad_threshold_exits_2_with_one_line(tmp_path: Path) -> None:
    p = run_cli(
        "run", "--db", str(tmp_path / "x.db"),
        "--set", 'criteria.thresholds=["p95(totl_ms) < 80"]',
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "criteria.thresholds.0.expr: 'p95(totl_ms) < 80': unknown column" in p.stderr
    assert "did you mean total_ms" in p.stderr


def test_cli_soak_judges_each_threshold_as_its_own_criterion(tmp_path: Path) -> None:
    """A real synthetic soak: a threshold the ~24 ms frames break fails the run (exit 1),
    one they keep passes, and both are stored as criteria with their values."""
    db = tmp_path / "soakd.db"
    p = run_cli(
        "run", *SYNTH_CLI, "--db", str(db), "--set", "run.duration=3", "--set", "run.fps=20",
        "--set", 'criteria.thresholds=["p95(total_ms) < 5", "max(total_ms) < 1000"]',
    )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    conn = sqlite3.connect(db)
    rows = dict(
        conn.execute(
            "SELECT criterion, status FROM verdicts WHERE criterion LIKE 'threshold:%'"
        ).fetchall()
    )
    assert rows == {"threshold:p95(total_ms)<5": "fail", "threshold:max(total_ms)<1000": "pass"}
    assert conn.execute("SELECT verdict FROM runs").fetchone()[0] == "FAIL"


@pytest.fixture
def judged(
    synthetic: Callable[..., Settings], db_path: Path
) -> Callable[..., tuple[object, object]]:
    def run(*overrides: str) -> tuple[object, object]:
        result = run_soak(synthetic(*overrides))
        conn = sqlite3.connect(db_path)
        try:
            return result, evaluate(conn, result.run_id)
        finally:
            conn.close()

    return run


def test_every_report_format_shows_the_threshold(judged: Callable[..., tuple]) -> None:
    _, (data, verdict) = judged('criteria.thresholds=["max(total_ms) < 1000"]')
    assert verdict.get("threshold:max(total_ms)<1000").status == "pass"
    doc = json.loads(render("json", data, verdict))
    assert "threshold:max(total_ms)<1000" in json.dumps(doc)
    for fmt in ("md", "junit", "html"):
        assert "max(total_ms)" in render(fmt, data, verdict), fmt


def test_a_threshold_on_a_column_without_data_is_invalid(judged: Callable[..., tuple]) -> None:
    """A staged workload never emits first_emit_ms: the threshold is INVALID, not passed."""
    result, (_, verdict) = judged('criteria.thresholds=["max(first_emit_ms) < 1000"]')
    c = verdict.get("threshold:max(first_emit_ms)<1000")
    assert c.status == "invalid" and c.value is None
    assert verdict.status == "INVALID" and int(result.exit_code) == 3


def test_abort_on_fail_ends_a_planted_spike_run_early_with_fail(
    judged: Callable[..., tuple],
) -> None:
    """A 150 ms spike every 15th frame breaks max(total_ms) < 100 within the first second
    after warm-up: the 20 s run stops at once, FAIL (exit 1), with the threshold's reason."""
    result, (_, verdict) = judged(
        "run.duration=20",
        "workload.spike_every=15",
        "workload.spike_ms=150",
        'criteria.thresholds=[{expr = "max(total_ms) < 100", abort_on_fail = true}]',
    )
    assert result.duration_s < 6
    assert result.status == "aborted"
    assert result.reason.startswith("threshold max(total_ms) < 100 failed: max(total_ms) = ")
    assert result.reason.endswith("(abort_on_fail)")
    assert verdict.status == "FAIL" and int(result.exit_code) == 1
    assert verdict.get("threshold:max(total_ms)<100").status == "fail"


def _frame(i: int, total_ms: float) -> FrameRecord:
    return FrameRecord(i, 0.0, i * 0.05, None, None, 0.0, 0.0, total_ms=total_ms)


def _watch(expr: str, fired: list[str], events: list[Event]) -> EarlyStop:
    """The run's early-stop observer asking the thresholds criterion alone, warm-up over."""
    crit = CriteriaSettings(thresholds=[{"expr": expr, "abort_on_fail": True}], min_frames=1)
    live = Live(planned_s=60.0, fps=20.0, streams=1)
    watch = EarlyStop(live, crit, [thresholds_criterion], event=events.append, stop=fired.append)
    watch.on_event(Event("warmup_end", 0.0, 0.0))
    return watch


def test_a_percentile_aborts_only_after_the_minimum_of_values() -> None:
    fired: list[str] = []
    events: list[Event] = []
    watch = _watch("p95(total_ms) < 10", fired, events)
    tick = Progress(elapsed_s=2.0, remaining_s=1.0, frames_done=0, frames_captured=0,
                    achieved_fps=0.0, drops=0, stale=0, errors=0, age_p50_ms=None)  # fmt: skip
    for i in range(ABORT_MIN_VALUES - 1):
        watch.on_frame(_frame(i, 50.0))
    watch.on_progress(tick)
    assert fired == []
    watch.on_frame(_frame(ABORT_MIN_VALUES, 50.0))
    watch.on_progress(tick)
    assert len(fired) == 1 and fired[0].startswith("threshold p95(total_ms) < 10 failed")
    assert [e.kind for e in events] == ["early_stop"]
    assert events[0].data == {"criterion": "threshold:p95(total_ms)<10", "t": 2.0}


def test_a_monotone_statistic_aborts_only_when_it_cannot_come_back() -> None:
    assert can_no_longer_pass(parse_threshold("max(total_ms) < 100"), 150.0, 1, 20)
    assert not can_no_longer_pass(parse_threshold("max(total_ms) > 100"), 50.0, 999, 20)
    assert can_no_longer_pass(parse_threshold("min(total_ms) > 10"), 5.0, 1, 20)
    assert not can_no_longer_pass(parse_threshold("count(total_ms) > 100"), 50.0, 999, 20)
