"""The concurrent driver: a staged workload with one frame in flight per stream.

A served model (``kind = "openai"``) answers many requests at once, so ``run.streams = N``
means N requests in flight, as N cameras calling one server would keep. Each stream gets a
thread of its own (``soakd-driver-S``) running the staged loop (``staged.drive``) on its
stream's queue alone, with its own ``Counters``; the run's counters are their sum
(``StreamCounters``), and the frame in flight longest is the one a stall is judged on.
Records go to the one sink, whose deliveries are serialised. Unpaced (a profile) the
streams are taken in turn by the one staged loop: a profile measures one request at a time.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from soakd.run.drivers import staged
from soakd.run.drivers.context import Counters, DriverContext, StreamCounters
from soakd.run.queue import StreamQueues


def drive(ctx: DriverContext[Any]) -> None:
    """One staged loop per stream, each in its own thread; returns when all have."""
    queue, counters = ctx.queue, ctx.counters
    if not isinstance(queue, StreamQueues) or not isinstance(counters, StreamCounters):
        staged.drive(ctx)  # unpaced, or one stream: the staged loop as it is
        return
    errors: list[BaseException] = []

    def one(i: int) -> None:
        sub = replace(ctx, queue=queue.stream(i), counters=counters.parts[i])
        try:
            staged.drive(sub)
        except BaseException as exc:  # a bug: end the whole run, re-raised below
            errors.append(exc)
            ctx.request_abort(f"driver crashed: {type(exc).__name__}: {exc}")
            ctx.stop.set()

    threads = [
        threading.Thread(target=one, args=(i,), name=f"soakd-driver-{i}", daemon=True)
        for i in range(len(counters.parts))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def counters_for(streams: int, t0_ns: int) -> Counters | StreamCounters:
    """The run's live counters: one ``Counters``, or one per stream summed."""
    if streams <= 1:
        return Counters(last_done_ns=t0_ns)
    return StreamCounters([Counters(last_done_ns=t0_ns) for _ in range(streams)])
