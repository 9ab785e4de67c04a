"""Served models: soakd's own CPU per request at a soak's rate, against a bare httpx loop.

Target (issue 34, "the harness's own cost on served runs"): soakd's CPU per served request
at most 1.5x a bare httpx loop's, at the same rate against the same server. Before this
bench, soakd used 5-6 % of a core at 2 requests/s against 1.4 % for the bare loop, about 3 %
of it the server-process probe listing the server's process tree (``psutil`` children,
recursively: a walk of every process on the host) on every 150 ms tick.

Server: tests/openai_test_server.py (a test fixture, not a model), 8 tokens a request,
streamed; its own CPU is not counted. Arms, each ``duration`` seconds at ``rate`` requests/s:

* bare httpx: one ``httpx.Client``, a 320x240 JPEG body encoded once beforehand, one
  streamed POST per period read to ``data: [DONE]``, sleeping to the next period;
* bare httpx, a frame encoded per request: the same loop doing what any client sending
  captured frames must do and the first arm skips: each request JPEG-encodes the next of
  the synthetic source's own pictures (read beforehand; the same quality as soakd's), base64
  and the JSON body built around it (the first arm is kept, both ratios are reported);
* soakd: ``run_soak`` of the openai workload (320x240 frames encoded per request), the
  default 150 ms telemetry with the server-process probe, the store and the verdict; CPU
  counted from the run's own start to its end (setup and judging left out), the process's
  user + system time read by the test's own thread; beside it, each of soakd's threads'
  CPU over the same span (each thread's CPU clock, ns; threads that ended are the rest of
  the process's);
* soakd, tree every tick: the same with ``TREE_REFRESH_S = 0`` (the probe lists the tree on
  every tick, as before it was kept);
* at ``RATE_HIGH`` (8 requests/s), half as long: the loop encoding each frame and soakd, as
  above (``ratio_at_high_rate``, reported, not a target: the per-second costs, telemetry and
  the monitor, weigh on each request a quarter as much as at 2 requests/s).

Beside them, the probe alone: its thread CPU per tick over ``ticks`` ticks at 150 ms, with the
tree kept and listed every tick, and the number of processes on the host (the walk's cost
grows with it); and the rest of the sampler's tick taken apart the same way: a wake that
does nothing, and this process's own probe (its RSS, CPU and the host's).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench._common import BenchResult, Target, bench_main
from soakd.observers.base import Observer
from soakd.telemetry.probes import ProcessProbe

TOKENS = 8
RATE = 2.0
RATE_HIGH = 8.0  # requests/s of the second pair of arms (half as long)
WIDTH, HEIGHT = 320, 240
QUALITY = 85  # workload.jpeg_quality's default


def _cpu_s() -> float:
    """This process's CPU seconds, every thread (user + system, ns resolution: psutil's
    cpu_times counts clock ticks, 10 ms, too coarse for a short arm)."""
    return time.process_time()


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, by thread name, in
    ns (each thread's CPU clock, ``pthread_getcpuclockid``; /proc's task files count 10 ms
    ticks, too coarse for a thread that wakes for 100 µs); {} where there is none."""
    import threading

    out: dict[str, float] = {}
    for t in threading.enumerate():
        if t.ident is None:
            continue
        try:
            ns = time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
        except (AttributeError, OSError):
            continue
        out[t.name] = out.get(t.name, 0.0) + ns / 1e9
    return out


def source_frames(n: int, width: int, height: int, fps: float) -> list[Any]:
    """The synthetic source's own pictures (what soakd's run encodes: a JPEG's cost depends
    on what it shows), read before an arm's CPU clock starts."""
    from soakd.config import load_settings
    from soakd.sources.synthetic import SyntheticSource

    cfg = load_settings(overrides=[f"source.width={width}", f"source.height={height}"]).source
    src = SyntheticSource(cfg, fps=fps)
    src.open()
    return [src.read()[0].copy() for _ in range(n)]


def _encoder(body: bytes, quality: int) -> Any:
    """A function of a picture giving the request body ``body`` with that picture, JPEG at
    ``quality``, base64, in place of its image: what a client sending frames does."""
    import base64
    import json

    import cv2

    doc = json.loads(body)
    part = next(p for p in doc["messages"][-1]["content"] if p["type"] == "image_url")

    def encode(image: Any) -> bytes:
        _, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
        part["image_url"]["url"] = "data:image/jpeg;base64," + base64.b64encode(
            buf.tobytes()
        ).decode("ascii")
        return json.dumps(doc).encode()

    return encode


