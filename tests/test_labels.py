"""Labels: what a run belongs to, stored beside it, shown, and filtered on."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from soakd.config import ConfigError, load_settings
from soakd.store import db as store
from soakd.store import runs

from .conftest import SYNTH_CLI, make_run, run_cli


def _labelled(conn: sqlite3.Connection, labels: dict[str, str]) -> str:
    rid = make_run(conn)
    conn.executemany(
        "INSERT INTO labels (run_id, key, value) VALUES (?, ?, ?)",
        [(rid, k, v) for k, v in labels.items()],
    )
    return rid


def test_labels_are_validated_at_load_and_numbers_become_text() -> None:
    s = load_settings(overrides=["run.labels.release='1.4.0'", "run.labels.fps=2"])
    assert s.run.labels == {"release": "1.4.0", "fps": "2"}
    with pytest.raises(ConfigError, match="label name '1x'"):
        load_settings(overrides=["run.labels.1x=a"])
    with pytest.raises(ConfigError, match="'gpu' is reserved"):
        load_settings(overrides=["run.labels.gpu=h200"])


def test_labels_do_not_change_the_config_hash() -> None:
    labelled = load_settings(flags={"run.labels.release": "1.4.0"})
    assert labelled.config_hash() == load_settings().config_hash()


def test_find_runs_returns_only_runs_carrying_every_label(tmp_path: Path) -> None:
    conn = store.connect(tmp_path / "l.db")
    a = _labelled(conn, {"release": "1.4.0", "model": "a"})
    b = _labelled(conn, {"release": "1.4.0", "model": "b"})
    _labelled(conn, {"release": "1.3.0", "model": "a"})
    assert [r.id for r in runs.find_runs(conn, labels={"release": "1.4.0"})] == [a, b]
    assert [r.id for r in runs.find_runs(conn, labels={"release": "1.4.0", "model": "b"})] == [b]
    assert runs.get_run(conn, a).labels == {"model": "a", "release": "1.4.0"}


def test_list_runs_filters_on_labels(tmp_path: Path) -> None:
    conn = store.connect(tmp_path / "l.db")
    a = _labelled(conn, {"release": "1.4.0"})
    _labelled(conn, {"release": "1.3.0"})
    rows = runs.list_runs(conn, labels={"release": "1.4.0"})
    assert [(r["run_id"], r["labels"]) for r in rows] == [(a, {"release": "1.4.0"})]


def test_run_label_is_stored_and_runs_label_filters_it(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    r = run_cli("run", "--db", db, "--duration", "2s", "--no-live", *SYNTH_CLI,
                "--label", "release=1.4.0", "-l", "model=tiny")  # fmt: skip
    assert r.returncode in (0, 3), r.stderr
    hit = run_cli("runs", "--db", db, "--label", "release=1.4.0", "-f", "json")
    miss = run_cli("runs", "--db", db, "--label", "release=1.3.0", "-f", "json")
    assert [json.loads(x)["labels"] for x in hit.stdout.splitlines()] == [
        {"model": "tiny", "release": "1.4.0"}
    ]
    assert miss.returncode == 0 and miss.stdout == ""


def test_a_label_without_a_value_is_a_usage_error(tmp_path: Path) -> None:
    r = run_cli("runs", "--db", str(tmp_path / "s.db"), "--label", "release")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith("--label 'release': expected NAME=VALUE")
