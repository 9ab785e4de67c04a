"""A verdict row reads as one answer: where the value is not the number its detail quotes
(jitter: the ratio the rule judged beside the max ratio), the detail says which the value
is, in the console table, Markdown and HTML alike. A real judged run database."""

from __future__ import annotations

import re
from pathlib import Path

from soakd.report import render
from soakd.report.console import format_verdict_table
from tests.test_report import _load, _make_db


def test_the_jitter_rows_value_and_detail_name_one_number(tmp_path: Path) -> None:
    """The jitter row's value (the largest frame once the allowed ones are set aside) is
    named in its detail beside the max ratio the detail quotes, in every table."""
    from rich.console import Console

    rid = _make_db(tmp_path / "r.db", leak=False)
    data, v = _load(tmp_path / "r.db", rid)
    jit = v.get("jitter")
    assert jit is not None and jit.value is not None
    assert abs(jit.value - jit.evidence["max_ratio"]) > 0.01  # two numbers to tell apart
    said = f"value {jit.value:.4g} x median: the largest frame after the"
    con = Console(width=400, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    con.print(format_verdict_table(v))
    for text in (con.export_text(), render("md", data, v), render("html", data, v)):
        assert said in re.sub(r"\s+", " ", text)
