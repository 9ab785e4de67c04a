"""A served model's server sampled beside soakd (soakd/telemetry/server.py,
soakd/store/server_metrics.py): real processes, real sockets, a real HTTP /metrics page and
a real SQLite file."""

from __future__ import annotations

import http.server
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from soakd.clock import MonotonicClock
from soakd.config import Settings, load_settings
from soakd.errors import UsageError
from soakd.records import Sample, ServerMetric
from soakd.run.runner import run_soak
from soakd.store import db as store
from soakd.store import export, merge, prune
from soakd.store.server_metrics import load_server_metrics
from soakd.telemetry.probes import Values
from soakd.telemetry.sampler import Sampler
from soakd.telemetry.server import (
    ServerMetricsProbe,
    ServerNotFound,
    ServerProcessProbe,
    canonical_labels,
    find_server,
    server_probes,
)

from .conftest import make_run
from .openai_test_server import start_server
from .test_telemetry import make_fake_pynvml

MB = 1024**2
SERVER_KEYS = ("server_rss_bytes", "server_cpu_pct", "server_cgroup_mem_bytes")

# a stand-in server: holds 50 MB, listens on 127.0.0.1, and has a grandchild holding 20 MB
# that inherits the listening socket (as pre-forked workers do); prints "PORT GRANDCHILD"
_TREE = textwrap.dedent(
    """
    import socket, subprocess, sys, time
    held = bytearray(b"\\x01") * (50 << 20)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    worker = subprocess.Popen(
        [sys.executable, "-c",
         "import time; held = bytearray(b'\\\\x01') * (20 << 20); time.sleep(60)"],
        pass_fds=(s.fileno(),),
    )
    print(s.getsockname()[1], worker.pid, flush=True)
    time.sleep(60)
    """
)


@dataclass
class Tree:
    proc: subprocess.Popen[str]
    port: int
    child: int  # the grandchild of this test: the server's worker

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        for pid in (self.child, self.pid):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        self.proc.wait(5)


@pytest.fixture
def tree() -> Iterator[Tree]:
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port, child = map(int, proc.stdout.readline().split())
    t = Tree(proc, port, child)
    _wait_rss(child, 20 * MB)
    yield t
    t.kill()


def _wait_rss(pid: int, at_least: int) -> None:
    deadline = time.monotonic() + 5
    while psutil.Process(pid).memory_info().rss < at_least and time.monotonic() < deadline:
        time.sleep(0.01)


def openai(*overrides: str) -> Settings:
    return load_settings(overrides=["workload.kind=openai", *overrides])


def _at(port: int, *overrides: str) -> Settings:
    return openai(f"workload.base_url='http://127.0.0.1:{port}/v1'", *overrides)


def _sampled(probe: ServerProcessProbe) -> Values:
    into: Values = dict.fromkeys((*SERVER_KEYS, "server_gpu_mem_bytes"))
    probe.sample(into)
    return into


# --------------------------------------------------------------------------- the process


def test_the_server_is_found_by_pid_and_by_the_port_it_listens_on(tree: Tree) -> None:
    """server_pid names the server; without it, the process listening on the base_url's
    port is found, as the topmost of the processes that hold the socket."""
    assert find_server(_at(1, f"telemetry.server_pid={tree.pid}"))[0] == tree.pid
    assert find_server(_at(tree.port))[0] == tree.pid
    localhost = openai(f"workload.base_url='http://localhost:{tree.port}/v1'")
    assert find_server(localhost)[0] == tree.pid


def test_rss_is_summed_over_the_server_and_all_its_children(tree: Tree) -> None:
    """server_rss_bytes is the RSS of the server plus every descendant (psutil's own)."""
    probe = ServerProcessProbe(tree.pid, nvml=make_fake_pynvml(init_error="no driver"))
    got = _sampled(probe)["server_rss_bytes"]
    procs = [psutil.Process(tree.pid), psutil.Process(tree.child)]
    direct = sum(p.memory_info().rss for p in procs)
    assert got is not None and abs(got - direct) < 2 * MB
    assert got > procs[0].memory_info().rss + 15 * MB  # the worker's 20 MB is in it


