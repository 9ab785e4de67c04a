"""``audio_playback``: a realtime session's spoken answers play without a stutter. Runs
written through the store (each answered turn's numbers in its frame's ``extra``, as the
realtime driver writes them) judged on both paths, and one real soak against the realtime
test server (tests/realtime_test_server.py, a test server, not a product) whose voice
streams slower than it plays."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from soakd.records import Sample
from soakd.store.db import connect

from .realtime_test_server import start
from .stored_runs import healthy, judged, status, store_run
from .test_realtime import criteria, soak, url


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    s = start()
    yield s
    s.stop()


def _turns(rtf: list[float], underruns: list[int] | None = None, *, at: float = 10.0,
           every: float = 5.0, audio: bool = True) -> dict[str, Any]:  # fmt: skip
    """A healthy 120 s run at 10 fps whose frames at ``at``, ``at + every``, ... carry one
    answered turn each: ``rtf[i]`` and ``underruns[i]`` (0 when not given)."""
    cols = healthy()
    extra = np.full(cols["t_capture"].size, None, dtype=object)
    under = underruns or [0] * len(rtf)
    for k, (r, u) in enumerate(zip(rtf, under, strict=True)):
        i = round((at + k * every) * 10)
        turn: dict[str, Any] = {"turn": k + 1, "ttfd_ms": 80.0, "done_ms": 300.0}
        if audio:
            turn |= {"audio_s": 0.24, "audio_rtf": r, "underruns": u}
        extra[i] = turn
    cols["extra"] = extra
    return cols


_ids = itertools.count()


def _ticks(busy_at: tuple[float, ...] = ()) -> list[Sample]:
    """Host telemetry every 0.5 s on a 1-CPU host: other processes at 95 % within a second
    of each time in ``busy_at``, at 10 % elsewhere."""
    out = []
    for i, t in enumerate(np.arange(0.5, 120.5, 0.5)):
        busy = any(abs(t - b) <= 1.0 for b in busy_at)
        values = {"rss_bytes": 400 << 20, "host_cpu_pct": 100.0 if busy else 20.0,
                  "cpu_pct": 5.0, "server_cpu_pct": 0.0 if busy else 5.0}  # fmt: skip
        out.append(Sample(i, float(t), 0.0, 0.0, 0.1, values))
    return out


def _judge(tmp_path, cols: dict[str, Any], bounded: bool = False,
           samples: list[Sample] | None = None, **crit: Any) -> Any:  # fmt: skip
    db = tmp_path / "runs.db"
    conn = connect(str(db))
    try:
        more: dict[str, Any] = {}
        if samples is not None:
            more = {"samples": samples, "environment": {"cpu_count": 1}}
        rid = store_run(conn, f"r{next(_ids)}", cols, crit=crit, workload_kind="realtime",
                        **more)  # fmt: skip
        conn.commit()
        return judged(conn, rid, bounded=bounded)
    finally:
        conn.close()


@pytest.mark.parametrize("bounded", [False, True], ids=["exact", "bounded"])
def test_turns_whose_audio_outruns_playback_pass_on_both_paths(tmp_path, bounded) -> None:
    """Ten turns at 2-3 x real time, no underrun: PASS, exact and streamed alike."""
    v = _judge(tmp_path, _turns([2.0 + 0.1 * k for k in range(10)]), bounded)
    assert status(v, "audio_playback") == "pass"
    assert v.get("audio_playback").value == pytest.approx(np.percentile(
        [2.0 + 0.1 * k for k in range(10)], 5))  # fmt: skip


@pytest.mark.parametrize("bounded", [False, True], ids=["exact", "bounded"])
def test_a_p5_real_time_factor_under_the_minimum_fails(tmp_path, bounded) -> None:
    """Twenty turns, two at 0.5 x real time: the p5 falls under 1.0, FAIL; the same turns
    at 1.05 x pass (the rule is the p5 against criteria.min_audio_rtf)."""
    slow = _turns([3.0] * 18 + [0.5, 0.5], every=4.0)
    assert status(_judge(tmp_path, slow, bounded), "audio_playback") == "fail"
    ok = _turns([3.0] * 18 + [1.05, 1.05], every=4.0)
    assert status(_judge(tmp_path, ok, bounded), "audio_playback") == "pass"


def test_underruns_past_the_allowance_fail_and_at_it_pass(tmp_path) -> None:
    """criteria.max_audio_underruns = 2: two underruns in all pass, three fail."""
    two = _turns([3.0] * 5, [1, 0, 1, 0, 0])
    assert status(_judge(tmp_path, two, max_audio_underruns=2), "audio_playback") == "pass"
    three = _turns([3.0] * 5, [1, 1, 1, 0, 0])
    v = _judge(tmp_path, three, max_audio_underruns=2)
    assert status(v, "audio_playback") == "fail" and "stutter" in v.get("audio_playback").detail


def test_turns_during_the_warm_up_are_not_judged(tmp_path) -> None:
    """Stuttering turns only in the 5 s warm-up, healthy ones after it: PASS."""
    cols = _turns([0.2, 0.2, 3.0, 3.0, 3.0], [5, 5, 0, 0, 0], at=1.0, every=2.0)
    v = _judge(tmp_path, cols)
    assert status(v, "audio_playback") == "pass" and v.get("audio_playback").evidence["turns"] == 3


def test_turns_that_stutter_only_while_the_host_is_contended_are_invalid_not_fail(
    tmp_path,
) -> None:
    """Two of ten turns fall behind, both while other processes held 95 % of the CPU:
    INVALID naming the host; the same turns on a quiet host, or with the rule off, FAIL."""
    rtf = [3.0, 3.0, 0.5, 3.0, 3.0, 0.5, 3.0, 3.0, 3.0, 3.0]  # turns at 10, 15, ... 55 s
    busy = _judge(tmp_path, _turns(rtf), samples=_ticks((20.0, 35.0)))
    c = busy.get("audio_playback")
    assert c.status == "invalid" and "the host was contended" in c.detail, c.detail
    assert status(_judge(tmp_path, _turns(rtf), samples=_ticks()), "audio_playback") == "fail"
    off = _judge(tmp_path, _turns(rtf), samples=_ticks((20.0, 35.0)), contended_cpu_pct=100)
    assert status(off, "audio_playback") == "fail"
    # one slow turn on a quiet tick is the model's, whatever the host did at the other
    quiet_one = _judge(tmp_path, _turns(rtf), samples=_ticks((20.0,)))
    assert status(quiet_one, "audio_playback") == "fail"


def test_fewer_than_three_audio_turns_after_the_warm_up_are_invalid_never_pass(tmp_path) -> None:
    """Two answered turns with audio cannot show the playback holds: INVALID."""
    v = _judge(tmp_path, _turns([3.0, 3.0]))
    assert status(v, "audio_playback") == "invalid" and "3 judge playback" in v.get(
        "audio_playback").detail  # fmt: skip


def test_a_session_without_audio_out_has_no_audio_criterion(tmp_path) -> None:
    """Text-only turns: nothing to play, no audio_playback result."""
    v = _judge(tmp_path, _turns([1.0] * 5, audio=False))
    assert v.get("audio_playback") is None


def test_the_html_report_draws_each_turn_and_its_audio_against_the_minimum(tmp_path) -> None:
    """A realtime run's HTML report has a per-turn answers panel, an audio panel with the
    min_audio_rtf line, and the server memory panel of a served kind; a text-only session
    has no audio panel."""
    from soakd.analysis import evaluate
    from soakd.report.html import render_html

    def html(cols: dict[str, Any]) -> str:
        conn = connect(str(tmp_path / "h.db"))
        try:
            rid = store_run(conn, f"h{next(_ids)}", cols, workload_kind="realtime")
            conn.commit()
            return render_html(*evaluate(conn, rid))
        finally:
            conn.close()

    page = html(_turns([2.0, 0.5, 3.0, 3.0]))
    assert 'data-panel="turns"' in page and 'data-panel="audio"' in page
    assert "min_audio_rtf 1" in page.split('data-panel="audio"')[1].split("</svg>")[0]
    assert 'data-panel="server_mem"' in page  # a served kind, as openai
    text_only = html(_turns([1.0] * 4, audio=False))
    assert 'data-panel="turns"' in text_only and 'data-panel="audio"' not in text_only


@pytest.mark.slow
def test_a_voice_that_streams_slower_than_it_plays_fails_a_real_soak(db_path, server) -> None:
    """A realtime server whose 40 ms audio chunks come 150 ms apart: every turn's real-time
    factor is under 1 and it underruns; audio_playback FAILs and so does the run."""
    result = soak(
        db_path,
        url(server, query="max_tokens=4&audio_gap_ms=150"),
        "openai-realtime",
        "workload.session={output_modalities = ['text', 'audio']}",
        "workload.question_every_s=1",
        "run.duration=6",
    )
    assert criteria(db_path, result.run_id)["audio_playback"] == "fail"
    with sqlite3.connect(db_path) as conn:
        (detail,) = conn.execute(
            "SELECT detail FROM verdicts WHERE run_id = ? AND criterion = 'audio_playback'",
            (result.run_id,),
        ).fetchone()
    assert "slower than it plays" in detail, detail
    assert result.verdict.status != "PASS"  # FAIL, or INVALID where a short run is (it beats FAIL)
