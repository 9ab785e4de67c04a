"""Reports (Markdown, JSON, JUnit, HTML), the SVG primitives, and the `soakd report` /
`soakd gate` commands on a real run database through a real subprocess."""

from __future__ import annotations

import itertools
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
from soakd.report.svg import (
    HLine,
    Series,
    VLine,
    decimate,
    line_chart,
    nice_ticks,
    text_width,
)
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
    assert 'data-series="rss"' in html and 'data-series="tolerance +' in html


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
    shortened to what the plot's height holds when long; an unlabelled one draws no
    text."""
    svg = line_chart(
        [Series("a", [0, 1], [0, 1])],
        vlines=[VLine(0.5, "error: " + "x" * 60), VLine(0.7)],
    )
    ns = "{http://www.w3.org/2000/svg}"
    labels = [t for t in ET.fromstring(svg).iter(f"{ns}text") if t.get("class") == "vlabel"]
    assert len(labels) == 1
    text = labels[0].text or ""
    assert text.startswith("error: x") and text.endswith("…") and len(text) < 60
    assert text_width(text, 10.0) <= 220 - 12 - 36 - 8  # the plot area's height


def test_html_fps_panel_counts_frames_done_per_window(leaky_db: Path) -> None:
    """The frame-rate panel of a 10 fps run draws the frames captured and the frames
    completed per window, both reading 10 fps (count divided by the window's width) with
    the 10 fps target as a threshold line, but for the window of its one error frame,
    which completed 9."""
    data, v = _load(leaky_db)
    html = render("html", data, v)
    svg = html[html.index('data-panel="fps"') - 200 :]
    svg = svg[svg.index("<svg") : svg.index("</svg>") + 6]
    assert "target 10 fps" in svg
    ns = "{http://www.w3.org/2000/svg}"
    root = ET.fromstring(svg)
    paths = {p.get("data-series"): p for p in root.iter(f"{ns}path") if p.get("class") == "series"}
    assert set(paths) == {"captured per 1 s", "completed per 1 s"}
    (hline,) = [ln for ln in root.iter(f"{ns}line") if ln.get("class") == "hline"]
    target = float(hline.get("y1", "nan"))
    ys = {k: [float(y) for y in re.findall(r"[ML][\d.]+,([\d.]+)", p.get("d", ""))]
          for k, p in paths.items()}  # fmt: skip
    assert set(ys["captured per 1 s"]) == {target}
    low = [y for y in ys["completed per 1 s"] if y != target]
    assert len(low) == 1 and low[0] > target


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


# --- the report shows why a run failed (issue 25): evidence, streams, axes, legend, colours

NS = "{http://www.w3.org/2000/svg}"


def _panel(html: str, panel: str) -> ET.Element:
    """The ``<svg>`` of one panel of an HTML report, parsed."""
    i = html.index(f'data-panel="{panel}"')
    start = html.rindex("<svg", 0, i)
    return ET.fromstring(html[start : html.index("</svg>", i) + 6])


def _series(svg: ET.Element) -> dict[str, ET.Element]:
    return {e.get("data-series", ""): e for e in svg.iter() if e.get("class") == "series"}


def _plot(svg: ET.Element) -> tuple[float, float, float, float]:
    """The plot area's (x0, y0, x1, y1) in px: the chart's first rect."""
    r = next(svg.iter(f"{NS}rect"))
    x, y, w, h = (float(r.get(k, "nan")) for k in ("x", "y", "width", "height"))
    return x, y, x + w, y + h


def _points(path: ET.Element) -> list[tuple[float, float]]:
    return [
        (float(a), float(b)) for a, b in re.findall(r"[ML]([\d.]+),([\d.]+)", path.get("d", ""))
    ]


def _values(svg: ET.Element, py: np.ndarray) -> np.ndarray:
    """Pixel heights read back as values through the y axis's first and last tick labels
    (each written 4 px below its tick)."""
    ticks = [
        (float(t.text or "nan"), float(t.get("y", 0)) - 4)
        for t in svg.iter(f"{NS}text")
        if t.get("text-anchor") == "end" and re.fullmatch(r"-?[\d.]+", t.text or "")
    ]
    (v0, y0), (v1, y1) = ticks[0], ticks[-1]
    return v0 + (py - y0) * (v1 - v0) / (y1 - y0)


def _stored(tmp_path: Path, cols: dict, **kw: object) -> tuple[RunData, Verdict]:
    """A run written row by row through the store (tests/stored_runs.py), then loaded and
    judged as ``soakd report`` does."""
    from tests.stored_runs import store_run

    conn = store.connect(tmp_path / "stored.db")
    store_run(conn, "r", cols, **kw)  # type: ignore[arg-type]
    try:
        return evaluate(conn, "r")
    finally:
        conn.close()


def test_failing_jitter_draws_k_times_median_on_the_stage_panel_and_marks_the_frames(
    tmp_path: Path,
) -> None:
    """A run whose every 40th infer is 10x the median fails jitter; the stage panel draws
    the line k x median at the verdict's k and median and marks each judged frame over it
    (as many marks as the verdict counted, each above the line)."""
    from tests.stored_runs import healthy

    cols = healthy()
    cols["infer_ms"][::40] *= 10
    cols["total_ms"] = cols["grab_ms"] + cols["pre_ms"] + cols["infer_ms"] + cols["decode_ms"]
    data, v = _stored(tmp_path, cols)
    jit = v.get("jitter")
    assert jit is not None and jit.status == "fail", jit
    cut = jit.evidence["k"] * jit.evidence["median_ms"]
    svg = _panel(render("html", data, v), "stages")
    (line,) = [e for e in svg.iter(f"{NS}line") if e.get("class") == "hline"]
    label = "".join(svg.itertext())
    assert f"= {cut:.3g} ms" in label and "k x median" in label
    marks = [s for n, s in _series(svg).items() if "over k x median" in n]
    assert len(marks) == 1
    circles = [(float(c.get("cx", 0)), float(c.get("cy", 0))) for c in marks[0]]
    assert len(circles) == jit.evidence["exceed_count"] > 2
    assert all(cy < float(line.get("y1", 0)) for _, cy in circles)  # above it (y grows down)


def test_a_passing_run_draws_no_jitter_evidence(leaky_db: Path) -> None:
    """Jitter passed: the stage panel has no k x median line and no marked frames."""
    data, v = _load(leaky_db)
    svg = _panel(render("html", data, v), "stages")
    assert v.get("jitter").status == "pass"  # type: ignore[union-attr]
    assert not [e for e in svg.iter(f"{NS}line") if e.get("class") == "hline"]
    assert not [n for n in _series(svg) if "over k x median" in n]


def test_frame_age_ceiling_and_drop_limit_are_drawn_when_they_fail(tmp_path: Path) -> None:
    """A run whose frame age p95 passes max_age_p95_ms and which loses a tenth of its frames
    draws the ceiling (labelled with the run's p95) on the frame-age panel and the
    max_drop_fraction limit on the drops panel, below the loss line."""
    from tests.stored_runs import healthy

    cols = healthy()
    cols["frame_age_ms"] = cols["frame_age_ms"] + 40
    cols["drop_count"] = np.arange(cols["frame_id"].size) // 10
    data, v = _stored(tmp_path, cols, crit={"max_age_p95_ms": 30.0})
    assert v.get("frame_age").status == "fail" and v.get("drops").status == "fail"  # type: ignore[union-attr]
    html = render("html", data, v)
    age = "".join(_panel(html, "frame_age").itertext())
    p95 = v.get("frame_age").evidence["p95_ms"]  # type: ignore[union-attr]
    assert f"p95 ceiling 30 ms (p95 {p95:.3g} ms)" in age
    drops = _panel(html, "drops")
    (limit,) = [e for e in drops.iter(f"{NS}line") if e.get("class") == "hline"]
    assert "max_drop_fraction 0.05" in "".join(drops.itertext())
    loss = _series(drops)["loss rate per window"]
    assert max(y for _, y in _points(loss)) < float(limit.get("y1", 0))  # drawn above it


def test_a_steep_tolerance_stays_inside_its_panel_and_the_data_keeps_the_height(
    tmp_path: Path,
) -> None:
    """A flat 10-minute RSS (0.2 MB of noise) against a 1.5 MB/min tolerance (15 MB over the
    run): the tolerance line starts on the data, runs to the top edge of the plot area and
    stops there (every point inside it), and the RSS line still spans over a third of the
    plot's height (the axis was not stretched to the whole allowance)."""
    from tests.stored_runs import flat_samples, healthy

    cols = healthy(dur=600.0, fps=2.0)
    data, v = _stored(tmp_path, cols, dur=600.0, fps=2.0, samples=flat_samples(600.0),
                      crit={"max_memory_growth_mb_per_min": 1.5})  # fmt: skip
    svg = _panel(render("html", data, v), "rss")
    x0, y0, x1, y1 = _plot(svg)
    series = _series(svg)
    (tol,) = [s for n, s in series.items() if n.startswith("tolerance")]
    pts = _points(tol)
    assert all(x0 - 0.1 <= x <= x1 + 0.1 and y0 - 0.1 <= y <= y1 + 0.1 for x, y in pts), pts
    assert abs(min(y for _, y in pts) - y0) < 0.2  # it meets the top edge
    rss = [y for _, y in _points(series["rss"])]
    assert max(rss) - min(rss) > (y1 - y0) / 3


def test_every_axis_labels_its_ticks_apart(tmp_path: Path) -> None:
    """Ticks over a range under 1 MB (112.0 to 112.6) read 112.1, 112.2, ..., never the same
    label twice; in a real report every panel's x and y tick labels are distinct."""
    svg = line_chart([Series("rss", [0, 1, 2], [112.0, 112.3, 112.6])], panel_id="p")
    ticks = [t.text for t in ET.fromstring(svg).iter(f"{NS}text") if t.get("text-anchor") == "end"]
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), ticks
    assert all(t and t.startswith("112.") for t in ticks), ticks
    from tests.stored_runs import flat_samples, healthy

    data, v = _stored(tmp_path, healthy(), samples=flat_samples(120.0))
    html = render("html", data, v)
    for panel in re.findall(r'<svg[^>]*data-panel="([^"]+)"', html):
        axes = next(g for g in _panel(html, panel).iter(f"{NS}g") if g.get("class") == "axes")
        for anchor in ("end", "middle"):
            labels = [t.text for t in axes.iter(f"{NS}text") if t.get("text-anchor") == anchor]
            labels = [lb for lb in labels if re.fullmatch(r"-?[\d.]+[kMG]?", lb or "")]
            assert len(set(labels)) == len(labels), (panel, labels)


def test_legend_entries_are_spaced_by_their_text_and_wrap_inside_the_chart(
    leaky_db: Path,
) -> None:
    """Every panel's legend entries, each as wide as its swatch and measured text, do not
    overlap on their row and end inside the chart; long ones wrap onto a second row."""
    from soakd.report.svg import text_width

    names = [f"a rather long series name number {i}" for i in range(6)]
    svgs = [line_chart([Series(n, [0, 1], [0, 1]) for n in names], panel_id="many")]
    data, v = _load(leaky_db)
    html = render("html", data, v)
    svgs += [html[html.rindex("<svg", 0, m.start()) :] for m in re.finditer("data-panel=", html)]
    for text in svgs:
        svg = ET.fromstring(text[: text.index("</svg>") + 6])
        width = float(svg.get("width", 0))
        rows: dict[str, list[tuple[float, float]]] = {}
        for item in svg.iter(f"{NS}g"):
            if item.get("class") == "legend-item":
                label = next(item.iter(f"{NS}text")).text or ""
                x = float(item.get("data-x", 0))
                rows.setdefault(item.get("data-row", ""), []).append(
                    (x, x + 14 + text_width(label))
                )
        for row in rows.values():
            row.sort()
            assert all(a[1] < b[0] for a, b in itertools.pairwise(row)), row
            assert row[-1][1] <= width, row
    first = ET.fromstring(svgs[0])
    assert {i.get("data-row") for i in first.iter(f"{NS}g") if i.get("data-x")} == {"0", "1"}


def test_a_series_keeps_its_colour_whatever_else_the_run_drew(tmp_path: Path) -> None:
    """The stage panel's "total" line has the same colour in a run that timed every stage
    and in one that timed no pre stage (a series missing must not shift the others')."""
    from tests.stored_runs import healthy

    colours = []
    for i, drop_pre in enumerate((False, True)):
        cols = healthy()
        if drop_pre:
            cols["pre_ms"] = np.full(cols["frame_id"].size, np.nan)
            cols["total_ms"] = cols["grab_ms"] + cols["infer_ms"] + cols["decode_ms"]
        d = tmp_path / str(i)
        d.mkdir()
        data, v = _stored(d, cols)
        series = _series(_panel(render("html", data, v), "stages"))
        assert ("pre" in series) != drop_pre
        colours.append({n: series[n].get("stroke") for n in ("total", "infer", "grab")})
    assert colours[0] == colours[1], colours


def test_host_load_is_drawn_beside_soakds_cpu_only_when_sampled(leaky_db: Path) -> None:
    """Samples with host_cpu_pct, host_steal_pct and host_load1 add a host cpu line (its
    window means) and a host steal line beside soakd's cpu, and the load average in the
    title; a run without them draws soakd's cpu alone and says nothing of the host."""
    data, v = _load(leaky_db)
    plain = _panel(render("html", data, v), "util")
    assert [n.split(" (")[0] for n in _series(plain)] == ["cpu"]
    assert "host" not in "".join(plain.itertext())
    n = data.samples["t"].size
    data.samples["host_cpu_pct"] = np.full(n, 80.0)
    data.samples["host_steal_pct"] = np.full(n, 5.0)
    data.samples["host_load1"] = np.linspace(1.0, 3.0, n)
    svg = _panel(render("html", data, v), "util")
    series = _series(svg)
    assert [k.split(" (")[0] for k in series] == ["cpu", "host cpu", "host steal"]
    host = next(s for k, s in series.items() if k.startswith("host cpu"))
    cpu = next(s for k, s in series.items() if k.startswith("cpu"))
    # 80 % is drawn above soakd's own 50 % (y grows down)
    assert max(y for _, y in _points(host)) < min(y for _, y in _points(cpu))
    assert "host load average (1 min) median 2, max 3" in "".join(svg.itertext())


def _two_streams() -> dict:
    """Two interleaved streams at 10 fps each for 120 s: stream 1 loses every 10th capture
    (a dropped frame has no row; the next row's drop_count counts it) and its frames wait
    three times as long."""
    from tests.stored_runs import healthy

    cols = healthy(fps=20.0)
    n = cols["frame_id"].size
    stream = np.arange(n) % 2
    keep = ~((stream == 1) & ((np.arange(n) // 2) % 10 == 9))
    drops = np.cumsum(~keep & (stream == 1))
    out = {k: v[keep] for k, v in cols.items()}
    out["stream"] = stream[keep]
    out["drop_count"] = np.where(out["stream"] == 1, drops[keep], 0)
    out["frame_age_ms"] = np.where(out["stream"] == 1, 3 * out["frame_age_ms"],
                                   out["frame_age_ms"])  # fmt: skip
    out["total_ms"] = np.where(out["stream"] == 1, out["total_ms"] + 10, out["total_ms"])
    return out


def test_a_two_stream_run_draws_a_line_per_stream_and_names_the_worst(tmp_path: Path) -> None:
    """run.streams = 2: the latency, frame-age and drop panels draw each stream's own line;
    stream 1, which loses a tenth of its frames and is slower, is named the worst on each
    and above the panels; its drop line reads about 10 %, stream 0's 0 %."""
    data, v = _stored(tmp_path, _two_streams(), run={"streams": 2}, fps=10.0)
    html = render("html", data, v)
    assert "Worst: <b>stream 1</b>" in html
    stages = _series(_panel(html, "stages"))
    assert any(re.fullmatch(r"total stream 0 \(p95 [\d.]+ ms\)", n) for n in stages)
    assert any(re.fullmatch(r"total stream 1 \(p95 [\d.]+ ms, worst\)", n) for n in stages)
    age = _series(_panel(html, "frame_age"))
    assert any(n.startswith("median stream 1 (p95") and n.endswith(", worst)") for n in age)
    assert any(n.startswith("median stream 0 (p95") and "worst" not in n for n in age)
    drops = _panel(html, "drops")
    assert "worst: stream 1" in "".join(drops.itertext())
    series = _series(drops)
    (s0,) = [s for n, s in series.items() if n.startswith("stream 0")]
    (s1,) = [s for n, s in series.items() if n.startswith("stream 1")]
    assert "(10.00% lost)" in s1.get("data-series", "")
    _x0, y0, _x1, y1 = _plot(drops)
    ys0, ys1 = [y for _, y in _points(s0)], [y for _, y in _points(s1)]
    zero = max(ys0)  # stream 0 loses nothing: its line lies on 0 %
    assert min(ys0) == zero and np.median(ys1) < zero - (y1 - y0) / 10


def test_a_two_stream_report_names_one_worst_stream_everywhere(tmp_path: Path) -> None:
    """Stream 1 FAILs (it loses a tenth of its frames) while stream 0's frame age has the
    larger p95: the note, the stage, frame-age and drop panels all name stream 1 the worst,
    none stream 0."""
    cols = _two_streams()
    cols["frame_age_ms"] = np.where(cols["stream"] == 0, 6 * cols["frame_age_ms"],
                                    cols["frame_age_ms"])  # fmt: skip
    data, v = _stored(tmp_path, cols, run={"streams": 2}, fps=10.0)
    html = render("html", data, v)
    assert "Worst: <b>stream 1</b>" in html
    named = [n for panel in ("stages", "frame_age") for n in _series(_panel(html, panel))
             if "worst" in n]  # fmt: skip
    assert len(named) == 2 and all(" stream 1 " in n for n in named), named
    assert "worst: stream 1" in "".join(_panel(html, "drops").itertext())


def test_a_generators_achieved_rate_counts_its_frames_not_its_requests(tmp_path: Path) -> None:
    """A generator asked 2 requests a second that each emit 3 chunks of 4 frames outputs 24
    frames a second: the fps panel reads 24 (its emitted frames per window), not 2; its
    failing content_fps draws its period (1000 / content_fps ms) on the interval panel."""
    from soakd.records import Emission
    from tests.stored_runs import healthy

    cols = healthy(dur=60.0, fps=2.0)
    em = [
        Emission(int(f), c * 4 + i, float(t) + 0.1 * c + 0.001 * i, 25.0, c, 4, 100.0)
        for f, t in zip(cols["frame_id"], cols["t_capture"], strict=True)
        for c in range(3)
        for i in range(4)
    ]
    data, v = _stored(tmp_path, cols, dur=60.0, fps=2.0, emissions=em, crit={"content_fps": 60},
                      workload={"shape": "generator"}, workload_kind="generator")  # fmt: skip
    assert data.meta.generates
    html = render("html", data, v)
    cf = v.get("content_fps")
    assert cf is not None and cf.status == "fail"
    interval = "".join(_panel(html, "interval").itertext())
    assert "content_fps 60: period 16.67 ms" in interval
    assert f"judged p95 {cf.value:.4g} ms (FAIL)" in interval
    svg = _panel(html, "fps")
    (name,) = _series(svg)
    assert name.startswith("frames out per")
    px = np.array([y for _, y in _points(_series(svg)[name])])
    assert np.median(_values(svg, px)) == pytest.approx(24, rel=0.05)


def test_many_events_of_a_kind_are_ticks_not_lines_that_hide_the_data(leaky_db: Path) -> None:
    """A run with 40 error events draws, on each panel, one labelled line at the first (its
    label counting them) and a short tick at the top for each of the 39 others (none
    dropped); a run with one error draws it as a labelled line."""
    data, v = _load(leaky_db)
    one = _panel(render("html", data, v), "rss")
    assert [e.get("class") for e in one.iter(f"{NS}line") if "v" in (e.get("class") or "")] == [
        "vline"
    ]
    conn = store.connect(leaky_db)
    conn.executemany(
        "INSERT INTO events (run_id, t, wall, kind, frame_id, message) "
        "VALUES ('leaky', ?, 0, 'error', ?, 'boom')",
        [(10 + i, 100 + i) for i in range(39)],
    )
    conn.close()
    data, v = _load(leaky_db)
    svg = _panel(render("html", data, v), "rss")
    lines = [e for e in svg.iter(f"{NS}line") if e.get("class") in ("vline", "vtick")]
    assert [e.get("class") for e in lines].count("vline") == 1
    assert [e.get("class") for e in lines].count("vtick") == 39
    _x0, y0, _x1, y1 = _plot(svg)
    assert all(float(e.get("y2", 0)) - float(e.get("y1", 0)) < (y1 - y0) / 10 for e in lines
               if e.get("class") == "vtick")  # fmt: skip
    (label,) = [t.text for t in svg.iter(f"{NS}text") if t.get("class") == "vlabel"]
    assert (label or "").startswith("error x40")


def test_a_run_killed_before_its_first_frame_still_gets_every_report(tmp_path: Path) -> None:
    """A run with no frame rows (killed 0.2 s after it started) is reported in every format,
    the HTML one saying its frame rate panel has no frames, never a Traceback (exit 4)."""
    db = tmp_path / "r.db"
    conn = store.connect(db)
    cfg = {"workload": {"kind": "synthetic", "device": "cpu"}}
    make_run(conn, id="killed", fps=10, config=cfg, duration_s=0.2, status="aborted",
             reason="killed")  # fmt: skip
    conn.commit()
    for fmt in ("html", "md", "json", "junit"):
        out = tmp_path / f"r.{fmt}"
        p = subprocess.run(
            soakd_cmd("report", "killed", "--db", str(db), "-f", fmt, "-o", str(out)),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert p.returncode == 0, (fmt, p.stderr)
        assert "Traceback" not in p.stderr
    assert "Achieved frame rate: no frames" in (tmp_path / "r.html").read_text()
