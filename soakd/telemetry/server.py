"""A served model's server, sampled beside soakd's own telemetry (``workload.kind = "openai"``).

A served model leaks in the server, not in soakd, so a run of one samples, every tick:

* ``ServerProcessProbe``: the server's process and all its children (re-listed each tick:
  workers come and go), RSS and CPU summed (``server_rss_bytes``, ``server_cpu_pct``), its
  systemd unit's cgroup ``memory.current`` (``server_cgroup_mem_bytes``) and, where NVML
  starts, the GPU memory of those processes (``server_gpu_mem_bytes``). The process is
  ``telemetry.server_pid``, or ``telemetry.server_unit``'s MainPID, or (``server_process =
  "auto"``) the one listening on the endpoint's port on this host. A server that dies
  leaves the keys None; it never raises out of a tick.
* ``ServerMetricsProbe``: the server's Prometheus endpoint, parsed with prometheus_client's
  parser; the series named in ``telemetry.server_metrics`` become ``ServerMetric`` rows on
  the tick's ``Sample`` (``server_metrics`` table). A scrape that fails or times out gives
  no rows that tick.

``server_probes(settings)`` builds what a run needs; a server process that cannot be found
is a ``UsageError`` naming what was tried (exit 2, before the run row exists).
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import socket
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from soakd.errors import UsageError
from soakd.records import ServerMetric
from soakd.telemetry.probes import Values

#: the longest one scrape of the server's /metrics may take (a tick must never stall)
SCRAPE_TIMEOUT_S = 0.5


class ServerNotFound(UsageError):
    """The server's process could not be found on this host; the message says how to name
    it."""


def canonical_labels(labels: dict[str, str]) -> str:
    """``k="v"`` pairs sorted by key, comma-joined ("" for none): one series' identity."""
    return ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))


# --------------------------------------------------------------------------- the process


def _port_of(base_url: str) -> tuple[str, int]:
    p = urlsplit(base_url)
    return p.hostname or "", p.port or (443 if p.scheme == "https" else 80)