def test_cpu_is_primed_when_built_so_the_first_tick_already_reports_it() -> None:
    """server_cpu_pct sums the tree's CPU since the previous reading; the probe's first
    reading (primed when it is built) already shows a busy server."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        probe = ServerProcessProbe(spin.pid)
        time.sleep(0.3)
        assert (_sampled(probe)["server_cpu_pct"] or 0) > 10  # unprimed: 0 (a loaded host: < 50)
    finally:
        spin.kill()
        spin.wait()


def test_without_proc_the_probe_reads_the_same_tree_through_psutil(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where /proc cannot be read (another OS), the server probe falls back to psutil: the
    same RSS summed over the server and its worker, a CPU figure, the keys None once the
    server is gone."""
    from soakd.telemetry import procfs

    monkeypatch.setattr(procfs, "read", lambda path: None)
    probe = ServerProcessProbe(tree.pid, nvml=make_fake_pynvml(init_error="no driver"))
    got = _sampled(probe)
    procs = [psutil.Process(tree.pid), psutil.Process(tree.child)]
    direct = sum(p.memory_info().rss for p in procs)
    assert got["server_rss_bytes"] is not None and abs(got["server_rss_bytes"] - direct) < 2 * MB
    assert isinstance(got["server_cpu_pct"], float)
    tree.kill()
    assert _sampled(probe) == dict.fromkeys((*SERVER_KEYS, "server_gpu_mem_bytes"))


def test_server_cpu_agrees_with_psutil_s_over_the_same_second() -> None:
    """server_cpu_pct of a spinning server over one second is psutil's cpu_percent of it
    over the same second, within 3 points or a quarter of it (read from /proc: user +
    system, per second)."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        probe = ServerProcessProbe(spin.pid)
        theirs = psutil.Process(spin.pid)
        time.sleep(0.2)
        _sampled(probe)
        theirs.cpu_percent(None)
        time.sleep(1.0)
        got = _sampled(probe)["server_cpu_pct"]
        want = theirs.cpu_percent(None)
    finally:
        spin.kill()
        spin.wait()
    # a spinner a busy host let run at all (5 %), read within 3 points or a quarter of it
    assert isinstance(got, float) and want > 5 and abs(got - want) <= max(3, want / 4), (
        got,
        want,
    )


def test_a_server_that_dies_mid_run_leaves_its_keys_none_without_raising(tree: Tree) -> None:
    """Once the server has exited (not yet reaped, then reaped) its keys are None, never 0,
    and sample() does not raise."""
    probe = ServerProcessProbe(tree.pid)
    assert _sampled(probe)["server_rss_bytes"]
    psutil.Process(tree.pid).kill()
    while psutil.Process(tree.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.01)
    assert _sampled(probe) == dict.fromkeys((*SERVER_KEYS, "server_gpu_mem_bytes"))
    tree.kill()
    assert _sampled(probe) == dict.fromkeys((*SERVER_KEYS, "server_gpu_mem_bytes"))


def test_a_pid_that_does_not_exist_is_a_one_line_usage_error() -> None:
    """telemetry.server_pid naming no process: ServerNotFound (a UsageError, exit 2), one
    line naming the pid."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    with pytest.raises(ServerNotFound) as e:
        server_probes(_at(1, f"telemetry.server_pid={pid}", "telemetry.server_metrics_url=off"))
    assert isinstance(e.value, UsageError)
    assert str(e.value) == f"server process {pid} (telemetry.server_pid): no such process"


