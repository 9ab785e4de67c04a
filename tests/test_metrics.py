"""The Prometheus exporter: served over loopback HTTP, scraped with urllib, parsed with
prometheus_client's own exposition parser."""

from __future__ import annotations

import math
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from soakd.analysis.model import CriterionResult, Verdict
from soakd.config import RESERVED_LABELS, Settings
from soakd.errors import UsageError
from soakd.observers.base import Progress, RunInfo, RunResult
from soakd.observers.metrics import (
    METRIC_LABELS,
    RUN_LABELS,
    CriterionRow,
    MetricsObserver,
    MetricsServer,
    is_loopback,
    open_metrics,
    parse_metrics_addr,
    start_exporter,
    verdict_rows,
)
from soakd.records import Event, FrameRecord, Sample
from tests.conftest import REPO, soakd_cmd

Scrape = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Scrape:
    """GET /metrics and parse it: {(sample name, labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out: Scrape = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(data: Scrape, metric: str, /, **labels: str) -> float:
    """The one sample named ``metric`` whose labels include ``labels``."""
    hits = [v for (n, lbl), v in data.items() if n == metric and set(labels.items()) <= lbl]
    assert len(hits) == 1, f"{metric} {labels}: {len(hits)} samples"
    return hits[0]


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    srv = start_exporter("127.0.0.1:0")
    yield srv
    srv.close()


def _info(gpu: str | None = "NVIDIA H200") -> RunInfo:
    s = Settings.model_validate({"run": {"fps": 4, "duration": 60, "name": "moss"}})
    return RunInfo(
        run_id="run-1", settings=s, db_path=Path("x.db"), config_hash="abc123", gpu_name=gpu
    )


def _frame(i: int, *, drops: int = 0, stale: int = 0, error: str | None = None) -> FrameRecord:
    return FrameRecord(
        frame_id=i,
        t_sched=i * 0.25,
        t_capture=i * 0.25,
        t_dispatch=i * 0.25 + 0.004,
        t_done=i * 0.25 + 0.034,
        lateness_ms=0.1,
        grab_ms=1.0,
        pre_ms=3.0,
        infer_ms=20.0,
        decode_ms=2.0,
        total_ms=26.0,
        frame_age_ms=4.0,
        e2e_ms=34.0,
        drop_count=drops,
        stale_count=stale,
        error=error,
    )


def test_frames_samples_progress_and_verdict_are_exported(server: MetricsServer) -> None:
    """Fed records show up in base units with run/config/gpu labels, counters as increases."""
    obs = MetricsObserver(server)
    obs.on_run_start(_info())
    obs.on_frame(_frame(0))
    obs.on_frame(_frame(1, drops=2))
    obs.on_frame(_frame(2, drops=3, stale=1, error="boom"))
    obs.on_sample(Sample(0, 0.15, 0.0, 0.0, 0.2, {"rss_bytes": 123_456_789, "gpu_util_pct": 50.0}))
    obs.on_event(Event("stall", 5.0, 0.0, "no frame"))
    obs.on_progress(Progress(15.0, 45.0, 3, 4, 3.9, 3, 1, 1, 4.0, stalled_s=0.2, warmup=False))
    data = scrape(server.url)
    run = {"run": "run-1", "config": "abc123", "modelName": "NVIDIA H200"}

    assert value(data, "soakd_stage_latency_seconds_count", stage="infer", **run) == 3
    assert value(data, "soakd_stage_latency_seconds_sum", stage="infer", **run) == pytest.approx(
        0.060
    )
    assert value(data, "soakd_stage_latency_seconds_bucket", stage="infer", le="0.02", **run) == 3
    assert value(data, "soakd_stage_latency_seconds_bucket", stage="infer", le="0.01", **run) == 0
    assert value(data, "soakd_frame_age_seconds_sum", **run) == pytest.approx(0.012)
    assert value(data, "soakd_e2e_latency_seconds_count", **run) == 3
    assert value(data, "soakd_frames_total", **run) == 3
    assert value(data, "soakd_frame_errors_total", **run) == 1
    assert value(data, "soakd_dropped_frames_total", **run) == 3
    assert value(data, "soakd_stale_frames_total", **run) == 1
    assert value(data, "soakd_events_total", kind="stall", **run) == 1
    assert value(data, "soakd_rss_bytes", **run) == 123_456_789
    assert value(data, "soakd_gpu_utilization_ratio", **run) == pytest.approx(0.5)
    assert value(data, "soakd_achieved_frames_per_second", **run) == pytest.approx(3.9)
    assert value(data, "soakd_target_frames_per_second", **run) == 4
    assert value(data, "soakd_frame_age_p50_seconds", **run) == pytest.approx(0.004)
    assert value(data, "soakd_run_progress_ratio", **run) == pytest.approx(0.25)
    assert value(data, "soakd_run_status", status="running", **run) == 1
    assert value(data, "soakd_run_info", name="moss", workload="tiny-vlm", **run) == 1
    # a probe that never reported is absent, not zero
    assert not any(n == "soakd_gpu_memory_used_bytes" for n, _ in data)

    verdict = {
        "status": "FAIL",
        "criteria": [
            {"name": "memory_growth", "status": "fail", "value": 9.5, "threshold": 5.0,
             "unit": "MB/min"},
            {"name": "drops", "status": "pass", "value": 0.01, "threshold": 0.05},
        ],
    }  # fmt: skip
    obs.on_run_end(RunResult("run-1", "completed", None, 60.0, {}, verdict, 1))
    data = scrape(server.url)
    assert value(data, "soakd_run_status", status="completed", **run) == 1
    assert value(data, "soakd_run_status", status="running", **run) == 0
    assert value(data, "soakd_verdict", verdict="FAIL", **run) == 1
    assert value(data, "soakd_verdict", verdict="PASS", **run) == 0
    assert value(data, "soakd_criterion_status", criterion="memory_growth", status="fail") == 1
    assert value(data, "soakd_criterion_status", criterion="drops", status="pass") == 1
    assert value(
        data, "soakd_criterion_value", criterion="memory_growth", unit="bytes_per_second"
    ) == pytest.approx(9.5 * 2**20 / 60)
    assert value(data, "soakd_criterion_threshold", criterion="drops") == 0.05


def test_a_served_answer_s_tokens_and_a_realtime_answer_s_audio_are_exported(
    server: MetricsServer,
) -> None:
    """Output tokens are counted; a realtime turn's audio real-time factor is observed and
    its underruns counted; a frame with no turn adds neither."""
    obs = MetricsObserver(server)
    obs.on_run_start(_info())
    turn = {"turn": 1, "audio_s": 0.24, "audio_rtf": 0.8, "underruns": 2}
    obs.on_frame(_frame(0)._replace(out_tokens=6, extra=turn))
    obs.on_frame(_frame(1)._replace(out_tokens=4, extra={"turn": 2, "audio_rtf": 3.0,
                                                          "underruns": 0}))  # fmt: skip
    obs.on_frame(_frame(2)._replace(extra={"chunks": 3}))
    data = scrape(server.url)
    run = {"run": "run-1", "config": "abc123", "modelName": "NVIDIA H200"}
    assert value(data, "soakd_output_tokens_total", **run) == 10
    assert value(data, "soakd_turn_audio_realtime_factor_count", **run) == 2
    assert value(data, "soakd_turn_audio_realtime_factor_bucket", le="1.0", **run) == 1
    assert value(data, "soakd_turn_audio_underruns_total", **run) == 2


def test_an_auto_runs_last_look_is_exported_per_criterion(server: MetricsServer) -> None:
    """A ``duration = "auto"`` run's look: each criterion's standing one-hot, and each
    trend's detectable slope over its tolerance; the next look replaces both."""
    obs = MetricsObserver(server)
    obs.on_run_start(_info())
    run = {"run": "run-1", "config": "abc123", "modelName": "NVIDIA H200"}
    look = [["memory_rss", "undecided", 3.0, 1.5, "MB/min", "undecided"],
            ["drops", "decided", None, 0.05, "fraction", ""]]  # fmt: skip
    obs.on_event(Event("look", 60.0, 0.0, "", data={"criteria": look}))
    data = scrape(server.url)
    state = "soakd_look_standing"
    assert value(data, state, criterion="memory_rss", state="undecided", **run) == 1
    assert value(data, state, criterion="memory_rss", state="decided", **run) == 0
    assert value(data, state, criterion="drops", state="decided", **run) == 1
    assert value(data, "soakd_look_detectable_ratio", criterion="memory_rss", **run) == 2.0
    assert not any(
        n == "soakd_look_detectable_ratio" and ("criterion", "drops") in lb for n, lb in data
    )
    look[0][1:3] = ["decided", 1.2]
    obs.on_event(Event("look", 70.0, 0.0, "", data={"criteria": look}))
    data = scrape(server.url)
    assert value(data, state, criterion="memory_rss", state="decided", **run) == 1
    assert value(data, state, criterion="memory_rss", state="undecided", **run) == 0
    assert value(
        data, "soakd_look_detectable_ratio", criterion="memory_rss", **run
    ) == pytest.approx(0.8)


