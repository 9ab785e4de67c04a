"""`soakd plan`: a matrix of overrides expanded into named cells (soakd.studies.plan), shown,
soaked one after another or one at a time (`--cell`, as an array task runs it), and written
out as one config per cell."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import time
import tomllib
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from soakd.cli import main
from soakd.config import ConfigError, load_settings
from soakd.store.runs import find_runs
from soakd.studies.plan import load_plan, plan_exit_code, toml_value

from .conftest import REPO, SYNTH_CLI, error_lines, run_cli, soakd_cmd

#: every cell a short synthetic soak; the test's own --set flags make it a few seconds long
SHORT = ["--set", "run.duration=2", "--set", "run.fps=20", *SYNTH_CLI]


def write_plan(tmp_path: Path, body: str, name: str = "plan.toml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


RELEASE = """\
[plan]
name = "release-1.4.0"
set = ["workload.kind=synthetic"]
labels = { release = "1.4.0" }

[matrix]
"run.fps" = [2, 4.5]
workload.infer_ms = [10.0, 25]
"""

TWO_CELLS = """\
[plan]
name = "two"
set = ["workload.kind=synthetic"]
labels = { release = "1.4.0" }

[matrix]
"workload.infer_ms" = [5.0, 10.0]
"""


#: a cell whose threshold no frame can meet: FAIL whatever else a short soak gets
PLANTED_FAIL = """
[[cell]]
name = "planted-fail"
set = ['criteria.thresholds=["max(total_ms) < 0.001"]']
"""


def conn_of(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(db)


def plan_error(tmp_path: Path, body: str) -> str:
    path = write_plan(tmp_path, body)
    with pytest.raises(ConfigError) as exc:
        load_plan(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


# --------------------------------------------------------------------------- expansion


def test_the_matrix_is_the_product_in_file_order_then_the_extra_cells(tmp_path: Path) -> None:
    """Cells are the [matrix] product, the first key varying slowest, then the [[cell]]
    tables; each named key=value by the key's last part, indexed 0..N-1."""
    plan = load_plan(write_plan(tmp_path, RELEASE + '[[cell]]\nname = "leak"\n'
                                'set = ["workload.leak_mb_per_min=30"]\n'))  # fmt: skip
    assert [(c.index, c.name) for c in plan.cells] == [
        (0, "fps=2,infer_ms=10"),
        (1, "fps=2,infer_ms=25"),
        (2, "fps=4.5,infer_ms=10"),
        (3, "fps=4.5,infer_ms=25"),
        (4, "leak"),
    ]
    assert plan.cells[2].overrides == ("run.fps=4.5", "workload.infer_ms=10.0")
    assert plan.cells[2].values == {"run.fps": 4.5, "workload.infer_ms": 10.0}
    assert plan.cells[4].values == {"workload.leak_mb_per_min": 30}


def test_names_stay_readable_and_unique(tmp_path: Path) -> None:
    """A path value is named by its last component while those differ, a key by its last
    part unless two keys share it; anything outside letters, digits and ._+- becomes _."""
    plan = load_plan(write_plan(tmp_path, """\
[plan]
name = "p"
set = ["workload.kind=synthetic", "source.kind=video"]
[matrix]
"source.path" = ["/clips/a/day.mp4", "/clips/b/day.mp4"]
"run.seed" = [1]
"workload.seed" = [2]
"run.name" = ["what is on screen?"]
"""))  # fmt: skip
    assert [c.name for c in plan.cells] == [
        "path=_clips_a_day.mp4,run.seed=1,workload.seed=2,name=what_is_on_screen_",
        "path=_clips_b_day.mp4,run.seed=1,workload.seed=2,name=what_is_on_screen_",
    ]
    short = load_plan(write_plan(tmp_path, """\
[plan]
name = "p"
set = ["workload.kind=synthetic", "source.kind=video"]
[matrix]
"source.path" = ["/clips/a/day.mp4", "/clips/b/night.mp4"]
""", "short.toml"))  # fmt: skip
    assert [c.name for c in short.cells] == ["path=day.mp4", "path=night.mp4"]