def test_nothing_listening_or_a_remote_host_is_an_error_saying_how_to_name_the_server() -> None:
    """Auto finds nothing: the one line names the port and the settings that fix it; a
    remote host says it is not this host; server_process = "off" samples no process."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]  # bound, never listening
    with pytest.raises(ServerNotFound, match=rf"port {port}.*server_pid.*server_process"):
        find_server(_at(port))
    remote = openai("workload.base_url='http://192.0.2.1:8000/v1'")
    with pytest.raises(ServerNotFound, match=r'192\.0\.2\.1.*not this host.*"off"'):
        find_server(remote)
    off = openai(
        "workload.base_url='http://192.0.2.1:8000/v1'",
        "telemetry.server_process=off",
        "telemetry.server_metrics_url=off",
    )
    assert server_probes(off) == []
    free.close()


def test_gpu_memory_sums_the_server_s_processes_over_every_gpu(tree: Tree) -> None:
    """server_gpu_mem_bytes: NVML's usedGpuMemory of the server's pids on every GPU, not
    another process's. NVML is a FAKE here (tests.test_telemetry.make_fake_pynvml): this
    machine has no GPU."""
    procs = [(tree.pid, 3 * 1024**3), (tree.child, 1024**3), (1, 5 * 1024**3)]
    nvml = make_fake_pynvml(uuids=("GPU-a", "GPU-b"), procs=procs)
    assert _sampled(ServerProcessProbe(tree.pid, nvml=nvml))["server_gpu_mem_bytes"] == 8 * 1024**3


def test_gpu_memory_is_none_when_nvml_fails_and_unsupported_is_not_asked_again(
    tree: Tree,
) -> None:
    """NVML that does not start, or a GPU that does not support the query, leaves
    server_gpu_mem_bytes None silently; an unsupported query is asked once. (A FAKE NVML:
    no GPU here.)"""
    no_driver = make_fake_pynvml(init_error="NVML Shared Library Not Found")
    assert _sampled(ServerProcessProbe(tree.pid, nvml=no_driver))["server_gpu_mem_bytes"] is None
    unsupported = make_fake_pynvml(
        uuids=("GPU-a",), unsupported=frozenset({"nvmlDeviceGetComputeRunningProcesses"})
    )
    probe = ServerProcessProbe(tree.pid, nvml=unsupported)
    for _ in range(3):
        assert _sampled(probe)["server_gpu_mem_bytes"] is None
    assert unsupported.calls["nvmlDeviceGetComputeRunningProcesses"] == 1  # type: ignore[attr-defined]
    probe.close()
    assert unsupported.shutdowns == 1  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- /metrics

METRICS = """\
# HELP vllm:num_requests_running Requests in model execution.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="1"} 2.0
# HELP vllm:num_requests_waiting Requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# HELP vllm:num_preemptions_total Cumulative preemptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 11.0
# HELP python_gc_objects_collected_total Objects collected.
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 999.0
"""
NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total")


class _Page(http.server.BaseHTTPRequestHandler):
    server: _MetricsServer

    def do_GET(self) -> None:
        srv = self.server
        srv.requests += 1
        srv.authorization = self.headers.get("Authorization")
        if self.path != "/metrics":
            self.send_error(404)
            return
        if srv.delay_s:
            srv.release.wait(srv.delay_s)
        body = srv.text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


class _MetricsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    text = METRICS
    delay_s = 0.0
    requests = 0
    authorization: str | None = None
    release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"


@pytest.fixture
def page() -> Iterator[_MetricsServer]:
    srv = _MetricsServer(("127.0.0.1", 0), _Page)
    srv.release = threading.Event()
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def test_the_listed_series_are_kept_with_canonical_labels_and_nothing_else(
    page: _MetricsServer,
) -> None:
    """Every sample whose exported name (a counter with its _total) is listed becomes a
    row with the tick's seq and t and its labels sorted by key; an unlisted one does not."""
    probe = ServerMetricsProbe(page.url, NAMES)
    rows = probe.sample_server(4, 0.6)
    probe.close()
    assert sorted((m.name, m.labels, m.value) for m in rows) == [
        ("vllm:num_preemptions_total", 'engine="0",model_name="m"', 11.0),
        ("vllm:num_requests_running", 'engine="0",model_name="m"', 3.0),
        ("vllm:num_requests_running", 'engine="1",model_name="m"', 2.0),
        ("vllm:num_requests_waiting", 'engine="0",model_name="m"', 7.0),
    ]
    assert {(m.seq, m.t) for m in rows} == {(4, 0.6)}


def test_the_page_is_scraped_at_most_every_every_s_not_every_tick(page: _MetricsServer) -> None:
    """every_s = 1: ticks every 0.15 s from 0 to 2.1 s scrape at 0, 1.05 and 2.1 s only
    (the first tick at or after each second since the last), rows on those ticks alone."""
    probe = ServerMetricsProbe(page.url, NAMES, every_s=1.0)
    ticks = [round(0.15 * i, 2) for i in range(15)]
    got = [t for i, t in enumerate(ticks) if probe.sample_server(i, t)]
    probe.close()
    assert got == [0.0, 1.05, 2.1] and page.requests == 3, (got, page.requests)


def test_a_probe_s_scrapes_run_on_one_kept_thread_that_ends_at_close(
    page: _MetricsServer,
) -> None:
    """Five scrapes (every tick) run on one ``soakd-scrape`` thread, alive between them (no
    thread started a second, issue 34), which ends when the probe is closed."""

    def scrapers() -> set[int]:
        return {t.ident or 0 for t in threading.enumerate() if t.name == "soakd-scrape"}

    before = scrapers()
    probe = ServerMetricsProbe(page.url, NAMES)
    seen = []
    for seq in range(5):
        assert len(probe.sample_server(seq, 0.15 * seq)) == 4
        seen.append(scrapers() - before)
    assert page.requests == 5
    assert len(seen[0]) == 1 and all(s == seen[0] for s in seen), seen
    probe.close()
    deadline = time.monotonic() + 2.0
    while scrapers() - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not scrapers() - before


