"""structlog set-up: JSON lines when stderr is not a terminal (journald, CI), key=value on a
terminal. Plus the per-frame log line observer."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from soakd.observers.base import Observer
from soakd.records import FrameRecord


def configure_logging(*, json: bool | None = None, level: str = "info", stream: Any = None) -> None:
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    if json:
        processors += [
            structlog.processors.EventRenamer("msg"),
            structlog.processors.JSONRenderer(),
        ]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=stream.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


class FrameLogObserver(Observer):
    """One log line per N frames with the seed's fields:
    ``frame grab pre infer decode total queue age drop`` (ms)."""

    def __init__(self, every: int = 1) -> None:
        self.every = max(0, every)
        self.log = structlog.get_logger("soakd.frames")

    def on_frame(self, rec: FrameRecord) -> None:
        if not self.every or rec.frame_id % self.every:
            return
        self.log.info(
            "frame",
            frame=rec.frame_id,
            grab=_r(rec.grab_ms),
            pre=_r(rec.pre_ms),
            infer=_r(rec.infer_ms),
            decode=_r(rec.decode_ms),
            total=_r(rec.total_ms),
            queue=rec.queue_len,
            age=_r(rec.frame_age_ms),
            drop=rec.drop_count,
            stale=rec.stale_count,
            warmup=rec.warmup or None,
            skipped=rec.skipped or None,
            error=rec.error,
        )