def test_the_example_plan_is_valid_and_has_four_cells() -> None:
    """configs/plan-example.toml (the README's and docs/fleet.md's plan) loads."""
    plan = load_plan(REPO / "configs" / "plan-example.toml")
    assert plan.name == "example" and len(plan.cells) == 4
    assert plan.config == REPO / "configs" / "synthetic.toml"


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('[plan]\nset = []\n[matrix]\n"run.fps" = [2]\n', "[plan] name: required key"),
        ('[plan]\nname = "p"\n[matrix]\n"run.fps" = []\n', "[matrix] run.fps: must be a non-empty"),
        ('[plan]\nname = "p"\n[matrix]\n"run.fps" = [2, 2]\n', "run.fps: value 2 is given twice"),
        ('[plan]\nname = "p"\n[matrix]\nfps = [2]\n', "[matrix] fps: expected section.key"),
        ('[plan]\nname = "p"\n[matrix]\n"run.fpz" = [2]\n', "cell 0 (fpz=2): run.fpz: unknown key"),
        ('[plan]\nname = "p"\nsets = []\n', "[plan]: unknown key 'sets'"),
        ('[plan]\nname = "p"\n[matrx]\n"run.fps" = [2]\n', "unknown table 'matrx'"),
        ('[plan]\nname = "p"\n', "no cells"),
        ('[plan]\nname = "p a"\n[[cell]]\nname = "x"\n', "[plan] name: letters, digits"),
        ('[plan]\nname = "p"\nconfig = "nope.toml"\n[[cell]]\nname = "x"\n', "nope.toml: config"),
        ('[plan]\nname = "p"\nset = ["fps"]\n[[cell]]\nname = "x"\n', "[plan] set: 'fps'"),
        ('[plan]\nname = "p"\nlabels = { cell = "x" }\n[[cell]]\nname = "x"\n', "'cell' is set"),
        ('[plan]\nname = "p"\nlabels = { "a-b" = 1 }\n[[cell]]\nname = "x"\n', "label name 'a-b'"),
        ('[plan]\nname = "p"\n[[cell]]\nname = "3"\n', "[[cell]] #1 name: letters"),
        ('[plan]\nname = "p"\n[[cell]]\nname = "x"\n[[cell]]\nname = "x"\n', "cells 0 and 1 are"),
        ('[plan]\nname = "p"\n[[cell]]\nset = ["run.fps=-1"]\n', "run.fps: must be > 0"),
    ],
    ids=lambda x: str(x)[:40],
)
def test_a_bad_plan_is_one_line_naming_the_file_and_the_problem(
    tmp_path: Path, body: str, expected: str
) -> None:
    """Every problem, every cell's settings included, is refused at load in one line that
    starts with the plan file."""
    assert expected in plan_error(tmp_path, body)


def test_a_typo_in_the_matrix_exits_2_before_any_run(tmp_path: Path) -> None:
    """`plan run` with a misspelt matrix key: exit 2, one line naming the file and the key,
    no database created."""
    plan = write_plan(tmp_path, '[plan]\nname = "p"\n[matrix]\n"workload.infer_mz" = [5.0]\n')
    db = tmp_path / "soakd.db"
    out = run_cli("plan", "run", str(plan), "--db", str(db), *SHORT)
    assert out.returncode == 2, out.stderr
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and str(plan) in lines[0] and "workload.infer_mz: unknown" in lines[0]
    assert not db.exists()


# --------------------------------------------------------------------------- settings