def test_a_labelled_runs_every_series_carries_its_labels(
    server: MetricsServer,
) -> None:
    """[run.labels] are labels of every soakd series, beside run, config and gpu."""
    obs = MetricsObserver(server)
    info = _info()
    info.settings = Settings.model_validate(
        {"run": {"fps": 4, "labels": {"release": "1.4.0", "cell": "h200-bf16"}}}
    )
    obs.on_run_start(info)
    obs.on_frame(_frame(0))
    obs.on_sample(Sample(0, 0.1, 0.0, 0.0, 0.1, {"rss_bytes": 1000}))
    obs.on_event(Event("stall", 5.0, 0.0, "no frame"))
    obs.on_progress(Progress(1.0, 59.0, 1, 1, 1.0, 0, 0, 0, 4.0))
    obs.on_run_end(RunResult("run-1", "completed", None, 60.0, {}, "PASS", 0))
    with urllib.request.urlopen(server.url, timeout=10) as resp:
        text = resp.read().decode()
    families = list(text_string_to_metric_families(text))
    samples = [smp for fam in families for smp in fam.samples]
    assert len(families) > 20 and all(fam.name.startswith("soakd_") for fam in families)
    assert samples and all(
        smp.labels["release"] == "1.4.0" and smp.labels["cell"] == "h200-bf16" for smp in samples
    )
    frames = next(smp for smp in samples if smp.name == "soakd_frames_total")
    assert frames.labels == {
        "run": "run-1", "config": "abc123", "modelName": "NVIDIA H200",
        "cell": "h200-bf16", "release": "1.4.0",
    }  # fmt: skip