def test_a_metrics_url_s_user_and_password_go_as_basic_auth(page: _MetricsServer) -> None:
    """telemetry.server_metrics_url = http://user:p%40ss@host/metrics: each scrape sends
    ``Authorization: Basic`` of ``user:p@ss`` (the password unquoted) and gets the rows;
    a URL without them sends none."""
    port = page.server_address[1]
    probe = ServerMetricsProbe(f"http://user:p%40ss@127.0.0.1:{port}/metrics", NAMES)
    assert len(probe.sample_server(0, 0.0)) == 4
    assert page.authorization == "Basic dXNlcjpwQHNz"  # base64 of user:p@ss
    plain = ServerMetricsProbe(page.url, NAMES)
    assert len(plain.sample_server(0, 0.0)) == 4
    assert page.authorization is None


def test_labels_are_sorted_comma_joined_escaped_and_empty_for_none() -> None:
    """A label set's canonical form: k="v" by key, comma-joined, values escaped as the
    Prometheus text format escapes them, "" without labels."""
    assert canonical_labels({"b": "2", "a": "1"}) == 'a="1",b="2"'
    assert canonical_labels({"p": 'say "hi"\\now\n'}) == 'p="say \\"hi\\"\\\\now\\n"'
    assert canonical_labels({}) == ""


def test_a_scrape_that_fails_gives_no_rows_and_never_raises(page: _MetricsServer) -> None:
    """A refused connection, a 404 or text that is not Prometheus: () that tick."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    refused = f"http://127.0.0.1:{free.getsockname()[1]}/metrics"
    missing = page.url.replace("/metrics", "/nothing")
    for url in (refused, missing):
        assert ServerMetricsProbe(url, NAMES).sample_server(0, 0.0) == ()
    page.text = "<html>not metrics</html>"
    probe = ServerMetricsProbe(page.url, NAMES)
    assert probe.sample_server(0, 0.0) == () and probe.failures == 1
    free.close()


def test_a_hung_metrics_page_never_stalls_a_tick_and_one_scrape_is_in_flight(
    page: _MetricsServer,
) -> None:
    """A server whose /metrics does not answer: each tick returns within its wait with no
    rows, and no second scrape starts while the first is still waiting."""
    page.delay_s = 30
    probe = ServerMetricsProbe(page.url, NAMES, timeout_s=5, wait_s=0.1)
    for seq in range(4):
        t0 = time.perf_counter()
        assert probe.sample_server(seq, 0.0) == ()
        assert time.perf_counter() - t0 < 0.3
    assert page.requests == 1
    probe.close()


def test_a_scrape_slower_than_its_tick_s_wait_gives_its_rows_to_the_next_tick(
    page: _MetricsServer,
) -> None:
    """A slow but answering server loses no data: the late scrape's rows come with the
    next tick's seq."""
    page.delay_s = 0.25
    probe = ServerMetricsProbe(page.url, NAMES, timeout_s=2, wait_s=0.15)
    assert probe.sample_server(0, 0.0) == ()
    rows = probe.sample_server(1, 0.15)
    assert rows and {m.seq for m in rows} == {1} and page.requests == 1
    probe.close()


def test_the_sampler_keeps_its_rate_with_a_hung_metrics_page(page: _MetricsServer) -> None:
    """Through server_probes and the real Sampler: a tick with a hung /metrics takes at
    most half the interval, so no deadline is skipped; the tick's rows ride on Sample.server."""
    page.delay_s = 30
    s = _at(
        1,
        "telemetry.server_process=off",
        f"telemetry.server_metrics_url='{page.url}'",
        "run.sample_interval_ms=100",
    )
    samples: list[Sample] = []
    clock = MonotonicClock()
    sampler = Sampler(
        server_probes(s), interval_ms=100, clock=clock, t0_ns=clock.now_ns(),
        on_sample=samples.append,
    )  # fmt: skip
    sampler.start()
    time.sleep(1.0)
    sampler.stop()
    assert len(samples) >= 8 and sampler.skipped == 0
    assert max(x.tick_ms for x in samples) < 80
    assert all(x.server == () for x in samples)


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)