def test_layers_merge_base_set_cell_extra_flags_and_the_plan_labels_win(tmp_path: Path) -> None:
    """Base config < [plan] set < cell < extra overrides < flags; plan= and cell= labels
    always come from the plan, the base config's labels stay."""
    write_plan(tmp_path, '[run]\nfps = 5.0\nseed = 1\nwarmup_s = 1\nlabels = { team = "a" }\n'
               '[workload]\nkind = "synthetic"\n', "base.toml")  # fmt: skip
    plan = load_plan(write_plan(tmp_path, """\
[plan]
name = "p"
config = "base.toml"
set = ["run.seed=2", "run.warmup_s=2", "run.max_queue=3"]
labels = { release = "1.4.0" }
[[cell]]
name = "c"
set = ["run.seed=3", "run.warmup_s=3"]
"""))  # fmt: skip
    s = plan.settings(
        plan.cells[0], ["run.warmup_s=4"], {"run.sample_interval_ms": 200, "run.labels.plan": "x"}
    )
    assert (s.run.fps, s.run.max_queue, s.run.seed, s.run.warmup_s) == (5.0, 3, 3, 4.0)
    assert s.run.sample_interval_ms == 200
    assert s.run.labels == {"team": "a", "release": "1.4.0", "plan": "p", "cell": "c"}


def test_a_cell_stops_on_its_first_failure_unless_a_layer_says_otherwise(tmp_path: Path) -> None:
    """Under a plan ``run.stop_on_fail`` defaults to true (GPU hours are the plan's cost);
    a base config, the plan's set or the caller setting it false keeps it false."""
    base = write_plan(tmp_path, '[workload]\nkind = "synthetic"\n', "base.toml")
    plan = load_plan(write_plan(tmp_path, '[plan]\nname = "p"\nconfig = "base.toml"\n'
                                '[matrix]\n"run.fps" = [2]\n'))  # fmt: skip
    assert plan.settings(plan.cells[0]).run.stop_on_fail is True
    assert plan.settings(plan.cells[0], ["run.stop_on_fail=false"]).run.stop_on_fail is False
    base.write_text('[run]\nstop_on_fail = false\n[workload]\nkind = "synthetic"\n')
    assert plan.settings(plan.cells[0]).run.stop_on_fail is False


def test_a_cell_is_found_by_index_or_name_else_a_clear_error(tmp_path: Path) -> None:
    plan = load_plan(write_plan(tmp_path, RELEASE))
    assert plan.cell("3").name == "fps=4.5,infer_ms=25"
    assert plan.cell("fps=2,infer_ms=25").index == 1
    with pytest.raises(ConfigError, match=r"no cell 4: the plan has 4 \(0-3\)"):
        plan.cell("4")
    named = re.escape("no cell named 'fps=3' (cells: fps=2,infer_ms=10, fps=2,infer_ms=25, ")
    with pytest.raises(ConfigError, match=named):
        plan.cell("fps=3")


@pytest.mark.parametrize(
    ("codes", "expected"),
    [([0, 0], 0), ([0, 3, 1, 2], 1), ([3, 4, 2], 4), ([0, 3, 2], 2), ([0, 3], 3), ([0, 134], 4)],
)
def test_the_plan_exits_with_its_worst_cell(codes: list[int], expected: int) -> None:
    """FAIL, then soakd failing, then a cell that could not start, then INVALID."""
    assert plan_exit_code(codes) == expected


@pytest.mark.parametrize(
    "value",
    [
        'say "hi"\\\n\t\x01\x7f é 😀',
        -0.0,
        1e-05,
        2.0,
        12,
        True,
        [1, "a", [2.5]],
        {"expr": "p95(total_ms) < 80", "n": {"x": False}},
    ],
)
def test_toml_value_reads_back_as_the_same_value(value: Any) -> None:
    """A cell's override and a written config read back exactly what was written."""
    assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value


# --------------------------------------------------------------------------- CLI


def test_show_json_is_one_object_with_the_name_labels_and_cells(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "show", str(write_plan(tmp_path, RELEASE)), "-f", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["name"], shown["labels"]) == ("release-1.4.0", {"release": "1.4.0"})
    assert [c["index"] for c in shown["cells"]] == [0, 1, 2, 3]
    assert shown["cells"][1]["overrides"] == ["run.fps=2", "workload.infer_ms=25"]


