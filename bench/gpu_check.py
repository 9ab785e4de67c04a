"""GPU check for the telemetry probes and CUDA stage timing (run it when a GPU host is lent).

    python -m bench.gpu_check [--device cuda:0] [--cycles 3] [--step-mb 256] [--steps 4]

1. Starts the real sampler (100 ms) with ``default_probes(device)`` and drives a memory
   sawtooth: allocate ``steps`` blocks of ``step_mb`` MiB one by one, free them all, repeat
   ``cycles`` times. Checks that the NVML and torch-allocator columns carry real values,
   that torch's allocated bytes rise by the expected amount and fall back, and that NVML's
   used memory and this process's GPU memory follow the reserved pool.
2. Times a matmul stage two ways: up to kernel enqueue (no synchronize) and up to
   ``torch.cuda.synchronize()``. The synchronized time must be clearly longer; that is why
   soakd ends each CUDA stage after ``sync()``.
3. Per-GPU sampling (``run.gpus``) on every visible GPU, one after another: allocates
   ``step_mb`` MiB on it and checks that ``GpuDevicesProbe`` puts the rise on that GPU's
   ``DeviceSample`` (not on another's), that its used memory matches a direct NVML read and
   that its UUID is the one torch reports for that CUDA ordinal (CUDA_VISIBLE_DEVICES).
4. ``workload.timing``, "events" against "sync", through the real staged driver (unpaced
   runs, read back from their databases): (a) ``QueuedWork``, whose ``preprocess`` queues a
   matmul chain without waiting and whose ``infer`` waits for a small one: both timings
   must put the chain in ``pre`` (at least 80 % of its synchronized time) and not in
   ``infer``, the events run must store ``stage_timing = "events"`` and be no slower per
   frame; (b) the tiny LLaVA (``tiny-vlm``) on the device: the events run's stages must sum
   to its total and its median total stay within 25 % of the sync run's.
5. With 2+ visible GPUs, a real soak (``run_soak``) of a model sharded over cuda:0 and
   cuda:1 by a ``device_map`` in its options: ``gpu_samples`` must hold one row per tick for
   each GPU under the UUIDs NVML gives, and the verdict a ``memory_gpu[i]`` for each. On a
   one-GPU host it says it skipped this.

Prints one JSON summary on stdout; exit 0 when every check passed, 1 when one failed. On a
host without a GPU it prints ``{"gpu": false, ...}`` with the reason and exits 0. Takes well
under a minute on a GPU host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from typing import Any

MB = 1 << 20


class _Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str, *args: Any, **kw: Any) -> None:
        self.warnings.append(message)


def _no_gpu(reason: str) -> int:
    print(json.dumps({"gpu": False, "ok": True, "message": f"no GPU: {reason}; nothing to check"}))
    return 0


def _sawtooth(torch: Any, device: str, cycles: int, steps: int, step_mb: int) -> list[dict]:
    """Allocate/free in steps; returns the phases with their times (perf_counter)."""
    phases: list[dict] = []
    for c in range(cycles):
        blocks = []
        for s in range(steps):
            blocks.append(torch.ones(step_mb * MB // 4, dtype=torch.float32, device=device))
            torch.cuda.synchronize(device)
            phases.append({"cycle": c, "step": s + 1, "t": time.perf_counter()})
            time.sleep(0.4)
        del blocks
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # hand the pool back so NVML sees the fall too
        phases.append({"cycle": c, "step": 0, "t": time.perf_counter()})
        time.sleep(0.6)
    return phases


def _stage_timing(torch: Any, device: str, n: int = 4096, reps: int = 10) -> dict[str, Any]:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    for _ in range(3):  # warm-up (cuBLAS handles, clocks)
        a @ b
    torch.cuda.synchronize(device)
    enqueue, synced = [], []
    for _ in range(reps):
        t = time.perf_counter()
        c = a @ b
        t_enq = time.perf_counter()
        torch.cuda.synchronize(device)
        t_sync = time.perf_counter()
        enqueue.append((t_enq - t) * 1e3)
        synced.append((t_sync - t) * 1e3)
        del c
    enq, syn = statistics.median(enqueue), statistics.median(synced)
    return {
        "matmul_n": n,
        "enqueue_ms_p50": round(enq, 3),
        "synchronized_ms_p50": round(syn, 3),
        "ratio": round(syn / max(enq, 1e-6), 1),
        "ok": syn > 2 * enq,
    }


def _check_series(samples: list[Any], step_mb: int, steps: int) -> dict[str, Any]:
    cols = (
        "gpu_mem_used_bytes",
        "gpu_mem_total_bytes",
        "gpu_util_pct",
        "gpu_proc_mem_bytes",
        "gpu_temp_c",
        "gpu_power_w",
        "gpu_sm_clock_mhz",
        "torch_allocated_bytes",
        "torch_reserved_bytes",
        "torch_max_allocated_bytes",
        "torch_alloc_retries",
        "torch_ooms",
    )
    present = {c: sum(s.values.get(c) is not None for s in samples) for c in cols}

    def series(col: str) -> list[float]:
        return [float(v) for s in samples if (v := s.values.get(col)) is not None]

    alloc = series("torch_allocated_bytes")
    used = series("gpu_mem_used_bytes")
    proc = series("gpu_proc_mem_bytes")
    want = steps * step_mb * MB
    swing = (max(alloc) - min(alloc)) if alloc else 0.0
    used_swing = (max(used) - min(used)) if used else 0.0
    proc_swing = (max(proc) - min(proc)) if proc else 0.0
    lags = sorted(s.lag_ms for s in samples)
    checks = {
        "nvml_memory_present": present["gpu_mem_used_bytes"] > 0,
        "nvml_util_present": present["gpu_util_pct"] > 0,
        "torch_stats_present": present["torch_allocated_bytes"] > 0,
        "torch_allocated_swing_matches": abs(swing - want) <= 0.1 * want,
        "torch_allocated_falls_back": bool(alloc) and alloc[-1] <= min(alloc) + 0.1 * want,
        "nvml_used_follows": used_swing >= 0.8 * want,
    }
    # a PID namespace (container) can hide this process from NVML: reported, not failed
    proc_check = proc_swing >= 0.8 * want if proc else None
    return {
        "samples": len(samples),
        "non_null": present,
        "torch_allocated_swing_mb": round(swing / MB, 1),
        "nvml_used_swing_mb": round(used_swing / MB, 1),
        "proc_mem_swing_mb": round(proc_swing / MB, 1),
        "expected_swing_mb": steps * step_mb,
        "lag_ms_p99": round(lags[int(0.99 * (len(lags) - 1))], 3) if lags else None,
        "tick_ms_max": round(max(s.tick_ms for s in samples), 3) if samples else None,
        "last": {k: v for k, v in samples[-1].values.items() if v is not None} if samples else {},
        "checks": {**checks, "proc_mem_follows": proc_check},
        "ok": all(checks.values()) and proc_check is not False,
    }


def _devices_probe(torch: Any) -> tuple[Any, Any, list[Any]]:
    """(nvml, a GpuDevicesProbe over every visible GPU, their NVML handles by ordinal)."""
    import importlib
    import os

    from soakd.environment import device_uuid, nvml_handle, nvml_index
    from soakd.telemetry.devices import GpuDevicesProbe
    from soakd.telemetry.probes import NvmlProbe

    nvml = importlib.import_module("pynvml")
    nvml.nvmlInit()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    handles = [nvml_handle(nvml, o, env) for o in range(torch.cuda.device_count())]
    devices = [(nvml_index(nvml, h), device_uuid(nvml, h), NvmlProbe(h, nvml)) for h in handles]
    return nvml, GpuDevicesProbe(devices, primary=devices[0][0]), handles


def _read(probe: Any) -> dict[int, Any]:
    return {d.gpu: d for d in probe.sample_devices({}, 0, 0.0)}


def _nvml_used(nvml: Any, handle: Any) -> int:
    """Used memory straight from NVML (v2 when the driver has it, as the probe reads it)."""
    try:
        return int(nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2).used)
    except (AttributeError, TypeError, nvml.NVMLError):
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)


def _one_gpu(torch: Any, nvml: Any, probe: Any, handle: Any, ordinal: int, mb: int) -> dict:
    """Allocate ``mb`` MiB on cuda:``ordinal``: the rise must land on its reading only."""
    gpu = probe.devices[ordinal][0]
    before = _read(probe)
    block = torch.ones(mb * MB // 4, dtype=torch.float32, device=f"cuda:{ordinal}")
    torch.cuda.synchronize(ordinal)
    time.sleep(0.3)
    after = _read(probe)
    direct = _nvml_used(nvml, handle)
    del block
    torch.cuda.empty_cache()
    rise = {g: (after[g].mem_used_bytes or 0) - (before[g].mem_used_bytes or 0) for g in after}
    proc = (after[gpu].proc_mem_bytes or 0) - (before[gpu].proc_mem_bytes or 0)
    torch_uuid = str(getattr(torch.cuda.get_device_properties(ordinal), "uuid", "") or "")
    checks = {
        "rise_on_this_gpu": rise[gpu] >= 0.8 * mb * MB,
        "no_rise_elsewhere": all(r < 0.2 * mb * MB for g, r in rise.items() if g != gpu),
        "matches_direct_nvml": abs((after[gpu].mem_used_bytes or 0) - direct) <= 64 * MB,
        "uuid_is_torchs": not torch_uuid or after[gpu].uuid.endswith(torch_uuid),
    }
    return {
        "cuda": ordinal,
        "gpu": gpu,
        "uuid": after[gpu].uuid,
        "torch_uuid": torch_uuid or None,
        "rise_mb": {str(g): round(r / MB, 1) for g, r in rise.items()},
        "proc_rise_mb": round(proc / MB, 1),  # a PID namespace can hide it: not a check
        "util_pct": after[gpu].util_pct,
        "checks": checks,
        "ok": all(checks.values()),
    }


def _check_every_gpu(torch: Any, mb: int) -> dict[str, Any]:
    nvml, probe, handles = _devices_probe(torch)
    try:
        per = [_one_gpu(torch, nvml, probe, h, o, mb) for o, h in enumerate(handles)]
    finally:
        probe.close()
    return {"gpus": per, "ok": all(p["ok"] for p in per)}


class QueuedWork:
    """``preprocess`` queues ``reps`` matmuls of ``n`` x ``n`` on the GPU and returns at once;
    ``infer`` runs one small matmul and waits for its result (``.item()``), as ``generate``
    waits for its tokens; ``decode`` is host work."""

    shape = "staged"

    def __init__(self, options: dict[str, Any], device: str) -> None:
        self.n, self.reps, self.device = (
            int(options.get("n", 4096)),
            int(options.get("reps", 8)),
            device,
        )

    def setup(self) -> None:
        import torch

        self.torch = torch
        self.a = torch.randn(self.n, self.n, device=self.device)
        self.small = torch.randn(64, 64, device=self.device)

    def preprocess(self, frame: Any) -> Any:
        x = self.a
        for _ in range(self.reps):
            x = self.a @ x
        return x

    def infer(self, x: Any) -> Any:
        return (self.small @ self.small).sum().item() + float(x.numel())

    def decode(self, out: Any) -> Any:
        from soakd.records import StageOutput

        return StageOutput(text=f"{out:.1f}", tokens=1)

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def describe(self) -> dict[str, Any]:
        return {"kind": "queued_work", "n": self.n, "reps": self.reps}

    def close(self) -> None:
        del self.a, self.small


def queued_work(options: dict[str, Any], ctx: Any) -> QueuedWork:
    """The ``kind = "python"`` factory of ``QueuedWork``."""
    return QueuedWork(options, ctx.device)


def _timed_run(overrides: list[str], frames: int) -> dict[str, Any]:
    """An unpaced run of ``frames`` frames: the timing it used, its fallback events and the
    medians of its stages (the first frame left out)."""
    import sqlite3
    import tempfile

    from soakd.config import load_settings
    from soakd.run.runner import run_soak

    with tempfile.TemporaryDirectory() as tmp:
        db = f"{tmp}/timing.db"
        base = [f"run.db={db!r}", "run.warmup_s=0", "run.log_every=0"]
        result = run_soak(
            load_settings(overrides=[*base, *overrides]),
            max_frames=frames,
            paced=False,
            judge=False,
        )
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT pre_ms, infer_ms, decode_ms, total_ms - grab_ms FROM frames"
                " WHERE run_id = ? AND NOT first AND error IS NULL",
                (result.run_id,),
            ).fetchall()
            fallbacks = conn.execute(
                "SELECT message FROM events WHERE run_id = ? AND kind = 'stage_timing'",
                (result.run_id,),
            ).fetchall()
    names = ("pre_ms", "infer_ms", "decode_ms", "stages_total_ms")
    cols = list(zip(*rows, strict=True)) if rows else [()] * 4
    med = {
        k: round(statistics.median(c), 3) if c else None for k, c in zip(names, cols, strict=True)
    }
    gaps = [abs(p + i + d - t) for p, i, d, t in rows]
    return {
        "used": result.summary.get("stage_timing"),
        "fallbacks": [m for (m,) in fallbacks],
        "frames": len(rows),
        **med,
        "max_stage_sum_gap_ms": round(max(gaps, default=0.0), 3),
    }


def _chain_ms(torch: Any, device: str, n: int, reps: int) -> float:
    """The matmul chain's own synchronized time (ms, median of 5)."""
    a = torch.randn(n, n, device=device)
    times = []
    for _ in range(6):
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        x = a
        for _ in range(reps):
            x = a @ x
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[1:])


