"""The Prometheus exporter: the fleet's view of a run.

``start_exporter("127.0.0.1:9464")`` serves ``/metrics`` from its own ``CollectorRegistry``
on a named thread (``soakd-metrics``); ``MetricsObserver`` fills that registry from the
runner's hooks. Everything is in base units (``_seconds``, ``_bytes``, ``_total``, ratios
0..1) and labelled with ``run`` (run id), ``config`` (config hash) and ``modelName`` (the
GPU model, as dcgm-exporter names it, or ``none``), then the run's own labels
(``[run.labels]`` / ``--label``, e.g. ``release``) in name order, so that one Prometheus can
watch many ``soakd@`` units across GPU hosts and a dashboard can select ``release="1.4.0"``.
Run labels are constant for a run, so they add no series beyond the run's own; the host is
Prometheus's ``instance`` label, not soakd's.

Metric                                           type       extra labels
-----------------------------------------------  ---------  ----------------------------
soakd_stage_latency_seconds                      histogram  stage = grab|pre|infer|decode|total
soakd_frame_age_seconds                          histogram  (dispatch - capture)
soakd_e2e_latency_seconds                        histogram  (done - scheduled capture)
soakd_frames_total                               counter    frames finished (not skipped)
soakd_frame_errors_total                         counter
soakd_dropped_frames_total                       counter    dropped by the latest-frame queue
soakd_stale_frames_total                         counter    skipped as older than max_age_ms
soakd_events_total                               counter    kind = stall|oom|error|signal|...
soakd_output_tokens_total                        counter    a served model's answers' tokens
soakd_turn_audio_realtime_factor                 histogram  a realtime answer's audio seconds
                                                            per wall second (< 1: it stutters)
soakd_turn_audio_underruns_total                 counter    a realtime answer's underruns
soakd_achieved_frames_per_second                 gauge
soakd_target_frames_per_second                   gauge
soakd_frame_age_p50_seconds                      gauge      rolling median of the runner
soakd_rss_bytes                                  gauge
soakd_gpu_memory_used_bytes / _total_bytes       gauge
soakd_gpu_process_memory_bytes                   gauge
soakd_gpu_utilization_ratio                      gauge      0..1
soakd_torch_allocated_bytes / _reserved_bytes    gauge
soakd_server_rss_bytes                           gauge      a served model's server processes
soakd_server_cpu_ratio                           gauge      its CPU, in cores
soakd_server_gpu_memory_bytes                    gauge      its GPU memory (NVML)
soakd_gpu_device_memory_used_bytes / _total_bytes  gauge    gpu = NVML index, UUID (below)
soakd_gpu_device_process_memory_bytes            gauge      gpu, UUID
soakd_gpu_device_utilization_ratio               gauge      gpu, UUID; 0..1
soakd_run_elapsed_seconds / _remaining_seconds   gauge
soakd_run_progress_ratio                         gauge      0..1
soakd_run_stalled_seconds                        gauge      seconds since a frame finished
soakd_run_warmup                                 gauge      1 during warm-up
soakd_run_status                                 gauge      status = running|completed|aborted|...
soakd_run_info                                   gauge      name, workload, hostname (always 1)
soakd_verdict                                    gauge      verdict = PASS|FAIL|INVALID (one-hot)
soakd_criterion_status                           gauge      criterion, status (one-hot)
soakd_criterion_value / _threshold               gauge      criterion, unit (base unit:
                                                            seconds, bytes_per_second,
                                                            seconds_per_second, ratio, count)
soakd_look_standing                              gauge      criterion, state = decided|
                                                            failing|undecided (one-hot), at
                                                            a duration = "auto" run's last
                                                            look
soakd_look_detectable_ratio                      gauge      criterion: a trend's smallest
                                                            detectable slope / its tolerance
                                                            (decided below 1)

The process normally exits right after the verdict, before any scrape could read it; with
``service.metrics_linger_s`` > 0 the exporter keeps serving after the run's end until one
scrape has read the final metrics (status, verdict per criterion) or that many seconds pass.

A telemetry value that is unknown (no GPU, a probe failed) is not exported until it is first
known, and exported as NaN if it becomes unknown later: absent never reads as zero.

A run that samples several GPUs (``run.gpus``) exports the ``soakd_gpu_device_*`` series,
one per GPU, whose ``gpu`` label is the GPU's NVML index and ``UUID`` its UUID, spelled as
NVIDIA's dcgm-exporter spells them (``DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-..."}``), so
the two join in PromQL: ``soakd_gpu_device_memory_used_bytes * on(UUID) group_left
DCGM_FI_DEV_GPU_UTIL``. No other series has a ``gpu`` label; they carry ``modelName``.
"""

