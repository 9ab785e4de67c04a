"""The staged driver: preprocess -> infer -> decode, each timed on the monotonic clock and,
on CUDA, ended after ``workload.sync()``."""

from __future__ import annotations

from typing import Any

from soakd.records import Frame
from soakd.run.drivers.context import DriverContext
from soakd.workloads.base import StagedWorkload


def _oom_data(workload: object) -> dict[str, object] | None:
    """The CUDA allocator's state at an OOM, when torch is loaded and CUDA is up."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        stats = torch.cuda.memory_stats()
        keys = (
            "allocated_bytes.all.current",
            "reserved_bytes.all.current",
            "allocated_bytes.all.peak",
            "reserved_bytes.all.peak",
            "num_alloc_retries",
            "num_ooms",
        )
        return {k: stats.get(k) for k in keys}
    except Exception:
        return None


def _fail(ctx: DriverContext[StagedWorkload], exc: Exception, frame_id: int) -> str:
    """Count and record a stage's exception; an OOM may end the run (``on_oom = "stop"``)."""
    c = ctx.counters
    error = f"{type(exc).__name__}: {exc}"[:2000]
    c.errors += 1
    if ctx.is_oom(exc):
        c.ooms += 1
        ctx.event(ctx.make_event("oom", error, frame_id, _oom_data(ctx.workload)))
        if ctx.settings.run.on_oom == "stop":
            ctx.request_abort("CUDA out of memory (on_oom = stop)")
    else:
        ctx.event(ctx.make_event("error", error, frame_id))
    return error


def _run_stages(
    ctx: DriverContext[StagedWorkload], frame: Frame, t1: int
) -> tuple[dict[str, Any], int]:
    """preprocess -> infer -> decode from ``t1``: the record's stage fields and the end time."""
    wl, now = ctx.workload, ctx.clock.now_ns
    f: dict[str, Any] = {"pre_ms": None, "infer_ms": None, "decode_ms": None, "total_ms": None}
    out = None
    try:
        inputs = wl.preprocess(frame)
        wl.sync()
        t2 = now()
        f["pre_ms"] = (t2 - t1) / 1e6
        outputs = wl.infer(inputs)
        wl.sync()
        t3 = now()
        f["infer_ms"] = (t3 - t2) / 1e6
        out = wl.decode(outputs)
        t4 = now()
        f["decode_ms"] = (t4 - t3) / 1e6
        f["total_ms"] = frame.grab_ns / 1e6 + (t4 - t1) / 1e6
    except Exception as exc:
        t4 = now()
        f["error"] = _fail(ctx, exc, frame.id)
    if out is not None:
        f.update(
            out_tokens=out.tokens,
            vision_tokens=out.vision_tokens,
            audio_tokens=out.audio_tokens,
            extra=out.extra,
            sample_output=out.text,
        )
    return f, t4


def drive(ctx: DriverContext[StagedWorkload]) -> None:
    c = ctx.counters
    max_age_ms = ctx.settings.run.max_age_ms
    first = True
    for frame, qlen in ctx.frames(0.1):
        t_dispatch = ctx.clock.now_ns()
        drops = ctx.drops  # frames dropped before this one was dispatched
        warm = frame.t_capture_ns < ctx.warmup_end_ns or first
        age_ms = (t_dispatch - frame.t_capture_ns) / 1e6
        if max_age_ms and age_ms > max_age_ms and not first:
            c.stale += 1
            skip = {"drop_count": drops, "warmup": warm, "skipped": True}
            ctx.emit(ctx.record(frame, qlen, t_dispatch, dispatched=False, **skip))
            continue
        c.dispatched += 1
        c.in_flight_since_ns = t_dispatch
        fields, t_done = _run_stages(ctx, frame, t_dispatch)
        text = fields.pop("sample_output", None)
        c.in_flight_since_ns = None
        c.last_done_ns = t_done
        c.done += 1
        rec = ctx.record(
            frame,
            qlen,
            t_dispatch,
            t_done=ctx.s(t_done),
            e2e_ms=(t_done - frame.t_sched_ns) / 1e6,
            drop_count=drops,
            first=first,
            warmup=warm,
            **fields,
        )
        ctx.emit(rec)
        if first and text is not None:
            ctx.summary["sample_output"] = text[:500]
        first = False
        if ctx.budget_spent():
            return
