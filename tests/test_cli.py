"""The CLI around a run: per-frame log lines at their cadence, `soakd runs`, `soakd show`."""

from __future__ import annotations

import json
import os
import pty
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main

from soakd.cli import app
from soakd.cli.output import write_output
from soakd.studies.profiling import held_fixed

from .conftest import REPO, SYNTH_CLI, run_cli, soakd_cmd

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """One short synthetic soak through the real CLI, logging JSON every 5th frame."""
    db = tmp_path_factory.mktemp("cli") / "soakd.db"
    p = subprocess.run(
        soakd_cmd(
            "run",
            "--db",
            str(db),
            "--duration",
            "3s",
            "--fps",
            "20",
            "--no-live",
            "--log-json",
            "--set",
            "workload.kind=synthetic",
            "--set",
            "workload.infer_ms=5",
            "--set",
            "run.log_every=5",
            "--set",
            "run.warmup_s=0.5",
            "--set",
            "criteria.min_duration_s=1",
            "--set",
            "criteria.floor_window_s=0.2",
            # 3 s cannot judge memory growth at 1.5 MB/min: a few allocations read as a
            # rise, settling or undecided (conftest's SYNTH_CLI says the same)
            "--set",
            "criteria.max_memory_growth_mb_per_min=1000",
            "--set",
            "run.name='cli-smoke'",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return db, p


def _judged(db: Path) -> str:
    """The run's verdict and each criterion that did not pass, for an assertion's message."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT criterion, status, detail FROM verdicts").fetchall()
        verdict = conn.execute("SELECT verdict FROM runs").fetchall()
    return f"{verdict}: " + "; ".join(f"{c} {s}: {d}" for c, s, d in rows if s != "pass")


def test_frame_log_lines_carry_the_seed_fields_at_the_cadence(
    run_db: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """Off a terminal the run logs JSON lines; one `frame` line every log_every frames with
    frame, grab, pre, infer, decode, total, queue, age and drop; the last, `run ended`, names
    the verdict the run exits with (a busy host may judge 3 s of a healthy model otherwise
    than PASS: host contention has its own tests)."""
    db, p = run_db
    lines = [json.loads(ln) for ln in p.stderr.splitlines() if ln.startswith("{")]
    ended = next(ln for ln in lines if ln.get("msg") == "run ended")
    assert (ended["verdict"], ended["exit_code"], p.returncode) in {
        ("PASS", 0, 0), ("FAIL", 1, 1), ("INVALID", 3, 3)
    }, _judged(db)  # fmt: skip
    frames = [ln for ln in lines if ln.get("msg") == "frame"]
    assert 10 <= len(frames) <= 13  # ~60 frames / 5
    assert all(f["frame"] % 5 == 0 for f in frames)
    for key in ("frame", "grab", "pre", "infer", "decode", "total", "queue", "age", "drop"):
        assert key in frames[-1], key
    assert {ln.get("msg") for ln in lines} >= {"run started", "run ended"}


def test_runs_lists_the_run_and_show_summarises_it(
    run_db: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """`soakd runs -f json` lists the run with the verdict it ended with; `soakd show RUN` has
    the stage statistics, the run's name and summary, its events from the warm-up's end on,
    and its criteria."""
    db, ran = run_db
    ended = next(ln for ln in ran.stderr.splitlines() if '"msg": "run ended"' in ln)
    p = subprocess.run(
        soakd_cmd("runs", "--db", str(db), "-f", "json"), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    rows = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["status"] == "completed", _judged(db)
    assert rows[0]["verdict"] == json.loads(ended)["verdict"]
    run_id = rows[0]["run_id"]
    p = subprocess.run(
        soakd_cmd("show", run_id[:12], "--db", str(db), "-f", "json"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["run"]["id"] == run_id
    assert 4 <= doc["stages"]["infer"]["p50"] <= 20
    assert doc["run"]["summary"]["frames_done"] >= 55
    assert "warmup_end" in {e["kind"] for e in doc["events"]}
    crit = {c["criterion"]: c["status"] for c in doc["criteria"]}
    assert crit["run"] == "pass" and "memory_rss" in crit and "evidence" not in doc["criteria"][0]
    p = subprocess.run(
        soakd_cmd("show", "--latest", "--db", str(db)), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and "infer" in p.stdout and run_id in p.stdout
    assert "warmup_end" in p.stdout and "memory_rss" in p.stdout
    assert "run cli-smoke: workload synthetic" in p.stdout


#: what a command that only reads the database has no use for: the soak runner, the verdict
#: engine and the config's pydantic models under it, the report renderers, cv2 and structlog
READERS_SKIP = (
    "soakd.run.runner",
    "soakd.analysis.verdict",
    "soakd.config",
    "soakd.report.html",
    "cv2",
    "structlog",
)


def test_commands_that_read_a_run_import_only_what_they_use(
    run_db: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """`soakd --version`, `soakd runs` and `soakd show -f json` (a real process each, run
    through soakd.cli.main) import none of READERS_SKIP: a command's module is imported when
    the command runs, and heavy modules where they are used (each of the suite's hundreds of
    CLI calls paid ~0.6 s of CPU for them: docs/benchmarks.md)."""
    db, _ = run_db
    probe = (
        "import sys; from soakd.cli import main; code = main(sys.argv[1:]); "
        f"print(code, [m for m in {READERS_SKIP!r} if m in sys.modules], file=sys.stderr)"
    )
    for argv in (
        ["--version"],
        ["runs", "--db", str(db)],
        ["show", "--latest", "--db", str(db), "-f", "json"],
    ):
        p = subprocess.run(
            [sys.executable, "-c", probe, *argv],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert p.stderr.splitlines()[-1] == "0 []", (argv, p.stderr[-2000:])


def test_show_unknown_run_is_a_usage_error(
    run_db: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """An unknown run id is exit 2 with one line naming it."""
    db, _ = run_db
    p = subprocess.run(
        soakd_cmd("show", "nope", "--db", str(db)), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2 and "no run 'nope'" in p.stderr


@pytest.mark.model
def test_the_readme_main_job_runs_the_embedded_default(tmp_path: Path) -> None:
    """`soakd run` with no config soaks the embedded tiny VLM offline and judges it. This is
    a 6 s version of the README's first command, too short for its frame-age trend (one
    window at 2 fps): the honest outcome is INVALID "untested", naming the run length that
    would test it, never a PASS (test_verdict.py checks that the default length is
    testable)."""
    db = tmp_path / "soakd.db"
    env_cache = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(
        soakd_cmd(
            "run",
            "--db",
            str(db),
            "--duration",
            "6s",
            "--no-live",
            "--set",
            "run.warmup_s=1",
            "--set",
            "criteria.min_duration_s=3",
            "--set",
            f"workload.cache_dir={str(tmp_path / 'models')!r}",
        ),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env_cache},
    )
    assert p.returncode == 3, p.stderr[-3000:]
    assert "untested" in p.stdout, p.stdout[-3000:]
    conn = sqlite3.connect(db)
    ((kind, status, verdict),) = conn.execute("SELECT workload_kind, status, verdict FROM runs")
    assert (kind, status, verdict) == ("tiny-vlm", "completed", "INVALID")
    ((detail,),) = conn.execute("SELECT detail FROM verdicts WHERE criterion = 'frame_age'")
    assert detail.startswith("untested") and "run.duration >=" in detail
    ((n, tokens),) = conn.execute("SELECT count(*), min(out_tokens) FROM measured_frames")
    assert n >= 5 and tokens == 8


# --- write_output: stdout or a file


def test_write_output_into_a_missing_folder_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file in a folder that does not exist is a usage error: exit 2, one line naming the
    path and the reason, nothing written."""
    target = tmp_path / "nope" / "out.md"
    with pytest.raises(typer.Exit) as info:
        write_output("text", target)
    assert info.value.exit_code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"soakd: error: {target}: cannot write: folder {target.parent} does not exist"
    ]
    assert not target.parent.exists()


