"""The Grafana dashboard (docs/prometheus/grafana-soakd.json) asks only for what soakd serves.

Every label name the dashboard uses (label matchers in ``expr``, ``by (...)`` and friends,
``{{label}}`` in a legend, the table columns it hides, orders or colours, its variables'
``label_values``) must be served by a live exporter, and every metric it queries must exist.
The exporter is a real ``soakd run --metrics-addr 127.0.0.1:0`` labelled ``release`` (the run
label the dashboard's ``$release`` selects), scraped over HTTP while it soaks and once more
after its verdict (``service.metrics_linger_s``). Metrics only a GPU host fills
(``soakd_gpu_*``, the torch allocator's) are absent from a CPU soak: their labels are read
from the same exporter code fed one telemetry sample with every value known, as NVML and
torch give on a GPU host (a real ``MetricsObserver`` on a real HTTP exporter), so on a GPU
host they are what it serves. Recorded series (``run:...``) are checked against
docs/prometheus/recording.yml: each keeps the labels of the served series it is computed from
(less ``le``). ``job`` and ``instance`` are Prometheus' own, added at scrape time.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from soakd.config import Settings
from soakd.observers.base import RunInfo
from soakd.observers.metrics import MetricsObserver, start_exporter
from soakd.records import SAMPLE_FIELDS, DeviceSample, Sample
from tests.conftest import REPO, SYNTH_CLI, soakd_cmd

DASHBOARD = REPO / "docs" / "prometheus" / "grafana-soakd.json"
RECORDING = REPO / "docs" / "prometheus" / "recording.yml"
#: labels Prometheus adds to every scraped series
SCRAPE_LABELS = frozenset({"job", "instance"})
RELEASE = "docs-check"

Served = dict[str, frozenset[str]]  # sample name -> its label names


# --------------------------------------------------------------------------- the exporter


def _scrape(url: str) -> Served:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return {k: frozenset(v) for k, v in out.items()}


def _merge(a: Served, b: Served) -> Served:
    return {k: a.get(k, frozenset()) | b.get(k, frozenset()) for k in {*a, *b}}


def _port_of(proc: subprocess.Popen[str]) -> int:
    """The port a ``--metrics-addr 127.0.0.1:0`` soak names on stderr."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if "metrics on http://127.0.0.1:" in line:
            return int(line.split("metrics on http://127.0.0.1:", 1)[1].split("/", 1)[0])
    raise AssertionError(f"soakd never said where it serves (exit {proc.wait()})")


def _scrape_until_the_verdict(url: str, proc: subprocess.Popen[str]) -> Served:
    """Every series seen from the first scrape until one that carries the verdict."""
    served: Served = {}
    deadline = time.monotonic() + 90
    while "soakd_verdict" not in served:
        assert time.monotonic() < deadline, "the verdict was never served"
        try:
            served = _merge(served, _scrape(url))
        except OSError:
            assert proc.poll() is None, "the exporter went away before serving the verdict"
        time.sleep(0.2)
    return served


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Served:
    """What a real ``soakd run`` labelled ``release`` serves, from start to verdict."""
    db = tmp_path_factory.mktemp("dash") / "soakd.db"
    cmd = soakd_cmd(
        "run", "--db", str(db), "--duration", "3s", "--fps", "20", "--no-live", "--log-text",
        "--metrics-addr", "127.0.0.1:0", "--label", f"release={RELEASE}",
        "--set", "service.metrics_linger_s=30", *SYNTH_CLI,
    )  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        served = _scrape_until_the_verdict(f"http://127.0.0.1:{_port_of(proc)}/metrics", proc)
        assert proc.wait(timeout=60) in (0, 1, 3)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return served