def _bare(
    base_url: str,
    body: bytes,
    rate: float,
    duration: float,
    frames: list[Any] | None = None,
    quality: int = 85,
) -> tuple[float, int]:
    """(CPU seconds, requests) of the bare loop; with ``frames``, each request encodes the
    next of them into ``body``."""
    import httpx

    url = f"{base_url}/chat/completions"
    n, period = 0, 1.0 / rate
    encode = _encoder(body, quality) if frames else None
    with httpx.Client(timeout=30) as client:
        c0, t0 = _cpu_s(), time.monotonic()
        while time.monotonic() - t0 < duration:
            if encode is not None and frames:
                body = encode(frames[n % len(frames)])
            with client.stream(
                "POST", url, content=body, headers={"Content-Type": "application/json"}
            ) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        break
            n += 1
            time.sleep(max(0.0, t0 + n * period - time.monotonic()))
        return _cpu_s() - c0, n


class RunMarks(Observer):
    """The process's CPU when the run starts (its row is open) and when it starts to stop:
    the soak, not its setup nor its judging."""

    def __init__(self) -> None:
        self.start = self.end = 0.0
        self.threads0: dict[str, float] = {}
        self.threads1: dict[str, float] = {}

    def on_run_start(self, info: Any) -> None:
        self.start, self.threads0 = _cpu_s(), thread_cpu()

    def on_stopping(self, reason: str) -> None:
        self.end, self.threads1 = _cpu_s(), thread_cpu()

    def by_thread(self) -> dict[str, float]:
        """CPU seconds of each thread over the run; ``(ended threads)`` the rest."""
        names = set(self.threads0) | set(self.threads1)
        out = {n: self.threads1.get(n, 0.0) - self.threads0.get(n, 0.0) for n in names}
        out = {n: v for n, v in out.items() if v > 0}
        out["(ended threads)"] = max(0.0, self.end - self.start - sum(out.values()))
        return out


def _soakd(
    base_url: str, db: Path, rate: float, duration: float
) -> tuple[float, int, dict[str, float]]:
    """(CPU seconds from the run's start to its end, requests done, CPU seconds by thread)
    of one soakd run."""
    import sqlite3

    from soakd.config import load_settings
    from soakd.run.runner import run_soak

    s = load_settings(
        overrides=[
            "workload.kind=openai",
            f"workload.base_url={base_url!r}",
            f"workload.max_tokens={TOKENS}",
            f"run.db={str(db)!r}",
            f"run.fps={rate}",
            f"run.duration={duration}",
            "run.warmup_s=0",
            "run.log_every=0",
            f"source.width={WIDTH}",
            f"source.height={HEIGHT}",
        ]
    )
    marks = RunMarks()
    result = run_soak(s, observers=[marks])
    with sqlite3.connect(db) as c:
        n = c.execute(
            "SELECT count(*) FROM frames WHERE run_id = ? AND error IS NULL", (result.run_id,)
        ).fetchone()[0]
    return marks.end - marks.start, int(n), marks.by_thread()


def _tick_ms(sample: Callable[[], Any], ticks: int) -> float:
    """This thread's CPU a tick, ms, of ``sample`` called every 150 ms (the sampler's
    period): the wake's cost included, as the sampler pays it."""
    c0 = time.thread_time_ns()
    for _ in range(ticks):
        sample()
        time.sleep(0.15)
    return (time.thread_time_ns() - c0) / ticks / 1e6


def _probe_tick_ms(pid: int, refresh_s: float, ticks: int) -> float:
    from soakd.telemetry import server as srv

    keep = srv.TREE_REFRESH_S
    srv.TREE_REFRESH_S = refresh_s
    try:
        probe = srv.ServerProcessProbe(pid)
        return _tick_ms(lambda: probe.sample({}), ticks)
    finally:
        srv.TREE_REFRESH_S = keep