from __future__ import annotations

import ipaddress
import math
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from soakd.errors import UsageError
from soakd.observers.base import Observer, Progress, RunInfo, RunResult
from soakd.records import (
    DECIDED,
    FAILING,
    LOOK_EVENT,
    STAGES,
    UNDECIDED,
    DeviceSample,
    Event,
    FrameRecord,
    Sample,
    Standing,
    standings,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464

#: Latency buckets (seconds): real-time video stages live between a millisecond and seconds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, math.inf,
)  # fmt: skip
#: a realtime answer's audio real-time factor: under 1 the listener hears it stutter
RTF_BUCKETS: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0, 4.0, 8.0, math.inf)

#: modelName: the run's GPU model, as dcgm-exporter names it; `gpu` is only ever the NVML
#: index (on the per-GPU series), so soakd's and dcgm-exporter's series join on it
RUN_LABELS: tuple[str, ...] = ("run", "config", "modelName")
#: the labels some series carry beside the run's: a run label may take none of these names
#: (soakd.config.RESERVED_LABELS holds them all, so a bad name is a config error)
METRIC_LABELS: tuple[str, ...] = (
    "stage", "kind", "status", "name", "workload", "hostname", "verdict", "criterion", "unit",
    "gpu", "UUID",
)  # fmt: skip
RUN_STATUSES: tuple[str, ...] = ("running", "completed", "aborted", "crashed")
VERDICTS: tuple[str, ...] = ("PASS", "FAIL", "INVALID")
CRITERION_STATUSES: tuple[str, ...] = ("pass", "fail", "invalid", "n/a")

# samples.<column> -> (gauge name, help, scale to base unit)
_SAMPLE_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("rss_bytes", "soakd_rss_bytes", "Resident set size of the soakd process.", 1.0),
    ("gpu_mem_used_bytes", "soakd_gpu_memory_used_bytes", "GPU memory in use (device).", 1.0),
    ("gpu_mem_total_bytes", "soakd_gpu_memory_total_bytes", "GPU memory (device).", 1.0),
    ("gpu_proc_mem_bytes", "soakd_gpu_process_memory_bytes", "GPU memory of this process.", 1.0),
    ("gpu_util_pct", "soakd_gpu_utilization_ratio", "GPU utilisation, 0..1.", 0.01),
    ("torch_allocated_bytes", "soakd_torch_allocated_bytes", "torch allocator: allocated.", 1.0),
    ("torch_reserved_bytes", "soakd_torch_reserved_bytes", "torch allocator: reserved.", 1.0),
    ("server_rss_bytes", "soakd_server_rss_bytes",
     "Resident set size of the model server's processes (kind = openai).", 1.0),
    ("server_cpu_pct", "soakd_server_cpu_ratio",
     "CPU of the model server's processes, in cores (1 = one core busy).", 0.01),
    ("server_gpu_mem_bytes", "soakd_server_gpu_memory_bytes",
     "GPU memory of the model server's processes (NVML).", 1.0),
)  # fmt: skip

