"""soakd at a terminal 80, 100 and 200 columns wide (issue 25): a run id is never cut, a
verdict's detail is wrapped at word boundaries or, with too little room beside the other
columns, listed under the table, and nothing is lost. Every command is a real ``python -m
soakd`` subprocess on a short synthetic soak's database, its stdout a pseudo-terminal
COLUMNS wide (off a terminal soakd prints 160 columns, whatever COLUMNS says)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from soakd.analysis.model import CriterionResult, Verdict
from soakd.errors import ExitCode
from soakd.report.console import MIN_NOTE_WIDTH, format_streams_table, format_verdict_table

from .conftest import REPO, SYNTH_CLI, run_cli, soakd_cmd

WIDTHS = (80, 100, 200)
#: a run name and labels long enough to need room in `soakd runs`
NAME, LABELS = "nightly-moss-realtime-soak", ("release=1.4.0-rc2", "model=moss-vl-realtime")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def on_terminal(columns: int, *args: str) -> tuple[int, str]:
    """Run ``soakd ARGS`` with stdout on a pseudo-terminal ``columns`` wide (stderr to a
    file, so no live display); its exit code and what it printed, styling removed."""
    away = ("NOTIFY_SOCKET", "JOURNAL_STREAM", "STATE_DIRECTORY")
    env = {k: v for k, v in os.environ.items() if k not in away}
    env.update(COLUMNS=str(columns), LINES="50", NO_COLOR="1", PYTHONUNBUFFERED="1")
    leader, follower = pty.openpty()
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                soakd_cmd(*args), stdout=follower, stderr=err, env=env, cwd=REPO
            )
            os.close(follower)
            out = _read_all(leader, deadline=time.monotonic() + 120)
            rc = proc.wait(timeout=10)
        finally:
            os.close(leader)
        err.seek(0)
        assert rc in (0, 1, 3), err.read().decode(errors="replace")[-2000:]
    return rc, _ANSI.sub("", out.decode("utf-8", "replace")).replace("\r\n", "\n")


def _read_all(fd: int, deadline: float) -> bytes:
    """What the terminal ``fd`` gets until the child closes it (or the deadline passes)."""
    chunks = []
    while select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


@dataclass
class Soak:
    db: Path
    run_id: str
    verdict: str  # PASS, FAIL or INVALID
    printed: str  # what `soakd run` printed at its end, at 80 columns


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> Soak:
    """A 3 s synthetic soak, run at 80 columns, named and labelled."""
    db = tmp_path_factory.mktemp("width") / "soakd.db"
    labels = [arg for label in LABELS for arg in ("--label", label)]
    args = ("run", "--duration", "3", "--fps", "20", "--db", str(db), "--no-live", *labels)
    _, printed = on_terminal(80, *args, "--set", f"run.name={NAME!r}", *SYNTH_CLI)
    run_id, verdict = sqlite3.connect(db).execute("SELECT id, verdict FROM runs").fetchone()
    return Soak(db, run_id, verdict, printed)


def stored_details(soak: Soak) -> dict[str, str]:
    """The stored verdict's detail per criterion (what `soakd run` judged and printed)."""
    rows = sqlite3.connect(soak.db).execute(
        "SELECT criterion, detail FROM verdicts WHERE run_id = ?", (soak.run_id,)
    )
    return dict(rows.fetchall())


def assert_words_whole(texts: Iterable[str], printed: str) -> None:
    """Every word of every text is printed whole: none split across lines, none lost."""
    words = {w for t in texts for w in t.split()}
    missing = words - set(printed.split())
    assert not missing, f"split or lost: {sorted(missing)}\n{printed}"


def assert_keyed_below(details: dict[str, str], printed: str) -> None:
    """Each detail is listed under the table, keyed by its criterion (a line of its own)."""
    lines = [ln.strip() for ln in printed.splitlines()]
    for criterion, detail in details.items():
        first = detail.split()[0]
        assert any(ln.startswith(f"{criterion}: {first}") for ln in lines), printed


def test_run_prints_its_verdict_at_80_columns_with_the_details_under_the_table(
    soak: Soak,
) -> None:
    """`soakd run`'s end at 80 columns: the run id whole, and every criterion's detail,
    with no room beside the table, listed under it keyed by criterion, no word split."""
    details = stored_details(soak)
    assert f"{soak.verdict}  run {soak.run_id}" in soak.printed  # the verdict's title
    assert_words_whole(details.values(), soak.printed)
    assert_keyed_below(details, soak.printed)


@pytest.mark.parametrize("width", WIDTHS)
def test_gate_prints_every_criterion_whole_at_every_width(soak: Soak, width: int) -> None:
    """`soakd gate` at 80, 100 and 200 columns: the run id whole, every criterion and
    its status, every word of every detail, reason, warning and hint whole; no line wider
    than the terminal."""
    rc, printed = on_terminal(width, "gate", soak.run_id, "--db", str(soak.db))
    report = run_cli("report", soak.run_id, "-f", "json", "--db", str(soak.db))
    doc = json.loads(report.stdout)  # the same judgement, as data
    assert rc == doc["verdict"]["exit_code"]
    assert f"{doc['verdict']['status']}  run {soak.run_id}" in printed
    assert all(len(line) <= width for line in printed.splitlines()), printed
    for c in doc["criteria"]:
        assert re.search(rf"{c['criterion']}\b.*{c['status'].upper()}", printed), printed
    texts = [c["detail"] for c in doc["criteria"]] + doc["warnings"] + doc["hints"]
    assert_words_whole(texts + ([doc["verdict"]["reason"]] if rc else []), printed)


