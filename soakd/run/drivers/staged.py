"""The staged driver: preprocess -> infer -> decode, each timed on the monotonic clock and,
on CUDA, ended after ``workload.sync()``, or with ``workload.timing = "events"`` timed by
CUDA events recorded between the stages (run/drivers/timing.py)."""

from __future__ import annotations

from typing import Any

from soakd.records import Frame, StageOutput, error_text
from soakd.run.drivers.context import IDLE_WAIT_S, DriverContext
from soakd.run.drivers.timing import stage_events
from soakd.run.sink import StagedFrame
from soakd.workloads.base import RunAbort, StagedWorkload


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


def _fail(ctx: DriverContext[StagedWorkload], exc: BaseException, frame_id: int) -> str:
    """Count and record a stage's exception; an OOM may end the run (``on_oom = "stop"``)."""
    c = ctx.counters
    error = error_text(exc)
    c.errors += 1
    if isinstance(exc, RunAbort):  # the workload says the run cannot go on
        ctx.event(ctx.make_event(exc.event_kind, str(exc), frame_id))
        ctx.request_abort(str(exc))
    elif ctx.is_oom(exc):
        c.ooms += 1
        ctx.event(ctx.make_event("oom", error, frame_id, _oom_data(ctx.workload)))
        if ctx.settings.run.on_oom == "stop":
            ctx.request_abort("CUDA out of memory (on_oom = stop)")
    else:
        ctx.event(ctx.make_event("error", error, frame_id))
    return error


_NO_OUTPUT = StageOutput()


def _ms(start: int | None, end: int | None) -> float | None:
    """A stage's milliseconds, or None when it did not finish."""
    return None if start is None or end is None else (end - start) / 1e6


def _skip(
    ctx: DriverContext[StagedWorkload], frame: Frame, qlen: int, t: int, **flags: Any
) -> None:
    """A frame older than ``max_age_ms`` at dispatch: recorded as skipped, never run."""
    ctx.counters.skip(frame.stream)
    ctx.sink.add_now(ctx.record(frame, qlen, t, dispatched=False, skipped=True, **flags))


def _failed(
    ctx: DriverContext[StagedWorkload],
    frame: Frame,
    qlen: int,
    t: tuple[int | None, ...],
    exc: BaseException,
    **flags: Any,
) -> None:
    """A frame whose stage raised: counted, an ``error`` (or ``oom``) event, and its record
    with the stages that finished (``t``: dispatched, preprocessed, inferred, done)."""
    t1, t2, t3, t4 = t
    assert t1 is not None and t4 is not None
    rec = ctx.record(
        frame, qlen, t1, t_done=(t4 - ctx.t0_ns) / 1e9, pre_ms=_ms(t1, t2),
        infer_ms=_ms(t2, t3), e2e_ms=(t4 - frame.t_sched_ns) / 1e6,
        error=_fail(ctx, exc, frame.id), **flags,
    )  # fmt: skip
    ctx.sink.add_now(rec)


def drive(ctx: DriverContext[StagedWorkload]) -> None:
    """preprocess -> infer -> decode for each frame, each stage ended after ``sync()`` or,
    with CUDA events (``ev``), marked by an event and read once when the frame ends.

    The loop is the harness's per-frame cost (bench/overhead.py): it binds what it calls
    once, reads the clock four times a frame and hands the sink the frame's clock readings
    as a StagedFrame, which becomes its record with its batch (run/sink.py)."""
    c, now, sink = ctx.counters, ctx.clock.now_ns, ctx.sink
    wl = ctx.workload
    preprocess, infer, decode = wl.preprocess, wl.infer, wl.decode
    ev = stage_events(ctx)
    end_pre, end_infer = (wl.sync, wl.sync) if ev is None else (ev.after_pre, ev.after_infer)
    max_age_ns = (ctx.settings.run.max_age_ms or 0) * 1e6
    warmup_end, max_frames, stale_by = ctx.warmup_end_ns, ctx.max_frames, c.stale_by
    drops_of = ctx.queue.drops_of if ctx.queue is not None else None
    add, new, first = sink.add, tuple.__new__, True
    for frame, qlen in ctx.frames(IDLE_WAIT_S):
        t1 = now()  # dispatched
        stream, t_cap = frame.stream, frame.t_capture_ns
        drops = drops_of(stream) if drops_of is not None else 0  # before it was dispatched
        warm = first or t_cap < warmup_end
        if max_age_ns and not first and t1 - t_cap > max_age_ns:
            _skip(ctx, frame, qlen, t1, drop_count=drops, warmup=warm)
            continue
        c.dispatched += 1
        c.in_flight_since_ns, c.in_flight_stream = t1, stream
        t2 = t3 = None
        try:
            if ev is not None:
                ev.begin()
            inputs = preprocess(frame)
            end_pre()
            t2 = now()
            outputs = infer(inputs)
            end_infer()
            t3 = now()
            out = decode(outputs)
            if ev is None:
                t4 = now()
            else:
                t2, t3, t4 = ev.finish(t1)
        except (Exception, SystemExit) as exc:  # sys.exit() in a model is its error too
            t4 = now()
            c.in_flight_since_ns, c.last_done_ns, c.done = None, t4, c.done + 1
            _failed(ctx, frame, qlen, (t1, t2, t3, t4), exc, drop_count=drops, first=first,
                    warmup=warm)  # fmt: skip
        else:
            c.in_flight_since_ns, c.last_done_ns, c.done = None, t4, c.done + 1
            if out is None:  # a decode that returns nothing: no counts
                out = _NO_OUTPUT
            if first and out.text is not None:
                ctx.summary["sample_output"] = out.text[:500]
            add(
                new(
                    StagedFrame,
                    (
                        frame.id, stream, frame.t_sched_ns, t_cap, frame.grab_ns, t1, t2, t3,
                        t4, qlen, drops, stale_by.get(stream, 0), out.tokens,
                        out.vision_tokens, out.audio_tokens, out.extra, first, warm,
                    ),
                )
            )  # fmt: skip
        if first:
            ctx.first_done(t4)
            warmup_end = ctx.warmup_end_ns
        first = False
        if max_frames is not None and c.done >= max_frames:  # the budget (ctx.budget_spent)
            return
