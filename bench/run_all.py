"""Run every benchmark, one fresh process each, and summarise the targets.

``python -m bench.run_all [--quick] [--out DIR] [--only a,b] [--skip leak]`` writes
``DIR/NAME.json`` per benchmark and ``DIR/summary.json`` (every target, met or missed).
The full set takes about 45 minutes, 30 of them the leak run; ``--skip leak`` leaves it out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import format_table, machine

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS: tuple[str, ...] = (
    "store",
    "overhead",
    "pacing",
    "sampler",
    "telemetry_overhead",
    "verdict",
    "openai_client",
    "realtime_session",
    "dbsize",
    "leak",
)


def _names(csv: str | None) -> list[str]:
    if not csv:
        return []
    names = [n.strip() for n in csv.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)} (known: {BENCHMARKS})")
    return names


def run_one(name: str, out: Path, quick: bool) -> dict[str, Any]:
    """Run ``bench.NAME`` in a fresh interpreter; its JSON result (or why it failed)."""
    cmd = [sys.executable, "-m", f"bench.{name}", "--out", str(out)]
    if quick:
        cmd.append("--quick")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, check=False)
    if proc.returncode != 0 or not out.exists():
        return {"benchmark": name, "error": f"exit code {proc.returncode}", "targets": []}
    doc: dict[str, Any] = json.loads(out.read_text())
    doc.setdefault("elapsed_s", time.perf_counter() - t0)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="the smoke version of each")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="results folder")
    p.add_argument("--only", default=None, help="comma-separated benchmarks to run")
    p.add_argument("--skip", default=None, help="comma-separated benchmarks to leave out")
    args = p.parse_args(argv)
    only, skip = _names(args.only), _names(args.skip)
    names = [n for n in BENCHMARKS if (not only or n in only) and n not in skip]
    args.out.mkdir(parents=True, exist_ok=True)
    docs = [run_one(n, args.out / f"{n}.json", args.quick) for n in names]
    rows = []
    for d in docs:
        if "error" in d:
            rows.append({"benchmark": d["benchmark"], "target": "-", "value": d["error"]})
        for t in d.get("targets", []):
            met = {True: "yes", False: "MISSED", None: "n/a"}[t["met"]]
            rows.append(
                {
                    "benchmark": d["benchmark"],
                    "target": t["name"],
                    "value": t["value"],
                    "limit": f"{t['op']} {t['limit']:g} {t['unit']}",
                    "met": met,
                }
            )
    sys.stdout.write("\n== summary ==\n" + format_table(rows) + "\n")
    summary = {"quick": args.quick, "machine": machine(), "results": docs}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if any("error" in d for d in docs) else 0


if __name__ == "__main__":
    sys.exit(main())
