"""Harness overhead: soakd's per-frame cost around a no-op workload, against a bare loop and
MLPerf LoadGen's null SUT, all in one process.

Targets: issue 2, the median per-frame cost of soakd around a no-op workload against the
bare four-stage loop of ``time.perf_counter`` calls, under 50 µs added; issue 14, soakd's
unpaced per-frame cost (telemetry and the store on) at most 1.0x LoadGen's per-query cost.

soakd: an unpaced run (``paced=False``: frames back to back through the staged driver,
capture inline from the synthetic source) of the null workload (``NullWorkload`` below,
through ``kind = "python"``: stages that return at once, LoadGen's null SUT's counterpart),
with telemetry, the store writer and the monitor running as in production. The per-frame
cost is the median interval between consecutive frames' ``t_dispatch`` read back from the
run database: one whole cycle of grab, three timed stages, the frame's hand-off to the
sink. Beside it: the mean interval (everything the run spent per frame: the batches' turn
into records, the writer's, the observers' and the garbage collector's turns on the
interpreter included) and the median cycle less the source's own read (``grab_ms`` of the
next frame: rendering the 64x48 test pattern).

LoadGen (``mlcommons-loadgen``, the ``bench`` extra): the SingleStream scenario, a null SUT
whose ``issue_queries`` completes each query at once, a QSL of 16 samples that load
nothing, PerformanceOnly, exactly ``n`` queries, ``min_duration_ms = 0``. SingleStream is
the comparable scenario: one query in flight and the next issued when it completes, as
soakd's unpaced loop takes one frame at a time back to back (Offline hands every query to
one callback and Server paces them). Its per-query cost is measured like soakd's: the
median interval between consecutive ``issue_queries`` calls (LoadGen schedules, issues,
the SUT completes, LoadGen records), and the mean beside it. Without the package the
LoadGen row is skipped with a note.

The baseline loop: five ``perf_counter`` calls around four no-op stage calls, its
per-iteration cost measured the same way. Each repetition runs bare, LoadGen, soakd.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import (
    BenchResult,
    Target,
    bench_main,
    frame_columns,
    machine,
    noop_overrides,
)

LIMIT_US = 50.0
#: soakd's per-frame cost over LoadGen's per-query cost, at most (issue 14)
LIMIT_LOADGEN_RATIO = 1.0
#: the stream counts to measure once ``run.streams`` exists (issue 14)
STREAMS = (1, 4, 16)
#: samples in the null QSL (LoadGen picks one per query; nothing is loaded)
QSL_SAMPLES = 16


def _noop(x: object) -> object:
    return x


class NullWorkload:
    """soakd's counterpart of LoadGen's null SUT: a staged workload whose stages return at
    once (the same for both harnesses: a Python callback that does nothing)."""

    shape = "staged"

    def __init__(self) -> None:
        from soakd.records import StageOutput

        self._out = StageOutput(text="null", tokens=0)

    def setup(self) -> None:
        return None

    def preprocess(self, frame: Any) -> Any:
        return frame

    def infer(self, inputs: Any) -> Any:
        return inputs

    def decode(self, outputs: Any) -> Any:
        return self._out

    def sync(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": "null"}

    def close(self) -> None:
        return None


def null_workload(options: dict[str, Any], ctx: Any) -> NullWorkload:
    """``workload.factory = "bench.overhead:null_workload"``."""
    return NullWorkload()


#: the run's workload: the null SUT above, through ``kind = "python"``
NULL_WORKLOAD = ("workload.kind=python", 'workload.factory="bench.overhead:null_workload"')


def bare_loop(n: int) -> np.ndarray:
    """Per-iteration seconds of the bare four-stage loop (``n - 1`` intervals)."""
    pc = time.perf_counter
    starts = [0.0] * n
    stage = _noop
    for i in range(n):
        t0 = pc()
        a = stage(i)  # grab
        t1 = pc()
        b = stage(a)  # preprocess
        t2 = pc()
        c = stage(b)  # infer
        t3 = pc()
        stage(c)  # decode
        t4 = pc()
        starts[i] = t0
        del t1, t2, t3, t4
    return np.diff(np.asarray(starts))


def loadgen_loop(n: int, logdir: Path) -> np.ndarray | None:
    """Seconds between consecutive queries of LoadGen's SingleStream null SUT over ``n``
    queries, or None when ``mlperf_loadgen`` is not installed."""
    try:
        import mlperf_loadgen as lg
    except ImportError:
        return None
    issued: list[int] = []
    stamp = time.perf_counter_ns

    def issue_queries(queries: Any) -> None:
        issued.append(stamp())
        lg.QuerySamplesComplete([lg.QuerySampleResponse(q.id, 0, 0) for q in queries])

    sut = lg.ConstructSUT(issue_queries, lambda: None)
    qsl = lg.ConstructQSL(QSL_SAMPLES, QSL_SAMPLES, lambda s: None, lambda s: None)
    try:
        lg.StartTestWithLogSettings(sut, qsl, _loadgen_settings(lg, n), _loadgen_logs(lg, logdir))
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    if len(issued) != n:
        raise RuntimeError(f"LoadGen issued {len(issued)} queries, expected {n}")
    return np.diff(np.asarray(issued, dtype=np.float64)) / 1e9


def _loadgen_settings(lg: Any, n: int) -> Any:
    ts = lg.TestSettings()
    ts.scenario = lg.TestScenario.SingleStream
    ts.mode = lg.TestMode.PerformanceOnly
    ts.min_query_count = ts.max_query_count = n
    ts.min_duration_ms = 0
    return ts


def _loadgen_logs(lg: Any, logdir: Path) -> Any:
    """LoadGen's summary and detail logs in ``logdir``, nothing on stdout, no trace."""
    logdir.mkdir(parents=True, exist_ok=True)
    out = lg.LogOutputSettings()
    out.outdir = str(logdir)
    out.copy_summary_to_stdout = False
    ls = lg.LogSettings()
    ls.log_output = out
    ls.enable_trace = False
    return ls