def test_a_run_with_other_label_names_replaces_the_metrics() -> None:
    """A second run on the same observer with other label names is exported with its own
    names, the first run's series gone (one metric has one set of label names)."""
    obs = MetricsObserver()
    obs.on_run_start(_info())
    info = _info()
    info.run_id = "run-2"
    info.settings = Settings.model_validate({"run": {"fps": 4, "labels": {"release": "2"}}})
    obs.on_run_start(info)
    lbl = {"run": "run-2", "config": "abc123", "modelName": "NVIDIA H200", "release": "2"}
    assert obs.registry.get_sample_value("soakd_target_frames_per_second", lbl) == 4
    assert (
        obs.registry.get_sample_value(
            "soakd_target_frames_per_second",
            {"run": "run-1", "config": "abc123", "modelName": "NVIDIA H200"},
        )
        is None
    )


def test_every_label_name_of_soakd_series_is_reserved_from_run_labels() -> None:
    """A run label cannot collide with a label soakd's own series carry: config rejects it."""
    assert {*RUN_LABELS, *METRIC_LABELS} <= RESERVED_LABELS
    obs = MetricsObserver()
    obs.on_run_start(_info())
    obs.on_frame(_frame(0))
    obs.on_event(Event("stall", 5.0, 0.0, "no frame"))
    obs.set_verdict("PASS", [CriterionRow("c", "pass", 1.0, 2.0, "ms")])
    used = {k for m in obs.registry.collect() for smp in m.samples for k in smp.labels}
    assert used - {"le"} <= {*RUN_LABELS, *METRIC_LABELS}