def _check_timing_modes(torch: Any, device: str, frames: int) -> dict[str, Any]:
    """workload.timing "events" against "sync" on planted queued work and on the tiny
    LLaVA (see the module's docstring, step 4)."""
    chain = _chain_ms(torch, device, 4096, 8)
    queued = [
        'workload.kind="python"',
        'workload.factory="bench.gpu_check:queued_work"',
        f'workload.device="{device}"',
        "workload.options={n = 4096, reps = 8}",
    ]
    tiny = [
        'workload.kind="tiny-vlm"',
        f'workload.device="{device}"',
        "source.width=320",
        "source.height=240",
    ]
    runs = {
        f"{name}_{mode}": _timed_run([*over, f'workload.timing="{mode}"'], frames)
        for name, over in (("queued", queued), ("tiny_vlm", tiny))
        for mode in ("sync", "events")
    }
    qs, qe, ts, te = (
        runs[k] for k in ("queued_sync", "queued_events", "tiny_vlm_sync", "tiny_vlm_events")
    )
    checks = {
        "events_used": qe["used"] == te["used"] == "events" and not qe["fallbacks"],
        "sync_puts_chain_in_pre": (qs["pre_ms"] or 0) >= 0.8 * chain,
        "events_put_chain_in_pre": (qe["pre_ms"] or 0) >= 0.8 * chain,
        "events_keep_chain_out_of_infer": (qe["infer_ms"] or 1e9) < 0.2 * chain,
        "events_no_slower": (qe["stages_total_ms"] or 1e9) <= 1.05 * (qs["stages_total_ms"] or 0),
        "tiny_stages_sum_to_total": te["max_stage_sum_gap_ms"] < 0.01,
        "tiny_total_close_to_sync": abs((te["stages_total_ms"] or 0) - (ts["stages_total_ms"] or 0))
        <= 0.25 * (ts["stages_total_ms"] or 0),
    }
    return {"chain_ms": round(chain, 3), "runs": runs, "checks": checks, "ok": all(checks.values())}


