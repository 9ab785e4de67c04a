"""A served model's server, sampled beside soakd's own telemetry (``workload.kind = "openai"``).

A served model leaks in the server, not in soakd, so a run of one samples, every tick:

* ``ServerProcessProbe``: the server's process and all its children (listed again every
  ``TREE_REFRESH_S`` and when one vanishes: workers come and go), RSS and CPU summed
  (``server_rss_bytes``, ``server_cpu_pct``), its systemd unit's cgroup ``memory.current``
  (``server_cgroup_mem_bytes``) and, where NVML starts, the GPU memory NVML reports for those
  pids on every GPU (``server_gpu_mem_bytes``; None in a container whose pids NVML does not
  share). The process is ``telemetry.server_pid``, or ``telemetry.server_unit``'s MainPID,
  or (``server_process = "auto"``) the one listening on the endpoint's port on this host,
  known by its pid and create time. A server replaced where it was found is followed (a
  ``server_replaced`` change), one gone with nothing in its place leaves the keys None (one
  ``server_lost`` change); the sampler stores the changes as run events. A tick never
  raises.
* ``ServerMetricsProbe``: the server's Prometheus endpoint, scraped on a thread of its own
  and read by ``promtext`` (prometheus_client's parser for a page it does not vouch for);
  the samples named (as exported, ``vllm:num_preemptions_total``) in
  ``telemetry.server_metrics`` become ``ServerMetric`` rows on the tick's ``Sample``
  (``server_metrics`` table). A scrape may take one interval (at most 0.5 s), a tick waits
  for it half that; a scrape that fails gives no rows, one still running when its tick gives
  up stays the only one in flight and gives its rows to the next tick.

``server_probes(settings)`` builds what a run needs; a server process that cannot be found
raises ``ServerNotFound``, a ``UsageError`` naming what was tried (exit 2, before the run row
exists).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import importlib
import ipaddress
import math
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit, urlunsplit

import psutil

from soakd.config import SERVED_KINDS
from soakd.errors import UsageError
from soakd.records import ServerMetric
from soakd.telemetry import procfs, promtext
from soakd.telemetry.probes import Probe, Values

#: the longest one scrape of the server's /metrics may take (one interval when shorter)
SCRAPE_TIMEOUT_S = 0.5
#: how often the server's process tree is listed again (from /proc task files on Linux; psutil
#: walks every process on the host)
#: and, in port mode, checked to still listen there (one readlink of the socket it was found
#: with; the host's TCP table only when that socket is gone); a process that vanishes lists
#: it at once
TREE_REFRESH_S = 2.0
#: the build-time check that the default /metrics answers
CHECK_TIMEOUT_S = 2.0
#: processes that hold a port for a container, not the server behind it
_FORWARDERS = frozenset({"docker-proxy", "rootlessport", "rootlesskit", "slirp4netns", "pasta"})
_HINT = (
    "set telemetry.server_pid or telemetry.server_unit, or telemetry.server_process"
    ' = "off" for a server on another host'
)

#: one kept sample of a scrape: (name as exported, canonical labels, value)
Series = tuple[str, str, float]


class ServerNotFound(UsageError):
    """The server's process cannot be found on this host; the message says how to name it."""


def canonical_labels(labels: dict[str, str]) -> str:
    """``k="v"`` pairs sorted by key, comma-joined ("" for none), each value's backslashes,
    double quotes and newlines escaped as in the Prometheus text format: one series'
    identity."""
    return ",".join(f'{k}="{_escaped(labels[k])}"' for k in sorted(labels))


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# --------------------------------------------------------------------------- the process


def endpoint_url(settings: Any) -> str:
    """The served model's HTTP root: ``workload.base_url``, or a realtime workload's
    ``workload.url`` as http(s) (ws -> http, wss -> https; vLLM serves /metrics there too)."""
    w = settings.workload
    if w.kind != "realtime":
        return str(w.base_url)
    p = urlsplit(w.url)
    scheme = "https" if p.scheme == "wss" else "http"
    return urlunsplit((scheme, p.netloc, "", "", ""))