def test_unknown_telemetry_after_known_becomes_nan(server: MetricsServer) -> None:
    """A probe that stops reporting is exported as NaN, never as a stale or zero value."""
    obs = MetricsObserver(server)
    obs.on_run_start(_info(gpu=None))
    obs.on_sample(Sample(0, 0.1, 0.0, 0.0, 0.1, {"rss_bytes": 1000}))
    obs.on_sample(Sample(1, 0.2, 0.0, 0.0, 0.1, {"rss_bytes": None}))
    data = scrape(server.url)
    assert math.isnan(value(data, "soakd_rss_bytes", modelName="none"))


def test_hooks_before_run_start_are_ignored() -> None:
    """Frames or samples before on_run_start (no labels yet) do not raise or export."""
    obs = MetricsObserver()
    obs.on_frame(_frame(0))
    obs.on_sample(Sample(0, 0.1, 0.0, 0.0, 0.1, {"rss_bytes": 1}))
    obs.on_progress(Progress(1.0, 1.0, 0, 0, 0.0, 0, 0, 0, None))
    assert obs.registry.get_sample_value("soakd_rss_bytes") is None


@dataclass
class _Crit:
    name: str
    status: str
    value: float | None
    threshold: float | None
    unit: str | None = None


@dataclass
class _Verdict:
    status: str
    criteria: list[_Crit] = field(default_factory=list)


def test_verdict_rows_reads_objects_and_mappings() -> None:
    """Verdict objects with attributes and name->criterion mappings both read the same."""
    overall, rows = verdict_rows(_Verdict("PASS", [_Crit("age_slope", "pass", 1.0, 50.0)]))
    assert overall == "PASS" and rows[0].name == "age_slope" and rows[0].threshold == 50.0
    overall, rows = verdict_rows({"verdict": "INVALID", "criteria": {"duration": {
        "status": "invalid", "value": None}}})  # fmt: skip
    assert overall == "INVALID" and rows[0].name == "duration" and rows[0].value is None
    assert verdict_rows("PASS") == ("PASS", [])


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        (":9464", ("127.0.0.1", 9464)),
        ("9464", ("127.0.0.1", 9464)),
        ("[::1]:9000", ("::1", 9000)),
        ("0.0.0.0:9464", ("0.0.0.0", 9464)),
    ],
)
def test_parse_metrics_addr(addr: str, expected: tuple[str, int]) -> None:
    """Host defaults to loopback; other interfaces only when named explicitly."""
    assert parse_metrics_addr(addr) == expected


@pytest.mark.parametrize(
    ("addr", "needle"),
    [
        ("127.0.0.1:http", "not a number"),
        ("127.0.0.1:70000", "out of range"),
        ("::1:9464", "brackets"),
        ("", "empty"),
        ("[::1", "[ipv6]:port"),
    ],
)
def test_bad_metrics_addr_is_a_one_line_usage_error(addr: str, needle: str) -> None:
    """A malformed address is a UsageError (exit 2) naming the flag and the problem."""
    with pytest.raises(UsageError, match="--metrics-addr") as err:
        parse_metrics_addr(addr)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == 2


def test_port_in_use_is_a_usage_error(server: MetricsServer) -> None:
    """Binding a port that is taken fails with a one-line UsageError, not a traceback."""
    with pytest.raises(UsageError, match="cannot listen"):
        start_exporter(f"127.0.0.1:{server.port}")


def test_default_bind_is_loopback_only() -> None:
    """Without a host the exporter listens on 127.0.0.1, unreachable from other hosts."""
    obs = open_metrics(":0")
    try:
        assert obs.server is not None
        assert obs.server.host == "127.0.0.1" and is_loopback(obs.server.host)
        with socket.create_connection(("127.0.0.1", obs.server.port), timeout=5):
            pass
    finally:
        obs.close()
    assert not is_loopback("0.0.0.0") and is_loopback("::1") and is_loopback("localhost")


def test_close_stops_serving() -> None:
    """close() joins the named server thread and frees the port."""
    srv = start_exporter("127.0.0.1:0")
    assert srv._thread.name == "soakd-metrics"
    srv.close()
    assert not srv._thread.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=2)


