"""The samples soakd stores from a Prometheus text page (the server's /metrics), read at a
fraction of prometheus_client's cost and to the same result.

prometheus_client's parser reads every line character by character in Python (0.47 ms for
a 21-line page of vLLM's series on a 2-vCPU VM, once a second on a served run: issue 34;
0.06 ms here). Each line is matched whole by one regular expression that accepts only lines
prometheus_client accepts and reads alike; the kept samples' labels and values are taken
from the match. A page with any line the expressions do not vouch for (an exemplar, a
quoted name, a label escape other than ``\\\\``, ``\\n``, ``\\"``, a counter typed
without ``_total``, whose samples prometheus_client renames, text that is not Prometheus) is
read by prometheus_client whole, as before: the same rows, or the same ValueError.
"""

from __future__ import annotations

import re

#: one kept sample: (name as exported, labels, value)
Parsed = tuple[str, dict[str, str], float]

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# a label name prometheus_client accepts (``__``-prefixed names are reserved: it refuses them)
_LNAME = r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*"
_LVALUE = r'(?:[^"\\\n]|\\[\\n"])*'
_VALUE = (
    r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?(?:Inf|inf|NaN|nan)"
)
_SAMPLE = re.compile(
    rf'({_NAME})(?:\{{((?:{_LNAME}="{_LVALUE}")(?:,{_LNAME}="{_LVALUE}")*,?)?\}})?'
    rf"[ \t]+({_VALUE})(?:[ \t]+-?[0-9]+)?"
)
_LABEL = re.compile(rf'({_LNAME})="({_LVALUE})"')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_HELP = re.compile(rf"#[ \t]+HELP[ \t]+{_NAME}(?:[ \t].*)?")
_TYPE = re.compile(rf"#[ \t]+TYPE[ \t]+({_NAME})[ \t]+(counter|gauge|histogram|summary|untyped)")


def kept_samples(text: str, names: frozenset[str]) -> list[Parsed] | None:
    """The samples of ``text`` whose name is in ``names``, in page order, as
    prometheus_client reads them; None when a line is not one this reader vouches for (read
    the page with prometheus_client then)."""
    out: list[Parsed] = []
    for raw in text.split("\n"):  # as prometheus_client's StringIO iterates it
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            if not _comment_ok(line):
                return None
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None:
            return None
        name, labels, value = m.groups()
        if labels is None:
            if name in names:
                out.append((name, {}, float(value)))
            continue
        pairs = _LABEL.findall(labels)
        if len({k for k, _ in pairs}) != len(pairs):  # a label twice: prometheus_client refuses
            return None
        if name in names:
            out.append((name, {k: _unescape(v) for k, v in pairs}, float(value)))
    return out


def _comment_ok(line: str) -> bool:
    """A ``# HELP`` or ``# TYPE`` line prometheus_client reads alike (a counter named
    without ``_total`` is not: its samples get ``_total`` added), or a comment it ignores."""
    if _HELP.fullmatch(line):
        return True
    m = _TYPE.fullmatch(line)
    if m is not None:
        return m.group(2) != "counter" or m.group(1).endswith("_total")
    return "HELP" not in line and "TYPE" not in line


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _UNESCAPED[m.group(0)], value)
