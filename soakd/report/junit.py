"""JUnit XML: one ``<testcase>`` per criterion, so CI systems show the verdict natively.

A failed criterion is a ``<failure>``, an invalid one an ``<error>``, a criterion that does
not apply ``<skipped>``; the evidence goes into the element's text. The suite name and every
``classname`` are ``soakd.<run name>`` (or ``soakd.<workload kind>`` for an unnamed run), the
same from one run of a config to the next, so a CI system's test history lines up; the run
id is a suite property. Every piece of text passes through ``soakd.report.text.plain``: no
ANSI escape or control character can make the document ill-formed.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

from soakd.analysis.model import CriterionResult, RunData, Verdict
from soakd.jsonsafe import clean_json
from soakd.report.text import plain

CLASS_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def junit_classname(data: RunData) -> str:
    """``soakd.<run name or workload kind>``: stable across runs of one config; characters
    other than letters, digits, ``_ . -`` become ``_``."""
    label = data.meta.name or data.meta.workload_kind or "run"
    return "soakd." + (CLASS_UNSAFE.sub("_", plain(label)).strip("._") or "run")


def _body(c: CriterionResult) -> str:
    """The evidence as indented JSON (ASCII: control characters become ``\\u`` escapes)."""
    doc = {
        "value": c.value,
        "threshold": c.threshold,
        "unit": c.unit,
        "warnings": c.warnings,
        "evidence": c.evidence,
    }
    return json.dumps(clean_json(doc), indent=1)


def render_junit(data: RunData, verdict: Verdict) -> str:
    """The JUnit XML document (UTF-8 text with an XML declaration)."""
    cs = verdict.criteria
    classname = junit_classname(data)
    root = ET.Element("testsuites", name="soakd")
    suite = ET.SubElement(
        root,
        "testsuite",
        name=classname,
        tests=str(len(cs)),
        failures=str(sum(c.status == "fail" for c in cs)),
        errors=str(sum(c.status == "invalid" for c in cs)),
        skipped=str(sum(c.status == "n/a" for c in cs)),
        time=f"{data.meta.duration_s or 0:.3f}",
    )
    props = ET.SubElement(suite, "properties")
    for k, v in (
        ("verdict", verdict.status),
        ("exit_code", str(int(verdict.exit_code))),
        ("run_id", verdict.run_id),
        ("run_name", data.meta.name or ""),
        ("config_hash", data.meta.config_hash),
    ):
        ET.SubElement(props, "property", name=k, value=plain(v))
    for c in cs:
        tc = ET.SubElement(suite, "testcase", classname=classname, name=plain(c.criterion))
        tc.set("time", "0")
        body = _body(c)
        tag = {"fail": "failure", "invalid": "error", "n/a": "skipped"}.get(c.status)
        if tag:
            el = ET.SubElement(tc, tag, message=plain(c.detail), type=c.status)
            if tag != "skipped":
                el.text = body
        else:
            ET.SubElement(tc, "system-out").text = f"{plain(c.detail)}\n{body}"
    out = ET.SubElement(suite, "system-out")
    out.text = plain(
        "\n".join(
            [
                f"verdict: {verdict.status} ({verdict.reason})",
                *(f"warning: {w}" for w in verdict.warnings),
                *(f"hint: {h}" for h in verdict.hints),
            ]
        )
    )
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"