def test_verdict_from_soakd_analysis_is_exported() -> None:
    """The analysis package's own Verdict/CriterionResult map onto the verdict metrics."""
    crit = CriterionResult(
        criterion="memory_floor_slope", title="memory", status="fail", value=7.5,
        threshold=5.0, unit="MB/min", detail="floor grows",
    )  # fmt: skip
    verdict = Verdict(run_id="run-1", status="FAIL", exit_code=1, reason="memory", criteria=[crit])
    obs = MetricsObserver()
    obs.on_run_start(_info())
    obs.on_run_end(RunResult("run-1", "completed", None, 60.0, {}, verdict, 1))
    get = obs.registry.get_sample_value
    run = {"run": "run-1", "config": "abc123", "modelName": "NVIDIA H200"}
    assert get("soakd_verdict", {**run, "verdict": "FAIL"}) == 1
    assert (
        get("soakd_criterion_status", {**run, "criterion": "memory_floor_slope", "status": "fail"})
        == 1
    )
    assert get(
        "soakd_criterion_value",
        {**run, "criterion": "memory_floor_slope", "unit": "bytes_per_second"},
    ) == pytest.approx(7.5 * 2**20 / 60)


@pytest.mark.parametrize(
    ("unit", "value", "base", "expected"),
    [
        ("MB/min", 6.0, "bytes_per_second", 6.0 * 2**20 / 60),
        ("ms/min", 60.0, "seconds_per_second", 0.001),
        ("x median", 3.0, "ratio", 3.0),
        ("fraction", 0.02, "ratio", 0.02),
        ("h", 2.0, "seconds", 7200.0),
        ("s", 30.0, "seconds", 30.0),
        ("count", 4.0, "count", 4.0),
    ],
)
def test_criterion_value_and_threshold_are_exported_in_base_units(
    unit: str, value: float, base: str, expected: float
) -> None:
    """soakd_criterion_value/_threshold carry base units (seconds, bytes per second, ratio),
    never the verdict's ms/min, MB/min or x median, with the base unit as the unit label."""
    obs = MetricsObserver()
    obs.on_run_start(_info())
    obs.set_verdict("PASS", [CriterionRow("c", "pass", value, value, unit)])
    lbl = {"run": "run-1", "config": "abc123", "modelName": "NVIDIA H200", "criterion": "c"}
    get = obs.registry.get_sample_value
    assert get("soakd_criterion_value", {**lbl, "unit": base}) == pytest.approx(expected)
    assert get("soakd_criterion_threshold", {**lbl, "unit": base}) == pytest.approx(expected)
    assert unit == base or get("soakd_criterion_value", {**lbl, "unit": unit}) is None


def test_linger_serves_the_final_verdict_until_one_scrape_reads_it() -> None:
    """With linger_s, close() keeps serving until a scrape begun after the run's end is done."""
    obs = open_metrics("127.0.0.1:0", linger_s=60.0)
    assert obs.server is not None
    url = obs.server.url
    obs.on_run_start(_info())
    scrape(url)  # a scrape during the run does not release the linger
    obs.on_run_end(RunResult("run-1", "completed", None, 60.0, {}, "PASS", 0))
    closer = threading.Thread(target=obs.close, name="test-close")
    closer.start()
    assert closer.is_alive()  # waiting for Prometheus, up to 60 s
    data = scrape(url)
    closer.join(timeout=10)
    assert not closer.is_alive()
    assert value(data, "soakd_verdict", verdict="PASS") == 1
    assert value(data, "soakd_run_status", status="completed") == 1


def test_linger_is_bounded_when_nobody_scrapes() -> None:
    """Without a scrape the linger ends after linger_s (taken from service.metrics_linger_s)."""
    obs = open_metrics("127.0.0.1:0")
    info = _info()
    info.settings = Settings.model_validate({"service": {"metrics_linger_s": "200ms"}})
    obs.on_run_start(info)
    assert obs.linger_s == pytest.approx(0.2)
    obs.on_run_end(RunResult("run-1", "completed", None, 1.0, {}, None, 0))
    t0 = time.monotonic()
    obs.close()
    assert 0.15 < time.monotonic() - t0 < 5.0