# gpu_samples.<column> -> (gauge name, help, scale to base unit): one series per GPU
_DEVICE_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("mem_used_bytes", "soakd_gpu_device_memory_used_bytes", "GPU memory in use, per GPU.", 1.0),
    ("mem_total_bytes", "soakd_gpu_device_memory_total_bytes", "GPU memory, per GPU.", 1.0),
    ("proc_mem_bytes", "soakd_gpu_device_process_memory_bytes",
     "GPU memory of this process, per GPU.", 1.0),
    ("util_pct", "soakd_gpu_device_utilization_ratio", "GPU utilisation per GPU, 0..1.", 0.01),
)  # fmt: skip

#: the states of a criterion at a look (soakd_look_standing)
LOOK_STATES = (DECIDED, FAILING, UNDECIDED)


# ---------------------------------------------------------------------------------------
# The address and the server


def parse_metrics_addr(addr: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"``, ``"[::1]:9464"``, ``":9464"`` or ``"9464"`` -> (host, port).

    Without a host the exporter binds loopback (``127.0.0.1``); listening on another
    interface (``0.0.0.0:9464``) must be asked for by naming it. Raises ``UsageError`` with
    a one-line message for anything else.
    """
    text = addr.strip()
    where = f"--metrics-addr {addr!r}"
    if not text:
        raise UsageError(f"{where}: empty; expected host:port such as 127.0.0.1:{DEFAULT_PORT}")
    if text.startswith("["):
        host, sep, port_s = text[1:].partition("]:")
        if not sep:
            raise UsageError(f"{where}: expected [ipv6]:port such as [::1]:{DEFAULT_PORT}")
    elif text.count(":") > 1:
        raise UsageError(f"{where}: write an IPv6 address in brackets, e.g. [::1]:{DEFAULT_PORT}")
    elif ":" in text:
        host, _, port_s = text.rpartition(":")
    else:
        host, port_s = "", text
    host = host or DEFAULT_HOST
    try:
        port = int(port_s)
    except ValueError:
        raise UsageError(f"{where}: port {port_s!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"{where}: port {port} is out of range 0..65535")
    return host, port


def is_loopback(host: str) -> bool:
    """True for ``127.0.0.0/8``, ``::1`` and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr for every scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Server4(ThreadingWSGIServer):
    address_family = socket.AF_INET


class _Server6(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _ScrapeTracker:
    """Wraps the WSGI app to count scrapes, so that a lingering exporter can stop as soon as
    a scrape that began after the run ended has been written out completely."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._cond = threading.Condition()
        self.started = 0  # scrapes begun
        self._done_upto = 0  # highest scrape number fully written

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        with self._cond:
            self.started += 1
            n = self.started
        return _Body(self._app(environ, start_response), lambda: self._done(n))

    def _done(self, n: int) -> None:
        with self._cond:
            self._done_upto = max(self._done_upto, n)
            self._cond.notify_all()

    def wait_after(self, mark: int, timeout: float) -> bool:
        """Block until a scrape numbered above ``mark`` has been written (or ``timeout``)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._done_upto > mark, timeout)


class _Body:
    """The response body; WSGI calls ``close()`` once it has been written to the socket."""

    def __init__(self, inner: Iterable[bytes], on_close: Callable[[], None]) -> None:
        self._inner = inner
        self._on_close = on_close

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._inner)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()
        self._on_close()


