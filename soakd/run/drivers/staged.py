"""The staged driver: preprocess -> infer -> decode, each timed on the monotonic clock and,
on CUDA, ended after ``workload.sync()``."""

from __future__ import annotations

from typing import Any

from soakd.records import Frame, FrameRecord, StageOutput
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


#: what ``_run_stages`` returns: pre, infer, decode and total ms (None where a stage did not
#: finish), the error (or None), the decoded output (or None) and the end time
_Stages = tuple[float | None, float | None, float | None, float | None, str | None, Any, int]


def _run_stages(ctx: DriverContext[StagedWorkload], frame: Frame, t1: int) -> _Stages:
    """preprocess -> infer -> decode from ``t1``, each ended after ``sync()``."""
    wl, now = ctx.workload, ctx.clock.now_ns
    pre = infer = decode = total = None
    try:
        inputs = wl.preprocess(frame)
        wl.sync()
        t2 = now()
        pre = (t2 - t1) / 1e6
        outputs = wl.infer(inputs)
        wl.sync()
        t3 = now()
        infer = (t3 - t2) / 1e6
        out = wl.decode(outputs)
        t4 = now()
        decode = (t4 - t3) / 1e6
        total = frame.grab_ns / 1e6 + (t4 - t1) / 1e6
    except Exception as exc:
        t4 = now()
        return pre, infer, decode, None, _fail(ctx, exc, frame.id), None, t4
    return pre, infer, decode, total, None, out, t4


def _skip(
    ctx: DriverContext[StagedWorkload], frame: Frame, qlen: int, t: int, **flags: Any
) -> None:
    """A frame older than ``max_age_ms`` at dispatch: recorded as skipped, never run."""
    ctx.counters.skip(frame.stream)
    ctx.emit(ctx.record(frame, qlen, t, dispatched=False, skipped=True, **flags))


def drive(ctx: DriverContext[StagedWorkload]) -> None:
    c, now, emit, record = ctx.counters, ctx.clock.now_ns, ctx.emit, ctx.record
    max_age_ms = ctx.settings.run.max_age_ms
    warmup_end, max_frames = ctx.warmup_end_ns, ctx.max_frames
    first = True
    for frame, qlen in ctx.frames(0.1):
        t_dispatch = now()
        drops = ctx.drops_of(frame.stream)  # its stream's drops before it was dispatched
        warm = first or frame.t_capture_ns < warmup_end
        if max_age_ms and not first and (t_dispatch - frame.t_capture_ns) / 1e6 > max_age_ms:
            _skip(ctx, frame, qlen, t_dispatch, drop_count=drops, warmup=warm)
            continue
        c.dispatched += 1
        c.in_flight_since_ns, c.in_flight_stream = t_dispatch, frame.stream
        pre, infer, decode, total, error, out, t_done = _run_stages(ctx, frame, t_dispatch)
        c.in_flight_since_ns = None
        c.last_done_ns = t_done
        c.done += 1
        rec = record(
            frame,
            qlen,
            t_dispatch,
            t_done=(t_done - ctx.t0_ns) / 1e9,
            pre_ms=pre,
            infer_ms=infer,
            decode_ms=decode,
            total_ms=total,
            e2e_ms=(t_done - frame.t_sched_ns) / 1e6,
            drop_count=drops,
            error=error,
            first=first,
            warmup=warm,
        )
        if out is not None:
            _add_output(rec, out, ctx.summary if first else None)
        emit(rec)
        first = False
        if max_frames is not None and c.done >= max_frames:  # the budget (ctx.budget_spent)
            return


def _add_output(rec: FrameRecord, out: StageOutput, summary: dict[str, Any] | None) -> None:
    """The decoded output's counts on the record; the first frame's text in ``summary``."""
    rec.out_tokens = out.tokens
    rec.vision_tokens = out.vision_tokens
    rec.audio_tokens = out.audio_tokens
    rec.extra = out.extra
    if summary is not None and out.text is not None:
        summary["sample_output"] = out.text[:500]