@pytest.fixture(scope="module")
def gpu_host() -> Iterator[Served]:
    """What the exporter serves once NVML and torch report: the same observer, fed one
    sample with every telemetry value and one per-GPU reading, scraped over HTTP."""
    server = start_exporter("127.0.0.1:0")
    try:
        obs = MetricsObserver(server)
        settings = Settings.model_validate({"run": {"labels": {"release": RELEASE}}})
        obs.on_run_start(
            RunInfo(
                run_id="gpu-run", settings=settings, db_path=Path("x.db"),
                config_hash="abc", gpu_name="NVIDIA H100 80GB HBM3",
            )
        )  # fmt: skip
        device = DeviceSample(
            0, 0.1, gpu=0, uuid="GPU-0", mem_used_bytes=1, mem_total_bytes=2, util_pct=3.0,
            proc_mem_bytes=4,
        )  # fmt: skip
        obs.on_sample(Sample(0, 0.1, 0.0, 0.0, 0.1, dict.fromkeys(SAMPLE_FIELDS, 1), (device,)))
        yield _scrape(server.url)
    finally:
        server.close()


# --------------------------------------------------------------------------- PromQL, lightly

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_WORD = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER = re.compile(r"(?<![\w:])\d[\w.]*")
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                       "and", "or", "unless", "offset", "inf", "nan"})  # fmt: skip
_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def parse_promql(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """``expr``'s metrics, each with the label names its selectors match on, and the label
    names of its grouping clauses (``by``, ``on``, ...)."""
    text = _STRING.sub('""', expr)
    grouping = {w.strip() for m in _GROUPING.finditer(text) for w in m.group(1).split(",")}
    text = _GROUPING.sub(" ", text)
    metrics: dict[str, set[str]] = {}
    for m in _SELECTOR.finditer(text):
        if m.group(1):
            metrics.setdefault(m.group(1), set()).update(_MATCHER.findall(m.group(2)))
    text = _RANGE.sub(" ", _SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", text))
    text = _NUMBER.sub(" ", text)
    for m in _WORD.finditer(text):
        is_call = text[m.end() :].lstrip().startswith("(")
        if not is_call and m.group().lower() not in _KEYWORDS:
            metrics.setdefault(m.group(), set())
    return metrics, grouping - {""}


def recorded(served: Served) -> Served:
    """Each recording rule's series with the labels of the served series its expr reads."""
    out: dict[str, frozenset[str]] = {}
    for group in yaml.safe_load(RECORDING.read_text())["groups"]:
        for rule in group["rules"]:
            metrics, _ = parse_promql(rule["expr"])
            missing = sorted(set(metrics) - set(served))
            assert not missing, f"recording rule {rule['record']} reads {missing}: not served"
            common = frozenset.intersection(*(served[m] for m in metrics)) - {"le"}
            out[rule["record"]] = common
    return out


# --------------------------------------------------------------------------- the dashboard

#: Grafana's own table columns (not labels): the time, the metric name, each query's value
_GRAFANA_FIELDS = re.compile(r"^(Time|__name__|Value( #\w+)?)$")


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _table_columns(panel: dict[str, Any]) -> set[str]:
    """Label names a table panel's transformations and overrides name as columns."""
    names: set[str] = set()
    for t in panel.get("transformations", []):
        opts = t.get("options", {})
        for key in ("excludeByName", "indexByName", "renameByName"):
            names.update(opts.get(key, {}))
    for o in panel.get("fieldConfig", {}).get("overrides", []):
        if o.get("matcher", {}).get("id") == "byName":
            names.add(o["matcher"]["options"])
    return {n for n in names if not _GRAFANA_FIELDS.match(n)}


#: where, each metric with the labels its selector matches on, the other labels it names
Use = tuple[str, dict[str, set[str]], set[str]]


def dashboard_uses(dashboard: dict[str, Any]) -> list[Use]:
    """Each query (its matchers; its grouping and legend labels), each table panel (the
    columns it names) and each variable (``label_values(SELECTOR, LABEL)``)."""
    uses: list[Use] = []
    for panel in _panels(dashboard["panels"]):
        title, panel_metrics = panel.get("title", "?"), set()
        for t in panel.get("targets", []):
            metrics, grouping = parse_promql(t["expr"])
            legend = set(_LEGEND.findall(t.get("legendFormat", "")))
            uses.append((f"{title} [{t.get('refId')}]", metrics, grouping | legend))
            panel_metrics |= set(metrics)
        if columns := _table_columns(panel):
            unmatched: dict[str, set[str]] = {m: set() for m in panel_metrics}
            uses.append((f"{title} (table columns)", unmatched, columns))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["definition"].strip())
            assert m, f"${var['name']}: not a label_values() query"
            uses.append((f"${var['name']}", parse_promql(m.group(1))[0], {m.group(2)}))
    return uses


def _problems(uses: list[Use], known: Served) -> list[str]:
    """Each metric neither served nor recorded, each matcher label its metric lacks, and
    each other label that no metric of its query carries."""
    out = []
    for where, metrics, labels in uses:
        for m, matched in sorted(metrics.items()):
            if m not in known:
                out.append(f"{where}: metric {m} is neither served nor recorded")
                continue
            out += [f"{where}: label {lbl!r} is not on ['{m}']" for lbl in
                    sorted(matched - known[m] - SCRAPE_LABELS)]  # fmt: skip
        offered = set().union(*(known.get(m, frozenset()) for m in metrics)) | SCRAPE_LABELS
        out += [f"{where}: label {lbl!r} is not on {sorted(metrics)}" for lbl in
                sorted(labels - offered)]  # fmt: skip
    return out


def _known(live: Served, gpu_host: Served) -> Served:
    """Served live, else by a GPU host's exporter, plus the recorded series."""
    served = {**gpu_host, **live}
    return {**served, **recorded(served)}


@pytest.mark.slow
def test_every_dashboard_label_and_metric_is_served_by_a_live_exporter(
    live: Served, gpu_host: Served
) -> None:
    """Each metric the dashboard queries is served (or recorded) and each label it uses in a
    matcher, grouping, legend, table column or variable is on that metric."""
    assert "release" in live["soakd_run_info"] and "modelName" in live["soakd_rss_bytes"]
    uses = dashboard_uses(json.loads(DASHBOARD.read_text()))
    assert len(uses) > 20, "the dashboard's queries were not found"
    assert _problems(uses, _known(live, gpu_host)) == []


@pytest.mark.slow
def test_a_label_the_exporter_does_not_serve_is_reported(live: Served, gpu_host: Served) -> None:
    """The check above can fail: the old ``{{gpu}}`` legend (the exporter serves
    ``modelName``) and a matcher on a metric soakd never served are both named."""
    text = DASHBOARD.read_text()
    assert "GPU used ({{modelName}})" in text
    broken = text.replace("GPU used ({{modelName}})", "GPU used ({{gpu}})").replace(
        "soakd_run_stalled_seconds{", "soakd_run_stall_seconds{"
    )
    problems = _problems(dashboard_uses(json.loads(broken)), _known(live, gpu_host))
    assert any("label 'gpu' is not on ['soakd_gpu_memory_used_bytes']" in p for p in problems)
    assert any("soakd_run_stall_seconds is neither served nor recorded" in p for p in problems)


def test_promql_reader_finds_metrics_matchers_groupings_and_skips_functions() -> None:
    """The light PromQL reader sees metrics inside functions and binary operations, their
    matchers, ``by``/``on`` lists, and no function name, range or string as a metric."""
    metrics, grouping = parse_promql(
        'sum by (run, stage) (rate(a_total{x=~"$v", y!="b"}[$__rate_interval]))'
        ' / on(run) group_left(cell) b:c:d{z="1"} > 0.5 and bool 1e3'
    )
    assert metrics == {"a_total": {"x", "y"}, "b:c:d": {"z"}}
    assert grouping == {"run", "stage", "cell"}