def run(quick: bool, workdir: Path) -> BenchResult:
    import numpy as np

    from soakd.config import load_settings
    from soakd.records import Frame
    from soakd.telemetry import server as srv
    from soakd.workloads.base import WorkloadContext
    from soakd.workloads.openai import OpenAIStaged
    from tests.openai_test_server import start_server

    duration, ticks = (8.0, 30) if quick else (60.0, 200)
    res = BenchResult(
        "served_cpu", quick,
        params={"rate": RATE, "rate_high": RATE_HIGH, "duration_s": duration, "tokens": TOKENS,
                "frame": f"{WIDTH}x{HEIGHT}", "probe_ticks": ticks,
                "tree_refresh_s": srv.TREE_REFRESH_S,
                "server": "tests/openai_test_server.py"},
    )  # fmt: skip
    with start_server() as server:
        s = load_settings(
            overrides=["workload.kind=openai", f"workload.base_url={server.base_url!r}"]
        )
        wl = OpenAIStaged(s.workload, WorkloadContext())  # type: ignore[arg-type]
        wl.setup()
        image = np.random.default_rng(0).integers(0, 255, (HEIGHT, WIDTH, 3), dtype=np.uint8)
        body = wl.preprocess(Frame(0, 0, 0, 0, image))[1]
        wl.close()
        frames = source_frames(int(duration * RATE) + 2, WIDTH, HEIGHT, RATE)
        host = len(psutil.pids())
        cpu_b, n_b = _bare(server.base_url, body, RATE, duration)
        cpu_f, n_f = _bare(server.base_url, body, RATE, duration, frames, QUALITY)
        cpu_s, n_s, threads = _soakd(server.base_url, workdir / "kept.db", RATE, duration)
        keep = srv.TREE_REFRESH_S
        srv.TREE_REFRESH_S = 0.0
        try:
            cpu_e, n_e, _ = _soakd(server.base_url, workdir / "every.db", RATE, duration)
        finally:
            srv.TREE_REFRESH_S = keep
        # at RATE_HIGH the per-second costs (telemetry, the monitor) weigh on each request
        # less: the ratio there is what soakd adds per request itself
        cpu_bh, n_bh = _bare(server.base_url, body, RATE_HIGH, duration / 2, frames, QUALITY)
        cpu_sh, n_sh, _ = _soakd(server.base_url, workdir / "high.db", RATE_HIGH, duration / 2)
        kept_ms = _probe_tick_ms(server.pid, keep, ticks)
        every_ms = _probe_tick_ms(server.pid, 0.0, ticks)
        # the sampler's tick taken apart: a wake that does nothing, this process's probe
        empty_ms = _tick_ms(lambda: None, ticks)
        own = ProcessProbe()
        own_ms = _tick_ms(lambda: own.sample({}), ticks)
    per = {
        "bare httpx": (cpu_b, n_b, duration),
        "bare httpx, a frame encoded per request": (cpu_f, n_f, duration),
        "soakd": (cpu_s, n_s, duration),
        "soakd, tree every tick": (cpu_e, n_e, duration),
        f"bare httpx encoding each frame, {RATE_HIGH:g}/s": (cpu_bh, n_bh, duration / 2),
        f"soakd, {RATE_HIGH:g}/s": (cpu_sh, n_sh, duration / 2),
    }
    for arm, (cpu, n, seconds) in per.items():
        res.rows.append(
            {
                "arm": arm,
                "requests": n,
                "cpu_ms_per_request": 1e3 * cpu / max(n, 1),
                "core_pct": 100 * cpu / seconds,
                "probe_tick_ms": None,
            }
        )
    bare_ms = 1e3 * cpu_b / max(n_b, 1)
    fair_ms = 1e3 * cpu_f / max(n_f, 1)
    soak_ms = 1e3 * cpu_s / max(n_s, 1)
    res.metrics.update(
        host_processes=host, bare_cpu_ms_per_request=bare_ms, soakd_cpu_ms_per_request=soak_ms,
        bare_encoding_cpu_ms_per_request=fair_ms,
        ratio_to_encoding_bare=soak_ms / fair_ms if fair_ms else None,
        every_tick_cpu_ms_per_request=1e3 * cpu_e / max(n_e, 1),
        ratio=soak_ms / bare_ms if bare_ms else None,
        ratio_at_high_rate=(cpu_sh / max(n_sh, 1)) / (cpu_bh / max(n_bh, 1)) if cpu_bh else None,
        probe_tick_ms_kept=kept_ms, probe_tick_ms_every_tick=every_ms,
        empty_tick_ms=empty_ms, process_probe_tick_ms=own_ms,
    )  # fmt: skip
    # one number a metric (the results' schema): the split by thread, thread by thread
    res.metrics.update(
        {f"soakd_cpu_ms_per_request[{k}]": 1e3 * v / max(n_s, 1) for k, v in threads.items()}
    )
    for arm, ms in (
        ("probe alone, tree kept", kept_ms),
        ("probe alone, every tick", every_ms),
        ("an empty tick (the wake alone)", empty_ms),
        ("this process's probe alone", own_ms),
    ):
        res.rows.append(
            {"arm": arm, "requests": None, "cpu_ms_per_request": None, "core_pct": None,
             "probe_tick_ms": ms}
        )  # fmt: skip
    res.notes.append(f"{host} processes on the host")
    split = ", ".join(
        f"{k} {1e3 * v / max(n_s, 1):.2f}"
        for k, v in sorted(threads.items(), key=lambda kv: -kv[1])
    )
    res.notes.append(f"soakd's CPU per request by thread (ms): {split}")
    res.targets.append(
        Target(
            "soakd CPU per request / bare httpx loop's",
            soak_ms / bare_ms if bare_ms else None,
            1.5,
            "<=",
            "x",
            f"at {RATE:g} requests/s, same server, same machine",
        )
    )
    res.targets.append(
        Target(
            "soakd CPU per request / bare httpx loop's encoding each frame",
            soak_ms / fair_ms if fair_ms else None,
            1.5,
            "<=",
            "x",
            "the bare loop JPEG-encodes each request's frame, as soakd and any client must",
        )
    )
    return res


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
