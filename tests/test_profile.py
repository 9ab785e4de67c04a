"""soakd profile: the stage table, the first frame apart, the rate it implies, the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soakd.config import (
    GeneratorWorkloadSettings,
    HfWorkload,
    SessionWorkloadSettings,
    Settings,
    TinyVlmWorkload,
)
from soakd.records import Emission, FrameRecord
from soakd.store import db as store
from soakd.store import runs
from soakd.studies.profiling import (
    RECOMMEND_BAND,
    profile,
    profile_from_db,
    random_weights,
    recommend,
    round_down_2sig,
)
from soakd.workloads.base import WorkloadContext
from soakd.workloads.registry import build_workload
from tests.test_compare import md_tables_consistent

from .conftest import make_run, run_cli

REPO = Path(__file__).resolve().parents[1]


def test_round_down_2sig_examples() -> None:
    """Two significant digits, always rounded down."""
    assert round_down_2sig(25.97) == 25
    assert round_down_2sig(0.357) == 0.35
    assert round_down_2sig(2.4) == 2.4
    assert round_down_2sig(1234.0) == 1200
    assert round_down_2sig(0.0) == 0.0


@given(st.floats(min_value=0.01, max_value=1600.0))
def test_recommended_rate_stays_inside_the_band(theo: float) -> None:
    """The recommended rate is within 0.5-0.6x the theoretical rate and the band is 0.5-0.7x."""
    rec, band = recommend(theo)
    assert rec is not None and band is not None
    assert RECOMMEND_BAND[0] * theo * (1 - 1e-9) <= rec <= 0.6 * theo * (1 + 1e-9)
    assert band == pytest.approx((0.5 * theo, 0.7 * theo), rel=1e-3, abs=1e-3)


def test_no_rate_without_a_total() -> None:
    """Without a median total there is no theoretical or recommended rate."""
    assert recommend(None) == (None, None)


@pytest.mark.slow
def test_profile_of_synthetic_workload_gives_known_medians_and_rate(
    synthetic: Callable[..., Settings], db_path: Path
) -> None:
    """Known synthetic stage times (2/20/2 ms, no jitter) come back as the medians within
    sleep overshoot; the rate is 1000/total and the recommendation 0.5-0.7x of it; the run
    is stored with mode 'profile'."""
    s = synthetic(
        "workload.jitter=0", "workload.pre_ms=2", "workload.infer_ms=20", "workload.decode_ms=2"
    )
    r = profile(s, frames=15)
    assert r.frames == 15 and r.measured == 14 and r.errors == 0
    st_ = r.stages
    assert st_["pre"].median is not None and 2.0 <= st_["pre"].median < 3.5
    assert st_["infer"].median is not None and 20.0 <= st_["infer"].median < 23.0
    assert st_["decode"].median is not None and 2.0 <= st_["decode"].median < 3.5
    total = st_["total"].median
    assert total is not None and 24.0 <= total < 29.0
    assert r.theoretical_fps == pytest.approx(1000.0 / total)
    assert r.recommended_fps is not None and r.theoretical_fps is not None
    assert 0.5 * r.theoretical_fps <= r.recommended_fps <= 0.7 * r.theoretical_fps
    assert r.fps_flag == f"--fps {r.recommended_fps:g}"
    assert r.first["infer"] is not None and r.first["infer"] >= 20.0
    assert r.sample_output == "frame 1" and r.out_tokens == 1
    conn = store.connect(db_path)
    run = runs.find_run(conn, r.run_id)
    assert run is not None and run.mode == "profile" and run.status == "completed"
    assert (
        conn.execute("SELECT count(*) FROM frames WHERE run_id = ?", (r.run_id,)).fetchone()[0]
        == 15
    )
    d = json.loads(r.to_json())
    assert d["schema"] == "soakd.profile/1" and d["fps_flag"] == r.fps_flag
    md = r.to_markdown()
    assert md_tables_consistent(md) == 1
    assert "held fixed" in md and r.fps_flag in md


def test_generator_profile_keeps_first_output_apart_from_intervals(
    synthetic: Callable[..., Settings], db_path: Path
) -> None:
    """For a generator run the first request's first-output latency is reported on its own,
    and the interval statistics hold only later outputs of later requests."""
    conn = store.connect(db_path)
    s = synthetic("workload.kind='generator'")
    make_run(conn, id="G", mode="profile", workload_kind="generator", config=s.to_dict())
    w = store.StoreWriter(db_path, "G", flush_interval_s=0.05)
    w.start()
    for f in range(5):
        first = f == 0
        w.put(
            FrameRecord(
                frame_id=f,
                t_sched=f,
                t_capture=f,
                t_dispatch=f,
                t_done=f + 0.5,
                lateness_ms=0,
                grab_ms=0.1,
                pre_ms=1,
                infer_ms=50,
                decode_ms=5,
                total_ms=56.1,
                first_emit_ms=900.0 if first else 40.0 + f,
                emitted=3,
                first=first,
            )
        )
        for k in range(3):
            iv = None if k == 0 else (500.0 if first else 10.0 * k)
            w.put(
                Emission(
                    frame_id=f,
                    idx=k,
                    t_emit=f + k / 100,
                    interval_ms=iv,
                    chunk=k,
                    chunk_frames=1,
                    chunk_ms=10,
                )
            )
    w.close()
    r = profile_from_db(conn, "G")
    assert r.stream is not None
    assert r.stream.first_output_ms == 900.0
    assert r.stream.first_output_max_ms == 44.0  # the first request is not in the rest
    assert r.stream.intervals == 8
    assert r.stream.interval_max_ms == 20.0 and r.stream.interval_p50_ms == 15.0
    md = r.to_markdown()
    assert md_tables_consistent(md) == 2 and "first output" in md
    assert json.loads(r.to_json())["stream"]["interval_p95_ms"] == pytest.approx(20.0)


@pytest.mark.slow
def test_cli_profile_json_and_config_error(tmp_path: Path) -> None:
    """`soakd profile --json` prints valid JSON and exits 0; a bad --set exits 2 with the
    key named on one line."""
    db = tmp_path / "p.db"
    r = run_cli(
        "profile",
        "--frames",
        "6",
        "--json",
        "--db",
        str(db),
        "--set",
        "workload.kind=synthetic",
        "--set",
        "workload.infer_ms=5",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["frames"] == 6 and d["recommended_fps"] > 0
    assert d["fps_flag"].startswith("--fps ")
    r = run_cli("profile", "--db", str(db), "--set", "run.fps=-2")
    assert r.returncode == 2
    assert "run.fps" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.model
@pytest.mark.slow
def test_profile_of_the_real_tiny_model(tmp_path: Path) -> None:
    """The tiny random-weight VLM profiles: every stage timed, fixed output length held and
    reported, a sample text, a recommended rate."""
    from soakd.config import load_settings

    s = load_settings(
        overrides=[
            f"run.db={str(tmp_path / 'm.db')!r}",
            "run.log_every=0",
            "workload.kind=tiny-vlm",
            "workload.arch=llava",
            "workload.short_side=28",
            f"workload.cache_dir={str(tmp_path / 'cache')!r}",
        ]
    )
    r = profile(s, frames=5)
    assert r.errors == 0 and r.measured == 4, r.first_error
    for stage in ("pre", "infer", "decode"):
        assert (r.stages[stage].median or 0) > 0
    assert r.held_fixed["max_new_tokens"] == s.workload.max_new_tokens  # type: ignore[union-attr]
    assert "prompt" in r.held_fixed
    assert isinstance(r.sample_output, str)
    assert r.recommended_fps is not None and r.recommended_fps > 0
    assert md_tables_consistent(r.to_markdown()) == 1


@pytest.mark.model
@pytest.mark.slow
def test_a_session_profile_recommends_the_rate_its_model_takes_frames_at(tmp_path: Path) -> None:
    """`soakd profile configs/session.toml`: the rate is 1000 / the median interval between
    the frames the tiny session model took (fed faster than it takes them), its stages and
    output latency are reported, and no generation prompt is said to be held fixed."""
    r = run_cli(
        "profile", "configs/session.toml", "--frames", "8", "-f", "json",
        "--db", str(tmp_path / "s.db"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    se = d["session"]
    assert se["taken"] >= 5 and se["take_interval_p50_ms"] > 0
    assert d["theoretical_fps"] == pytest.approx(1000 / se["take_interval_p50_ms"])
    assert d["rate_basis"] == "median interval between frames taken"
    assert 0 < d["recommended_fps"] < d["theoretical_fps"] and d["fps_flag"].startswith("--fps ")
    assert d["stages"]["infer"]["median"] > 0 and se["output_latency_p50_ms"] > 0
    assert "prompt" not in d["held_fixed"] and "max_tokens_per_turn" in d["held_fixed"]
    assert any("random weights" in n for n in d["notes"])


@pytest.mark.parametrize(
    ("make", "builtin"),
    [
        (lambda model: TinyVlmWorkload(), True),
        (lambda model: HfWorkload(model_path=model), False),
        (lambda model: SessionWorkloadSettings(), True),
        (lambda model: SessionWorkloadSettings(model_path=model), False),
        (lambda model: GeneratorWorkloadSettings(), True),
    ],
)
def test_each_workload_says_whether_its_weights_are_built_in(
    make: Callable[[str], Any], builtin: bool, tmp_path: Path
) -> None:
    """``describe()`` of each workload says ``builtin`` (random weights, built offline), and
    the profile's random-weights note follows it, a stored generator included."""
    (tmp_path / "config.json").write_text("{}")  # a checkpoint folder, for those given one
    wl = build_workload(make(str(tmp_path)), WorkloadContext(width=64, height=48))
    assert wl.describe()["builtin"] is builtin
    assert random_weights(wl.describe(), {}) is builtin