def soakd_loop(
    n: int, db: Path, extra: tuple[str, ...] = ()
) -> tuple[np.ndarray, dict[str, float]]:
    """Per-frame seconds of an unpaced no-op soakd run of ``n`` frames, and its summary."""
    from soakd.config import load_settings
    from soakd.run.runner import run_soak

    overrides = [*noop_overrides(db, fps=30, duration_s=3600), *NULL_WORKLOAD, *extra]
    res = run_soak(load_settings(overrides=overrides), paced=False, max_frames=n, judge=False)
    if res.status != "completed":
        raise RuntimeError(f"soakd run ended {res.status}: {res.reason}")
    cols = frame_columns(db, res.run_id, ["t_dispatch", "total_ms", "grab_ms"])
    t = cols["t_dispatch"]
    if t.size < n:
        raise RuntimeError(f"expected {n} frames in the run database, got {t.size}")
    # the interval before a frame holds its grab: less that, the cycle without the source
    ex_source = np.diff(t) * 1e6 - cols["grab_ms"][1:] * 1e3
    stats = {
        "in_driver_total_us_median": float(np.median(cols["total_ms"][1:])) * 1e3,
        "ex_source_us_median": float(np.median(ex_source)),
    }
    return np.diff(np.sort(t)), stats  # sorted: over all streams, once there are several


def streams_supported() -> bool:
    """Whether this soakd has ``run.streams`` (issue 14: N sources feeding one workload)."""
    from soakd.config import RunSettings

    return "streams" in RunSettings.model_fields


def streams_rows(n: int, workdir: Path) -> list[dict[str, Any]] | None:
    """soakd's per-frame cost with 1, 4 and 16 streams (issue 14), or None without
    ``run.streams``: an unpaced run of ``run.streams = N`` grabs from the N sources in turn
    (``run.pacer.RoundRobin``) and stores every stream's frames in the one run, so the cost
    is the median interval between dispatches over all streams, as for one stream."""
    if not streams_supported():
        return None
    rows = []
    for k in STREAMS:
        s, _ = soakd_loop(n, workdir / f"overhead-streams-{k}.db", (f"run.streams={k}",))
        med = float(np.median(s)) * 1e6
        rows.append({"streams": k, "soakd_us_median": med, "soakd_us_mean": _us(s)[1]})
    return rows


def _us(a: np.ndarray) -> tuple[float, float]:
    """Median and mean of intervals in seconds, as µs."""
    return float(np.median(a)) * 1e6, float(np.mean(a)) * 1e6


def _rep(rep: int, n: int, workdir: Path) -> dict[str, Any]:
    """One repetition: bare loop, LoadGen, soakd, in that order."""
    b = bare_loop(n)
    lg = loadgen_loop(n, workdir / f"loadgen-{rep}")
    s, stats = soakd_loop(n, workdir / f"overhead-{rep}.db")
    row: dict[str, Any] = {"rep": rep, "bare_us_median": _us(b)[0]}
    if lg is not None:
        row["loadgen_us_median"], row["loadgen_us_mean"] = _us(lg)
    row["soakd_us_median"], row["soakd_us_mean"] = _us(s)
    row["soakd_ex_source_us_median"] = stats["ex_source_us_median"]
    row["soakd_us_p99"] = float(np.percentile(s, 99)) * 1e6
    row["soakd_in_driver_total_us"] = stats["in_driver_total_us_median"]
    if lg is not None:
        row["ratio_vs_loadgen"] = row["soakd_us_median"] / row["loadgen_us_median"]
    return row