class ShardedWorkload:
    """A model split in two by ``device_map`` (``{"half0": 0, "half1": 1}``): each frame runs
    a matmul on the first half's GPU, moves the result to the second's and runs another."""

    shape = "staged"

    def __init__(self, options: dict[str, Any]) -> None:
        self.map = options["device_map"]
        self.n = int(options.get("n", 2048))

    def setup(self) -> None:
        import torch

        self.torch = torch
        self.w = [torch.randn(self.n, self.n, device=f"cuda:{self.map[k]}") for k in self.map]

    def preprocess(self, frame: Any) -> Any:
        return self.w[0]

    def infer(self, x: Any) -> Any:
        for w in self.w:
            x = w @ x.to(w.device)
        return x

    def decode(self, out: Any) -> Any:
        from soakd.records import StageOutput

        return StageOutput(text="ok", tokens=1)

    def sync(self) -> None:
        for w in self.w:
            self.torch.cuda.synchronize(w.device)

    def describe(self) -> dict[str, Any]:
        return {"kind": "sharded", "device_map": self.map, "n": self.n}

    def close(self) -> None:
        self.w = []


def sharded(options: dict[str, Any], ctx: Any) -> ShardedWorkload:
    """The ``kind = "python"`` factory of ``ShardedWorkload``."""
    return ShardedWorkload(options)