PROMETHEUS_DOCS = Path(__file__).resolve().parent.parent / "docs" / "prometheus"


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not installed (Debian 'prometheus'; `bash .ci/setup --test` installs it)",
)
def test_documented_alert_rules_fire_on_the_patterns_they_name() -> None:
    """promtool accepts alerts.yml, recording.yml and their unit tests: rising age, drops,
    floor growth fire, a flat age, a 1 % drop rate and a pure allocator sawtooth do not; the
    recorded quantiles, drop share and floor are what they name, labels kept."""
    for args in (
        ["check", "rules", "alerts.yml", "recording.yml"],
        ["test", "rules", "alerts_test.yml"],
    ):
        proc = subprocess.run(
            ["promtool", *args],
            cwd=PROMETHEUS_DOCS,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def _metrics_logs(addr: str) -> tuple[MetricsServer, list[dict[str, object]]]:
    with capture_logs() as logs:
        srv = start_exporter(addr)
    return srv, logs


def test_port_0_logs_the_chosen_port_in_one_line_a_user_can_scrape() -> None:
    """``:0``: one line ``metrics on http://127.0.0.1:PORT/metrics`` at warning level (seen
    beside the live display), naming the port actually bound; no exposure warning."""
    srv, logs = _metrics_logs("127.0.0.1:0")
    try:
        assert [(e["log_level"], e["event"]) for e in logs] == [
            ("warning", f"metrics on http://127.0.0.1:{srv.port}/metrics")
        ]
        assert srv.port != 0
        scrape(f"http://127.0.0.1:{srv.port}/metrics")
    finally:
        srv.close()


def test_fixed_loopback_port_logs_where_it_serves_at_info_without_warning() -> None:
    """A named loopback port is logged at info only: nothing to warn about."""
    with socket.socket() as probe:  # a port free right now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    srv, logs = _metrics_logs(f"127.0.0.1:{port}")
    srv.close()
    assert [(e["log_level"], e["event"]) for e in logs] == [
        ("info", f"metrics on http://127.0.0.1:{port}/metrics")
    ]


def test_non_loopback_metrics_addr_warns_that_metrics_leave_this_host() -> None:
    """``0.0.0.0:0`` binds every interface: a warning says the metrics are exposed beyond
    this host (and how to keep them local), besides the line naming the chosen port."""
    srv, logs = _metrics_logs("0.0.0.0:0")
    try:
        events = [(e["log_level"], str(e["event"])) for e in logs]
        assert events[0] == ("warning", f"metrics on http://0.0.0.0:{srv.port}/metrics")
        assert len(events) == 2 and events[1][0] == "warning"
        assert events[1][1].startswith("metrics exposed beyond this host: listening on every")
        assert f"127.0.0.1:{srv.port}" in events[1][1]
        scrape(f"http://127.0.0.1:{srv.port}/metrics")
    finally:
        srv.close()


@pytest.mark.slow
def test_soakd_run_with_metrics_port_0_prints_the_port_it_serves_on(tmp_path: Path) -> None:
    """A real ``soakd run --metrics-addr 127.0.0.1:0``: stderr names the chosen port in one
    line while the run goes on, and that port answers a scrape with the run's metrics."""
    cmd = soakd_cmd(
        "run", "--db", str(tmp_path / "soakd.db"), "--duration", "6s", "--no-live",
        "--log-text", "--metrics-addr", "127.0.0.1:0", "--set", "run.log_every=0",
    )  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stderr is not None
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "metrics on http://127.0.0.1:" in line:
                break
        assert lines, "soakd wrote nothing on stderr"
        port = int(lines[-1].split("metrics on http://127.0.0.1:", 1)[1].split("/", 1)[0])
        # the exporter is up before the run row exists; the run's series follow at its start
        url, deadline = f"http://127.0.0.1:{port}/metrics", time.monotonic() + 60
        data = scrape(url)
        while not any(n == "soakd_run_status" for n, _ in data):
            assert time.monotonic() < deadline, "the run's metrics never appeared"
            time.sleep(0.2)
            data = scrape(url)
        assert value(data, "soakd_run_status", status="running") == 1
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) in (0, 1, 3), rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sum("metrics on http://" in ln for ln in [*lines, *rest.splitlines()]) == 1
    assert "exposed beyond this host" not in "".join(lines) + rest
