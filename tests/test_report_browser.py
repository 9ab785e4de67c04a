"""The HTML report renders in a real headless Chromium with its panels drawn.

Each report is opened with an injected probe script that measures what the browser drew
(every series' length and box, every threshold, trend and event line against the plot
area) and writes it as JSON into ``<pre id="probe">``; the tests read it back from
``--dump-dom``. Two runs are drawn: a short low-rate one (30 s at 2 fps, where plot windows
would be shorter than the frame period) and a 10-minute one at 30 fps.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.analysis import judge_run
from soakd.store import db as store
from tests.conftest import make_run
from tests.test_report import _load, _make_db

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
MIB = 1 << 20

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason="chromium is not installed (apt-get install chromium; .ci/run does)",
    ),
]

PROBE_JS = """
(function () {
  function box(e) { var b = e.getBBox(); return [b.x, b.y, b.width, b.height]; }
  var out = {};
  document.querySelectorAll("svg[data-panel]").forEach(function (svg) {
    var p = {plot: box(svg.querySelector("rect")), series: {}, hlines: [], vlines: []};
    svg.querySelectorAll(".series").forEach(function (e) {
      var n = e.tagName === "path" ? e.getTotalLength() : e.childElementCount;
      p.series[e.getAttribute("data-series")] = {len: n, box: box(e)};
    });
    p.yticks = Array.from(svg.querySelectorAll('.axes text[text-anchor="end"]')).map(
      function (e) { return [e.textContent, e.y.baseVal[0].value]; });
    svg.querySelectorAll("line.hline").forEach(function (e) { p.hlines.push(box(e)); });
    p.legend = Array.from(svg.querySelectorAll(".legend-item")).map(box);
    p.width = svg.width.baseVal.value;
    svg.querySelectorAll("line.vline").forEach(function (e) {
      var t = e.nextElementSibling;
      var label = t && t.classList.contains("vlabel") ? t.textContent : "";
      p.vlines.push({box: box(e), label: label});
    });
    out[svg.getAttribute("data-panel")] = p;
  });
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
"""


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _synthetic_db(path: Path, *, duration_s: float, fps: float) -> str:
    """A real run database with one run at ``fps`` for ``duration_s``: a sawtooth RSS that
    grows 2 MB/min, samples every 0.2 s with psutil-like quantised CPU (0 or 10 %), a
    queue that holds one or two frames, and one error event half-way."""
    conn = store.connect(path)
    rid = f"r{int(duration_s)}s{int(fps)}fps"
    cfg = {"workload": {"kind": "synthetic", "device": "cpu"}, "run": {"warmup_s": 5.0}}
    make_run(conn, id=rid, started_unix=1000, host="h", fps=fps, config=cfg,
             duration_s=duration_s + 0.3)  # a real run ends a little late  # fmt: skip
    rng = np.random.default_rng(1)
    n = int(duration_s * fps)
    t = np.arange(n) / fps
    infer = 20 * np.exp(rng.normal(0, 0.05, n))
    rows = [
        (rid, i, t[i], t[i], t[i] + (infer[i] + 5) / 1e3, int(t[i] < 5), 1.0, 2.0, infer[i],
         2.0, infer[i] + 5, int(i % 3 == 0) + 1, 3.0 + rng.normal(0, 0.3))
        for i in range(n)
    ]  # fmt: skip
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, t_done, warmup, grab_ms, "
        "pre_ms, infer_ms, decode_ms, total_ms, queue_len, frame_age_ms) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    st = np.arange(0, duration_s + 0.3, 0.2)
    rss = 400 * MIB + 2 * MIB * st / 60 + (st % 7) * 0.5 * MIB
    cpu = np.where(rng.random(st.size) < 0.3, 10.0, 0.0)
    conn.executemany(
        "INSERT INTO samples (run_id, seq, t, wall, rss_bytes, cpu_pct) VALUES (?,?,?,0,?,?)",
        [(rid, i, float(st[i]), int(rss[i]), float(cpu[i])) for i in range(st.size)],
    )
    conn.execute(
        "INSERT INTO events (run_id, t, wall, kind, message) VALUES (?, ?, 0, 'error', 'boom')",
        (rid, duration_s / 2),
    )
    judge_run(conn, rid)
    conn.close()
    return rid


def _report(d: Path, rid: str) -> Path:
    from soakd.report import render

    data, v = _load(d / "soakd.db", rid)
    out = d / "report.html"
    out.write_text(render("html", data, v), encoding="utf-8")
    return out


def _probe(report: Path, tmp_path: Path) -> dict[str, Any]:
    """What Chromium drew in each panel, measured by the injected probe script."""
    probed = tmp_path / "probed.html"
    text = report.read_text(encoding="utf-8")
    probed.write_text(text.replace("</body>", f"<script>{PROBE_JS}</script></body>"), "utf-8")
    r = _chromium(tmp_path, "--dump-dom", probed.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', r.stdout, re.S)
    assert m, "the probe script did not run"
    doc: dict[str, Any] = json.loads(html.unescape(m.group(1)))
    return doc


@pytest.fixture(scope="module", params=[(30.0, 2.0), (600.0, 30.0)], ids=["30s-2fps", "10min"])
def probed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    duration, fps = request.param
    d = tmp_path_factory.mktemp("run")
    rid = _synthetic_db(d / "soakd.db", duration_s=duration, fps=fps)
    return _probe(_report(d, rid), d), d / "report.html"


def _inside(b: list[float], plot: list[float], slack: float = 3.0) -> bool:
    """Box ``b`` lies in the plot area, give or take a point mark's radius (2.5 px)."""
    return (
        b[0] >= plot[0] - slack
        and b[1] >= plot[1] - slack
        and b[0] + b[2] <= plot[0] + plot[2] + slack
        and b[1] + b[3] <= plot[1] + plot[3] + slack
    )


def test_every_panel_draws_every_series_as_a_non_empty_path(probed: Any) -> None:
    """Every panel with data, the new queue and achieved-fps panels included, draws each of
    its series with a positive length inside its plot area."""
    doc, _ = probed
    for panel in ("stages", "frame_age", "drops", "rss", "util", "queue", "fps"):
        assert panel in doc, f"panel {panel} missing"
        p = doc[panel]
        assert p["series"], f"panel {panel} draws no series"
        for name, s in p["series"].items():
            assert s["len"] > 0, f"{panel}/{name} is drawn empty"
            assert _inside(s["box"], p["plot"]), f"{panel}/{name} leaves the plot area"
    assert set(doc["stages"]["series"]) >= {"grab", "pre", "infer", "decode", "total"}


def test_trend_and_tolerance_lines_lie_inside_the_plot_near_the_data(probed: Any) -> None:
    """The frame-age and RSS trend and tolerance lines start inside the plot area within a
    tenth of its height of the data they describe (not off-scale below it)."""
    doc, _ = probed
    for panel, data_name in (("frame_age", "window median"), ("rss", "rss floor")):
        p = doc[panel]
        data_box = p["series"][data_name]["box"]
        lines = {k: v for k, v in p["series"].items() if k.startswith(("trend", "tolerance"))}
        assert len(lines) == 2, f"{panel}: {sorted(p['series'])}"
        for name, s in lines.items():
            assert _inside(s["box"], p["plot"]), f"{panel}/{name} outside the plot area"
            near = 0.1 * p["plot"][3]
            assert s["box"][1] <= data_box[1] + data_box[3] + near, f"{panel}/{name} is below"
            assert s["box"][1] + s["box"][3] >= data_box[1] - near, f"{panel}/{name} is above"


def test_cpu_panel_is_smoothed_not_quantised(probed: Any) -> None:
    """Quantised 0/10 % CPU readings draw as a window mean: the line's box stays well inside
    the 0..10 % band instead of jumping across all of it every sample."""
    doc, _ = probed
    p = doc["util"]
    (cpu,) = [s for k, s in p["series"].items() if k.startswith("cpu")]
    (v0, y0), (v1, y1) = [(float(v), y) for v, y in p["yticks"][:2]]
    band_px = 10 * abs(y1 - y0) / abs(v1 - v0)  # the height of 0..10 % on the y axis
    assert cpu["box"][3] < 0.8 * band_px


def test_event_lines_are_labelled_inside_the_plot(probed: Any) -> None:
    """The error event draws a vertical line in every panel, inside the plot, with its kind
    written next to it."""
    doc, _ = probed
    for panel in ("stages", "rss", "fps"):
        (vl,) = doc[panel]["vlines"]
        assert _inside(vl["box"], doc[panel]["plot"])
        assert vl["label"].startswith("error"), vl


@pytest.fixture(scope="module")
def report_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("browser")
    _make_db(d / "soakd.db", leak=True)
    return _report(d, "leaky")


def test_dom_has_the_fail_verdict(report_file: Path, tmp_path: Path) -> None:
    """Chromium parses the leaky run's report and shows its FAIL verdict."""
    r = _chromium(tmp_path, "--dump-dom", report_file.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'id="verdict"' in r.stdout and ">FAIL<" in r.stdout


def test_screenshot_shows_coloured_plot_lines(report_file: Path, tmp_path: Path) -> None:
    """A screenshot of the rendered report contains the series colours (lines were painted),
    not just a blank page."""
    import cv2

    shot = tmp_path / "shot.png"
    r = _chromium(
        tmp_path,
        f"--screenshot={shot}",
        "--window-size=1100,2200",
        "--hide-scrollbars",
        report_file.as_uri(),
    )
    assert shot.exists(), r.stderr[-2000:]
    img = cv2.imread(str(shot))
    assert img is not None
    # the first palette colour, #1f77b4, in BGR, within a small tolerance
    blue = np.all(np.abs(img.astype(int) - np.array([0xB4, 0x77, 0x1F])) < 40, axis=2)
    assert blue.sum() > 200, f"only {blue.sum()} pixels of the first series colour"
    # the red failure threshold/tolerance lines
    red = np.all(np.abs(img.astype(int) - np.array([0x28, 0x27, 0xD6])) < 40, axis=2)
    assert red.sum() > 50


def test_legend_entries_do_not_run_into_each_other(probed: Any) -> None:
    """In every panel as Chromium draws it, no two legend entries (swatch and text) overlap
    and each ends inside the chart."""
    doc, _ = probed
    for panel, p in doc.items():
        boxes = p["legend"]
        assert boxes, f"{panel}: no legend"
        for i, a in enumerate(boxes):
            assert a[0] + a[2] <= p["width"], (panel, a)
            for b in boxes[i + 1 :]:
                apart = a[0] + a[2] <= b[0] or b[0] + b[2] <= a[0]
                apart = apart or a[1] + a[3] <= b[1] or b[1] + b[3] <= a[1]
                assert apart, (panel, a, b)


@pytest.mark.slow
def test_screenshot_script_photographs_real_failing_soaks(tmp_path: Path) -> None:
    """bench/screenshots.py --duration 20s soaks the planted faults for real, renders their
    reports and writes both screenshots; each shows the failing evidence in red (the
    k x median line and marked frames, the tolerance line) and the series colours."""
    import cv2

    r = subprocess.run(
        [sys.executable, "-m", "bench.screenshots", "--duration", "20s", "--out",
         str(tmp_path / "img"), "--workdir", str(tmp_path / "work")],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "report-10min: FAIL" in r.stdout and "report-2streams: FAIL" in r.stdout
    html = (tmp_path / "work" / "report-10min.html").read_text(encoding="utf-8")
    assert "over k x median" in html and "jitter: k x median" in html
    two = (tmp_path / "work" / "report-2streams.html").read_text(encoding="utf-8")
    assert "Worst: <b>stream 1</b>" in two
    for name in ("report-10min", "report-2streams"):
        img = cv2.imread(str(tmp_path / "img" / f"{name}.png"))
        assert img is not None and img.shape[1] == 1100
        red = np.all(np.abs(img.astype(int) - np.array([0x28, 0x27, 0xD6])) < 40, axis=2)
        blue = np.all(np.abs(img.astype(int) - np.array([0xB4, 0x77, 0x1F])) < 40, axis=2)
        assert red.sum() > 100 and blue.sum() > 200, (name, red.sum(), blue.sum())