def test_write_output_unwritable_path_names_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path that cannot be written (here: a folder) is exit 2 with the OS's reason."""
    with pytest.raises(typer.Exit) as info:
        write_output("text", tmp_path)
    assert info.value.exit_code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"soakd: error: {tmp_path}: cannot write: ") and "directory" in line


def test_write_output_stdout_is_newline_terminated_and_files_are_as_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On stdout the text ends with exactly one newline; a file gets the text unchanged."""
    write_output("a", None)
    write_output("b\n", None)
    assert capsys.readouterr().out == "a\nb\n"
    write_output("c", tmp_path / "c.txt")
    assert (tmp_path / "c.txt").read_text() == "c"


def test_sweep_output_into_a_missing_folder_exits_2(tmp_path: Path) -> None:
    """`soakd sweep -o MISSING/x.md` exits 2 with one line on stderr."""
    target = tmp_path / "missing" / "x.md"
    p = run_cli(
        "sweep",
        "--vary",
        "workload.infer_ms=1",
        "--frames",
        "2",
        "--set",
        "workload.kind=synthetic",
        "--db",
        str(tmp_path / "x.db"),
        "-o",
        str(target),
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"soakd: error: {target}: cannot write: folder {target.parent} does not exist"
    ]


# --- one CLI: the same option means the same thing everywhere

#: commands that write a report (or a listing) and so take -f/--format and -o/--output
REPORTING = ("report", "sweep", "compare", "profile", "show", "runs", "export")
#: commands that take a run and so take --latest, --mode and --db
TAKING_A_RUN = ("show", "report", "gate", "compare", "baseline set", "export")


def cli_commands() -> dict[str, Any]:
    """Every leaf command of the typer app by its path after `soakd` (e.g. "baseline set");
    tests/test_cli_grammar.py walks them too."""
    out: dict[str, Any] = {}

    def walk(cmd: Any, path: str) -> None:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            out[path] = cmd
            return
        for name, sub in subs.items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    return out


def _options(cmd: Any) -> dict[str, Any]:
    """Each visible option of a command by every one of its names."""
    return {
        name: p
        for p in cmd.params
        if not p.hidden and hasattr(p, "opts")
        for name in (*p.opts, *p.secondary_opts)
        if name.startswith("-")
    }


def test_every_command_uses_the_same_option_names_for_the_same_ideas() -> None:
    """Every reporting command has -f/--format and -o/--output; every command taking a run
    has --latest, --mode and --db; --set always reads KEY=VALUE; no visible --json is left."""
    cmds = cli_commands()
    assert set(REPORTING) | set(TAKING_A_RUN) <= set(cmds)
    for path, cmd in cmds.items():
        opts = _options(cmd)
        want = {"--db"} if path in TAKING_A_RUN or path in ("runs", "baseline list") else set()
        want |= {"-f", "--format", "-o", "--output"} if path in REPORTING else set()
        want |= {"--latest", "--mode"} if path in TAKING_A_RUN else set()
        assert want <= set(opts), (path, sorted(want - set(opts)))
        assert "--json" not in opts, path
        if "--set" in opts:
            assert opts["--set"].metavar == "KEY=VALUE", path
        if "-f" in opts:
            assert opts["-f"] is opts["--format"], path


def test_help_of_every_command_shows_its_shared_options() -> None:
    """`soakd CMD --help` (a real subprocess) lists -f/--format, -o/--output and --latest
    where the command has them, with the fixed values of -f spelled out."""
    for path in ("report", "export", "compare", "baseline set"):
        p = run_cli(*path.split(), "--help")
        assert p.returncode == 0, p.stderr
        if path in REPORTING:
            assert "-f, --format" in p.stdout and "-o, --output" in p.stdout, path
        assert "--latest" in p.stdout, path
    assert "md|json|junit|html" in run_cli("report", "--help").stdout


def test_version_prints_the_package_version() -> None:
    """`soakd --version` prints `soakd X.Y.Z` and exits 0."""
    from soakd import __version__

    p = run_cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"soakd {__version__}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runs", "--mode", "bogus"], "'bogus' is not one of soak, profile"),
        (["show", "--latest", "-f", "yaml"], "'yaml' is not one of text, json"),
        (["report", "--latest", "--mode", "x"], "'x' is not one of soak, profile, any"),
        (["runs", "--no-such-option"], "No such option: --no-such-option"),
        (["runs", "--limit", "0"], "--limit"),
    ],
)
def test_bad_values_are_one_line_usage_errors(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """A value outside an option's fixed set, an unknown option, a bad number: exit 2 and
    one line on stderr naming it, no traceback."""
    p = run_cli(*args, "--db", str(tmp_path / "soakd.db"))
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("soakd: error: ") and message in line


def test_the_old_json_flag_still_works_hidden(
    run_db: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """`--json` (deprecated, hidden) prints what `-f json` prints."""
    db, _ = run_db
    new = run_cli("runs", "--db", str(db), "-f", "json")
    old = run_cli("runs", "--db", str(db), "--json")
    assert old.returncode == 0 and old.stdout == new.stdout and old.stdout.startswith("{")
    assert "--json" not in run_cli("runs", "--help").stdout


def test_show_and_runs_write_to_output_files(
    run_db: tuple[Path, subprocess.CompletedProcess], tmp_path: Path
) -> None:
    """`-o PATH` writes show's JSON and runs' table to the file, nothing to stdout."""
    db, _ = run_db
    p = run_cli("show", "--latest", "--db", str(db), "-f", "json", "-o", str(tmp_path / "s.json"))
    assert p.returncode == 0 and p.stdout == "", p.stderr
    assert json.loads((tmp_path / "s.json").read_text())["run"]["status"] == "completed"
    p = run_cli("runs", "--db", str(db), "-o", str(tmp_path / "runs.txt"))
    assert p.returncode == 0 and p.stdout == ""
    assert "completed" in (tmp_path / "runs.txt").read_text()


def test_baseline_set_takes_latest_as_an_option(
    run_db: tuple[Path, subprocess.CompletedProcess], tmp_path: Path
) -> None:
    """`baseline set --latest --name N` marks the newest soak run; `compare N --latest -f
    json` then compares it with itself; a RUN_ID and --latest together is a usage error."""
    db = tmp_path / "copy.db"
    db.write_bytes(run_db[0].read_bytes())
    p = run_cli("baseline", "set", "--latest", "--name", "ref", "--db", str(db))
    assert p.returncode == 0, p.stderr
    (rid,) = [
        json.loads(ln)["run_id"]
        for ln in run_cli("runs", "--db", str(db), "-f", "json").stdout.splitlines()
    ]
    assert p.stdout.strip() == f"baseline ref = {rid}"
    p = run_cli("compare", "ref", "--latest", "-f", "json", "--db", str(db))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["run_a"]["id"] == doc["run_b"]["id"] == rid
    p = run_cli("baseline", "set", rid, "--latest", "--db", str(db))
    assert p.returncode == 2 and "not both" in p.stderr


def _on_a_terminal(*args: str) -> str:
    """Run `soakd ARGS` with stdout on a pseudo-terminal; what it printed there."""
    leader, follower = pty.openpty()
    try:
        p = subprocess.run(
            soakd_cmd(*args),
            stdout=follower,
            stderr=subprocess.PIPE,
            timeout=120,
            env={**os.environ, "COLUMNS": "160"},
        )
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert p.returncode == 0, p.stderr[-2000:]
    return b"".join(chunks).decode("utf-8", "replace")


def test_profile_on_a_terminal_is_a_rich_table_and_markdown_when_piped(tmp_path: Path) -> None:
    """On a terminal `profile` draws a table (box characters, no Markdown pipes); piped it
    prints Markdown; `-f md` forces Markdown."""
    args = ("profile", "--frames", "3", "--db", str(tmp_path / "p.db"), *SYNTH_CLI)
    tty = _on_a_terminal(*args)
    assert "stage" in tty and "━" in tty and "|---|" not in tty
    piped = run_cli(*args)
    assert piped.returncode == 0 and "| stage | first frame (ms)" in piped.stdout
    assert "━" not in piped.stdout
    assert "|---|" in _on_a_terminal(*args, "-f", "md")


def test_sweep_on_a_terminal_is_a_rich_table(tmp_path: Path) -> None:
    """On a terminal `sweep` draws one table row per value and prints its summary line and
    the notes saying why a peak memory cell is empty."""
    vary = ("--vary", "workload.infer_ms=1,2", "--frames", "3")
    tty = _on_a_terminal("sweep", *vary, "--db", str(tmp_path / "s.db"), *SYNTH_CLI)
    assert "━" in tty and "total p50" in tty and "|---|" not in tty
    # its summary: a knee, none, or (a point cheaper than the one before beyond their spread,
    # as a loaded host can measure) no knee read from a non-monotone sweep
    words = " ".join(tty.split())  # the terminal wraps the line
    assert any(w in words for w in ("no knee found", "knee at", "not a knee"))
    # a few 1-2 ms frames fall between two telemetry samples: the dash in peak RSS says why
    assert "note: peak RSS and GPU – at workload.infer_ms=" in tty


def test_profile_shows_the_effective_min_new_tokens() -> None:
    """min_new_tokens unset means max_new_tokens, and that is what the profile shows."""
    wl = {"max_new_tokens": 8, "min_new_tokens": None, "prompt": "p"}
    assert held_fixed({"workload": wl})["min_new_tokens"] == 8
    assert held_fixed({"workload": {**wl, "min_new_tokens": 3}})["min_new_tokens"] == 3


def test_the_library_logs_to_stderr_never_stdout(tmp_path: Path) -> None:
    """`run_soak` called from a program (no CLI to configure logging) writes its log lines
    to stderr; the program's stdout stays its own: empty here."""
    overrides = [*_LIB_SETS, f"run.db={str(tmp_path / 'l.db')!r}"]
    code = (
        "from soakd.config import load_settings\n"
        "from soakd.run.runner import run_soak\n"
        f"s = load_settings(overrides={overrides!r})\n"
        "assert run_soak(s).run_id\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout == ""
    assert "run started" in p.stderr and "run ended" in p.stderr


_LIB_SETS = [
    "workload.kind=synthetic",
    "run.duration=1",
    "run.fps=20",
    "run.warmup_s=0.2",
    "run.log_every=0",
    "criteria.min_duration_s=1",
]