def _is_local(host: str) -> bool:
    """``host`` is this machine: loopback, or one of its own addresses."""
    try:
        addrs = {str(ai[4][0]) for ai in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    mine = {a.address for nics in psutil.net_if_addrs().values() for a in nics}
    return all(ipaddress.ip_address(a.split("%")[0]).is_loopback or a in mine for a in addrs)


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this host (the lowest pid when several
    share it: the parent of pre-forked workers)."""
    pids = sorted(
        c.pid
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
    )
    return pids[0] if pids else None


def _systemctl_show(unit: str, prop: str) -> str:
    try:
        out = subprocess.run(
            ["systemctl", "show", "-p", prop, "--value", unit],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerNotFound(f"telemetry.server_unit {unit!r}: systemctl failed: {exc}") from None
    return out.stdout.strip()


def unit_process(unit: str) -> tuple[int, Path | None]:
    """A systemd unit's MainPID and its cgroup's ``memory.current`` file (None: none)."""
    pid = _systemctl_show(unit, "MainPID")
    if not pid.isdigit() or int(pid) == 0:
        raise ServerNotFound(f"telemetry.server_unit {unit!r}: not running (MainPID {pid or '?'})")
    cg = _systemctl_show(unit, "ControlGroup")
    mem = Path("/sys/fs/cgroup" + cg) / "memory.current" if cg else None
    return int(pid), mem if mem is not None and mem.is_file() else None


def find_server(settings: Any) -> tuple[int, Path | None, str]:
    """(pid, cgroup memory.current file or None, how it was found) of the model server."""
    t, base = settings.telemetry, settings.workload.base_url
    if t.server_pid is not None:
        pid, mem, how = t.server_pid, None, "telemetry.server_pid"
    elif t.server_unit is not None:
        pid, mem = unit_process(t.server_unit)
        how = f"systemd unit {t.server_unit}"
    else:
        host, port = _port_of(base)
        found = listening_pid(port) if _is_local(host) else None
        if found is None:
            where = "listens on" if _is_local(host) else "is local to"
            raise ServerNotFound(
                f"no process on this host {where} {host}:{port} ({base}): set "
                "telemetry.server_pid or telemetry.server_unit, or telemetry.server_process"
                ' = "off" for a server on another host'
            )
        pid, mem, how = found, None, f"the process listening on port {port}"
    if not psutil.pid_exists(pid):
        raise ServerNotFound(f"server process {pid} ({how}): no such process")
    return pid, mem, how


class ServerProcessProbe:
    """The server's process tree: RSS and CPU summed, cgroup memory, GPU memory (NVML)."""

    name = "server_process"

    def __init__(self, pid: int, cgroup_mem: Path | None = None, nvml: Any = None) -> None:
        self.pid = pid
        self.cgroup_mem = cgroup_mem
        self._procs: dict[int, psutil.Process] = {}  # kept, so cpu_percent has a baseline
        self._nvml = nvml if nvml is not None else _nvml()
        self._handles = _nvml_handles(self._nvml)

    def _tree(self) -> list[psutil.Process]:
        root = self._procs.get(self.pid) or psutil.Process(self.pid)
        tree = [root, *root.children(recursive=True)]
        known = {p.pid: self._procs.get(p.pid, p) for p in tree}
        for pid, p in known.items():
            if pid not in self._procs:
                with contextlib.suppress(psutil.Error):
                    p.cpu_percent(None)  # the first call only primes the counter
        self._procs = known
        return list(known.values())

    def sample(self, into: Values) -> None:
        try:
            tree = self._tree()
        except psutil.Error:  # the server is gone: its keys stay None
            return
        rss, cpu = 0, 0.0
        for p in tree:
            with contextlib.suppress(psutil.Error), p.oneshot():
                rss += p.memory_info().rss
                cpu += p.cpu_percent(None)
        into["server_rss_bytes"] = rss
        into["server_cpu_pct"] = cpu
        if self.cgroup_mem is not None:
            with contextlib.suppress(OSError, ValueError):
                into["server_cgroup_mem_bytes"] = int(self.cgroup_mem.read_text())
        into["server_gpu_mem_bytes"] = self._gpu_bytes({p.pid for p in tree})

    def _gpu_bytes(self, pids: set[int]) -> int | None:
        """The GPU memory NVML sees the server's processes use, over every GPU."""
        nv, total, seen = self._nvml, 0, False
        for h in self._handles:
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:
                continue
            for p in procs:
                if p.pid in pids and p.usedGpuMemory is not None:
                    total, seen = total + int(p.usedGpuMemory), True
        return total if seen else None

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()


def _nvml() -> Any:
    """pynvml, initialised; None where there is no NVIDIA driver (this probe then reports
    no GPU memory)."""
    try:
        nv = importlib.import_module("pynvml")
        nv.nvmlInit()
    except Exception:
        return None
    return nv


def _nvml_handles(nv: Any) -> list[Any]:
    if nv is None:
        return []
    try:
        return [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    except Exception:
        return []


# --------------------------------------------------------------------------- /metrics


def parse_series(text: str, names: frozenset[str]) -> list[tuple[str, str, float]]:
    """(sample name, canonical labels, value) of every sample in Prometheus ``text`` whose
    name, as exported (a counter keeps its ``_total``), is in ``names``."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in names:
                out.append((s.name, canonical_labels(s.labels), float(s.value)))
    return out


class ServerMetricsProbe:
    """The server's Prometheus endpoint, scraped once a tick (at most SCRAPE_TIMEOUT_S)."""

    name = "server_metrics"

    def __init__(self, url: str, names: tuple[str, ...], timeout_s: float = SCRAPE_TIMEOUT_S):
        import httpx

        self.url = url
        self.names = frozenset(names)
        self._httpx = httpx
        self._client = httpx.Client(timeout=timeout_s)
        self.failures = 0  # scrapes that gave nothing (failed, timed out, not Prometheus)

    def scrape(self) -> list[tuple[str, str, float]] | None:
        """The kept series now, or None when the scrape failed."""
        try:
            r = self._client.get(self.url)
            if r.status_code != 200:
                return None
            return parse_series(r.text, self.names)
        except (self._httpx.HTTPError, ValueError):
            return None

    def sample_server(self, seq: int, t: float) -> tuple[ServerMetric, ...]:
        series = self.scrape()
        if series is None:
            self.failures += 1
            return ()
        return tuple(ServerMetric(seq, t, name, labels, v) for name, labels, v in series)

    def sample(self, into: Values) -> None:
        """Fills no sample column (its rows go to ``server_metrics``)."""

    def close(self) -> None:
        self._client.close()


def metrics_url(settings: Any) -> str | None:
    """``telemetry.server_metrics_url``, or ``<scheme://host:port>/metrics`` of the
    endpoint; None when ``"off"``."""
    url = settings.telemetry.server_metrics_url
    if url == "off":
        return None
    if url is not None:
        return str(url)
    p = urlsplit(settings.workload.base_url)
    return f"{p.scheme}://{p.netloc}/metrics"


def server_probes(settings: Any, log: Any = None) -> list[Any]:
    """What a run of a served model samples of its server (nothing for other workloads)."""
    if settings.workload.kind != "openai":
        return []
    t = settings.telemetry
    probes: list[Any] = []
    if t.server_process != "off" or t.server_pid is not None or t.server_unit is not None:
        pid, mem, how = find_server(settings)
        probes.append(ServerProcessProbe(pid, mem))
        if log is not None:
            log.info(f"sampling the model server: pid {pid} ({how}) and its children")
    url = metrics_url(settings)
    if url is not None:
        m = ServerMetricsProbe(url, t.server_metrics, timeout_s=2.0)
        answers = m.scrape() is not None
        m.close()
        if answers or t.server_metrics_url is not None:  # a named URL is kept: it may come up
            probes.append(ServerMetricsProbe(url, t.server_metrics))
        elif log is not None:
            log.info(f"no server metrics: {url} does not answer with Prometheus text")
    return probes
