"""A release gate over many runs, rendered: a terminal table, Markdown (a pull-request
comment), versioned JSON (``soakd.gate/1``) and JUnit XML (one testcase per cell).

Every format says the same: one row per cell (cell, verdict, run, host, database, the
failing or invalid criteria with their values), then ``N cells: P passed, F failed, I
invalid, M missing``. Text from runs (names, labels, details) passes through
``soakd.report.text.plain`` (and Markdown escaping), as in the single-run reports.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from soakd import __version__
from soakd.analysis.fleet import (
    MISSING,
    SCHEMA,
    CellResult,
    FleetResult,
    Problem,
    RunRef,
    SetAside,
)
from soakd.analysis.model import OVERALL_FAIL, OVERALL_INVALID, OVERALL_PASS
from soakd.jsonsafe import clean_json
from soakd.report.junit import CLASS_UNSAFE
from soakd.report.markdown import BADGE
from soakd.report.markdown import md_cell as md
from soakd.report.text import plain

FLEET_FORMATS: tuple[str, ...] = ("table", "md", "json", "junit")
_STYLE = {
    OVERALL_PASS: "bold green",
    OVERALL_FAIL: "bold red",
    OVERALL_INVALID: "bold yellow",
    MISSING: "bold yellow",
}
_BADGES = {**BADGE, MISSING: "⚠️ MISSING"}


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v:.2%}" if unit == "fraction" else f"{v:.4g}"


def problem_text(p: Problem) -> str:
    """A failed criterion as ``criterion value unit (threshold T): detail``; an invalid one
    (nothing to compare: no data, untested, an aborted run) as ``criterion: detail``."""
    if p.status == "invalid" or p.value is None:
        return f"{p.criterion}: {p.detail}"
    unit = "" if p.unit == "fraction" else f" {p.unit}"
    value, threshold = _num(p.value, p.unit), _num(p.threshold, p.unit)
    return f"{p.criterion} {value}{unit} (threshold {threshold}): {p.detail}"


def why_text(c: CellResult) -> str:
    """What keeps a cell from passing: its failing / invalid criteria, else its reason
    (still running, no run); empty for a PASS."""
    if c.status == OVERALL_PASS:
        return ""
    return "; ".join(problem_text(p) for p in c.problems) or c.reason


def _selection(r: FleetResult) -> str:
    labels = ", ".join(f"{k}={v}" for k, v in sorted(r.labels.items()))
    plan = f"plan {r.plan}, " if r.plan else ""
    n = len(r.dbs)
    return f"{plan}labels {labels}, {n} database{'' if n == 1 else 's'}"


def _aside_line(s: SetAside) -> str:
    return f"{s.why}: {s.run.id} (cell {s.cell}, host {s.run.host or '?'}, {s.run.db})"


def _footer(r: FleetResult) -> list[str]:
    """Lines after the table: runs not in the plan, database notes, the reason unless PASS,
    and the summary line last."""
    lines = [_aside_line(s) for s in r.aside("not in plan")]
    lines += [f"note: {n}" for n in r.notes]
    if r.status != OVERALL_PASS:
        lines.append(f"{r.status}: {r.reason}")
    return [*lines, r.summary]


# --------------------------------------------------------------------------- table


def fleet_table(r: FleetResult) -> list[RenderableType]:
    """A heading line, the rich table (one row per cell), then the footer lines; text from
    runs goes in as ``Text``, so a ``[`` in a label is never read as console markup."""
    head = Text(plain(f"{r.status}  release gate: {_selection(r)}"), style=_STYLE.get(r.status, ""))
    table = Table(box=box.HEAVY_HEAD)
    for col in ("cell", "verdict", "run", "host", "db", "failing criteria"):
        table.add_column(col, overflow="fold", no_wrap=col in ("verdict", "run"))
    for c in r.cells:
        run = c.run
        where = [run.id, run.host or "?", run.db] if run else ["-"] * 3
        table.add_row(
            Text(plain(c.cell)),
            Text(c.status, style=_STYLE.get(c.status, "")),
            *(Text(plain(w)) for w in where),
            Text(plain(why_text(c))),
        )
    return [head, *([table] if r.cells else []), *(Text(plain(line)) for line in _footer(r))]


# --------------------------------------------------------------------------- markdown


def render_fleet_markdown(r: FleetResult) -> str:
    """A heading with the gate's verdict, the cell table, then the footer lines."""
    lines = [
        f"## soakd release gate: {_BADGES.get(r.status, r.status)}",
        "",
        f"{md(_selection(r))}, exit code {int(r.exit_code)}.",
        "",
        "| cell | verdict | run | host | db | failing criteria |",
        "|---|---|---|---|---|---|",
    ]
    for c in r.cells:
        run = c.run
        where = [f"`{run.id}`", md(run.host or "?"), md(run.db)] if run else ["–"] * 3
        lines.append(
            f"| {md(c.cell)} | {_BADGES.get(c.status, c.status)} | {' | '.join(where)} | "
            f"{md(why_text(c))} |"
        )
    footer = _footer(r)
    lines += ["", *(f"- {md(x)}" for x in footer[:-1]), "", f"**{md(footer[-1])}**"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- json


def _run_dict(run: RunRef | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {
        "id": run.id,
        "db": run.db,
        "host": run.host,
        "name": run.name,
        "status": run.status,
        "started_at": run.started_at,
        "duration_s": run.duration_s,
        "stored_verdict": run.stored_verdict,
        "labels": dict(run.labels),
    }


def _problem_dict(p: Problem) -> dict[str, Any]:
    return {
        "criterion": p.criterion,
        "status": p.status,
        "value": p.value,
        "threshold": p.threshold,
        "unit": p.unit,
        "detail": p.detail,
    }


def fleet_dict(r: FleetResult) -> dict[str, Any]:
    """The gate as a JSON-safe dict (``schema``: soakd.gate/1)."""
    return clean_json(
        {
            "schema": SCHEMA,
            "generator": f"soakd {__version__}",
            "verdict": {"status": r.status, "exit_code": int(r.exit_code), "reason": r.reason},
            "selection": {"labels": dict(r.labels), "plan": r.plan, "dbs": list(r.dbs)},
            "counts": {
                "cells": len(r.cells),
                **{w: r.count(s) for w, s in _COUNT_WORDS},
            },
            "cells": [
                {
                    "cell": c.cell,
                    "status": c.status,
                    "reason": c.reason,
                    "run": _run_dict(c.run),
                    "criteria": [_problem_dict(p) for p in c.problems],
                    "warnings": list(c.warnings),
                }
                for c in r.cells
            ],
            "superseded": [_aside_dict(s) for s in r.aside("superseded")],
            "not_in_plan": [_aside_dict(s) for s in r.aside("not in plan")],
            "notes": list(r.notes),
        }
    )


_COUNT_WORDS = (
    ("passed", OVERALL_PASS),
    ("failed", OVERALL_FAIL),
    ("invalid", OVERALL_INVALID),
    ("missing", MISSING),
)


def _aside_dict(s: SetAside) -> dict[str, Any]:
    return {"cell": s.cell, "run": _run_dict(s.run)}


def render_fleet_json(r: FleetResult) -> str:
    return json.dumps(fleet_dict(r), indent=2, allow_nan=False) + "\n"


# --------------------------------------------------------------------------- junit


def _suite_name(r: FleetResult) -> str:
    """``soakd.gate.<plan>`` or ``soakd.gate.<label values>``: the same from one gate of a
    release to the next, so a CI system's test history lines up."""
    what = r.plan or "_".join(v for _, v in sorted(r.labels.items())) or "all"
    return "soakd.gate." + (CLASS_UNSAFE.sub("_", plain(what)).strip("._") or "all")


def _testcase(suite: ET.Element, name: str, c: CellResult) -> None:
    run = c.run
    tc = ET.SubElement(suite, "testcase", classname=name, name=plain(c.cell))
    tc.set("time", f"{(run.duration_s or 0) if run else 0:.3f}")
    props = ET.SubElement(tc, "properties")
    values = {"verdict": c.status}
    if run is not None:
        labels = ",".join(f"{k}={v}" for k, v in sorted(run.labels.items()))
        values |= {"run_id": run.id, "host": run.host or "", "db": run.db, "labels": labels}
    for k, v in values.items():
        ET.SubElement(props, "property", name=k, value=plain(v))
    tag = {OVERALL_FAIL: "failure", OVERALL_INVALID: "error", MISSING: "error"}.get(c.status)
    lines = [*(problem_text(p) for p in c.problems)] or ([c.reason] if tag else [])
    body = plain("\n".join([*lines, *(f"warning: {w}" for w in c.warnings)]))
    if tag is not None:
        ET.SubElement(tc, tag, message=plain(why_text(c)), type=c.status).text = body
    elif body:
        ET.SubElement(tc, "system-out").text = body


def render_fleet_junit(r: FleetResult) -> str:
    """One testsuite, one testcase per cell: FAIL a ``<failure>``, INVALID and MISSING an
    ``<error>`` with the reason; properties run_id, host, db and labels. A gate that matched
    no run at all has one ``runs`` testcase in error, so CI never shows an empty green
    suite."""
    name = _suite_name(r)
    cells = list(r.cells) or [CellResult("runs", OVERALL_INVALID, r.reason)]
    root = ET.Element("testsuites", name="soakd")
    suite = ET.SubElement(
        root,
        "testsuite",
        name=name,
        tests=str(len(cells)),
        failures=str(sum(c.status == OVERALL_FAIL for c in cells)),
        errors=str(sum(c.status in (OVERALL_INVALID, MISSING) for c in cells)),
        skipped="0",
    )
    props = ET.SubElement(suite, "properties")
    for k, v in (
        ("verdict", r.status),
        ("exit_code", str(int(r.exit_code))),
        ("plan", r.plan or ""),
        ("labels", ",".join(f"{k}={v}" for k, v in sorted(r.labels.items()))),
    ):
        ET.SubElement(props, "property", name=k, value=plain(v))
    for c in cells:
        _testcase(suite, name, c)
    ET.SubElement(suite, "system-out").text = plain("\n".join(_footer(r)))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def render_fleet(fmt: str, r: FleetResult) -> str:
    """The gate as text in ``fmt``: md, json or junit (``table``: see ``fleet_table``)."""
    renderers: dict[str, Callable[[FleetResult], str]] = {
        "md": render_fleet_markdown,
        "json": render_fleet_json,
        "junit": render_fleet_junit,
    }
    if fmt not in renderers:
        raise ValueError(f"unknown gate format {fmt!r} (choose {', '.join(renderers)})")
    return renderers[fmt](r)