#: the sharded soak: a python workload whose options carry a device_map over cuda:0 and cuda:1
_SHARDED = (
    'workload.kind="python"',
    'workload.factory="bench.gpu_check:sharded"',
    "workload.options={device_map = {half0 = 0, half1 = 1}}",
    "run.fps=5",
    "run.warmup_s=2",
    "run.sample_interval_ms=100",
    "run.log_every=0",
    "criteria.min_duration_s=5",
)


def _check_sharded_run(torch: Any, seconds: float) -> dict[str, Any]:
    """A soak of ``ShardedWorkload`` over cuda:0 and cuda:1, read back from its database."""
    n = torch.cuda.device_count()
    if n < 2:
        return {"skipped": f"needs 2+ visible GPUs, this host shows {n}", "ok": True}
    import sqlite3
    import tempfile

    from soakd.config import load_settings
    from soakd.run.runner import run_soak

    with tempfile.TemporaryDirectory() as tmp:
        db = f"{tmp}/gpu_check.db"
        s = load_settings(overrides=[*_SHARDED, f"run.db={db!r}", f"run.duration={seconds}"])
        result = run_soak(s)
        with sqlite3.connect(db) as conn:
            return _sharded_result(conn, result)


def _sharded_result(conn: Any, result: Any) -> dict[str, Any]:
    rid = result.run_id
    ticks = conn.execute("SELECT count(*) FROM samples WHERE run_id = ?", (rid,)).fetchone()[0]
    rows = conn.execute(
        "SELECT gpu, uuid, count(*), max(mem_used_bytes), max(util_pct) FROM gpu_samples"
        " WHERE run_id = ? GROUP BY gpu, uuid ORDER BY gpu",
        (rid,),
    ).fetchall()
    crit = dict(conn.execute("SELECT criterion, status FROM verdicts WHERE run_id = ?", (rid,)))
    per_gpu = {f"memory_gpu[{g}]": crit.get(f"memory_gpu[{g}]") for g, *_ in rows}
    checks = {
        "two_gpus_sampled": len(rows) == 2,
        "a_row_per_tick_each": all(r[2] == ticks for r in rows),
        "a_criterion_per_gpu": all(v is not None for v in per_gpu.values()) and len(rows) == 2,
    }
    return {
        "run_id": rid,
        "verdict": result.verdict.status if result.verdict is not None else None,
        "ticks": ticks,
        "gpu_samples": [
            {"gpu": g, "uuid": u, "rows": c, "peak_mb": round((m or 0) / MB), "util_max": x}
            for g, u, c, m, x in rows
        ],
        "criteria": per_gpu,
        "checks": checks,
        "ok": all(checks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--step-mb", type=int, default=256)
    ap.add_argument("--sharded-s", type=float, default=20.0, help="the sharded soak's length")
    ap.add_argument("--timing-frames", type=int, default=30, help="frames per timing run")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        return _no_gpu("torch is not installed")
    if not torch.cuda.is_available():
        return _no_gpu("torch.cuda.is_available() is False (CPU-only torch or no driver)")

    from soakd.clock import MonotonicClock
    from soakd.records import Sample
    from soakd.telemetry.probes import default_probes
    from soakd.telemetry.sampler import Sampler

    device = args.device
    torch.cuda.init()
    torch.empty(1, device=device)  # create the context before sampling starts
    log = _Log()
    probes = default_probes(device, log)
    clock = MonotonicClock()
    samples: list[Sample] = []
    lock = threading.Lock()

    def keep(s: Sample) -> None:
        with lock:
            samples.append(s)

    sampler = Sampler(
        probes, interval_ms=100, clock=clock, t0_ns=clock.now_ns(), on_sample=keep, log=log
    )
    sampler.start()
    t = time.perf_counter()
    try:
        phases = _sawtooth(torch, device, args.cycles, args.steps, args.step_mb)
    finally:
        time.sleep(0.3)
        sampler.stop()
    sawtooth_s = time.perf_counter() - t
    result: dict[str, Any] = {
        "gpu": True,
        "device": device,
        "gpu_name": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "probes": [p.name for p in probes],
        "warnings": log.warnings,
        "disabled": sampler.disabled,
        "sawtooth_s": round(sawtooth_s, 2),
        "phases": len(phases),
        "sampler_cpu_pct_of_core": round(100 * sampler.cpu_ns / 1e9 / max(sawtooth_s, 1e-9), 3),
        "telemetry": _check_series(samples, args.step_mb, args.steps),
        "stage_timing": _stage_timing(torch, device),
        "timing_modes": _check_timing_modes(torch, device, args.timing_frames),
        "every_gpu": _check_every_gpu(torch, args.step_mb),
        "sharded_run": _check_sharded_run(torch, args.sharded_s),
    }
    parts = ("telemetry", "stage_timing", "timing_modes", "every_gpu", "sharded_run")
    result["ok"] = all(result[k]["ok"] for k in parts)
    print(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
