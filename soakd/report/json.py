"""The versioned JSON report (docs/report-schema.md): ``{"schema": "soakd.verdict/2", ...}``.

The schema string changes its number only on an incompatible change (a key removed or its
meaning changed); new keys may appear within a version. Version 2 added ``summary`` (the
run's numbers: ``soakd.report.summary``), ``environment`` and ``config``, and later
``streams`` (``run.streams``: each stream's own verdict).
"""

from __future__ import annotations

import json
from typing import Any

from soakd import __version__
from soakd.analysis.model import RunData, Verdict
from soakd.analysis.streams import stream_count, streams_of
from soakd.jsonsafe import clean_json
from soakd.report.summary import summarize

SCHEMA = "soakd.verdict/2"


def verdict_dict(data: RunData, verdict: Verdict) -> dict[str, Any]:
    """The report as a JSON-safe dict (NaN and infinities become null)."""
    m = data.meta
    numbers = summarize(data, verdict)
    return clean_json(
        {
            "schema": SCHEMA,
            "generator": f"soakd {__version__}",
            "run": {
                "id": m.run_id,
                "name": m.name,
                "mode": m.mode,
                "status": m.status,
                "reason": m.reason,
                "started_at": m.started_at,
                "duration_s": m.duration_s,
                "fps": m.fps,
                "workload_kind": m.workload_kind,
                "device": m.device,
                "host": m.host,
                "config_hash": m.config_hash,
            },
            "verdict": {
                "status": verdict.status,
                "exit_code": int(verdict.exit_code),
                "reason": verdict.reason,
            },
            "window": verdict.window,
            "streams": streams_block(data, verdict),
            "summary": numbers.as_dict(),
            "environment": numbers.environment,
            "config": numbers.config,
            "criteria": [
                {
                    "criterion": c.criterion,
                    "title": c.title,
                    "status": c.status,
                    "value": c.value,
                    "threshold": c.threshold,
                    "unit": c.unit,
                    "detail": c.detail,
                    "warnings": c.warnings,
                    "evidence": c.evidence,
                }
                for c in verdict.criteria
            ],
            "warnings": verdict.warnings,
            "hints": verdict.hints,
        }
    )


def streams_block(data: RunData, verdict: Verdict) -> dict[str, Any]:
    """``streams``: how many paced sources, the rate of each, and each one's own verdict
    (``per_stream`` is empty for one stream: the run's verdict is its verdict)."""
    return {
        "count": stream_count(data),
        "fps_each": data.meta.setting("run", "fps"),
        "per_stream": streams_of(verdict),
    }


def render_json(data: RunData, verdict: Verdict) -> str:
    """The JSON report text (indented, keys in a stable order, newline-terminated)."""
    return json.dumps(verdict_dict(data, verdict), indent=2, allow_nan=False) + "\n"
