"""The staged driver: preprocess -> infer -> decode, each timed on the monotonic clock and,
on CUDA, ended after ``workload.sync()``."""

from __future__ import annotations

from soakd.records import FrameRecord
from soakd.run.drivers import DriverContext


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


def drive(ctx: DriverContext) -> None:
    wl = ctx.workload
    clock = ctx.clock
    now = clock.now_ns
    c = ctx.counters
    settings = ctx.settings.run
    max_age_ns = int(settings.max_age_ms * 1e6) if settings.max_age_ms else None
    stop_on_oom = settings.on_oom == "stop"
    emit, to_s = ctx.emit, ctx.s
    first = True
    while not ctx.stop.is_set():
        got = ctx.next_frame(0.1)
        if got is None:
            if ctx.queue is not None and ctx.queue.closed:
                return
            continue
        frame, qlen = got
        t_dispatch = now()
        drops = ctx.drops  # frames dropped before this one was dispatched
        age_ns = t_dispatch - frame.t_capture_ns
        lateness_ms = (frame.t_capture_ns - frame.grab_ns - frame.t_sched_ns) / 1e6
        grab_ms = frame.grab_ns / 1e6
        warm = frame.t_capture_ns < ctx.warmup_end_ns or first
        if max_age_ns is not None and age_ns > max_age_ns and not first:
            c.stale += 1
            emit(
                FrameRecord(
                    frame_id=frame.id,
                    t_sched=to_s(frame.t_sched_ns),
                    t_capture=to_s(frame.t_capture_ns),
                    t_dispatch=None,
                    t_done=None,
                    lateness_ms=lateness_ms,
                    grab_ms=grab_ms,
                    queue_len=qlen,
                    frame_age_ms=age_ns / 1e6,
                    drop_count=drops,
                    stale_count=c.stale,
                    warmup=warm,
                    skipped=True,
                )
            )
            continue
        c.dispatched += 1
        c.in_flight_since_ns = t_dispatch
        pre_ms = infer_ms = decode_ms = None
        error = None
        out = None
        t1 = t_dispatch
        try:
            inputs = wl.preprocess(frame)
            wl.sync()
            t2 = now()
            pre_ms = (t2 - t1) / 1e6
            outputs = wl.infer(inputs)
            wl.sync()
            t3 = now()
            infer_ms = (t3 - t2) / 1e6
            out = wl.decode(outputs)
            t4 = now()
            decode_ms = (t4 - t3) / 1e6
        except Exception as exc:
            t4 = now()
            error = f"{type(exc).__name__}: {exc}"[:2000]
            c.errors += 1
            if ctx.is_oom(exc):
                c.ooms += 1
                ctx.event(ctx.make_event("oom", error, frame.id, _oom_data(wl)))
                if stop_on_oom:
                    ctx.request_abort("CUDA out of memory (on_oom = stop)")
            else:
                ctx.event(ctx.make_event("error", error, frame.id))
        total_ms = (
            grab_ms + pre_ms + infer_ms + decode_ms
            if decode_ms is not None and pre_ms is not None and infer_ms is not None
            else None
        )
        c.in_flight_since_ns = None
        c.last_done_ns = t4
        c.done += 1
        emit(
            FrameRecord(
                frame_id=frame.id,
                t_sched=to_s(frame.t_sched_ns),
                t_capture=to_s(frame.t_capture_ns),
                t_dispatch=to_s(t_dispatch),
                t_done=to_s(t4),
                lateness_ms=lateness_ms,
                grab_ms=grab_ms,
                pre_ms=pre_ms,
                infer_ms=infer_ms,
                decode_ms=decode_ms,
                total_ms=total_ms,
                queue_len=qlen,
                frame_age_ms=age_ns / 1e6,
                e2e_ms=(t4 - frame.t_sched_ns) / 1e6,
                drop_count=drops,
                stale_count=c.stale,
                out_tokens=out.tokens if out is not None else None,
                vision_tokens=out.vision_tokens if out is not None else None,
                audio_tokens=out.audio_tokens if out is not None else None,
                error=error,
                first=first,
                warmup=warm,
                extra=out.extra if out is not None else None,
            )
        )
        if first:
            first = False
            if out is not None and out.text is not None:
                ctx.summary["sample_output"] = out.text[:500]
        if ctx.max_frames is not None and c.done >= ctx.max_frames:
            return
