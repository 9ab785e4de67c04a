"""The report pictures in docs/img/: real failing soaks of the synthetic workload, their
HTML reports, and a headless Chromium screenshot of each.

    .venv/bin/python -m bench.screenshots                      # 10-minute soaks (about 11 min)
    .venv/bin/python -m bench.screenshots --duration 20s --out /tmp/shots   # a quick check

Two soaks run at once through the real CLI (``soakd run``), each on its own database:

* ``report-10min``: one stream at 25 fps with two planted faults: a 100 ms infer spike on
  every 50th frame (``jitter`` FAILs: the stage panel draws k x median and marks the frames
  over it) and a 6 MB/min RSS leak (``memory_rss`` FAILs: the RSS panel draws the floors,
  their trend and the tolerance). The synthetic leak grows in 1 MiB steps, so a shorter soak
  leaks faster, 60 steps over the run whatever its length (``LEAK_STEPS``): at 6 MB/min a
  20 s soak makes two steps, which memory_rss rightly reads as growth that stopped. Its
  ``criteria.contended_cpu_pct`` is 100: the spikes are planted in the workload, not made
  by the host, so they stay the model's on a busy machine (the other soak runs beside it);
* ``report-2streams``: two streams (``run.streams = 2``) at 12.5 fps each, stream 1's every
  200th frame raising (``errors`` and ``streams`` FAIL, stream 1 named the worst).

Each run's report is rendered with ``soakd report RUN -f html`` and photographed with
``chromium --headless --screenshot``; the PNGs (and the HTML beside them in ``--workdir``)
are written to ``--out`` (default docs/img). ``--reuse`` renders the databases already in
``--workdir`` again without soaking (after a change to the report). Exits 1 when a soak did
not FAIL on its planted criterion, 2 on a usage error (no chromium).
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.planted import BASE
from soakd.config import parse_duration

REPO = Path(__file__).resolve().parents[1]
WINDOW = (1100, 3000)  # px: the whole report of a one-stream staged run
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run")  # fmt: skip


LEAK_MB_PER_MIN = 6.0  # report-10min's leak in a soak of 10 minutes or more
LEAK_STEPS = 60  # ... and the 1 MiB steps (synthetic.py's chunks) it makes in any soak


@dataclass(frozen=True)
class Shot:
    name: str
    settings: tuple[str, ...]
    fails: frozenset[str]  # criteria the planted faults must fail
    leak: bool = False  # plant a leak of leak_mb_per_min(duration)


SHOTS = (
    Shot(
        "report-10min",
        # the spikes are planted, not the host's: a busy host does not make them INVALID
        ("workload.spike_every=50", "workload.spike_ms=100", "criteria.contended_cpu_pct=100"),
        frozenset({"jitter", "memory_rss"}),
        leak=True,
    ),
    Shot(
        "report-2streams",
        ("run.streams=2", "run.fps=12.5", "workload.error_stream=1", "workload.error_every=200"),
        frozenset({"errors", "streams"}),
    ),
)


def leak_mb_per_min(duration: str) -> float:
    """The planted leak's rate for a soak of ``duration``: ``LEAK_MB_PER_MIN``, or faster
    in a shorter soak so that it still makes ``LEAK_STEPS`` of the synthetic workload's
    1 MiB steps (a leak of two steps is a rise that stopped, not one that goes on)."""
    minutes = parse_duration(duration) / 60.0
    return max(LEAK_MB_PER_MIN, LEAK_STEPS / minutes) if minutes > 0 else LEAK_MB_PER_MIN


def _soak(shot: Shot, db: Path, duration: str) -> subprocess.Popen[str]:
    leak = (f"workload.leak_mb_per_min={leak_mb_per_min(duration):g}",) if shot.leak else ()
    sets = [a for kv in (*BASE, *shot.settings, *leak) for a in ("--set", kv)]
    cmd = [sys.executable, "-m", "soakd", "run", "--no-live", "--log-text", "--db", str(db),
           "--duration", duration, "--label", f"shot={shot.name}", *sets]  # fmt: skip
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def _failed(db: Path) -> tuple[str, set[str]]:
    """The latest soak run's verdict and the criteria it failed."""
    with sqlite3.connect(db) as conn:
        rid, verdict = conn.execute(
            "SELECT id, verdict FROM runs ORDER BY started_unix DESC LIMIT 1"
        ).fetchone()
        rows = conn.execute(
            "SELECT criterion FROM verdicts WHERE run_id = ? AND status = 'fail'", (rid,)
        )
        return str(verdict), {r[0] for r in rows}


def _render(db: Path, html: Path) -> None:
    cmd = [sys.executable, "-m", "soakd", "report", "--latest", "-f", "html", "-o", str(html),
           "--db", str(db)]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True, timeout=300)


def screenshot(chromium: str, html: Path, png: Path, profile: Path) -> None:
    """Chromium's headless screenshot of ``html`` (``WINDOW`` px) into ``png``."""
    png.unlink(missing_ok=True)
    cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
           f"--window-size={WINDOW[0]},{WINDOW[1]}", html.as_uri()]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot: {r.stderr.strip()[-500:]}")


def run(duration: str, out: Path, work: Path, reuse: bool, chromium: str) -> int:
    """Soak (unless ``reuse``), render and photograph every shot; 1 when a planted fault
    did not fail its criteria."""
    if not reuse:
        procs = [(s, _soak(s, work / f"{s.name}.db", duration)) for s in SHOTS]
        for s, p in procs:
            _, err = p.communicate()
            if p.returncode not in (0, 1, 3):
                print(f"{s.name}: soakd run exited {p.returncode}: {err[-500:]}", file=sys.stderr)
                return 1
    bad = 0
    out.mkdir(parents=True, exist_ok=True)
    for s in SHOTS:
        db = work / f"{s.name}.db"
        verdict, failed = _failed(db)
        ok = verdict == "FAIL" and s.fails <= failed
        bad += not ok
        html = work / f"{s.name}.html"
        _render(db, html)
        screenshot(chromium, html, out / f"{s.name}.png", work / "chromium-profile")
        note = "" if ok else f" (expected {sorted(s.fails)})"
        print(f"{s.name}: {verdict}, failed {sorted(failed)}{note} -> {out / s.name}.png")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--duration", default="10m", help="soak length (default 10m)")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="folder for PNGs")
    p.add_argument("--workdir", type=Path, default=None,
                   help="folder for the databases and HTML (default: a temporary one)")  # fmt: skip
    p.add_argument("--reuse", action="store_true",
                   help="render the databases already in --workdir, no new soak")  # fmt: skip
    a = p.parse_args(argv)
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        print("error: chromium is not installed (bash .ci/setup installs it)", file=sys.stderr)
        return 2
    try:
        parse_duration(a.duration)
    except ValueError as exc:
        print(f"error: --duration: {exc}", file=sys.stderr)
        return 2
    if a.reuse and a.workdir is None:
        print("error: --reuse needs --workdir", file=sys.stderr)
        return 2
    if a.workdir is not None:
        a.workdir.mkdir(parents=True, exist_ok=True)
        return run(a.duration, a.out, a.workdir, a.reuse, chromium)
    with tempfile.TemporaryDirectory() as tmp:
        return run(a.duration, a.out, Path(tmp), False, chromium)


if __name__ == "__main__":
    raise SystemExit(main())
