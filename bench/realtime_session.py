"""Realtime sessions: soakd's CPU per frame pushed (``kind = "realtime"``) against a bare
``websockets`` loop pushing the same frames.

Target (issue 34): soakd's CPU per frame at most 1.5x the bare loop's.

Both arms run in this process, one after the other, against the same server
(tests/realtime_test_server.py, a test server, vLLM-Omni's streaming video dialect, no
question asked: frames only), at the same rate for the same time, and their CPU is this
process's CPU time over the arm (``time.process_time``: every thread; the server is another
process). The bare loop is what anyone would write: one ``websockets`` connection, each frame (the
synthetic source's own pictures, read beforehand) JPEG-encoded (OpenCV, the same quality),
base64, a ``video.frame`` JSON, sent on a
``time.sleep`` schedule. soakd's arm is a whole soak (``run_soak``): pacer, source, sender and
receiver threads, the sampler, the SQLite writer, the verdict at the end; its setup and
verdict are inside its CPU time, so a short run overstates soakd's steady cost; a second soak
half as long gives the marginal cost (the longer run's CPU minus the shorter's, per frame
more), where setup and verdict cancel out (both soaks come after a 1 s warm-up soak, as the
bare arms after a 1 s warm-up loop: else the first soak alone pays soakd's imports).

A second bare arm reads each frame from the synthetic source as it goes (soakd's pacer
captures each frame on its tick; the first bare arm's pictures are read beforehand, outside
its CPU): what a client pushing a camera's frames also pays. Both bare arms are kept and
both ratios reported. Beside soakd's whole soak, its CPU from the run's start to its stop
(setup and verdict left out, as bench/served_cpu.py counts it), and each of its threads'
CPU over that span (each thread's CPU clock, ns: ``bench.served_cpu.thread_cpu``).
"""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import BenchResult, Target, bench_main
from bench.served_cpu import RunMarks

WIDTH, HEIGHT, FPS, QUALITY = 320, 240, 10.0, 85


def _source_frames(n: int) -> list[np.ndarray]:
    """The frames soakd's synthetic source gives (the same pictures in both arms: a JPEG's
    cost depends on what it shows), read before the arm's CPU clock starts."""
    from soakd.config import load_settings
    from soakd.sources.synthetic import SyntheticSource

    cfg = load_settings(overrides=[f"source.width={WIDTH}", f"source.height={HEIGHT}"]).source
    src = SyntheticSource(cfg, fps=FPS)
    src.open()
    return [src.read()[0].copy() for _ in range(n)]


def _live_source() -> Any:
    from soakd.config import load_settings
    from soakd.sources.synthetic import SyntheticSource

    cfg = load_settings(overrides=[f"source.width={WIDTH}", f"source.height={HEIGHT}"]).source
    src = SyntheticSource(cfg, fps=FPS)
    src.open()
    return lambda: src.read()[0]


def _bare(url: str, seconds: float, live: bool = False) -> tuple[float, int]:
    """CPU seconds and frames of a bare loop pushing frames at FPS for ``seconds``; ``live``:
    each frame read from the source in the loop, not beforehand."""
    import cv2
    from websockets.sync.client import connect

    if live:
        read = _live_source()
    else:
        images = _source_frames(int(seconds * FPS) + 1)
        read = lambda: images[n % len(images)]  # noqa: E731
    c0 = time.process_time()
    n = 0
    with connect(url, max_size=None) as ws:
        ws.send(json.dumps({"type": "session.config", "modalities": ["text"]}))
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            img = read()
            _, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, QUALITY])
            data = base64.b64encode(buf.tobytes()).decode("ascii")
            ws.send(json.dumps({"type": "video.frame", "data": data}))
            n += 1
            time.sleep(max(0.0, t0 + n / FPS - time.perf_counter()))
    return time.process_time() - c0, n


def _soakd(url: str, seconds: float, workdir: Path) -> tuple[float, int, RunMarks]:
    """CPU seconds and frames of a whole soak, and its marks: the CPU from the run's start to
    its stop (setup and verdict left out), by thread."""
    from soakd.config import load_settings
    from soakd.run.runner import run_soak

    db = workdir / "realtime_session.db"
    s = load_settings(
        overrides=[
            "workload.kind=realtime", "workload.protocol='vllm-omni-video'",
            f"workload.url={url!r}", "workload.question_every_s=86400",
            f"workload.jpeg_quality={QUALITY}", f"run.db={str(db)!r}",
            f"run.duration={seconds}", f"run.fps={FPS}", "run.warmup_s=0.5", "run.log_every=0",
            "source.kind='synthetic'", f"source.width={WIDTH}", f"source.height={HEIGHT}",
            "telemetry.server_process='off'",
        ]
    )  # fmt: skip
    marks = RunMarks()
    c0 = time.process_time()
    result = run_soak(s, observers=[marks])
    cpu = time.process_time() - c0
    import sqlite3

    with sqlite3.connect(db) as conn:  # the frames the socket took: a row each
        q = "SELECT count(*) FROM frames WHERE run_id = ? AND error IS NULL"
        n = int(conn.execute(q, (result.run_id,)).fetchone()[0])
    return cpu, n, marks