@dataclass(slots=True)
class MetricsServer:
    """A running exporter: ``url`` is where Prometheus scrapes; ``close()`` stops it."""

    host: str
    port: int
    registry: CollectorRegistry
    _httpd: ThreadingWSGIServer
    _thread: threading.Thread
    _tracker: _ScrapeTracker

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/metrics"

    @property
    def scrapes(self) -> int:
        """Scrapes begun so far."""
        return self._tracker.started

    def wait_for_scrape(self, after: int, timeout: float) -> bool:
        """Wait until a scrape begun after the ``after``-th has been fully served; False
        when ``timeout`` seconds pass first."""
        return self._tracker.wait_after(after, timeout)

    def close(self) -> None:
        """Stop serving, close the socket and join the thread (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()


def start_exporter(addr: str, registry: CollectorRegistry | None = None) -> MetricsServer:
    """Serve ``registry`` (a fresh one when None) on ``addr`` over HTTP at ``/metrics``.

    Port 0 picks a free port (``server.port`` tells which). Raises ``UsageError`` for a bad
    address or one that cannot be bound (in use, not an address of this host). Logs where
    it serves and warns when that is beyond this host (see ``announce``).
    """
    host, port = parse_metrics_addr(addr)
    reg = registry if registry is not None else CollectorRegistry(auto_describe=True)
    family = _Server6 if ":" in host else _Server4
    tracker = _ScrapeTracker(make_wsgi_app(reg))
    try:
        httpd = make_server(host, port, tracker, family, handler_class=_QuietHandler)
    except (OSError, UnicodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"--metrics-addr {addr}: cannot listen on {host}:{port}: {why}") from None
    thread = threading.Thread(target=httpd.serve_forever, name="soakd-metrics", daemon=True)
    thread.start()
    bound_port = int(httpd.server_address[1])
    server = MetricsServer(host, bound_port, reg, httpd, thread, tracker)
    announce(server, chosen=port == 0)
    return server


def announce(server: MetricsServer, *, chosen: bool, log: Any = None) -> None:
    """One line ``metrics on http://HOST:PORT/metrics``: at info, or at warning when the
    port was chosen by the system (``:0``), so it is seen even beside the live display,
    which only lets warnings through; plus a warning when the host is not loopback."""
    log = log if log is not None else structlog.get_logger("soakd.metrics")
    line = f"metrics on {server.url}"
    if chosen:
        log.warning(line, url=server.url, port=server.port)
    else:
        log.info(line, url=server.url, port=server.port)
    if not is_loopback(server.host):
        where = "every interface" if server.host in ("0.0.0.0", "::") else server.host
        log.warning(
            f"metrics exposed beyond this host: listening on {where} port {server.port}; "
            "anyone who can reach it reads run ids, config hashes and the hostname "
            f"(use 127.0.0.1:{server.port} to keep them local)",
            host=server.host,
            port=server.port,
        )


# ---------------------------------------------------------------------------------------
# The observer


_MIB = float(1 << 20)

#: a verdict's unit -> (factor to the base unit, the base unit's name); a unit not listed
#: is exported as it is
BASE_UNITS: dict[str, tuple[float, str]] = {
    "ms": (1e-3, "seconds"),
    "s": (1.0, "seconds"),
    "h": (3600.0, "seconds"),
    "MB": (_MIB, "bytes"),
    "MB/min": (_MIB / 60.0, "bytes_per_second"),
    "ms/min": (1e-3 / 60.0, "seconds_per_second"),
    "x median": (1.0, "ratio"),
    "fraction": (1.0, "ratio"),
    "count": (1.0, "count"),
}


def to_base_unit(value: float, unit: str | None) -> tuple[float, str]:
    """A criterion's value (or threshold) in ``unit`` -> (value, unit) in base units,
    e.g. ``(2.0, "MB/min")`` -> ``(34952.53, "bytes_per_second")``."""
    factor, base = BASE_UNITS.get(unit or "", (1.0, unit or ""))
    return value * factor, base


@dataclass(slots=True)
class CriterionRow:
    """One criterion of a verdict, as exported."""

    name: str
    status: str  # pass | fail | invalid | n/a
    value: float | None = None
    threshold: float | None = None
    unit: str | None = None


class MetricsObserver(Observer):
    """Fills a ``CollectorRegistry`` from the runner's hooks (all quick, none raise).

    ``MetricsObserver(start_exporter(addr))`` fills the server's registry and owns the server
    (``close()`` stops serving); ``MetricsObserver(registry=reg)`` only fills ``reg``.
    """

    def __init__(
        self,
        server: MetricsServer | None = None,
        *,
        registry: CollectorRegistry | None = None,
        linger_s: float | None = None,
    ) -> None:
        if server is not None and registry is not None and registry is not server.registry:
            raise ValueError("give a server or a registry, not both")
        if server is not None:
            registry = server.registry
        self.registry = registry if registry is not None else CollectorRegistry()
        self.server = server
        self.linger_s = linger_s  # None: service.metrics_linger_s of the run's settings
        self._end_mark: int | None = None  # scrapes begun when the run ended
        self._labels: dict[str, str] | None = None
        self._last_drops = 0
        self._last_stale = 0
        self._sample_children: dict[str, Any] = {}
        self._device_children: dict[tuple[str, int, str], Any] = {}
        self._label_names: tuple[str, ...] | None = None
        self._own: CollectorRegistry | None = None

    # --- definitions (once per set of label names)
    def _define(self, lbl: tuple[str, ...]) -> None:
        """Define every metric with the label names ``lbl``: a metric's label names are fixed
        when it is made, and a run's own labels are known only when it starts. The metrics
        live in a registry of their own, served as one collector of ``self.registry``; the
        same names keep them (a second run adds its series beside the first's), other names
        replace them."""
        if lbl == self._label_names:
            return
        if self._own is not None:
            self.registry.unregister(self._own)
        self._own = CollectorRegistry()
        self._make(self._own, lbl)
        self.registry.register(self._own)
        self._label_names = lbl

    def _make(self, r: CollectorRegistry, lbl: tuple[str, ...]) -> None:
        self.stage_latency = Histogram(
            "soakd_stage_latency_seconds", "Latency of each stage of a frame.",
            [*lbl, "stage"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.frame_age = Histogram(
            "soakd_frame_age_seconds", "Frame age: dispatch into the model minus capture.",
            lbl, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "soakd_e2e_latency_seconds", "End-to-end latency: result minus scheduled capture.",
            lbl, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.frames = Counter("soakd_frames", "Frames finished.", lbl, registry=r)
        self.errors = Counter("soakd_frame_errors", "Frames that raised.", lbl, registry=r)
        self.drops = Counter(
            "soakd_dropped_frames", "Frames dropped by the latest-frame queue.", lbl, registry=r
        )
        self.stale = Counter(
            "soakd_stale_frames", "Frames skipped as older than max_age_ms.", lbl, registry=r
        )
        self.events = Counter("soakd_events", "Events by kind.", [*lbl, "kind"], registry=r)
        self.tokens = Counter("soakd_output_tokens", "Output tokens of a served model's answers.",
                              lbl, registry=r)  # fmt: skip
        self.audio_rtf = Histogram(
            "soakd_turn_audio_realtime_factor",
            "A realtime answer's audio seconds received per wall second.",
            lbl, buckets=RTF_BUCKETS, registry=r,
        )  # fmt: skip
        self.underruns = Counter("soakd_turn_audio_underruns",
                                 "A realtime answer's audio underruns (stutters).", lbl,
                                 registry=r)  # fmt: skip
        self.fps = Gauge(
            "soakd_achieved_frames_per_second", "Frames finished per second.", lbl, registry=r
        )
        self.target_fps = Gauge(
            "soakd_target_frames_per_second", "The configured frame rate.", lbl, registry=r
        )
        self.age_p50 = Gauge(
            "soakd_frame_age_p50_seconds", "Rolling median frame age.", lbl, registry=r
        )
        self.samples = {
            col: Gauge(name, help_, lbl, registry=r) for col, name, help_, _ in _SAMPLE_GAUGES
        }
        self.devices = {  # ``gpu`` (a run label) holds the NVML index on these
            col: Gauge(name, help_, [*lbl, "gpu", "UUID"], registry=r)
            for col, name, help_, _ in _DEVICE_GAUGES
        }
        self.elapsed = Gauge("soakd_run_elapsed_seconds", "Time since the run began.", lbl,
                             registry=r)  # fmt: skip
        self.remaining = Gauge("soakd_run_remaining_seconds", "Time left of the run.", lbl,
                               registry=r)  # fmt: skip
        self.progress = Gauge("soakd_run_progress_ratio", "Elapsed / planned, 0..1.", lbl,
                              registry=r)  # fmt: skip
        self.stalled = Gauge("soakd_run_stalled_seconds", "Seconds since a frame finished.",
                             lbl, registry=r)  # fmt: skip
        self.warmup = Gauge("soakd_run_warmup", "1 during the warm-up window.", lbl, registry=r)
        self.status = Gauge("soakd_run_status", "The run's status (one-hot).",
                            [*lbl, "status"], registry=r)  # fmt: skip
        self.info = Gauge("soakd_run_info", "Run metadata (always 1).",
                          [*lbl, "name", "workload", "hostname"], registry=r)  # fmt: skip
        self.verdict = Gauge("soakd_verdict", "The run's verdict (one-hot).",
                             [*lbl, "verdict"], registry=r)  # fmt: skip
        self.crit_status = Gauge("soakd_criterion_status", "Each criterion's status (one-hot).",
                                 [*lbl, "criterion", "status"], registry=r)  # fmt: skip
        self.crit_value = Gauge("soakd_criterion_value", "Each criterion's measured value.",
                                [*lbl, "criterion", "unit"], registry=r)  # fmt: skip
        self.crit_threshold = Gauge("soakd_criterion_threshold", "Each criterion's threshold.",
                                    [*lbl, "criterion", "unit"], registry=r)  # fmt: skip
        self.look_state = Gauge("soakd_look_standing",
                                "Each criterion at a duration = auto run's last look (one-hot).",
                                [*lbl, "criterion", "state"], registry=r)  # fmt: skip
        self.look_ratio = Gauge("soakd_look_detectable_ratio",
                                "A trend's smallest detectable slope / its tolerance, last look.",
                                [*lbl, "criterion"], registry=r)  # fmt: skip

    # --- hooks
    def on_run_start(self, info: RunInfo) -> None:
        own = info.settings.run.labels
        lv = {"run": info.run_id, "config": info.config_hash, "modelName": info.gpu_name or "none"}
        lv.update((k, own[k]) for k in sorted(own))
        self._define(tuple(lv))
        self._labels = lv
        if self.linger_s is None:
            self.linger_s = float(getattr(info.settings.service, "metrics_linger_s", 0.0))
        self._last_drops = self._last_stale = 0
        self._sample_children = {}
        self._device_children = {}
        # children cached once: the per-frame path only calls observe/inc on them
        self._stage = {s: self.stage_latency.labels(**lv, stage=s) for s in STAGES}
        self._age = self.frame_age.labels(**lv)
        self._e2e = self.e2e.labels(**lv)
        self._frames = self.frames.labels(**lv)
        self._tokens = self.tokens.labels(**lv)
        self._audio_rtf = self.audio_rtf.labels(**lv)
        self._underruns = self.underruns.labels(**lv)
        self._errors = self.errors.labels(**lv)
        self._drops = self.drops.labels(**lv)
        self._stale = self.stale.labels(**lv)
        self.target_fps.labels(**lv).set(info.settings.run.fps)
        self.info.labels(
            **lv,
            name=info.settings.run.name or "",
            workload=str(getattr(info.settings.workload, "kind", "")),
            hostname=socket.gethostname(),
        ).set(1)
        self._set_status("running")
        self.elapsed.labels(**lv).set(0)
        self.remaining.labels(**lv).set(info.settings.run.duration)
        self.progress.labels(**lv).set(0)

    def on_frame(self, rec: FrameRecord) -> None:
        if self._labels is None:
            return
        if rec.skipped:
            self._count_queue(rec)
            return
        stage = self._stage
        for name, ms in (
            ("grab", rec.grab_ms),
            ("pre", rec.pre_ms),
            ("infer", rec.infer_ms),
            ("decode", rec.decode_ms),
            ("total", rec.total_ms),
        ):
            if ms is not None:
                stage[name].observe(ms / 1000.0)
        if rec.frame_age_ms is not None:
            self._age.observe(rec.frame_age_ms / 1000.0)
        if rec.e2e_ms is not None:
            self._e2e.observe(rec.e2e_ms / 1000.0)
        self._frames.inc()
        if rec.error is not None:
            self._errors.inc()
        if rec.out_tokens:
            self._tokens.inc(rec.out_tokens)
        self._count_turn(rec.extra)
        self._count_queue(rec)

    def _count_turn(self, extra: dict[str, Any] | None) -> None:
        """A realtime answer's audio: its real-time factor and underruns."""
        if not extra or extra.get("turn") is None:
            return
        rtf, under = extra.get("audio_rtf"), extra.get("underruns")
        if isinstance(rtf, int | float) and math.isfinite(rtf):
            self._audio_rtf.observe(float(rtf))
        if isinstance(under, int) and under > 0:
            self._underruns.inc(under)

    def _count_queue(self, rec: FrameRecord) -> None:
        # FrameRecord carries cumulative counts; a counter takes the increase
        if rec.drop_count > self._last_drops:
            self._drops.inc(rec.drop_count - self._last_drops)
            self._last_drops = rec.drop_count
        if rec.stale_count > self._last_stale:
            self._stale.inc(rec.stale_count - self._last_stale)
            self._last_stale = rec.stale_count

    def on_sample(self, sample: Sample) -> None:
        if self._labels is None:
            return
        values = sample.values
        for col, _name, _help, scale in _SAMPLE_GAUGES:
            v = values.get(col)
            child = self._sample_children.get(col)
            if child is None:
                if v is None:
                    continue  # never known: not exported
                child = self._sample_children[col] = self.samples[col].labels(**self._labels)
            child.set(math.nan if v is None else float(v) * scale)
        for d in sample.devices:
            self._set_device(d)

    def _set_device(self, d: DeviceSample) -> None:
        """One GPU's gauges, labelled ``gpu`` = NVML index and ``UUID`` as dcgm-exporter."""
        assert self._labels is not None
        for col, _name, _help, scale in _DEVICE_GAUGES:
            v = getattr(d, col)
            key = (col, d.gpu, d.uuid)
            child = self._device_children.get(key)
            if child is None:
                if v is None:
                    continue  # never known: not exported
                labels = {**self._labels, "gpu": str(d.gpu), "UUID": d.uuid}
                child = self._device_children[key] = self.devices[col].labels(**labels)
            child.set(math.nan if v is None else float(v) * scale)

    def on_event(self, event: Event) -> None:
        if self._labels is not None:
            self.events.labels(**self._labels, kind=event.kind).inc()
            if event.kind == LOOK_EVENT:
                self._set_look(standings(event.data))

    def _set_look(self, stands: list[Standing]) -> None:
        """A ``duration = "auto"`` run's look: each criterion's standing, one-hot, and each
        trend's detectable slope over its tolerance."""
        lv = self._labels
        assert lv is not None
        for st in stands:
            for state in LOOK_STATES:
                self.look_state.labels(**lv, criterion=st.criterion, state=state).set(
                    1 if state == st.state else 0
                )
            if st.detectable is not None and st.tolerance:
                ratio = st.detectable / st.tolerance
                self.look_ratio.labels(**lv, criterion=st.criterion).set(ratio)

    def on_progress(self, progress: Progress) -> None:
        lv = self._labels
        if lv is None:
            return
        self.fps.labels(**lv).set(progress.achieved_fps)
        if progress.age_p50_ms is not None:
            self.age_p50.labels(**lv).set(progress.age_p50_ms / 1000.0)
        self.elapsed.labels(**lv).set(progress.elapsed_s)
        self.remaining.labels(**lv).set(progress.remaining_s)
        total = progress.elapsed_s + progress.remaining_s
        self.progress.labels(**lv).set(min(1.0, progress.elapsed_s / total) if total > 0 else 0)
        self.stalled.labels(**lv).set(progress.stalled_s)
        self.warmup.labels(**lv).set(1 if progress.warmup else 0)

    def on_run_end(self, result: RunResult) -> None:
        if self._labels is None:
            return
        self._set_status(result.status)
        self.elapsed.labels(**self._labels).set(result.duration_s)
        if result.verdict is not None:
            overall, rows = verdict_rows(result.verdict)
            self.set_verdict(overall, rows)
        if self.server is not None:
            self._end_mark = self.server.scrapes

    def set_verdict(self, overall: str | None, criteria: Iterable[CriterionRow]) -> None:
        """Export a verdict: one-hot overall and per-criterion status, value, threshold."""
        lv = self._labels
        if lv is None:
            return
        if overall is not None:
            word = overall.upper()
            for v in {*VERDICTS, word}:
                self.verdict.labels(**lv, verdict=v).set(1 if v == word else 0)
        for c in criteria:
            status = c.status.lower()
            for s in {*CRITERION_STATUSES, status}:
                self.crit_status.labels(**lv, criterion=c.name, status=s).set(
                    1 if s == status else 0
                )
            if c.value is not None:
                value, unit = to_base_unit(c.value, c.unit)
                self.crit_value.labels(**lv, criterion=c.name, unit=unit).set(value)
            if c.threshold is not None:
                thr, unit = to_base_unit(c.threshold, c.unit)
                self.crit_threshold.labels(**lv, criterion=c.name, unit=unit).set(thr)

    def _set_status(self, status: str) -> None:
        assert self._labels is not None
        for s in {*RUN_STATUSES, status}:
            self.status.labels(**self._labels, status=s).set(1 if s == status else 0)

    def close(self) -> None:
        """Stop the owned server; with ``linger_s`` > 0 first keep serving the final metrics
        until one scrape has read them or ``linger_s`` has passed."""
        if self.server is None:
            return
        if self._end_mark is not None and self.linger_s:
            self.server.wait_for_scrape(self._end_mark, self.linger_s)
        self.server.close()


def open_metrics(addr: str, *, linger_s: float | None = None) -> MetricsObserver:
    """Start an exporter on ``addr`` and return the observer that feeds (and owns) it."""
    return MetricsObserver(start_exporter(addr), linger_s=linger_s)


# ---------------------------------------------------------------------------------------
# Reading a verdict without depending on its class (soakd.analysis owns it)


def _get(obj: Any, *names: str) -> Any:
    for n in names:
        v = obj.get(n) if isinstance(obj, Mapping) else getattr(obj, n, None)
        if v is not None:
            return getattr(v, "value", v)  # enums -> their value
    return None


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f


def verdict_rows(verdict: Any) -> tuple[str | None, list[CriterionRow]]:
    """A verdict object or mapping -> (overall word, criterion rows).

    Reads ``status``/``verdict``/``outcome`` for the overall result and ``criteria`` (a list
    or a name -> criterion mapping) whose items carry ``name``/``criterion``, ``status``,
    ``value``, ``threshold`` and ``unit``, matching the ``verdicts`` table.
    """
    if isinstance(verdict, str):
        return verdict, []
    overall = _get(verdict, "status", "verdict", "outcome")
    raw = _get(verdict, "criteria")
    items: list[tuple[Any, Any]] = (
        list(raw.items()) if isinstance(raw, Mapping) else [(None, c) for c in raw or ()]
    )
    rows = []
    for key, c in items:
        name = _get(c, "name", "criterion") or key
        status = _get(c, "status")
        if name is None or status is None:
            continue
        rows.append(
            CriterionRow(
                name=str(name),
                status=str(status),
                value=_num(_get(c, "value")),
                threshold=_num(_get(c, "threshold")),
                unit=_get(c, "unit"),
            )
        )
    return (None if overall is None else str(overall)), rows