def test_a_run_stored_before_workloads_said_builtin_is_judged_by_its_config() -> None:
    """An older run's config: the tiny VLM, the tiny generator and a session or av model
    without a model_path are built in; an hf checkpoint is not."""
    for kind, builtin in (("tiny-vlm", True), ("generator", True), ("session", True),
                          ("av", True), ("hf", False), ("synthetic", False)):  # fmt: skip
        assert random_weights({}, {"workload": {"kind": kind}}) is builtin, kind
    assert not random_weights({}, {"workload": {"kind": "session", "model_path": "/m"}})


def test_a_profile_whose_run_stalled_exits_3_and_recommends_no_rate(tmp_path: Path) -> None:
    """A profile whose run ended aborted (its workload stalled) exits 3, names how it ended
    and recommends no --fps it cannot stand behind, in JSON and Markdown."""
    args = ("profile", "--frames", "20", "--db", str(tmp_path / "p.db"),
            "--set", "workload.kind=synthetic", "--set", "workload.infer_ms=50",
            "--set", "workload.stall_after_s=0.3", "--set", "run.stall_timeout_s=1")  # fmt: skip
    r = run_cli(*args, "-f", "json")
    assert r.returncode == 3, r.stderr
    d = json.loads(r.stdout)
    assert d["status"] == "aborted" and d["reason"] == "stalled"
    assert d["recommended_fps"] is None and d["fps_flag"] is None
    assert any("no rate is recommended" in n for n in d["notes"])
    md = run_cli(*args, "-f", "md")
    assert md.returncode == 3
    assert "--fps" not in md.stdout and "recommended rate: none" in md.stdout, md.stdout