def run(quick: bool, workdir: Path) -> BenchResult:
    from tests.realtime_test_server import start

    seconds = 4.0 if quick else 30.0
    res = BenchResult(
        "realtime_session", quick,
        params={"seconds": seconds, "fps": FPS, "frame": f"{WIDTH}x{HEIGHT}",
                "jpeg_quality": QUALITY, "server": "tests/realtime_test_server.py"},
    )  # fmt: skip
    srv = start()
    try:
        url = f"ws://127.0.0.1:{srv.port}/v1/video/chat/stream"
        _bare(url, 1.0)  # warm imports and the server
        # and soakd's (the analysis, the verdict): else the first soak pays them and the
        # marginal figure (first soak - second) counts imports as steady cost
        _soakd(url, 1.0, workdir)
        b_cpu, b_n = _bare(url, seconds)
        l_cpu, l_n = _bare(url, seconds, live=True)
        s_cpu, s_n, marks = _soakd(url, seconds, workdir)
        h_cpu, h_n, _ = _soakd(url, seconds / 2, workdir)  # the steady cost: what the longer adds
    finally:
        srv.stop()
    b_us, s_us = b_cpu / max(b_n, 1) * 1e6, s_cpu / max(s_n, 1) * 1e6
    l_us = l_cpu / max(l_n, 1) * 1e6
    threads = marks.by_thread()
    r_us = (marks.end - marks.start) / max(s_n, 1) * 1e6
    m_us = (s_cpu - h_cpu) / max(s_n - h_n, 1) * 1e6
    res.metrics.update(
        bare_cpu_us_per_frame=b_us, soakd_cpu_us_per_frame=s_us, bare_frames=b_n,
        soakd_frames=s_n, ratio=s_us / b_us if b_us else None,
        bare_cpu_pct_of_core=b_cpu / seconds * 100, soakd_cpu_pct_of_core=s_cpu / seconds * 100,
        soakd_marginal_cpu_us_per_frame=m_us, marginal_ratio=m_us / b_us if b_us else None,
        soakd_run_span_cpu_us_per_frame=r_us, run_span_ratio=r_us / b_us if b_us else None,
        bare_live_cpu_us_per_frame=l_us, ratio_to_live_bare=s_us / l_us if l_us else None,
        marginal_ratio_to_live_bare=m_us / l_us if l_us else None,
    )  # fmt: skip
    # one number a metric (the results' schema): the split by thread, thread by thread
    res.metrics.update(
        {f"soakd_cpu_us_per_frame[{k}]": v / max(s_n, 1) * 1e6 for k, v in threads.items()}
    )
    res.rows = [
        {"arm": "bare websockets", "cpu_us_per_frame": b_us, "frames": b_n},
        {"arm": "bare websockets, frames read live", "cpu_us_per_frame": l_us, "frames": l_n},
        {"arm": "soakd realtime (whole soak)", "cpu_us_per_frame": s_us, "frames": s_n},
        {
            "arm": "soakd realtime (run span: start to stop)",
            "cpu_us_per_frame": r_us,
            "frames": s_n,
        },
        {
            "arm": "soakd realtime (marginal: long - half)",
            "cpu_us_per_frame": m_us,
            "frames": s_n - h_n,
        },
    ]
    note = "same server, same rate and time; soakd's setup and verdict included"
    res.targets.append(Target("soakd CPU per frame / bare", s_us / b_us, 1.5, "<=", "x", note))
    note = "what a run twice as long costs more, per frame: setup and verdict cancel out"
    res.targets.append(
        Target("soakd marginal CPU per frame / bare", m_us / b_us, 1.5, "<=", "x", note)
    )
    note = "soakd's CPU from its run's start to its stop (setup and verdict out), as served_cpu"
    res.targets.append(
        Target("soakd run-span CPU per frame / bare", r_us / b_us, 1.5, "<=", "x", note)
    )
    note = "the bare loop reads each frame from the source as it goes, as soakd's pacer does"
    res.targets.append(
        Target("soakd CPU per frame / bare reading live", s_us / l_us, 1.5, "<=", "x", note)
    )
    res.targets.append(
        Target(
            "soakd marginal CPU per frame / bare reading live", m_us / l_us, 1.5, "<=", "x", note
        )
    )
    split = ", ".join(
        f"{k} {v / max(s_n, 1) * 1e6:.0f}"
        for k, v in sorted(threads.items(), key=lambda kv: -kv[1])
    )
    res.notes.append(f"soakd's CPU per frame by thread (us, run span): {split}")
    return res


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
