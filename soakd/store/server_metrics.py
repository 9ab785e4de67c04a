"""The ``server_metrics`` table: a served model's own Prometheus gauges and counters, one row
per series per telemetry tick, keyed ``(run_id, name, labels, seq)``; ``seq`` joins with
``samples.seq``.

The sampler's ``ServerMetricsProbe`` (soakd.telemetry.server) puts the tick's rows on its
``Sample``; the run's one writer stores them with the rest; ``load_server_metrics`` reads
them back for the analysis (``server_queue``), each name summed over its label sets.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import numpy as np

from soakd.records import ServerMetric

TABLE = "server_metrics"
SERVER_METRIC_COLUMNS: tuple[str, ...] = ("run_id", "seq", "t", "name", "labels", "value")


def server_metric_values(m: ServerMetric) -> tuple[Any, ...]:
    """A server metric row's values in the table's column order after ``run_id``."""
    return (m.seq, m.t, m.name, m.labels, m.value)


def load_server_metrics(
    conn: sqlite3.Connection, run_id: str
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per metric name: (t, value summed over its label sets at each tick), by tick."""
    rows = conn.execute(
        f"SELECT name, min(t), sum(value) FROM {TABLE} WHERE run_id = ? AND value IS NOT NULL"
        " GROUP BY name, seq ORDER BY name, seq",
        (run_id,),
    ).fetchall()
    out: dict[str, tuple[list[float], list[float]]] = {}
    for name, t, v in rows:
        ts, vs = out.setdefault(str(name), ([], []))
        ts.append(float(t))
        vs.append(float(v))
    return {k: (np.asarray(t), np.asarray(v)) for k, (t, v) in out.items()}