def _host_port(base_url: str) -> tuple[str, int]:
    p = urlsplit(base_url)
    return p.hostname or "", p.port or (443 if p.scheme == "https" else 80)


def is_local(host: str) -> bool:
    """``host`` is this machine: every address it resolves to is loopback, unspecified or
    one of this host's own."""
    try:
        addrs = {str(ai[4][0]).split("%")[0] for ai in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    mine = {a.address.split("%")[0] for nics in psutil.net_if_addrs().values() for a in nics}
    return bool(addrs) and all(
        a in mine or ipaddress.ip_address(a).is_loopback or ipaddress.ip_address(a).is_unspecified
        for a in addrs
    )


def listening_pid(port: int) -> int:
    """The process listening on TCP ``port`` on this host: psutil names one holder of the
    socket, which may be a worker that inherited it, so the server is its topmost ancestor
    that listens on the port too. Raises ``ServerNotFound`` when no process is found, when it
    is not visible to this user, or when it is a container's port forwarder."""
    try:
        found = [
            c.pid
            for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        ]
    except psutil.AccessDenied:
        raise ServerNotFound(f"cannot list listening sockets (port {port}): {_HINT}") from None
    pids = [p for p in found if p]
    if not pids:
        why = "another user's process" if found else "no process on this host"
        raise ServerNotFound(f"{why} listens on port {port}: {_HINT}")
    pid = _topmost_listener(min(pids), port)
    _refuse_forwarder(pid, port)
    return pid


def _topmost_listener(pid: int, port: int) -> int:
    """``pid``'s highest ancestor (below init) that listens on ``port`` as well."""
    with contextlib.suppress(psutil.Error):
        parent = psutil.Process(pid).parent()
        while parent is not None and parent.pid > 1 and _listens(parent, port):
            pid, parent = parent.pid, parent.parent()
    return pid


def _listens(p: psutil.Process, port: int) -> bool:
    return _listener(p, port) is not None


#: a process's socket listening on a port: its fd and what /proc/PID/fd/FD links to
#: (``socket:[INODE]``; None where /proc does not say)
Listener = tuple[int, str | None]


def _listener(p: psutil.Process, port: int) -> Listener | None:
    """``p``'s socket listening on TCP ``port`` (None: none). Finding it reads the host's
    whole TCP table (``/proc/net/tcp*``: milliseconds on a busy host), so the probe keeps
    it and checks it with ``_holds``."""
    try:
        conns = p.net_connections(kind="tcp")
    except psutil.Error:
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            return c.fd, _fd_link(p.pid, c.fd)
    return None


def _fd_link(pid: int, fd: int) -> str | None:
    if fd < 0:
        return None
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def _holds(pid: int, listener: Listener | None) -> bool:
    """``pid`` still holds the listening socket it was found with, on the same fd (one
    readlink): a socket that listened stays listening until it is closed, and a closed
    one's fd no longer links to its inode. False when /proc cannot say."""
    if listener is None or listener[1] is None:
        return False
    return _fd_link(pid, listener[0]) == listener[1]


def _refuse_forwarder(pid: int, port: int) -> None:
    """A container runtime's port forwarder is never taken for the server (its flat memory
    would pass every memory check)."""
    with contextlib.suppress(psutil.Error):
        name = psutil.Process(pid).name()
        if name in _FORWARDERS:
            raise ServerNotFound(
                f"port {port} is held by {name} (pid {pid}), a container's port forwarder, not"
                " the server: set telemetry.server_pid to the server's pid on this host"
                " (docker inspect -f '{{.State.Pid}}' CONTAINER) or telemetry.server_process"
                ' = "off"'
            )


def _systemctl_show(unit: str, prop: str) -> str:
    try:
        out = subprocess.run(
            ["systemctl", "show", "-p", prop, "--value", unit],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerNotFound(f"telemetry.server_unit {unit!r}: systemctl failed: {exc}") from None
    if out.returncode != 0:  # no systemd here, no bus: its own words, not "MainPID ?"
        why = " ".join(out.stderr.split()) or f"exit status {out.returncode}"
        raise ServerNotFound(f"telemetry.server_unit {unit!r}: systemctl failed: {why}")
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
    """(pid, cgroup ``memory.current`` file or None, how it was found) of the model server:
    ``telemetry.server_pid``, else ``telemetry.server_unit``, else the process listening on
    the endpoint's port when its host is this one. Raises ``ServerNotFound``."""
    t, base = settings.telemetry, endpoint_url(settings)
    if t.server_pid is not None:
        pid, mem, how = t.server_pid, None, "telemetry.server_pid"
    elif t.server_unit is not None:
        pid, mem = unit_process(t.server_unit)
        how = f"systemd unit {t.server_unit}"
    else:
        host, port = _host_port(base)
        if not is_local(host):
            raise ServerNotFound(f"{host} ({base}) is not this host: {_HINT}")
        pid, mem, how = listening_pid(port), None, f"listening on port {port}"
    if not psutil.pid_exists(pid):
        raise ServerNotFound(f"server process {pid} ({how}): no such process")
    return pid, mem, how


@dataclass(frozen=True, slots=True)
class ServerChange:
    """A change of the sampled server, for the run's events table: ``server_replaced``
    (``data``: old_pid, new_pid and their create times) or ``server_lost`` (pid, create
    time). The sampler stamps it with its tick's time."""

    kind: str
    message: str
    data: dict[str, Any]


class ServerProcessProbe:
    """The server's process tree: RSS and CPU summed, cgroup memory, GPU memory (NVML).
    ``nvml`` is the ``pynvml`` module (injectable for tests; this probe initialises it).

    The server is a process (pid and create time), not a pid: each tick checks it is still
    that process. One that exited (or whose pid was reused) is looked for again where it
    was found (``port``: whatever listens there now; ``unit``: the unit's MainPID; a pid
    named alone: nowhere), and so is one that stopped listening on ``port``: a different
    process there is a ``server_replaced`` change and sampling follows it; none is one
    ``server_lost`` (looked for again every ``TREE_REFRESH_S``). The tree below it is listed
    every ``TREE_REFRESH_S``, and at once when one of its processes vanishes, not every
    tick (psutil's listing walks every process on the host; the /proc one reads the tree's
    threads). On Linux each tick reads each process's ``/proc/PID/stat`` and ``statm`` once
    (``procfs``; a process whose start time changed is another one), elsewhere psutil.
    Not stat's RSS field: the kernel's approximate sum of its per-CPU counters, 19 pages
    off on a sleeping process of a 2-CPU host, more with more CPUs (statm's is the exact
    sum psutil reads)."""

    name = "server_process"

    def __init__(
        self,
        pid: int,
        cgroup_mem: Path | None = None,
        nvml: Any = None,
        *,
        port: int | None = None,
        unit: str | None = None,
    ) -> None:
        try:
            root = psutil.Process(pid)  # kept: a reused pid is never taken for it
        except psutil.Error:
            raise ServerNotFound(f"server process {pid}: no such process") from None
        self.port, self.unit = port, unit
        self.cgroup_mem = cgroup_mem
        self._procs: dict[int, psutil.Process] = {}  # kept, so cpu_percent has a baseline
        self._fresh: set[int] = set()  # primed this tick: their CPU counts from the next
        self._changes: list[ServerChange] = []
        self._next_refresh = 0.0
        self._lost = False
        self._listener: Listener | None = None  # the root's socket on ``port``, kept
        # read from /proc (one read of stat and statm a process a tick), else psutil
        self._procfs = procfs.stat(pid) is not None
        self._seen: dict[int, _Seen] = {}  # /proc: each process's identity and CPU baseline
        self._adopt(root)
        self._fresh = set()  # primed now: the first tick reads their CPU already
        self._nvml = _open_nvml(nvml)
        self._handles = _nvml_handles(self._nvml)

    # -- who the server is

    def _adopt(self, root: psutil.Process) -> None:
        self._root: psutil.Process | None = root
        self.pid = root.pid
        self._born = _created(root)
        self._procs = {}
        self._listener = None
        self._refresh()

    def _refresh(self) -> None:
        """List the tree again (the next time in ``TREE_REFRESH_S``): the processes first
        seen are primed now, their CPU counts from the next tick."""
        root = self._root
        assert root is not None
        self._next_refresh = time.monotonic() + TREE_REFRESH_S
        known = {p.pid: self._procs.get(p.pid, p) for p in self._tree(root)}
        self._fresh = set(known) - set(self._procs)
        self._seen = {pid: s for pid, s in self._seen.items() if pid in known}
        for pid in self._fresh:
            with contextlib.suppress(psutil.Error):
                self._prime(known[pid])
        self._procs = known

    def _tree(self, root: psutil.Process) -> list[psutil.Process]:
        """The root and every process below it: from the tree's own /proc task files where
        the kernel lists children (``procfs.descendants``), else psutil's walk of every
        process on the host."""
        kids = procfs.descendants(root.pid) if self._procfs else None
        if kids is None:
            try:
                return [root, *root.children(recursive=True)]
            except psutil.Error:
                return [root]
        tree = [root]
        for pid in kids:
            p = self._procs.get(pid)
            if p is None:
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(pid)
            if p is not None:
                tree.append(p)
        return tree

    def _prime(self, p: psutil.Process) -> None:
        """A process first seen: its CPU counts from now."""
        if not self._procfs:
            p.cpu_percent(None)
            return
        st = procfs.stat(p.pid)
        if st is None:
            raise psutil.NoSuchProcess(p.pid)
        self._seen[p.pid] = _Seen(st.start, st.cpu_s, time.monotonic())

    def take_changes(self) -> list[ServerChange]:
        """The changes since the last call (the sampler stores them as run events)."""
        out, self._changes = self._changes, []
        return out

    def _serving(self) -> bool:
        """The root is still the process found (same create time, not a zombie) and, in port
        mode at a refresh, still listens on the port."""
        root = self._root
        if root is None or not self._alive(root):
            return False
        due = time.monotonic() >= self._next_refresh
        return not (due and self.port is not None and not self._still_listens(root, self.port))

    def _alive(self, root: psutil.Process) -> bool:
        """The root is the process found (its start time unchanged) and no zombie (exited,
        not reaped yet: its memory reads 0)."""
        if self._procfs:
            st, seen = procfs.stat(root.pid), self._seen.get(root.pid)
            if st is None or seen is None:
                return False
            return st.start == seen.start and st.state != "Z"
        if not root.is_running():
            return False
        try:
            return bool(root.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def _still_listens(self, root: psutil.Process, port: int) -> bool:
        """``root`` listens on ``port``: it still holds the socket found listening there
        (one readlink), else the host's TCP table is read again (and its socket kept)."""
        if _holds(root.pid, self._listener):
            return True
        self._listener = _listener(root, port)
        return self._listener is not None

    def _follow(self) -> None:
        """The server is gone or left its port: take whatever now serves where it was found
        (``server_replaced``), else say once that it is lost (``server_lost``)."""
        now = time.monotonic()
        if self._lost and now < self._next_refresh:
            return
        self._next_refresh = now + TREE_REFRESH_S
        found = self._locate()
        if found is not None and (found.pid, _created(found)) == (self.pid, self._born):
            self._refresh()
            return  # still the server (its sockets could not be read)
        if found is None:
            self._root = None
            if not self._lost:
                self._lost = True
                self._changes.append(
                    ServerChange(
                        "server_lost",
                        f"model server pid {self.pid} is gone and nothing took its place"
                        f" ({self._where()})",
                        {"pid": self.pid, "created": self._born},
                    )
                )
            return
        old, born = self.pid, self._born
        self._adopt(found)
        self._lost = False
        self._changes.append(
            ServerChange(
                "server_replaced",
                f"model server pid {old} replaced by pid {found.pid} ({self._where()})",
                {
                    "old_pid": old,
                    "new_pid": found.pid,
                    "old_created": born,
                    "new_created": self._born,
                },
            )
        )

    def _locate(self) -> psutil.Process | None:
        """The process serving where the server was found now (None: none, or a pid named
        alone: it is never looked for elsewhere)."""
        try:
            if self.port is not None:
                pid = listening_pid(self.port)
            elif self.unit is not None:
                pid, mem = unit_process(self.unit)
                self.cgroup_mem = mem or self.cgroup_mem
            else:
                return None
            return psutil.Process(pid)
        except (ServerNotFound, psutil.Error):
            return None

    def _where(self) -> str:
        if self.port is not None:
            return f"listening on port {self.port}"
        if self.unit is not None:
            return f"systemd unit {self.unit}"
        return "telemetry.server_pid"

    # -- the tick

    def sample(self, into: Values) -> None:
        if not self._serving():
            self._follow()
            if self._root is None:
                return  # its keys stay None
        elif time.monotonic() >= self._next_refresh:
            self._refresh()
        got = self._read(self._procs.values())
        if got is None:
            return  # the root ended since the check: the next tick follows it
        rss, cpu, vanished = got
        if vanished:  # a worker ended: list the tree again, count the ones not read yet
            read = set(self._procs)
            self._refresh()
            more = self._read(p for p in self._procs.values() if p.pid not in read)
            if more is not None:
                rss, cpu = rss + more[0], cpu + more[1]
        self._fresh = set()
        into["server_rss_bytes"] = rss
        into["server_cpu_pct"] = cpu
        if self.cgroup_mem is not None:
            with contextlib.suppress(OSError, ValueError):
                into["server_cgroup_mem_bytes"] = int(self.cgroup_mem.read_text())
        into["server_gpu_mem_bytes"] = self._gpu_bytes(set(self._procs))

    def _read(self, procs: Iterable[psutil.Process]) -> tuple[int, float, bool] | None:
        """(RSS, CPU, whether one vanished) summed over ``procs``; None when the root is one
        of them and cannot be read."""
        rss, cpu, vanished = 0, 0.0, False
        for p in list(procs):
            try:
                r, c = self._usage(p, p.pid in self._fresh)
            except psutil.Error:
                if p.pid == self.pid:
                    return None
                self._procs.pop(p.pid, None)
                vanished = True
                continue
            rss, cpu = rss + r, cpu + c
        return rss, cpu, vanished

    def _usage(self, p: psutil.Process, new: bool) -> tuple[int, float]:
        """(RSS, CPU % since the last tick) of one process; a new one's CPU counts from the
        next. Raises ``psutil.NoSuchProcess`` when it is gone or its pid is another's now."""
        if not self._procfs:
            with p.oneshot():
                return p.memory_info().rss, 0.0 if new else p.cpu_percent(None)
        st, rss, seen = procfs.stat(p.pid), procfs.rss(p.pid), self._seen.get(p.pid)
        if st is None or rss is None or seen is None or seen.start != st.start:
            raise psutil.NoSuchProcess(p.pid)
        now = time.monotonic()
        dt = now - seen.at
        cpu = 0.0 if new or dt <= 0 else round(100.0 * max(0.0, st.cpu_s - seen.cpu_s) / dt, 1)
        self._seen[p.pid] = _Seen(st.start, st.cpu_s, now)
        return rss, cpu

    def _gpu_bytes(self, pids: set[int]) -> int | None:
        """The GPU memory NVML reports for ``pids``, over every GPU; None when it reports
        none of them. A GPU that does not support the query is not asked again."""
        nv, total, seen = self._nvml, 0, False
        for h in list(self._handles):
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            except _permanent(nv):
                self._handles.remove(h)
                continue
            except Exception:
                continue  # this tick only (GPU lost, busy...)
            for p in procs:
                if p.pid in pids and p.usedGpuMemory is not None:
                    total, seen = total + int(p.usedGpuMemory), True
        return total if seen else None

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()


def _created(p: psutil.Process) -> float:
    try:
        return float(p.create_time())
    except psutil.Error:
        return 0.0


class _Seen(NamedTuple):
    """A process as /proc last read it: its start time (ticks since boot: with the pid, its
    identity), its CPU seconds then and when (monotonic)."""

    start: int
    cpu_s: float
    at: float


def _open_nvml(nvml: Any) -> Any:
    """``nvml`` (else pynvml), initialised; None where NVML does not start (no NVIDIA
    driver, no binding): the probe then reports no GPU memory, silently."""
    try:
        nv = nvml if nvml is not None else importlib.import_module("pynvml")
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


def _permanent(nv: Any) -> tuple[type[BaseException], ...]:
    """NVML's "never ask again" errors, as ``NvmlProbe`` treats them."""
    names = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
    return tuple(getattr(nv, n) for n in names if hasattr(nv, n))


# --------------------------------------------------------------------------- /metrics


def parse_series(text: str, names: frozenset[str]) -> list[Series]:
    """(sample name, canonical labels, value) of every sample in Prometheus ``text`` whose
    name as exported (a counter keeps its ``_total``) is in ``names``. Raises ValueError
    for text that is not Prometheus. ``promtext`` reads a page it vouches for line by line
    (a quarter of the CPU); any other, prometheus_client whole, as before."""
    kept = promtext.kept_samples(text, names)
    if kept is not None:
        return [(name, canonical_labels(labels), value) for name, labels, value in kept]
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (s.name, canonical_labels(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in names
    ]


class _Scrape:
    """One scrape: ``result`` (None when it failed) once ``done`` is set."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: list[Series] | None = None


class _Scraper:
    """Runs scrapes one at a time on a thread of its own, started at the first and kept (a
    thread started for each scrape, once a second, cost more CPU than the scrape's read
    of the page: issue 34): a daemon, so a server that never answers holds up neither the
    sampler nor the process's exit. ``close`` ends it once its scrape in hand is done."""

    def __init__(self, scrape: Callable[[], list[Series] | None]) -> None:
        self._scrape = scrape
        self._cond = threading.Condition()
        self._next: _Scrape | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> _Scrape:
        """A scrape begun now (the caller starts the next only when this one is done)."""
        job = _Scrape()
        with self._cond:
            self._next = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="soakd-scrape", daemon=True)
                self._thread.start()
            self._cond.notify()
        return job

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._closed:
                    self._cond.wait()
                job, self._next = self._next, None
                if self._closed or job is None:
                    return
            try:
                job.result = self._scrape()
            except Exception:
                job.result = None
            finally:
                job.done.set()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()


class ServerMetricsProbe:
    """The server's Prometheus endpoint, scraped once a tick at most (every ``every_s``:
    ``telemetry.server_metrics_every_s``, 1 s; its parse is most of a served run's own
    CPU when done every 150 ms tick, and queue gauges move slower): a scrape takes at most
    ``timeout_s`` (the HTTP client's timeout), a tick waits for it at most ``wait_s``
    (default ``timeout_s``). At most one scrape is in flight: one still running when its
    tick gives up is waited for by the next tick (which then gets its rows), never doubled."""

    name = "server_metrics"

    def __init__(
        self,
        url: str,
        names: tuple[str, ...],
        *,
        timeout_s: float = SCRAPE_TIMEOUT_S,
        wait_s: float | None = None,
        every_s: float = 0.0,
    ) -> None:
        self.url = url
        self.names = frozenset(names)
        self.wait_s = timeout_s if wait_s is None else wait_s
        self.every_s = every_s  # a scrape starts at most this often (0: every tick)
        self.timeout_s = timeout_s
        self._due = -math.inf  # the tick time from which the next scrape may start
        self._inflight: _Scrape | None = None
        self._scraper = _Scraper(self.scrape)
        self.failures = 0  # ticks with no rows (failed, timed out, not Prometheus)

    def scrape(self) -> list[Series] | None:
        """The kept series now, or None when the scrape failed (blocks up to the timeout)."""
        try:
            text = get_text(self.url, self.timeout_s)
            return None if text is None else parse_series(text, self.names)
        except (OSError, http.client.HTTPException, ValueError):
            return None

    def sample_server(self, seq: int, t: float) -> tuple[ServerMetric, ...]:
        """The tick's rows; () when no scrape is due (``every_s``), or it failed or is not
        done within ``wait_s``."""
        if self._inflight is None and t < self._due:
            return ()
        if self._inflight is None:
            self._due = t + self.every_s
        job = self._inflight or self._scraper.start()
        self._inflight = job
        if not job.done.wait(self.wait_s):
            self.failures += 1
            return ()
        self._inflight = None
        if job.result is None:
            self.failures += 1
            return ()
        return tuple(ServerMetric(seq, t, name, labels, v) for name, labels, v in job.result)

    def sample(self, into: Values) -> None:
        """Fills no sample column (its rows go to ``server_metrics``)."""

    def close(self) -> None:
        """Ends the scrapes' thread (no connection is kept open between scrapes)."""
        self._scraper.close()


def get_text(url: str, timeout_s: float) -> str | None:
    """The body of ``GET url`` when it answers 200, else None; on a connection of its own,
    closed after it (no keep-alive to go stale between scrapes a second apart), each socket
    operation within ``timeout_s``. ``http.client``: a third of httpx's CPU a request (0.5
    against 1.6 ms on a 2-vCPU VM, issue 34); no proxy from the environment (a server's own
    /metrics is read where it is), a ``user:password@`` in the URL sent as Basic auth.
    Raises OSError or HTTPException when it cannot be read."""
    p = urlsplit(url)
    conn_type = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
    conn = conn_type(p.hostname or "", p.port, timeout=timeout_s)
    headers = {"Connection": "close", "Accept": "*/*"}
    if p.username is not None:
        who = f"{unquote(p.username)}:{unquote(p.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(who).decode("ascii")
    try:
        conn.request("GET", urlunsplit(("", "", p.path or "/", p.query, "")), headers=headers)
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            return None
        return body.decode(r.headers.get_content_charset() or "utf-8", "replace")
    finally:
        conn.close()


def metrics_url(settings: Any) -> str | None:
    """``telemetry.server_metrics_url``, or ``<scheme://host:port>/metrics`` of the
    endpoint; None when ``"off"``."""
    url = settings.telemetry.server_metrics_url
    if url == "off":
        return None
    if url is not None:
        return str(url)
    p = urlsplit(endpoint_url(settings))
    return f"{p.scheme}://{p.netloc}/metrics"


def _answers(url: str) -> bool:
    """``url`` answers 200 with Prometheus text now."""
    check = ServerMetricsProbe(url, (), timeout_s=CHECK_TIMEOUT_S)
    try:
        return check.scrape() is not None
    finally:
        check.close()


def server_probes(settings: Any, log: Any = None) -> list[Probe]:
    """What a run of a served model samples of its server (nothing for other workloads):
    its process tree unless ``server_process = "off"`` with no pid or unit named, and its
    /metrics unless ``"off"`` (the default URL only when it answers now; an explicit one
    always: it may come up later). Raises ``ServerNotFound`` when the process is not found."""
    if settings.workload.kind not in SERVED_KINDS:
        return []
    t = settings.telemetry
    probes: list[Probe] = []
    if t.server_process != "off" or t.server_pid is not None or t.server_unit is not None:
        pid, mem, how = find_server(settings)
        # followed where it was found: the unit's MainPID, the port's listener (a pid named
        # alone is never looked for elsewhere)
        unit = t.server_unit if t.server_pid is None else None
        port = None if t.server_pid is not None or unit else _host_port(endpoint_url(settings))[1]
        probes.append(ServerProcessProbe(pid, mem, port=port, unit=unit))
        _info(log, f"sampling the model server: pid {pid} ({how}) and its children")
    url = metrics_url(settings)
    if url is not None and (t.server_metrics_url is not None or _answers(url)):
        # a scrape may take one interval, a tick waits half that: it never overruns its period
        timeout = min(SCRAPE_TIMEOUT_S, settings.run.sample_interval_ms / 1000)
        every = t.server_metrics_every_s
        probes.append(
            ServerMetricsProbe(
                url, t.server_metrics, timeout_s=timeout, wait_s=timeout / 2, every_s=every
            )
        )
    elif url is not None:
        _info(log, f"no server metrics: {url} does not answer with Prometheus text")
    return probes


def _info(log: Any, message: str) -> None:
    if log is not None:
        log.info(message)