def _stored_profile(tmp_path: Path, host_cpu_pct: float, workload: dict[str, Any]) -> str:
    """A stored profile run (2 CPUs) of 10 frames, its samples' host CPU at
    ``host_cpu_pct`` and soakd's own CPU at 40 % of one CPU."""
    db = tmp_path / f"h{host_cpu_pct:.0f}.db"
    conn = store.connect(db)
    rid = make_run(conn, mode="profile", config={"workload": workload},
                   environment={"cpu_count": 2}, workload_kind=workload["kind"])  # fmt: skip
    conn.executemany(
        "INSERT INTO frames (run_id, frame_id, t_sched, t_capture, warmup, infer_ms, total_ms)"
        " VALUES (?,?,?,?,0,20,25)",
        [(rid, i, i * 0.03, i * 0.03) for i in range(10)],
    )
    conn.executemany(
        "INSERT INTO samples (run_id, seq, t, wall, cpu_pct, host_cpu_pct, host_load1) "
        "VALUES (?,?,?,0,40,?,?)",
        [(rid, i, i * 0.1, host_cpu_pct, host_cpu_pct / 25) for i in range(5)],
    )
    conn.commit()
    return rid


def test_a_profile_measured_beside_busy_cpus_says_so_and_a_quiet_one_does_not(
    tmp_path: Path,
) -> None:
    """Other processes holding the host's CPUs (host 95 % less soakd's 20 %) mark the
    profile as measured under contention (host, a note); a quiet host (30 %) is reported
    but not marked. A served profile holds max_tokens fixed, and an unset value reads
    'unset', never Python's None."""
    served = {"kind": "openai", "prompt": "p", "system_prompt": None, "max_tokens": 32,
              "temperature": 0.0}  # fmt: skip
    busy = _stored_profile(tmp_path, 95.0, served)
    conn = store.connect(tmp_path / "h95.db")
    r = profile_from_db(conn, busy)
    assert r.host is not None and r.host.contended and r.host.others_pct == pytest.approx(75)
    assert r.to_dict()["host"] == {"others_cpu_pct": 75.0, "load1": 3.8, "cpus": 2,
                                   "contended": True}  # fmt: skip
    assert any(n.startswith("host busy: other processes kept 75 % of the host's 2 CPUs")
               for n in r.notes)  # fmt: skip
    held = next(n for n in r.notes if n.startswith("held fixed"))
    assert "max_tokens=32" in held and "system_prompt=unset" in held and "None" not in held
    quiet = _stored_profile(tmp_path, 30.0, {"kind": "synthetic"})
    q = profile_from_db(store.connect(tmp_path / "h30.db"), quiet)
    assert q.host is not None and not q.host.contended
    assert not any(n.startswith("host busy") for n in q.notes)
    assert "host: other processes kept 10 %" in q.to_markdown()