def test_the_default_metrics_url_is_scraped_only_when_it_answers_and_off_is_off(
    page: _MetricsServer,
) -> None:
    """Default <origin>/metrics: kept when it answers with Prometheus text, else (down, or
    a page that is not Prometheus) one info line and none; an explicit URL is kept even
    when it does not answer yet; "off" is never scraped; a workload that is not "openai"
    samples no server."""
    port = page.server_address[1]
    answering = server_probes(_at(port, "telemetry.server_process=off"))
    assert [p.name for p in answering] == ["server_metrics"]
    page.text = "<html>a catch-all page</html>"
    log = _Log()
    assert server_probes(_at(port, "telemetry.server_process=off"), log) == []
    assert len(log.lines) == 1
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    down = free.getsockname()[1]
    log = _Log()
    assert server_probes(_at(down, "telemetry.server_process=off"), log) == []
    assert len(log.lines) == 1 and f"127.0.0.1:{down}/metrics" in log.lines[0]
    named = f"telemetry.server_metrics_url='http://127.0.0.1:{down}/metrics'"
    assert [p.name for p in server_probes(_at(down, "telemetry.server_process=off", named))] == [
        "server_metrics"
    ]
    off = _at(port, "telemetry.server_process=off", "telemetry.server_metrics_url=off")
    assert server_probes(off) == []
    assert server_probes(load_settings(overrides=["workload.kind=synthetic"])) == []
    free.close()


# --------------------------------------------------------------------------- the store


def _write(db: Path, rid: str, rows: list[ServerMetric]) -> None:
    """rows through the run's real writer thread into db."""
    conn = store.connect(db)
    make_run(conn, id=rid)
    conn.close()
    w = store.StoreWriter(db, rid, flush_interval_s=0.05)
    w.start()
    for m in rows:
        w.put(m)
    w.close()
    assert w.error is None


ROWS = [
    ServerMetric(0, 0.1, "vllm:num_requests_waiting", 'engine="0"', 2.0),
    ServerMetric(0, 0.1, "vllm:num_requests_waiting", 'engine="1"', 3.0),
    ServerMetric(1, 0.25, "vllm:num_requests_waiting", 'engine="0"', 4.0),
    ServerMetric(0, 0.1, "vllm:kv_cache_usage_perc", "", 0.5),
    ServerMetric(1, 0.25, "vllm:kv_cache_usage_perc", "", 0.75),
    ServerMetric(2, 0.4, "vllm:kv_cache_usage_perc", "", float("nan")),  # stored NULL
]


def _table(db: Path, rid: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as c:
        return c.execute(
            "SELECT seq, t, name, labels, value FROM server_metrics WHERE run_id = ?"
            " ORDER BY name, labels, seq",
            (rid,),
        ).fetchall()


def test_rows_written_by_the_run_s_writer_load_back_per_name_summed_over_labels(
    db_path: Path,
) -> None:
    """load_server_metrics: per name, (t, value) by seq, each value summed over its label
    sets at that seq; a NULL (NaN) value is no point."""
    _write(db_path, "r1", ROWS)
    assert len(_table(db_path, "r1")) == len(ROWS)
    with sqlite3.connect(db_path) as c:
        got = load_server_metrics(c, "r1")
    assert {k: (t.tolist(), v.tolist()) for k, (t, v) in got.items()} == {
        "vllm:num_requests_waiting": ([0.1, 0.25], [5.0, 4.0]),
        "vllm:kv_cache_usage_perc": ([0.1, 0.25], [0.5, 0.75]),
    }


def test_merge_export_and_prune_carry_server_metrics(tmp_path: Path) -> None:
    """A merged run brings its server_metrics rows, export writes them in key order, and
    pruning the run deletes them."""
    src, out = tmp_path / "in.db", tmp_path / "out.db"
    _write(src, "r1", ROWS)
    list(merge.merge(out, [src]))
    assert _table(out, "r1") == _table(src, "r1")
    conn = store.connect(out)
    cols = [name for name, _ in export.columns(conn, "server_metrics")]
    exported = [
        dict(zip(cols, r, strict=True))
        for ch in export.iter_chunks(conn, "server_metrics", "r1")
        for r in ch
    ]
    assert [(r["seq"], r["name"], r["labels"]) for r in exported] == sorted(
        (m.seq, m.name, m.labels) for m in ROWS
    )
    deleted = prune.delete_runs(conn, prune.plan(conn, prune.Policy(keep_runs=0)).delete)
    assert deleted == ["r1"] and _table(out, "r1") == []
    conn.close()


# --------------------------------------------------------------------------- the run


def test_a_server_that_cannot_be_found_is_exit_2_before_any_run_row(db_path: Path) -> None:
    """run_soak of a served model whose server_pid names no process raises the one-line
    UsageError after the workload answered and before a runs row exists."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    with start_server() as server:
        s = load_settings(
            overrides=[
                "workload.kind=openai",
                f"workload.base_url='{server.base_url}'",
                f"telemetry.server_pid={pid}",
                f"run.db={str(db_path)!r}",
                "run.duration=2",
                "run.fps=5",
            ]
        )
        with pytest.raises(UsageError, match=rf"server process {pid}.*no such process"):
            run_soak(s)
    with sqlite3.connect(db_path) as c:
        assert c.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
