"""Observers follow a run from its hooks (live display, logs, sd_notify, Prometheus); the
runner knows only the protocol in ``base``."""

# structlog's default prints to stdout: library use (no CLI) logs to stderr instead
from soakd.observers import logs as _logs  # noqa: F401
