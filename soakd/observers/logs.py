"""structlog set-up: JSON lines when stderr is not a terminal (journald, CI), key=value on a
terminal. Plus the log-line observer (phases, frames, periodic progress).

Under systemd, when the log stream is the journal (``$JOURNAL_STREAM`` names it), every line
starts with the ``<N>`` syslog priority journald reads (``SyslogLevelPrefix=``, on by
default), so ``journalctl -p warning`` finds soakd's warnings. With JSON logs, third-party
progress bars (tqdm, the Hugging Face hub's "Loading checkpoint shards") are turned off and
Python ``logging`` records (transformers' warnings) are rendered by structlog, so every line
stays JSON.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from soakd import redact
from soakd.observers.base import Observer, Progress
from soakd.observers.journal import ERR, INFO, WARNING, journal_stream
from soakd.records import LOOK_EVENT, STAGES, Event, FrameRecord, standings, waiting_on

#: seconds between two progress log lines
PROGRESS_EVERY_S = 10.0
_PRIORITY = {"critical": 2, "exception": ERR, "error": ERR, "warning": WARNING, "warn": WARNING}
#: set before transformers / huggingface_hub / tqdm are imported, when logs are JSON
QUIET_ENV = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    # transformers' own handler writes plain text: imported later, it may only speak errors
    "TRANSFORMERS_VERBOSITY": "error",
}


class StderrLoggerFactory:
    """structlog loggers printing to ``sys.stderr`` as it is when each line is logged (a
    test's capture, a redirected stream), never to stdout."""

    def __call__(self, *_args: Any) -> structlog.PrintLogger:
        return structlog.PrintLogger(sys.stderr)


def default_to_stderr() -> None:
    """soakd used as a library (``run_soak`` without the CLI): structlog's own default
    prints to stdout, which belongs to the program using soakd. Unless that program has
    configured structlog itself, point the default at stderr; ``configure_logging`` (the
    CLI) replaces it. Called when ``soakd.observers`` is imported, before anything logs."""
    if not structlog.is_configured():
        defaults = structlog.get_config()["processors"]
        structlog.configure(
            processors=[redact_secrets, *defaults], logger_factory=StderrLoggerFactory()
        )


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> dict[str, Any]:
    """The first processor: every value of a log line through soakd.redact (an error text a
    server echoed the API key into, a URL with a password)."""
    return {k: redact.data(v) for k, v in event_dict.items()}


class CurrentStderr:
    """``sys.stderr`` as it is at each write, not as it was when logging was configured:
    while the live display runs, rich puts a proxy there that prints each line above the
    display (a line written to the original stream was glued to its spinner line)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()

    def fileno(self) -> int:
        return sys.stderr.fileno()


def configure_logging(*, json: bool | None = None, level: str = "info", stream: Any = None) -> None:
    stream = stream or CurrentStderr()
    if json is None:
        json = not stream.isatty()
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        redact_secrets,
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
        quiet_third_party()
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=stream.isatty()))
        quiet_third_party()  # no progress bars left in the live display either
    if journal_stream(stream):
        processors.append(syslog_prefix)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def syslog_prefix(_logger: Any, method: str, rendered: Any) -> Any:
    """The last processor under systemd: ``<4>`` warnings, ``<3>`` errors, ``<6>`` info."""
    return f"<{_PRIORITY.get(method, INFO if method != 'debug' else 7)}>{rendered}"


class StructlogHandler(logging.Handler):
    """Python ``logging`` records (transformers, huggingface_hub) as structlog lines."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            structlog.get_logger(record.name).log(record.levelno, record.getMessage())
        except Exception:  # a log line is never worth a crash
            self.handleError(record)


def quiet_third_party() -> None:
    """No progress bars, and warnings and worse from ``logging`` through structlog."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    root = logging.getLogger()
    if not any(isinstance(h, StructlogHandler) for h in root.handlers):
        handler = StructlogHandler(logging.WARNING)
        root.addHandler(handler)
    if "transformers" in sys.modules:  # imported already: the environment came too late
        route_transformers()


def route_transformers() -> None:
    """transformers writes to its own stderr handler: send it to the root logger instead."""
    from transformers.utils import logging as tlog

    tlog.disable_progress_bar()
    tlog.set_verbosity_warning()
    tlog.disable_default_handler()
    tlog.enable_propagation()


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


class FrameLogObserver(Observer):
    """Log lines for a reader without a terminal: one per phase before the run starts
    (``phase``), one per N frames with the seed's fields ``frame grab pre infer decode total
    queue age drop`` (ms), and every ``PROGRESS_EVERY_S`` a ``progress`` line with each
    stage's recent p50 / p95 / max and the criteria failing so far."""

    def __init__(self, every: int = 1, progress_every_s: float = PROGRESS_EVERY_S) -> None:
        self.every = max(0, every)
        self.progress_every_s = progress_every_s
        self._next_progress_s = progress_every_s
        self._failing_told: set[str] = set()
        self._waiting: list[str] | None = None  # a duration = "auto" run's, at its last look
        self.log = structlog.get_logger("soakd.frames")

    def on_phase(self, name: str) -> None:
        self.log.info("phase", phase=name)

    def on_event(self, event: Event) -> None:
        """A ``duration = "auto"`` run's look: one ``look`` line with each criterion's
        standing and the smallest growth each trend could see so far."""
        if event.kind != LOOK_EVENT:
            return
        stands = standings(event.data)
        self._waiting = waiting_on(stands)
        self.log.info(
            "look",
            elapsed_s=round(event.t, 1),
            waiting_on=self._waiting,
            standing={st.criterion: st.state for st in stands},
            could_see={st.criterion: st.sees() for st in stands if st.sees()},
            why={st.criterion: st.why for st in stands if st.why},
        )

    def on_progress(self, p: Progress) -> None:
        if p.elapsed_s < self._next_progress_s or not self.progress_every_s:
            return
        self._next_progress_s = p.elapsed_s + self.progress_every_s
        stages = {
            k: [_r(p.stage_p50_ms.get(k)), _r(p.stage_p95_ms.get(k)), _r(p.stage_max_ms.get(k))]
            for k in STAGES
        }
        self.log.info(
            "progress",
            elapsed_s=round(p.elapsed_s, 1),
            fps=round(p.achieved_fps, 2),
            frames=p.frames_done,
            drops=p.drops,
            errors=p.errors,
            age_p50=_r(p.age_p50_ms),
            stages_p50_p95_max_ms=stages,
            failing=p.failing or None,
            **({} if self._waiting is None else {"waiting_on": self._waiting}),
        )
        for line in p.failing:
            criterion = line.split(" ", 1)[0]
            if criterion not in self._failing_told:  # once per criterion, not every line
                self._failing_told.add(criterion)
                self.log.warning("failing so far", criterion=line)

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


default_to_stderr()
