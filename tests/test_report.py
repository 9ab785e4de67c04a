"""Reports (Markdown, JSON, JUnit, HTML), the SVG primitives, and the `soakd report` /
`soakd gate` commands on a real run database through a real subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from soakd.analysis import evaluate, judge_run
from soakd.analysis.model import RunData, Verdict
from soakd.report import render
from soakd.report.svg import HLine, Series, VLine, decimate, line_chart, nice_ticks
from soakd.store import db as store
from tests.conftest import make_run, soakd_cmd

MIB = 1 << 20


def _make_db(path: Path, *, leak: bool) -> str:
    """A run database with one 60 s run (10 fps): healthy, or with a 20 MB/min RSS leak."""
    conn = store.connect(path)
    rid = "leaky" if leak else "healthy"
    cfg = {
        "criteria": {},
        "workload": {"kind": "synthetic", "device": "cpu"},
        "run": {"warmup_s": 2.0},
    }
    make_run(
        conn,
        id=rid,
        started_unix=1000,
        host="h",
        workload_kind="synthetic",
        fps=10,
        config=cfg,
        config_hash="abc",
        duration_s=60,
    )
    rng = np.random.default_rng(0)
    rows = []
    for i in range(600):
        infer = float(20 * np.exp(rng.normal(0, 0.05)))
        rows.append(
            (
                rid,
                i,
                i / 10,
                i / 10,
                int(i < 20),
                1.0,
                2.0,
                infer,
                2.0,
                infer + 5,
                3.0 + rng.normal(0, 0.3),
                "boom" if i == 300 else None,
            )
        )
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, warmup, grab_ms, pre_ms, "
        "infer_ms, decode_ms, total_ms, frame_age_ms, error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    t = np.arange(0, 60, 0.1)
    rss = 400 * MIB + (20 * MIB * t / 60 if leak else 0) + rng.normal(0, 0.1 * MIB, t.size)
    conn.executemany(
        "INSERT INTO samples (run_id, seq, t, wall, rss_bytes, cpu_pct) VALUES (?,?,?,0,?,50)",
        [(rid, i, float(t[i]), int(rss[i])) for i in range(t.size)],
    )
    conn.execute(
        "INSERT INTO events (run_id, t, wall, kind, frame_id, message) VALUES "
        "(?, 30, 0, 'error', 300, 'boom')",
        (rid,),
    )
    judge_run(conn, rid)
    conn.close()
    return rid


@pytest.fixture
def leaky_db(tmp_path: Path) -> Path:
    p = tmp_path / "soakd.db"
    _make_db(p, leak=True)
    return p


def _load(db: Path, rid: str = "leaky"):  # type: ignore[no-untyped-def]
    conn = store.connect(db)
    try:
        return evaluate(conn, rid)
    finally:
        conn.close()


def test_markdown_report_has_verdict_table_and_reason(leaky_db: Path) -> None:
    """The Markdown report names the verdict, the reason and one table row per criterion."""
    data, v = _load(leaky_db)
    md = render("md", data, v)
    assert md.startswith("## soakd verdict: ❌ FAIL")
    assert "**Reason:**" in md and "memory_rss" in md
    verdict_part = md.split("### Numbers", 1)[0]
    rows = [ln for ln in verdict_part.splitlines() if ln.startswith("| ") and "criterion" not in ln]
    assert len(rows) == len(v.criteria)


def test_json_report_is_versioned_and_strict(leaky_db: Path) -> None:
    """The JSON report carries schema soakd.verdict/2, parses without NaN, and matches the
    stored verdict rows."""
    data, v = _load(leaky_db)
    text = render("json", data, v)
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert doc["schema"] == "soakd.verdict/2"
    assert doc["verdict"] == {"status": "FAIL", "exit_code": 1, "reason": v.reason}
    by = {c["criterion"]: c for c in doc["criteria"]}
    assert by["memory_rss"]["status"] == "fail" and by["errors"]["value"] == 1
    assert by["memory_gpu"]["status"] == "n/a"
    conn = store.connect(leaky_db)
    stored = dict(conn.execute("SELECT criterion, status FROM verdicts WHERE run_id='leaky'"))
    assert stored == {k: c["status"] for k, c in by.items()}


def test_junit_has_one_testcase_per_criterion(leaky_db: Path) -> None:
    """JUnit XML: a testcase per criterion, failures for failed ones, skipped for n/a."""
    data, v = _load(leaky_db)
    root = ET.fromstring(render("junit", data, v).split("\n", 1)[1])
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [c.criterion for c in v.criteria]
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert failed == {"memory_rss", "errors"}
    na = sum(c.status == "n/a" for c in v.criteria)  # 3 GPU metrics + memory_headroom
    assert suite.get("failures") == "2" and int(suite.get("skipped") or 0) == na == 4


def test_html_is_self_contained_with_aligned_panels(leaky_db: Path) -> None:
    """The HTML report has every panel as inline SVG on the same time axis and loads
    nothing from outside (no script, no link, no remote URL)."""
    data, v = _load(leaky_db)
    html = render("html", data, v)
    for panel in ("stages", "frame_age", "drops", "rss", "util", "queue", "fps"):
        assert f'data-panel="{panel}"' in html
    assert "<script" not in html and "<link" not in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)
    assert 'data-series="rss"' in html and 'data-series="tolerance"' in html


def test_line_chart_draws_series_thresholds_and_gaps() -> None:
    """line_chart draws each series as a path (NaN breaks it), threshold and marker lines."""
    x = np.arange(100.0)
    y = np.sin(x)
    y[50] = np.nan
    svg = line_chart(
        [Series("a", x, y), Series("empty", x, np.full(100, np.nan))],
        hlines=[HLine(0.5, "limit")],
        vlines=[VLine(10, "warm-up")],
        panel_id="p",
        title="t",
    )
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    paths = [p for p in root.iter(f"{ns}path") if p.get("data-series") == "a"]
    assert len(paths) == 1 and paths[0].get("d", "").count("M") == 2
    assert len(list(root.iter(f"{ns}line"))) >= 2
    assert "empty (no data)" in svg


def test_vertical_markers_carry_a_visible_text_label() -> None:
    """A labelled VLine draws its label as text next to the line (not only as a tooltip),
    shortened when long; an unlabelled one draws no text."""
    svg = line_chart(
        [Series("a", [0, 1], [0, 1])],
        vlines=[VLine(0.5, "error: " + "x" * 60), VLine(0.7)],
    )
    ns = "{http://www.w3.org/2000/svg}"
    labels = [t for t in ET.fromstring(svg).iter(f"{ns}text") if t.get("class") == "vlabel"]
    assert len(labels) == 1
    assert (labels[0].text or "").startswith("error: x") and len(labels[0].text or "") <= 24


def test_html_fps_panel_counts_frames_done_per_window(leaky_db: Path) -> None:
    """The achieved-fps panel of a 10 fps run draws windows that read 10 fps (frames done
    per window divided by its width), with the 10 fps target as a threshold line."""
    data, v = _load(leaky_db)
    html = render("html", data, v)
    svg = html[html.index('data-panel="fps"') - 200 :]
    svg = svg[svg.index("<svg") : svg.index("</svg>") + 6]
    assert "target 10 fps" in svg
    ns = "{http://www.w3.org/2000/svg}"
    root = ET.fromstring(svg)
    (path,) = [p for p in root.iter(f"{ns}path") if p.get("class") == "series"]
    (hline,) = [ln for ln in root.iter(f"{ns}line") if ln.get("class") == "hline"]
    ys = {float(y) for y in re.findall(r"[ML][\d.]+,([\d.]+)", path.get("d", ""))}
    assert ys == {float(hline.get("y1", "nan"))}


def test_decimate_keeps_extremes_and_bounds_points() -> None:
    """Decimation keeps the global min and max and at most ~max_points points."""
    rng = np.random.default_rng(0)
    y = rng.normal(size=1_000_000)
    x = np.arange(y.size, dtype=float)
    dx, dy = decimate(x, y, 1000)
    assert dy.size <= 1000 and dy.max() == y.max() and dy.min() == y.min()
    assert np.all(np.diff(dx) > 0)


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    """Ticks are multiples of 1/2/2.5/5 x 10^k inside the range."""
    ticks = nice_ticks(0.0, 97.3)
    assert ticks[0] == 0.0 and ticks[-1] <= 97.3 and len(ticks) >= 4
    steps = np.diff(ticks)
    assert np.allclose(steps, steps[0])


def _cli(db: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        soakd_cmd(*args, "--db", str(db)), capture_output=True, text=True, env=env, timeout=120
    )


def test_cli_report_and_gate(
    leaky_db: Path, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """`soakd report` writes each format; `soakd gate` prints the verdict and exits 1 for a
    FAIL run; bad input exits 2 with a one-line error."""
    for fmt in ("md", "json", "junit", "html"):
        out = tmp_path / f"r.{fmt}"
        r = _cli(
            leaky_db, "report", "--latest", "--format", fmt, "-o", str(out), env=subprocess_env
        )
        assert r.returncode == 0, r.stderr
        assert out.stat().st_size > 200
    r = _cli(leaky_db, "report", "leak", "--format", "json", env=subprocess_env)
    assert r.returncode == 0 and json.loads(r.stdout)["run"]["id"] == "leaky"
    r = _cli(leaky_db, "gate", "--latest", env=subprocess_env)
    assert r.returncode == 1 and "FAIL" in r.stdout and "memory_rss" in r.stdout
    r = _cli(leaky_db, "gate", "nope", env=subprocess_env)
    assert r.returncode == 2 and "no run 'nope'" in r.stderr
    r = _cli(leaky_db, "report", "--latest", "--format", "pdf", env=subprocess_env)
    assert r.returncode == 2 and "--format" in r.stderr


def test_cli_gate_passes_healthy_run(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """`soakd gate` exits 0 for a healthy run... except that this one has an error frame,
    so it exits 1; a run with the error frame removed passes."""
    db = tmp_path / "h.db"
    _make_db(db, leak=False)
    conn = store.connect(db)
    conn.execute("UPDATE frames SET error = NULL")
    conn.execute("UPDATE runs SET verdict = NULL")
    conn.close()
    r = _cli(db, "gate", "healthy", env=subprocess_env)
    assert r.returncode == 0, r.stdout
    conn = store.connect(db)
    assert conn.execute("SELECT verdict FROM runs").fetchone()[0] == "PASS"


HOSTILE = "<script>alert(1)</script> a|b \x1b[31mred\x1b[0m bell\x07\nnext & <b>"
_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _hostile_run(
    tmp_path: Path, *, db_name: str = "hostile", name: str | None = HOSTILE
) -> tuple[RunData, Verdict]:
    """The leaky run (in ``db_name``.db), named ``name``, whose error frame and event carry
    HOSTILE text."""
    db = tmp_path / f"{db_name}.db"
    _make_db(db, leak=True)
    conn = store.connect(db)
    conn.execute("UPDATE runs SET name = ?", (name,))
    conn.execute("UPDATE frames SET error = ? WHERE error IS NOT NULL", (HOSTILE,))
    conn.execute("UPDATE events SET message = ? WHERE kind = 'error'", (HOSTILE,))
    conn.close()
    data, verdict = _load(db)
    return data, verdict


def test_junit_is_well_formed_without_control_chars_when_name_and_errors_hold_them(
    tmp_path: Path,
) -> None:
    """A run name and an error message with <script>, |, an ANSI colour and a bell: the
    JUnit document parses with xml.etree and carries no control character at all."""
    data, v = _hostile_run(tmp_path)
    assert any("\x07" in c.detail or "\x07" in json.dumps(c.evidence) for c in v.criteria)
    text = render("junit", data, v)
    assert not _XML_FORBIDDEN.search(text) and "\x1b" not in text
    root = ET.fromstring(text.split("\n", 1)[1])
    suite = root.find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["run_id"] == "leaky"
    assert props["run_name"] == "<script>alert(1)</script> a|b red bell\\x07\nnext & <b>"
    failure = next(tc for tc in suite.iter("testcase") if tc.get("name") == "errors")
    assert "\\x07" in ET.tostring(failure, "unicode")


def test_junit_classname_is_the_run_name_not_the_run_id_so_ci_history_lines_up(
    tmp_path: Path,
) -> None:
    """Two runs of one named config share their suite name and classnames (the run id is a
    property); an unnamed run is classed by its workload kind; the testcase is the
    criterion."""
    names = []
    for rid in ("leaky", "other"):
        data, v = _hostile_run(tmp_path, db_name=rid, name="nightly cam-1.soak")
        data.meta.run_id = v.run_id = rid
        suite = ET.fromstring(render("junit", data, v).split("\n", 1)[1]).find("testsuite")
        assert suite is not None
        classes = {tc.get("classname") for tc in suite.iter("testcase")}
        names.append((suite.get("name"), classes))
        assert [tc.get("name") for tc in suite.iter("testcase")] == [
            c.criterion for c in v.criteria
        ]
    assert names[0] == names[1] == ("soakd.nightly_cam-1.soak", {"soakd.nightly_cam-1.soak"})
    data, v = _hostile_run(tmp_path, db_name="unnamed", name=None)
    suite = ET.fromstring(render("junit", data, v).split("\n", 1)[1]).find("testsuite")
    assert suite is not None and suite.get("name") == "soakd.synthetic"
    assert {tc.get("classname") for tc in suite.iter("testcase")} == {"soakd.synthetic"}


def test_markdown_escapes_html_pipes_and_newlines_from_run_name_and_errors(
    tmp_path: Path,
) -> None:
    """The Markdown report shows no raw HTML from the run name or error text, and a `|` or
    newline in them does not break the criteria table (every row keeps its 7 pipes)."""
    data, v = _hostile_run(tmp_path)
    md = render("md", data, v)
    assert "<script>" not in md and "<b>" not in md and "&lt;script&gt;" in md
    assert "\x1b" not in md and "\x07" not in md
    head = next(ln for ln in md.splitlines() if ln.startswith("Run `leaky`"))
    assert (
        "(&lt;script&gt;alert(1)&lt;/script&gt; a\\|b red bell\\x07 next &amp; &lt;b&gt;)" in head
    )
    rows = [ln for ln in md.split("### Numbers", 1)[0].splitlines() if ln.startswith("| ")]
    assert len(rows) == len(v.criteria) + 1
    assert all(len(re.findall(r"(?<!\\)\|", ln)) == 7 for ln in rows)
    errors_row = next(ln for ln in rows if "| errors |" in ln)
    assert "&lt;script&gt;" in errors_row
