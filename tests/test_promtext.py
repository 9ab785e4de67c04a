"""soakd's reader of the server's /metrics page (``soakd/telemetry/promtext.py``) against
prometheus_client's parser, which it stands in for: the same rows, or the same error."""

from __future__ import annotations

import random
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from soakd.telemetry import promtext
from soakd.telemetry.server import canonical_labels, parse_series

NAMES = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:e2e_request_latency_seconds_bucket",
        "plain",
        "foo_total",
        "foo",
    }
)

# a vLLM-like page: HELP/TYPE, gauges, counters, a histogram, escapes, Inf, NaN, timestamps
VLLM = r"""# HELP vllm:num_requests_running Requests in model execution.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-VL-7B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen2.5-VL-7B"} 2
# HELP vllm:num_requests_waiting Requests "waiting" to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a \"quoted\" \\ name\nx"} 7 1700000000000
# HELP vllm:num_preemptions_total Cumulative preemptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m",} 1.1e1
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 4
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 9
vllm:e2e_request_latency_seconds_sum{model_name="m"} 2.5
vllm:e2e_request_latency_seconds_count{model_name="m"} 9
# a comment prometheus_client ignores
plain NaN
plain{x=""} -Inf
	other:metric{} +.5e-3
"""
# pages prometheus_client reads differently (a counter without _total) or refuses
ODD = [
    "# TYPE foo counter\nfoo 5\n",
    "# TYPE foo_total counter\nfoo_total 5\n",
    '{__name__="plain"} 1\n',
    'plain{a="1",a="2"} 1\n',
    'plain{__x="1"} 1\n',
    "plain 1_000\n",
    "plain 1 2 3\n",
    'plain{a="1"} 1 # {trace_id="x"} 2\n',
    "<html>not metrics</html>\n",
    '{"status": "ok"}',
    "",
    "# HELP\n",
    "# TYPE plain\n",
    "# TYPE plain gauge extra\nplain 1\n",
    "#\xa0x HELP 9bad\n",
    "plain\t4\r\n",
    'plain{a="\\x"} 1\n',
    'plain {a="1"} 1\n',
    'plain{a = "1"} 1\n',
]


def _reference(text: str, names: frozenset[str]) -> list[tuple[str, str, float]]:
    """What soakd stored before promtext: prometheus_client's reading."""
    return [
        (s.name, canonical_labels(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in names
    ]


def _outcome(read: Any, text: str) -> Any:
    try:
        return ("rows", [(n, lab, repr(v)) for n, lab, v in read(text, NAMES)])
    except Exception as exc:  # the error's kind is the outcome
        return ("raises", type(exc).__name__)


def _mutants(page: str, n: int, seed: int) -> list[str]:
    """``page`` with a few characters inserted, deleted or replaced at random, among them
    the ones the format turns on."""
    rng = random.Random(seed)
    chars = ' \t\n{}",=#\\_:.+-eE0aZ\xa0\r'
    out = []
    for _ in range(n):
        s = list(page)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(s) + 1)
            op = rng.choice("idr")
            if op == "i" or not s or i == len(s):
                s.insert(i, rng.choice(chars))
            elif op == "d":
                del s[i]
            else:
                s[i] = rng.choice(chars)
        out.append("".join(s))
    return out


def test_the_reader_vouches_for_a_vllm_page_and_reads_it_as_prometheus_client() -> None:
    """A vLLM-like page (histogram, escapes, Inf, NaN, a timestamp) is read by promtext
    itself (not handed back), to prometheus_client's rows exactly."""
    assert promtext.kept_samples(VLLM, NAMES) is not None
    assert _outcome(parse_series, VLLM) == _outcome(_reference, VLLM)
    assert len(parse_series(VLLM, NAMES)) == 8


def test_pages_read_differently_or_refused_give_prometheus_client_s_outcome() -> None:
    """A counter without _total (renamed), a label twice, a reserved label, an exemplar,
    HTML, JSON, odd comments: the rows or the error prometheus_client gives."""
    for text in ODD:
        assert _outcome(parse_series, text) == _outcome(_reference, text), text


def test_thousands_of_damaged_pages_give_prometheus_client_s_outcome() -> None:
    """Each of 3000 pages with one to three characters damaged gives prometheus_client's
    rows or its error; a good share of them are read by promtext itself."""
    fast = 0
    for i, text in enumerate(_mutants(VLLM, 3000, seed=34)):
        assert _outcome(parse_series, text) == _outcome(_reference, text), (i, text)
        fast += promtext.kept_samples(text, NAMES) is not None
    assert fast > 600, fast