def _spread(rows: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    """Median, min and max of ``key`` over the repetitions."""
    v = [float(r[key]) for r in rows]
    return float(np.median(v)), min(v), max(v)


def run(quick: bool, workdir: Path) -> BenchResult:
    n = 3_000 if quick else 100_000
    reps = 1 if quick else 3
    res = BenchResult("overhead", quick, params={"frames": n, "repetitions": reps})
    res.rows.extend(_rep(rep, n, workdir) for rep in range(reps))
    _summarise(res, res.rows)
    _add_streams(res, n, workdir)
    res.notes.append(_machine_line())
    res.notes.append(
        "soakd's cycle includes rendering a 64x48 synthetic frame (the grab; "
        "soakd_ex_source_us_per_frame is the cycle without it) and the frame's hand-off to "
        "the sink; the mean adds every 256th frame's batch turned into records and handed "
        "to the writer, the writer's binding (its thread shares the GIL), the observers and "
        "the garbage collector; figures are medians over the repetitions, *_min and *_max "
        "their spread"
    )
    return res


def _summarise(res: BenchResult, rows: list[dict[str, Any]]) -> None:
    bare = _spread(rows, "bare_us_median")[0]
    soak, soak_lo, soak_hi = _spread(rows, "soakd_us_median")
    res.metrics.update(
        bare_us_per_frame=bare,
        soakd_us_per_frame=soak,
        soakd_us_per_frame_min=soak_lo,
        soakd_us_per_frame_max=soak_hi,
        soakd_mean_us_per_frame=_spread(rows, "soakd_us_mean")[0],
        soakd_ex_source_us_per_frame=_spread(rows, "soakd_ex_source_us_median")[0],
        added_us_per_frame=soak - bare,
        ratio=soak / bare,
        soakd_in_driver_total_us=_spread(rows, "soakd_in_driver_total_us")[0],
    )
    res.targets.append(
        Target("added per-frame cost (soakd - bare loop)", soak - bare, LIMIT_US, "<=", "µs")
    )
    if "loadgen_us_median" not in rows[0]:
        res.notes.append(
            "mlperf_loadgen is not installed (pip install 'soakd[bench]'): "
            "the LoadGen baseline and its ratio are skipped"
        )
        return
    lg, lg_lo, lg_hi = _spread(rows, "loadgen_us_median")
    ratio, ratio_lo, ratio_hi = _spread(rows, "ratio_vs_loadgen")
    res.metrics.update(
        loadgen_us_per_query=lg,
        loadgen_us_per_query_min=lg_lo,
        loadgen_us_per_query_max=lg_hi,
        loadgen_mean_us_per_query=_spread(rows, "loadgen_us_mean")[0],
        ratio_vs_loadgen=ratio,
        ratio_vs_loadgen_min=ratio_lo,
        ratio_vs_loadgen_max=ratio_hi,
        ratio_vs_loadgen_mean=res.metrics["soakd_mean_us_per_frame"]
        / _spread(rows, "loadgen_us_mean")[0],
    )
    res.targets.append(
        Target(
            "soakd per-frame / LoadGen per-query cost (medians)",
            ratio,
            LIMIT_LOADGEN_RATIO,
            "<=",
            "x",
        )
    )


def _machine_line() -> str:
    """The CPU and versions that the absolute figures belong to (ratios travel, µs do not)."""
    m = machine()
    try:
        from importlib.metadata import version

        lg = version("mlcommons-loadgen")
    except Exception:  # not installed
        lg = "not installed"
    return (
        f"machine: {m['processor']}, {m['cpu_count']} CPUs at {m['cpu_mhz']} MHz, load "
        f"{m['loadavg']}, Python {m['python']}, SQLite {m['sqlite']}, mlcommons-loadgen {lg}"
    )


def _add_streams(res: BenchResult, n: int, workdir: Path) -> None:
    rows = streams_rows(n, workdir)
    if rows is None:
        res.notes.append(
            "run.streams does not exist yet (issue 14): the 1, 4 and 16 stream rows are not "
            "measured (hook: bench/overhead.py streams_rows)"
        )
        return
    lg = res.metrics.get("loadgen_us_per_query")
    for r in rows:
        k = r["streams"]
        res.metrics[f"soakd_us_per_frame_{k}_streams"] = r["soakd_us_median"]
        if lg:
            res.metrics[f"ratio_vs_loadgen_{k}_streams"] = r["soakd_us_median"] / lg


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