def test_a_label_contradicting_the_plan_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-l release=1.5.0 on a release=1.4.0 plan, or -l cell=..., would leave the plan."""
    plan = str(write_plan(tmp_path, TWO_CELLS))
    db = tmp_path / "soakd.db"
    assert main(["plan", "run", plan, "--db", str(db), "-l", "release=1.5.0"]) == 2
    assert "contradicts plan 'two' (release=1.4.0)" in capsys.readouterr().err
    assert main(["plan", "run", plan, "--db", str(db), "-l", "cell=x"]) == 2
    assert not db.exists()


def test_plan_run_soaks_every_cell_with_the_plan_labels(tmp_path: Path) -> None:
    """A matrix cell and a planted failing one: two stored runs labelled plan/cell/release,
    one line each (cell, stored verdict, the criteria that did not pass, run id, duration,
    exit code) and no per-cell verdict or stage table, then the summary table; the worst
    cell's exit code: 1."""
    db = tmp_path / "soakd.db"
    plan = write_plan(tmp_path, TWO_CELLS.replace("[5.0, 10.0]", "[5.0]") + PLANTED_FAIL)
    out = run_cli("plan", "run", str(plan), "--db", str(db), *SHORT)
    runs = find_runs(conn_of(db), labels={"plan": "two", "release": "1.4.0"})
    assert [r.labels["cell"] for r in runs] == ["infer_ms=5", "planted-fail"], out.stderr[-2000:]
    conn = conn_of(db)
    for i, r in enumerate(runs):
        bad = [
            c
            for (c,) in conn.execute(
                "SELECT criterion FROM verdicts WHERE run_id = ? AND status = ? ORDER BY rowid",
                (r.id, "fail" if r.verdict == "FAIL" else "invalid"),
            )
        ]
        failing = f" ({', '.join(bad)})" if bad and r.verdict != "PASS" else ""
        took = f"{r.duration_s:.1f} s"
        line = (
            f"soakd: plan two: cell {i} ({r.labels['cell']}): {r.verdict}{failing}, "
            f"run {r.id}, {took} (exit {r.exit_code})"
        )
        assert line in out.stdout.splitlines(), out.stdout
        assert bad or r.verdict == "PASS"
    assert runs[1].verdict == "FAIL" and out.returncode == 1
    assert "plan two: 2 cells: " in out.stdout
    assert "criterion" not in out.stdout and "infer" not in out.stdout.replace("infer_ms", "")
    assert "soakd show RUN_ID" in out.stdout


def test_an_auto_cell_says_when_it_was_decided_and_what_it_could_see(tmp_path: Path) -> None:
    """A cell with ``run.duration = "auto"``: its line and the summary table say "decided
    after N s" with the slope each trend could see, as the run's verdict does."""
    db = tmp_path / "soakd.db"
    plan = write_plan(tmp_path, TWO_CELLS.replace("[5.0, 10.0]", "[5.0]"))
    auto = ["run.duration='auto'", "run.max_duration=60", "criteria.min_duration_s=4", "run.fps=20",
            "criteria.floor_window_s=0.25", "criteria.max_memory_growth_mb_per_min=60"]  # fmt: skip
    out = run_cli("plan", "run", str(plan), "--db", str(db), *SYNTH_CLI,
                  *(a for kv in auto for a in ("--set", kv)))  # fmt: skip
    (run,) = find_runs(conn_of(db), labels={"plan": "two"})
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("soakd: plan two: cell 0")]
    assert run.verdict == "PASS" and f"run {run.id}" in line, out.stdout + out.stderr[-2000:]
    assert re.search(r", decided after \d+ s \(.*memory_rss could see [\d.]+ MB/min", line), line
    assert "decided after" in out.stdout.split(line, 1)[1]  # the table's note


