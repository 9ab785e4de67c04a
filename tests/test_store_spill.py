"""The writer's backlog while another process holds the database lock is bounded in memory
(issue 31: it grew soakd's RSS, which memory_rss judges as the model's): past
``spill_rows`` the waiting rows go to a spill file on disk, and every one of them is in the
database once the lock clears, none dropped."""

from __future__ import annotations

import time
from pathlib import Path

from soakd.records import Event
from soakd.store import db as store

from .conftest import make_run
from .test_store_faults import _count, _frame, _sample, locked


def test_rows_waiting_for_a_lock_spill_to_disk_and_all_arrive(db_path: Path) -> None:
    """3000 frames, 3000 samples and an event put while a second process holds BEGIN
    EXCLUSIVE for 3 s: the writer never holds more than spill_rows (+ one drained chunk)
    in memory, spills the rest, and after the lock every row is stored, with no
    store_overflow."""
    conn = store.connect(db_path)
    make_run(conn, id="r1", status="running")
    conn.close()
    w = store.StoreWriter(db_path, "r1", flush_interval_s=0.05, busy_timeout_s=0.3, spill_rows=200)
    w.start()
    most = 0
    with locked(db_path, 3.0):
        for i in range(3000):
            w.put(_frame(i))
            w.put(_sample(i))
            if i % 100 == 0:
                time.sleep(0.02)
                most = max(most, w._pending.n)
        w.put(Event("error", 1.0, time.time(), "boom"))
        time.sleep(1.0)
        most = max(most, w._pending.n)
        assert w.error is None and w.spilled > 0
    w.close()
    assert w.error is None, w.error
    assert most <= 200 + store.DRAIN_CHUNK, most
    assert _count(db_path, "SELECT count(*) FROM frames") == 3000
    assert _count(db_path, "SELECT count(*) FROM samples") == 3000
    assert _count(db_path, "SELECT count(*) FROM events WHERE kind = 'error'") == 1
    assert _count(db_path, "SELECT count(*) FROM events WHERE kind = 'store_overflow'") == 0
    assert _count(db_path, "SELECT count(*) FROM events WHERE kind = 'store_locked'") == 1


def test_a_lock_leaves_nothing_queued_in_memory_while_the_writer_waits_for_it(
    db_path: Path,
) -> None:
    """Records put while another process holds the lock, before its busy timeout (2 s) has
    run out, do not pile up in the writer's queue: between tries of its flush the writer
    drains them into its pending rows and spills those to disk (a flush waiting out the busy
    timeout in SQLite left every record put meanwhile queued in memory). A lock shorter
    than the busy timeout leaves no store_locked event; all rows arrive."""
    conn = store.connect(db_path)
    make_run(conn, id="r1", status="running")
    conn.close()
    w = store.StoreWriter(db_path, "r1", flush_interval_s=0.05, busy_timeout_s=2.0, spill_rows=50)
    w.start()
    queued = []
    with locked(db_path, 1.5):
        for i in range(600):
            w.put(_frame(i))
            if i % 50 == 49:
                time.sleep(0.1)
                queued.append(w._q.qsize())
        assert w.error is None and w.spilled > 0
    w.close()
    assert w.error is None, w.error
    assert max(queued[2:]) <= store.DRAIN_CHUNK, queued  # drained as they come
    assert _count(db_path, "SELECT count(*) FROM frames") == 600
    assert _count(db_path, "SELECT count(*) FROM events WHERE kind = 'store_locked'") == 0
