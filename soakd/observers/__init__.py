"""Observers follow a run from its hooks (live display, logs, sd_notify, Prometheus); the
runner knows only the protocol in ``base``."""
