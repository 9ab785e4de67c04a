"""Making text from a run (its name, error messages, reasons) safe for a report format.

Run names and error messages come from users and their models: they may hold terminal
colour codes, bells and other control characters, or markup. ``plain`` removes ANSI escape
sequences and shows every other control character (except tab and newline) as ``\\xNN``,
so the text survives into XML 1.0 (which forbids most C0 controls, even as character
references) and stays readable in a table.
"""

from __future__ import annotations

import re

from soakd.analysis.model import CriterionResult

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), and two-character ESC sequences
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?")
# what XML 1.0 cannot carry, plus C1 controls and DEL (legal in XML but invisible)
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def _show(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def plain(text: str) -> str:
    """``text`` without ANSI escape sequences; other control characters (tab, newline and
    carriage return kept) written out as ``\\xNN``."""
    return _CONTROL_RE.sub(_show, _ANSI_RE.sub("", text))


def row_detail(c: CriterionResult) -> str:
    """A criterion's detail as the verdict tables print it beside its value: for jitter
    whose value (the ratio the rule judged: the largest frame once the allowed ones are set
    aside) is not the max ratio its detail quotes, the detail says which number the value
    is, so the row reads as one answer."""
    ev = c.evidence
    judged, top = c.value, ev.get("max_ratio")
    if c.criterion != "jitter" or not isinstance(judged, int | float):
        return c.detail
    if not isinstance(top, int | float) or abs(judged - top) <= 1e-9 * max(1.0, abs(top)):
        return c.detail
    allowed = ev.get("exceed_allowed")
    aside = (
        f" after the {allowed:g} largest, which the rule allows, are set aside" if allowed else ""
    )
    return f"{c.detail}; value {judged:.4g} x median: the largest frame{aside}"
