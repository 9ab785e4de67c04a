"""Linux ``/proc`` read directly for the probes' every-tick numbers: one read of each file,
the same numbers psutil gives (issue 34: the sampler's own CPU on a served run was mostly
psutil building objects and reading the same files again).

Each reader returns None where ``/proc`` cannot say (another OS, a file that cannot be read,
a process that is gone): the probes then ask psutil, as before.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

#: bytes a page and clock ticks a second, as psutil reads them
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: the host CPU times in /proc/stat's first line, in order (psutil's names)
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
              "guest", "guest_nice")  # fmt: skip


#: files kept open between reads, the most recently read (a tick reads the same few), and
#: the bytes one ``pread`` asks for (a longer file takes more)
KEEP_OPEN = 32
KEPT_READ = 1 << 16
_kept: dict[tuple[int, str], int] = {}  # (this process's pid, path) -> descriptor
_kept_lock = threading.Lock()


def read(path: str) -> bytes | None:
    """The file's bytes, None when it cannot be read. A ``/proc`` file read before is read
    again on its kept descriptor (``pread`` from 0: the kernel writes the file afresh; a
    fifth of the CPU of open, read and close, issue 34); one that fails there (its process
    exited) is closed and the path opened again: a read says what opening it now says."""
    if not path.startswith("/proc/"):
        return _read_whole(path)
    key = (os.getpid(), path)  # a forked child opens its own
    with _kept_lock:
        fd = _kept.pop(key, None)
        data = None if fd is None else _pread(fd)
        if fd is None or data is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            data = _pread(fd)
            if data is None:
                return None
        _kept[key] = fd  # the most recently read last
        while len(_kept) > KEEP_OPEN:
            os.close(_kept.pop(next(iter(_kept))))
        return data


def _read_whole(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _pread(fd: int) -> bytes | None:
    """The whole file on ``fd`` from its start; None, ``fd`` closed, when it cannot be read."""
    try:
        chunks = [os.pread(fd, KEPT_READ, 0)]
        while len(chunks[-1]) == KEPT_READ:
            chunks.append(os.pread(fd, KEPT_READ, KEPT_READ * len(chunks)))
    except OSError:
        os.close(fd)
        return None
    return b"".join(chunks)


class ProcStat(NamedTuple):
    """One process's ``/proc/PID/stat``: its state letter, its CPU time (user + system,
    seconds) and its start time in clock ticks since boot (with the pid, its identity)."""

    state: str
    cpu_s: float
    start: int


def stat(pid: int) -> ProcStat | None:
    data = read(f"/proc/{pid}/stat")
    if data is None:
        return None
    try:
        f = data[data.rindex(b")") + 2 :].split()  # the name may hold spaces and ")"
        return ProcStat(f[0].decode(), (int(f[11]) + int(f[12])) / TICK, int(f[19]))
    except (ValueError, IndexError):
        return None


def rss(pid: int | str) -> int | None:
    """Resident bytes (``/proc/PID/statm``'s second field, as psutil's ``memory_info``)."""
    data = read(f"/proc/{pid}/statm")
    if data is None:
        return None
    try:
        return int(data.split()[1]) * PAGE
    except (ValueError, IndexError):
        return None


def _has_children_files() -> bool:
    return os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")


#: the kernel lists each thread's children (CONFIG_PROC_CHILDREN, on by default)
HAS_CHILDREN = _has_children_files()


def descendants(pid: int) -> list[int] | None:
    """Every process below ``pid`` (children first), from ``/proc/PID/task/TID/children``:
    reads of the tree's own threads, not a walk of every process on the host. None where
    the kernel does not list children or ``pid`` is gone. A child that exits while this
    reads may hide its own children until the next listing (the kernel's caveat)."""
    if not HAS_CHILDREN:
        return None
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            if p == pid:
                return None
            continue  # exited since it was listed
        for tid in tids:
            data = read(f"/proc/{p}/task/{tid}/children")
            kids = [int(k) for k in data.split()] if data else []
            out += kids
            todo += kids
    return out


def host_cpu(text: bytes | None) -> dict[str, float] | None:
    """The host's CPU times (seconds, by psutil's names) from ``/proc/stat``'s text."""
    if text is None or not text.startswith(b"cpu "):
        return None
    values = text[: text.index(b"\n")].split()[1:]
    return {f: int(v) / TICK for f, v in zip(CPU_FIELDS, values, strict=False)}


def procs_running(text: bytes) -> int | None:
    """``procs_running`` of ``/proc/stat``'s text (threads running or ready to run)."""
    at = text.find(b"\nprocs_running ")
    if at < 0:
        return None
    try:
        return int(text[at + 15 : text.index(b"\n", at + 1)])
    except ValueError:
        return None


def memory(path: str = "/proc/meminfo") -> tuple[int, int] | None:
    """(total, available) bytes of host memory: MemTotal and MemAvailable, which psutil's
    ``virtual_memory`` reports; None when the file lacks them."""
    text = read(path)
    if text is None:
        return None
    try:
        return _kib(text, b"MemTotal:") * 1024, _kib(text, b"MemAvailable:") * 1024
    except ValueError:
        return None


def _kib(text: bytes, key: bytes) -> int:
    at = text.index(key) + len(key)  # ValueError when absent
    return int(text[at : text.index(b"kB", at)])
