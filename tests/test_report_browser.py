"""The HTML report renders in a real headless Chromium with its panels drawn."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

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

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason="chromium is not installed (apt-get install chromium; .ci/run does)",
    ),
]


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def report_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from soakd.report import render

    d = tmp_path_factory.mktemp("browser")
    _make_db(d / "soakd.db", leak=True)
    data, v = _load(d / "soakd.db")
    out = d / "report.html"
    out.write_text(render("html", data, v), encoding="utf-8")
    return out


def test_dom_has_every_panel_with_drawn_series(report_file: Path, tmp_path: Path) -> None:
    """Chromium parses the report and every panel's SVG contains drawn series paths."""
    r = _chromium(tmp_path, "--dump-dom", report_file.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    for panel in ("stages", "frame_age", "drops", "rss", "util"):
        start = dom.find(f'data-panel="{panel}"')
        assert start >= 0, f"panel {panel} missing from the rendered DOM"
        end = dom.find("</svg>", start)
        assert 'class="series"' in dom[start:end], f"panel {panel} has no drawn series"
    assert 'id="verdict"' in dom and ">FAIL<" in dom


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