def test_cell_runs_only_that_cell(tmp_path: Path) -> None:
    """`--cell 1` (what an array task passes) soaks cell 1 alone."""
    db = tmp_path / "soakd.db"
    plan = write_plan(tmp_path, TWO_CELLS)
    out = run_cli("plan", "run", str(plan), "--cell", "1", "--db", str(db), *SHORT)
    runs = find_runs(conn_of(db), labels={"plan": "two"})
    assert [r.labels["cell"] for r in runs] == ["infer_ms=10"], out.stderr[-2000:]
    assert out.returncode == runs[0].exit_code
    bad = run_cli("plan", "run", str(plan), "--cell", "2", "--db", str(db))
    assert bad.returncode == 2 and "no cell 2: the plan has 2 (0-1)" in bad.stderr


def test_a_cell_that_cannot_start_is_reported_and_the_others_still_run(tmp_path: Path) -> None:
    """A cell whose source is missing is a usage error of that cell: reported, the next
    cell runs, the plan exits 2 (1 if the next one failed)."""
    plan = write_plan(tmp_path, """\
[plan]
name = "mixed"
set = ["workload.kind=synthetic"]
[[cell]]
name = "no-images"
set = ["source.kind=images", "source.path='/nonexistent/folder'"]
[[cell]]
name = "ok"
""")  # fmt: skip
    db = tmp_path / "soakd.db"
    out = run_cli("plan", "run", str(plan), "--db", str(db), *SHORT)
    assert f"{plan}: cell 0 (no-images): source.path:" in "\n".join(error_lines(out.stderr))
    (ok,) = find_runs(conn_of(db), labels={"plan": "mixed"})
    assert ok.labels["cell"] == "ok"
    assert out.returncode == plan_exit_code([2, ok.exit_code or 0]) != 0
    assert f"2 cells: 1 error, 1 {ok.verdict}" in out.stdout


def _cell_started(db: Path) -> bool:
    """A run row of the plan is stored; False while the file or its schema is not yet
    written (the poll can open the file between its creation and its first table)."""
    if not db.exists():
        return False
    try:
        with closing(sqlite3.connect(db)) as conn:
            return bool(find_runs(conn, labels={"plan": "two"}))
    except sqlite3.OperationalError:
        return False


def test_a_stop_signal_ends_the_cell_and_no_further_cell_starts(tmp_path: Path) -> None:
    """SIGINT during cell 0: that run is stored aborted, cell 1 never starts, exit 3."""
    db = tmp_path / "soakd.db"
    plan = write_plan(tmp_path, TWO_CELLS)
    argv = soakd_cmd("plan", "run", str(plan), "--db", str(db), *SYNTH_CLI, "--set",
                     "run.duration=60")  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _cell_started(db):
            assert proc.poll() is None and time.monotonic() < deadline, "cell 0 never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3, stdout[-2000:]
    runs = find_runs(conn_of(db), labels={"plan": "two"})
    assert [(r.labels["cell"], r.status) for r in runs] == [("infer_ms=5", "aborted")]
    assert "stopped (signal SIGINT): 1 cell(s) not run" in stdout


def test_written_configs_load_to_each_cells_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan write`: DIR/<index>-<name>.toml loads to the cell's settings (same config hash,
    labels included), and cells.tsv lists index, name and file."""
    plan_path = write_plan(tmp_path, RELEASE)
    out = tmp_path / "cells"
    extra = ["run.duration=7", "criteria.min_frames=7"]
    argv = ["plan", "write", str(plan_path), "--out", str(out), *(f"--set={s}" for s in extra)]
    assert main([*argv, "-l", "site=lab"]) == 0
    plan = load_plan(plan_path)
    rows = [ln.split("\t") for ln in (out / "cells.tsv").read_text().splitlines()]
    assert rows[0] == ["index", "name", "file"] and len(rows) == 5
    for cell, (index, name, file) in zip(plan.cells, rows[1:], strict=True):
        assert (index, name, file) == (str(cell.index), cell.name, f"{index}-{name}.toml")
        loaded = load_settings(out / file)
        expected = plan.settings(cell, extra, {"run.labels.site": "lab"})
        assert loaded == expected and loaded.config_hash() == plan.settings(cell).config_hash()
        assert loaded.run.labels["cell"] == cell.name and loaded.run.labels["site"] == "lab"
