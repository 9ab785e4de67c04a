"""systemd + Prometheus for real: the distribution's Prometheus server scrapes two concurrent
``soakd run --metrics-addr 127.0.0.1:0`` exporters every second, with the shipped rule files
(docs/prometheus/*.yml that hold rule groups) loaded unchanged. One soak is healthy, one has
a planted leak; both are labelled. Also: every query of the Grafana dashboard
(docs/prometheus/grafana-soakd.json) parses on that server and names a metric a real soakd
scrape serves or a shipped recording rule records.

SoakdMemoryFloorGrowing takes the slope of 2-minute floors sampled each minute, so its first
floor above the start comes 2-3 minutes into a run whatever the leak's rate: the alert test
waits that long (it mostly sleeps). Firing after its ``for:`` is promtool's part
(alerts_test.yml); here it must go pending on the leaking run, never on the healthy one.

Needs the ``prometheus`` binary (``bash .ci/setup --test`` installs the distribution's); skips
without it and fails instead when ``CI`` is set, since CI installs it. Root is not needed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from soakd.config import load_settings
from tests.conftest import REPO, SYNTH_CLI, soakd_cmd

PROM_DOCS = REPO / "docs" / "prometheus"
DASHBOARD = PROM_DOCS / "grafana-soakd.json"
RELEASE = "9.9.9-ci"
LEAK_MB_PER_MIN = 300  # steep: the first floor above the start already reads > 5 MiB/min
MEMORY_ALERT = "SoakdMemoryFloorGrowing"
SOAK_MINUTES = 10  # the documented release soak the alert must fire within
#: recording rules that need GPU telemetry, which a host without a GPU does not export
GPU_RECORDINGS = {"run:soakd_gpu_memory_used_bytes:floor_2m"}
#: what a dashboard variable or Grafana macro stands for when a query is checked
GRAFANA_VALUES = {"$__rate_interval": "1m", "$__interval": "15s", "$release": ".*", "$run": ".*"}


def require_prometheus() -> str:
    """The prometheus binary; skip without it, saying why, or fail when CI (which installs
    it) is set."""
    found = shutil.which("prometheus")
    if found is None:
        reason = "prometheus not installed (Debian 'prometheus'; `bash .ci/setup --test`)"
        if os.environ.get("CI"):
            pytest.fail(f"CI installs Prometheus, yet: {reason}")
        pytest.skip(reason)
    return found


def shipped_rules() -> list[dict[str, Any]]:
    """Every rule of the shipped rule files, as written."""
    groups = [g for f in shipped_rule_files() for g in yaml.safe_load(f.read_text())["groups"]]
    return [r for g in groups for r in g["rules"]]


def shipped_rule_files() -> list[Path]:
    """docs/prometheus/*.yml holding rule groups: the alerts and recording rules, not the
    promtool test or the scrape fragment."""
    files = [
        p for p in sorted(PROM_DOCS.glob("*.yml")) if "groups" in yaml.safe_load(p.read_text())
    ]
    assert {p.name for p in files} >= {"alerts.yml", "recording.yml"}
    return files


# ---------------------------------------------------------------------------------------
# Processes: each in its own process group, ended with it however the test leaves


@contextmanager
def process(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` with stdout and stderr to ``log``; on exit TERM its process group, KILL it
    after 15 s, and reap it."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
    try:
        yield proc
    finally:
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait_s)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


def wait_for(what: str, check: Callable[[], Any], timeout: float, log: Path | None = None) -> Any:
    """Poll ``check`` each 0.5 s until it returns something truthy; fail after ``timeout``
    seconds naming ``what`` (and the tail of ``log``)."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            pytest.fail(f"{what}: not within {timeout:.0f} s\n{tail}")
        time.sleep(0.5)
    return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Soak:
    cell: str
    port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_soak(stack: ExitStack, tmp: Path, cell: str, duration: str, *sets: str) -> Soak:
    """A labelled synthetic ``soakd run`` (ended with ``stack``) exporting on a port of its
    choosing, learned from its one ``metrics on http://127.0.0.1:PORT/metrics`` line."""
    log = tmp / f"soakd-{cell}.log"
    cmd = soakd_cmd(
        "run", "--db", str(tmp / f"{cell}.db"), "--duration", duration, "--fps", "10",
        "--no-live", "--log-text", "--metrics-addr", "127.0.0.1:0",
        "-l", f"release={RELEASE}", "-l", f"cell={cell}", *SYNTH_CLI,
        "--set", "run.sample_interval_ms=250", "--set", "workload.infer_ms=5",
        *(a for s in sets for a in ("--set", s)),
    )  # fmt: skip
    stack.enter_context(process(cmd, log))
    line = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")
    found = wait_for(f"soakd {cell} naming its port", lambda: line.search(log.read_text()), 60, log)
    return Soak(cell, int(found.group(1)))


class Prometheus:
    """A Prometheus server on a free loopback port (ended with ``stack``) scraping
    ``targets`` with the shipped rules, and its HTTP API."""

    def __init__(self, stack: ExitStack, binary: str, tmp: Path, targets: list[str]) -> None:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in shipped_rule_files()],
            "scrape_configs": [
                {"job_name": "soakd", "static_configs": [{"targets": targets}]}
            ] if targets else [],
        }  # fmt: skip
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log = tmp / "prometheus.log"
        cmd = [
            binary, f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]  # fmt: skip
        self.proc = stack.enter_context(process(cmd, self.log))
        wait_for("prometheus ready", self._ready, 60, self.log)

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/PATH: its ``data``, or the whole answer when it is not a success."""
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:  # 400 with {"status": "error", ...}
            body = json.load(exc)
        return body["data"] if body["status"] == "success" else body

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert "resultType" in data, f"{expr}: {data}"
        return list(data["result"])

    def rules(self) -> list[dict[str, Any]]:
        return [r for g in self.api("rules")["groups"] for r in g["rules"]]


def _when(iso: str) -> float:
    """An RFC 3339 time of the API (nanoseconds) -> unix seconds."""
    head, _, frac = iso.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float(f"0.{frac or 0}")


# ---------------------------------------------------------------------------------------
# The live test


@pytest.mark.slow
@pytest.mark.timeout(480)  # waits 2-3 min for the rule's look-back; slower on a loaded host
def test_prometheus_scrapes_two_labelled_soaks_and_the_leak_alert_goes_pending_on_the_leak(
    tmp_path: Path,
) -> None:
    """Both exporters' series carry their run labels; every recording rule records per run;
    every shipped rule evaluates with health ok; the memory alert goes pending for the leaking
    soak only, and its loaded ``for:`` after the look-back measured here fits a 10-minute
    soak's warm-up and length."""
    binary = require_prometheus()
    with ExitStack() as stack:
        healthy = start_soak(stack, tmp_path, "healthy", "4m")
        leak = start_soak(
            stack, tmp_path, "leak", "4m", f"workload.leak_mb_per_min={LEAK_MB_PER_MIN}"
        )
        prom = Prometheus(stack, binary, tmp_path, [healthy.target, leak.target])
        assert_series_carry_run_labels(prom, {healthy.cell: healthy.target, leak.cell: leak.target})
        assert_recording_rules_record_per_run(prom)
        assert_rules_healthy(prom)
        alert, seen = wait_for_alert(prom, leak.cell, timeout=240)
        assert not [a for a in seen if a["labels"].get("cell") == healthy.cell], seen
        assert_alert_fits_a_soak(prom, alert)


def assert_series_carry_run_labels(prom: Prometheus, targets: dict[str, str]) -> None:
    """Each soak's series come from its own exporter and every soakd series carries the run's
    labels (release, cell) beside run, config and gpu."""
    sel = f'soakd_run_info{{release="{RELEASE}"}}'
    wait_for("both soaks' soakd_run_info", lambda: len(prom.query(sel)) == 2, 30, prom.log)
    info = {r["metric"]["cell"]: r["metric"] for r in prom.query(sel)}
    assert {c: m["instance"] for c, m in info.items()} == targets
    assert all(m["run"] and m["config"] and m["modelName"] == "none" for m in info.values())
    assert len(prom.query('{__name__=~"soakd_.+"}')) > 50
    assert prom.query(f'{{__name__=~"soakd_.+", release!="{RELEASE}"}}') == []
    assert prom.query('{__name__=~"soakd_.+", cell!~"healthy|leak"}') == []


def assert_recording_rules_record_per_run(prom: Prometheus) -> None:
    """Every shipped recording rule (GPU floors aside on a host without GPU telemetry) has a
    recorded series for each soak, labels kept."""
    names = {r["name"] for r in prom.rules() if r["type"] == "recording"}
    if not prom.query("soakd_gpu_memory_used_bytes"):
        names -= GPU_RECORDINGS
    assert len(names) >= 6

    def missing() -> set[str]:
        return {n for n in names if len(prom.query(f'{n}{{release="{RELEASE}"}}')) < 2}

    wait_for("recorded series", lambda: not missing(), 60, prom.log)
    for n in names:
        cells = {r["metric"]["cell"] for r in prom.query(f'{n}{{release="{RELEASE}"}}')}
        assert cells == {"healthy", "leak"}, n


def assert_rules_healthy(prom: Prometheus) -> None:
    """Every loaded rule has been evaluated and its health is ok (none in error)."""

    def evaluated() -> bool:
        rules = prom.rules()
        bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] == "err"]
        assert not bad, bad
        return all(r["health"] == "ok" for r in rules)

    wait_for("every rule evaluated with health ok", evaluated, 30, prom.log)
    names = {r["name"] for r in prom.rules()}
    assert {MEMORY_ALERT, "SoakdStalled", "run:soakd_stage_latency_seconds:p95_1m"} <= names


def wait_for_alert(
    prom: Prometheus, cell: str, timeout: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Poll /api/v1/alerts until the memory alert is pending or firing for ``cell``: (that
    alert, every alert seen meanwhile)."""
    seen: list[dict[str, Any]] = []

    def check() -> dict[str, Any] | None:
        alerts = prom.api("alerts")["alerts"]
        seen.extend(alerts)
        hits = [a for a in alerts if a["labels"]["alertname"] == MEMORY_ALERT]
        return next((a for a in hits if a["labels"].get("cell") == cell), None)

    alert = wait_for(f"{MEMORY_ALERT} pending for the {cell} soak", check, timeout, prom.log)
    assert alert["state"] in ("pending", "firing")
    return alert, seen


def assert_alert_fits_a_soak(prom: Prometheus, alert: dict[str, Any]) -> None:
    """The default warm-up, the look-back this server took (first scrape of the leaking soak
    to the alert going pending) and the loaded rule's ``for:`` fit in a 10-minute soak."""
    rule = next(r for r in prom.rules() if r["name"] == MEMORY_ALERT)
    for_s = float(rule["duration"])
    run = alert["labels"]["run"]
    samples = prom.query(f'soakd_rss_bytes{{run="{run}"}}[10m]')[0]["values"]
    lookback_s = _when(alert["activeAt"]) - float(samples[0][0])
    warmup_s = load_settings().run.warmup_s
    print(f"{MEMORY_ALERT}: pending {lookback_s:.0f} s after the first scrape, for {for_s:.0f} s")
    assert for_s > 0 and warmup_s + lookback_s + for_s <= SOAK_MINUTES * 60


# ---------------------------------------------------------------------------------------
# The Grafana dashboard

#: PromQL words that are not metric names
_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
          "group_left", "group_right", "inf", "nan", "Inf", "NaN"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label
    matchers, ranges and grouping lists that are neither functions nor keywords."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    s = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    found = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", s):
        if m.group() not in _WORDS and not s[m.end() :].lstrip().startswith("("):
            found.add(m.group())
    return found


def grafana_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows' panels included, and for
    each query variable the selector of its ``label_values(SELECTOR, LABEL)``."""
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    out = [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["definition"])
            assert m, var["definition"]
            out.append((f"${var['name']}", m.group(1)))
    return out


def with_grafana_values(expr: str) -> str:
    for var, value in GRAFANA_VALUES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


#: the sample names of a metric family by its type (a family with no series yet has none)
SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def scraped_names(target: str) -> set[str]:
    """The names one scrape of a soakd exporter serves, a family's samples named by its type
    even before it has a series (no event yet), once its run has started (empty before)."""
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as resp:
        fams = list(text_string_to_metric_families(resp.read().decode()))
    names = {f.name + sfx for f in fams for sfx in SAMPLE_SUFFIXES.get(f.type, ("",))}
    return names if "soakd_run_info" in names else set()


@pytest.mark.slow
def test_every_dashboard_query_parses_and_names_a_served_or_recorded_metric(
    tmp_path: Path,
) -> None:
    """grafana-soakd.json: schemaVersion >= 36, $release and $run variables from run labels;
    each panel query (variables filled in) is accepted by a real Prometheus, and each metric
    it names is served by a real soakd scrape or recorded by a shipped rule."""
    binary = require_prometheus()
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "release" in variables["release"]["definition"]
    assert 'release=~"$release"' in variables["run"]["definition"]
    recorded = {r["record"] for r in shipped_rules() if "record" in r}
    with ExitStack() as stack:
        one = start_soak(stack, tmp_path, "healthy", "20s")
        served = wait_for("the soak's metrics", lambda: scraped_names(one.target), 30)
        prom = Prometheus(stack, binary, tmp_path, [])
        queries = grafana_queries(dashboard)
        for title, expr in queries:
            answer = prom.api("query", query=with_grafana_values(expr))
            assert "resultType" in answer, f"{title}: {expr}: {answer}"
    named = {n for _, expr in queries for n in metric_names(expr)}
    assert named - served - recorded == set()
    assert {
        "run:soakd_stage_latency_seconds:p50_1m", "run:soakd_stage_latency_seconds:p95_1m",
        "soakd_frame_age_p50_seconds", "soakd_target_frames_per_second",
        "soakd_achieved_frames_per_second", "run:soakd_dropped_frames:ratio_1m",
        "soakd_rss_bytes", "soakd_gpu_memory_used_bytes", "soakd_criterion_status",
        "soakd_verdict",
    } <= named  # fmt: skip
