"""JUnit XML: one ``<testcase>`` per criterion, so CI systems show the verdict natively.

A failed criterion is a ``<failure>``, an invalid one an ``<error>``, a criterion that does
not apply ``<skipped>``; the evidence goes into the element's text.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from soakd.analysis.model import RunData, Verdict
from soakd.jsonsafe import clean_json


def render_junit(data: RunData, verdict: Verdict) -> str:
    """The JUnit XML document (UTF-8 text with an XML declaration)."""
    cs = verdict.criteria
    root = ET.Element("testsuites", name="soakd")
    suite = ET.SubElement(
        root,
        "testsuite",
        name=f"soakd.{verdict.run_id}",
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
        ("config_hash", data.meta.config_hash),
    ):
        ET.SubElement(props, "property", name=k, value=v)
    for c in cs:
        tc = ET.SubElement(
            suite, "testcase", classname=f"soakd.{verdict.run_id}", name=c.criterion, time="0"
        )
        body = json.dumps(
            clean_json(
                {
                    "value": c.value,
                    "threshold": c.threshold,
                    "unit": c.unit,
                    "warnings": c.warnings,
                    "evidence": c.evidence,
                }
            ),
            indent=1,
        )
        tag = {"fail": "failure", "invalid": "error", "n/a": "skipped"}.get(c.status)
        if tag:
            el = ET.SubElement(tc, tag, message=c.detail, type=c.status)
            if tag != "skipped":
                el.text = body
        else:
            ET.SubElement(tc, "system-out").text = f"{c.detail}\n{body}"
    out = ET.SubElement(suite, "system-out")
    out.text = "\n".join(
        [
            f"verdict: {verdict.status} ({verdict.reason})",
            *(f"warning: {w}" for w in verdict.warnings),
            *(f"hint: {h}" for h in verdict.hints),
        ]
    )
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"