def test_gate_wraps_details_in_their_column_when_it_has_room(soak: Soak) -> None:
    """At 120 columns the details stay in the table, wrapped at word boundaries in a
    column at least MIN_NOTE_WIDTH wide; at 80 they move under it."""
    _, wide = on_terminal(120, "gate", soak.run_id, "--db", str(soak.db))
    head = next(ln for ln in wide.splitlines() if "criterion" in ln)
    assert "detail" in head and "details:" not in wide
    detail_cell = head.split("┃")[-2]
    assert len(detail_cell) - 2 >= MIN_NOTE_WIDTH
    assert any(len(d) > len(detail_cell) for d in stored_details(soak).values())  # wrapped
    assert_words_whole(stored_details(soak).values(), wide)
    _, narrow = on_terminal(80, "gate", soak.run_id, "--db", str(soak.db))
    assert_keyed_below(stored_details(soak), narrow)


@pytest.mark.parametrize("width", WIDTHS)
def test_show_prints_the_run_id_and_every_criterion_whole(soak: Soak, width: int) -> None:
    """`soakd show` at 80, 100 and 200 columns: the run id, every criterion and the
    run's labels whole."""
    _, printed = on_terminal(width, "show", soak.run_id, "--db", str(soak.db))
    assert f"run {soak.run_id}" in printed
    for criterion in stored_details(soak):
        assert criterion in printed.split(), printed
    assert_words_whole(LABELS, printed)


@pytest.mark.parametrize("width", WIDTHS)
def test_runs_lists_every_run_id_and_field_whole(soak: Soak, width: int) -> None:
    """`soakd runs` at 80, 100 and 200 columns: every run id whole, and every field of
    every run (name, mode, status, verdict, workload, start, frames, labels) printed whole:
    nothing cut to an ellipsis."""
    _, printed = on_terminal(width, "runs", "--db", str(soak.db))
    listed = run_cli("runs", "-f", "json", "--db", str(soak.db)).stdout.splitlines()
    for r in map(json.loads, listed):
        fields = [r["run_id"], r["name"], r["mode"], r["status"], r["verdict"]]
        fields += [r["workload_kind"], r["started_at"], str(r["frames"]), *LABELS]
        assert_words_whole(fields, printed)
    assert "…" not in printed


def _verdict(detail: str) -> Verdict:
    crit = CriterionResult(
        criterion="memory_rss", title="RSS growth", status="fail", value=3.0,
        threshold=1.5, unit="MB/min", detail=detail,
    )  # fmt: skip
    return Verdict(
        run_id="20261206T040613-4e6141", status="FAIL", exit_code=ExitCode.FAIL,
        reason="memory_rss", criteria=[crit],
    )  # fmt: skip


def test_a_word_too_long_for_the_column_moves_the_details_under_the_table() -> None:
    """A detail whose longest word (a path) is wider than the column left for it is listed
    under the table, where the word fits whole, rather than folded mid-word."""
    path = "/var/lib/soakd/workloads/moss-vl-realtime/checkpoints/step-120000/model.safetensors"
    detail = f"the allocator grew while loading {path} again"
    con = Console(width=120, record=True, color_system=None)
    con.print(format_verdict_table(_verdict(detail)))
    printed = con.export_text()
    assert_words_whole([detail], printed)
    assert_keyed_below({"memory_rss": detail}, printed)


def test_a_streams_reason_is_wrapped_like_a_detail() -> None:
    """The per-stream table at 80 columns: a failed stream's reason whole, word by word."""
    reason = "frame age rose 12.5 ms/min: backpressure accumulated in the decoder's queue"
    streams = [
        {"stream": "cam0", "status": "PASS", "frames": 60, "measured_frames": 50},
        {"stream": "cam1", "status": "FAIL", "frames": 60, "reason": reason},
    ]
    con = Console(width=80, record=True, color_system=None)
    con.print(format_streams_table(streams))
    printed = con.export_text()
    assert "cam0" in printed and "cam1" in printed
    assert_words_whole([reason], printed)


def test_a_warning_during_the_live_display_is_a_line_of_its_own_at_80_columns() -> None:
    """`soakd run` of the embedded model with stderr on an 80-column terminal: the GPU
    warning is printed above the live display on lines of its own, reason included (it was
    glued to the spinner's line, its reason erased by the next redraw), and no
    transformers "Loading weights" bar is left in the display."""
    import fcntl
    import struct
    import termios

    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM")}
    env.update(COLUMNS="80", LINES="40", TERM="xterm", PYTHONUNBUFFERED="1")
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 80, 0, 0))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.Popen(
                soakd_cmd("run", "--duration", "3", "--db", str(Path(tmp) / "t.db")),
                stdout=follower, stderr=follower, env=env, cwd=REPO,
            )  # fmt: skip
            os.close(follower)
            out = _read_all(leader, deadline=time.monotonic() + 240)
            rc = proc.wait(timeout=30)
        finally:
            os.close(leader)
    assert rc in (0, 1, 3)
    text = _ANSI.sub("", out.decode("utf-8", "replace"))
    # what a terminal shows of each line: the text after its last carriage return
    (line,) = [seg for ln in text.split("\n") for seg in ln.split("\r") if "GPU telemetry" in seg]
    assert "loading model" not in line and "..." not in line, line
    assert "device 'cpu' is not CUDA" in text.replace("\r\n", " ").replace("\n", " ")
    assert "Loading weights" not in text
