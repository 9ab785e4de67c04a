"""The ``matrix_game`` workload over a stand-in of the authors' checkout
(tests/stand_ins/matrix_game: the same module paths and signatures as Matrix-Game-3.5, tiny
torch ops inside): imported as a real checkout would be, driven chunk by chunk through the
rollout driver, every chunk's named stages stored, a planted slow memory bank named by the
diagnosis, and a missing checkout, file or dependency one line, exit 2."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from soakd.analysis import evaluate
from soakd.config import MatrixGameWorkloadSettings, load_settings
from soakd.errors import UsageError
from soakd.report import render
from soakd.run.runner import run_soak
from soakd.store import db as store
from soakd.workloads.base import Condition, WorkloadContext, WorkloadError
from soakd.workloads.matrix_game import TOP_LEVEL, MatrixGameWorkload, import_checkout

from .conftest import error_lines, run_cli

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "tests" / "stand_ins" / "matrix_game"
SITE = REPO / "tests" / "stand_ins" / "site"  # the accelerate stand-in
STAGES = {"context", "kv_seed", "denoise", "kv_write", "vae_decode", "memory_bank"}


@pytest.fixture(autouse=True, scope="module")
def _forget_the_stand_in() -> Iterator[None]:
    """The stand-in's top-level modules (and its accelerate) leave with this module."""
    yield
    for name in list(sys.modules):
        if name.partition(".")[0] in (*TOP_LEVEL, "accelerate"):
            del sys.modules[name]


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The inputs infer_distilled.py takes (anchor image, camera .npz, checkpoint, weight
    folders) and the accelerate stand-in on sys.path."""
    monkeypatch.syspath_prepend(str(SITE))
    cv2.imwrite(str(tmp_path / "input.png"), np.full((64, 64, 3), 120, np.uint8))
    extr = np.tile(np.eye(4, dtype=np.float32), (40, 1, 1))
    extr[:, 0, 3] = np.arange(40) * 0.1
    intr = np.array([50, 50, 32, 32], np.float32)
    np.savez(tmp_path / "camera.npz", extrinsics_c2w=extr, intrinsics=intr)
    (tmp_path / "first-person.safetensors").write_bytes(b"")
    for d in ("wan", "tokenizer", "da3"):
        (tmp_path / d).mkdir()
    return {
        "repo": str(STAND_IN),
        "checkpoint": str(tmp_path / "first-person.safetensors"),
        "image": str(tmp_path / "input.png"),
        "camera": str(tmp_path / "camera.npz"),
        "wan_dir": str(tmp_path / "wan"),
        "tokenizer_dir": str(tmp_path / "tokenizer"),
        "da3_dir": str(tmp_path / "da3"),
        "workdir": str(tmp_path / "work"),
    }


def _overrides(inputs: dict[str, str], tmp_path: Path, **extra: Any) -> list[str]:
    ov = [
        "workload.kind=matrix_game",
        "workload.device=cpu",
        "workload.prompt='a suburban street'",
        "workload.num_blocks=3",  # 6 chunks of 3 latent frames (12 RGB frames) an episode
        "run.fps=8",
        "run.duration=3",
        "run.warmup_s=0.5",
        f"run.db='{tmp_path / 'soakd.db'}'",
        "run.log_every=0",
        "source.width=64",
        "source.height=64",
    ]
    ov += [f"workload.{k}='{v}'" for k, v in inputs.items()]
    return ov + [f"{k}={v}" for k, v in extra.items()]


def _soak(inputs: dict[str, str], tmp_path: Path, **extra: Any) -> tuple[Any, Any, Any]:
    return _soak_with(_overrides(inputs, tmp_path, **extra), tmp_path)


def _soak_with(overrides: list[str], tmp_path: Path) -> tuple[Any, Any, Any]:
    res = run_soak(load_settings(overrides=overrides))
    conn = store.connect(tmp_path / "soakd.db")
    try:
        data, verdict = evaluate(conn, res.run_id)
        stages = conn.execute(
            "SELECT frame_id, name, ms FROM chunk_stages WHERE run_id = ?", (res.run_id,)
        ).fetchall()
        chunks = conn.execute(
            "SELECT frame_id, emitted FROM frames WHERE run_id = ? ORDER BY frame_id",
            (res.run_id,),
        ).fetchall()
    finally:
        conn.close()
    return res, (data, verdict), (stages, chunks)


def _median(stages: list[tuple[int, str, float]], name: str) -> float:
    return float(np.median([ms for _, n, ms in stages if n == name]))


def test_a_rollout_over_the_stand_in_reports_first_output_intervals_and_named_stages(
    inputs: dict[str, str], tmp_path: Path
) -> None:
    """Their rollout runs chunk by chunk: every chunk a row with its 12 frames, its six named
    stages stored, and the report gives first output, interval percentiles and the stages."""
    res, (data, verdict), (stages, chunks) = _soak(inputs, tmp_path)
    assert res.status == "completed", res.reason
    assert res.summary["first_output_ms"] > 0
    assert len(chunks) >= 8 and all(n == 12 for _, n in chunks)
    assert {name for _, name, _ in stages} == STAGES
    per_chunk = {fid for fid, name, _ in stages if name == "denoise"}
    assert per_chunk == {fid for fid, _ in chunks}  # every chunk denoised, named
    assert res.summary["rollout_episodes"] == math.ceil(len(chunks) / 6)  # 6 chunks each
    md = render("md", data, verdict)
    assert "**First output:**" in md and "**presentation interval**" in md and "p95" in md
    for name in STAGES:
        assert f"| {name} |" in md
    # (whether a stage "dominates" the stand-in's chunk is the host's load as much as the
    # stand-in's: a loaded host slowed its CPU-bound memory bank past a third of a chunk.
    # The hint's rule is pinned where the stage's cost is planted: the test below and
    # tests/test_rollout.py)


def test_a_planted_slow_memory_bank_is_named_by_the_diagnosis(
    inputs: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory bank that sleeps 120 ms per registration (the stand-in's planted fault) is
    the stage the diagnosis names as dominating the chunk."""
    monkeypatch.setenv("MG_STANDIN_MEMORY_SLEEP_MS", "120")
    res, (_, verdict), (stages, _) = _soak(inputs, tmp_path)
    assert res.status == "completed", res.reason
    assert _median(stages, "memory_bank") >= 100
    assert any(h.startswith("stage memory_bank dominates the chunk") for h in verdict.hints)


class ScriptedRun:
    """A RolloutRun that hands out ``n`` conditions and records stages and emits."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0
        self.log: list[tuple[int, str, int]] = []  # (chunk, "stage name" | "emit", frames)

    def next_condition(self) -> Condition | None:
        if self.i >= self.n:
            return None
        self.i += 1
        return Condition(frame=None, index=self.i - 1, action=None)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.log.append((self.i - 1, name, 0))
        yield

    def emit(self, n: int) -> None:
        self.log.append((self.i - 1, "emit", n))


def _workload(inputs: dict[str, str], **knobs: Any) -> MatrixGameWorkload:
    s = MatrixGameWorkloadSettings(**inputs, prompt="a street", device="cpu", **knobs)
    return MatrixGameWorkload(s, WorkloadContext())


def test_knobs_named_as_the_authors_name_them_replace_their_yaml(inputs: dict[str, str]) -> None:
    """chunk_size / latent_window_size / num_blocks set in soakd replace the YAML's: 2 blocks
    of 2 chunks of 2 latent frames, each chunk 8 frames, over two episodes; at close their
    module gets its own functions back."""
    wl = _workload(inputs, chunk_size=2, latent_window_size=4, num_blocks=2, context_chunks=2)
    wl.setup()
    cr = wl.mods["causal_rollout"]
    try:
        d = wl.describe()
        assert d["config"]["chunk_size"] == 2 and d["chunks_per_episode"] == 4
        assert d["frames_per_chunk"] == 8
        run = ScriptedRun(6)
        wl.rollout(run)
    finally:
        wl.close()
    emits = [(c, n) for c, what, n in run.log if what == "emit"]
    assert emits == [(c, 8) for c in range(6)]
    for c in range(6):  # per chunk: 3 steps x (DiT forward + transition); 1 cache-fill + trim
        names = [what for chunk, what, _ in run.log if chunk == c]
        assert names.count("denoise") == 6 and names.count("kv_write") == 2, names
    assert cr.model_fn_causal_kv.__module__ == "diffsynth.pipelines.wan_video"


def test_a_chunk_their_loop_does_not_decode_is_decoded_by_soakd(inputs: dict[str, str]) -> None:
    """memory_mode = "empty": their loop decodes no chunk and registers no memory; every
    chunk still emits its 12 frames (soakd's decode, a vae_decode stage), no memory_bank."""
    wl = _workload(inputs, memory_mode="empty")
    wl.setup()
    try:
        run = ScriptedRun(3)
        wl.rollout(run)
    finally:
        wl.close()
    assert [(c, n) for c, what, n in run.log if what == "emit"] == [(0, 12), (1, 12), (2, 12)]
    names = {what for _, what, _ in run.log}
    assert "memory_bank" not in names and {"vae_decode", "denoise", "kv_write"} <= names


def test_a_knob_their_config_rejects_is_a_one_line_error(inputs: dict[str, str]) -> None:
    with pytest.raises(WorkloadError, match=r"^workload \(schedule\): schedule must") as e:
        _workload(inputs, schedule=(900, 500)).setup()
    assert "\n" not in str(e.value)
    with pytest.raises(WorkloadError, match=r"^workload.memory_mode: .*'sometimes'"):
        _workload(inputs, memory_mode="sometimes").setup()
    with pytest.raises(WorkloadError, match=r"exactly one of prompt or caption"):
        s = MatrixGameWorkloadSettings(**inputs, device="cpu")  # neither, as their CLI refuses
        MatrixGameWorkload(s, WorkloadContext())


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("repo", "/nonexistent/Matrix-Game-3.5", r"workload\.repo: .* is not a directory"),
        ("repo", str(REPO / "docs"), r"workload\.repo: .* not a Matrix-Game-3.5 checkout"),
        ("config", "/nonexistent/infer.yaml", r"workload\.config: .* does not exist"),
        ("camera", "/nonexistent/camera.npz", r"workload\.camera: .* does not exist"),
    ],
)
def test_a_missing_checkout_or_file_is_one_line_before_the_run(
    inputs: dict[str, str], tmp_path: Path, key: str, value: str, message: str
) -> None:
    inputs[key] = value
    with pytest.raises(UsageError, match=message) as e:
        run_soak(load_settings(overrides=_overrides(inputs, tmp_path)))
    assert "\n" not in str(e.value)
    db = tmp_path / "soakd.db"
    if db.exists():  # nothing half-written
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_a_missing_dependency_is_one_line_exit_2(inputs: dict[str, str], tmp_path: Path) -> None:
    """Without accelerate (the stand-in site folder left off), `soakd run` says which
    package their code needs, on one line, and exits 2."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = [sys.executable, "-c", "import accelerate"]
    if subprocess.run(probe, env=env, capture_output=True, check=False).returncode == 0:
        pytest.skip("a real accelerate is installed here: no dependency is missing")
    cfg = tmp_path / "mg.toml"
    cfg.write_text(
        "[workload]\n" + "".join(f"{k} = '{v}'\n" for k, v in inputs.items()) + "kind = "
        "'matrix_game'\ndevice = 'cpu'\nprompt = 'a street'\n"
        f"[run]\ndb = '{tmp_path / 'soakd.db'}'\nduration = 2\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "soakd", "run", str(cfg), "--no-live"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith("{")]
    assert len(lines) == 1, out.stderr  # the error; the rest are JSON log lines
    assert lines[0].startswith("soakd: error: workload 'matrix_game': ")
    assert "needs the package 'accelerate', which is not installed" in lines[0]


def test_the_stand_in_imports_as_a_checkout_from_its_own_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every module the workload uses comes from the checkout it was given."""
    monkeypatch.syspath_prepend(str(SITE))
    mods = import_checkout(STAND_IN)
    for mod in mods.values():
        assert Path(mod.__file__ or "").resolve().is_relative_to(STAND_IN)


def test_the_stand_in_has_every_function_the_upstream_check_compares() -> None:
    """bench/upstream_check.py compares these signatures with a real checkout's: each one
    the workload calls or wraps is in the stand-in (a new call without a stand-in fails)."""
    from bench.upstream_check import SIGNATURES, signature

    missing = [f"{rel}:{q}" for rel, q in SIGNATURES if signature(STAND_IN, rel, q) is None]
    assert missing == []


def test_the_shipped_matrix_game_config_is_the_built_in_kind() -> None:
    """configs/matrix-game.toml loads as kind = "matrix_game" (no factory, no pipe.stream),
    judged against 16 fps playback, the authors' knobs left to their YAML."""
    s = load_settings(REPO / "configs" / "matrix-game.toml")
    assert isinstance(s.workload, MatrixGameWorkloadSettings)
    assert s.criteria.content_fps == 16.0
    assert all(getattr(s.workload, k) is None for k in ("schedule", "chunk_size", "num_blocks"))


# --- a changed release: hooks that no longer attach, a changed boundary call


def _drifted(tmp_path: Path, edits: dict[str, list[tuple[str, str]]]) -> str:
    """A copy of the stand-in checkout with ``edits`` (file -> [(old, new)]) applied, as a
    later release of theirs might have changed it."""
    repo = tmp_path / "Matrix-Game-3.5"
    shutil.copytree(STAND_IN, repo, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, pairs in edits.items():
        path = repo / rel
        text = path.read_text(encoding="utf-8")
        for old, new in pairs:
            assert old in text, (rel, old)
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    return str(repo)


_ROLLOUT = "examples/wanvideo/pipeline/mosaic/causal_rollout.py"
_RENAMED_BANK = {  # their memory bank's method renamed, and their loop calling the new name
    "frustum/frustum_handler.py": [("def register_source_sequence(", "def register_frames(")],
    _ROLLOUT: [("handler.register_source_sequence(", "handler.register_frames(")],
}


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        (
            _RENAMED_BANK,
            r"^workload 'matrix_game': stage memory_bank was expected and never timed in the "
            r"first episode \(no FrustumHandler\.register_source_sequence: a hook that no "
            r"longer attaches\) \(workload\.allow_missing_stages = true runs without them\)$",
        ),
        (
            {
                "diffsynth/pipelines/wan_video.py": [("cache_read_chunk_id", "read_chunk_id")],
                _ROLLOUT: [("cache_read_chunk_id", "read_chunk_id")],
            },
            r"their model_fn_causal_kv\(dit, latents_chunk, .*\) has no keyword "
            r"cache_read_chunk_id: soakd expected model_fn_causal_kv\(\.\.\., "
            r"latents_chunk=\.\.\., write_cache=\.\.\., cache_read_chunk_id=\.\.\.\)",
        ),
        (  # the boundary helper called through another name: soakd's shim never runs
            {
                _ROLLOUT: [
                    (
                        "import torch\n",
                        "import torch\nfrom diffsynth.core.data import "
                        "nonlocal_memory_context as _nmc\n",
                    ),
                    (
                        "        _rolling_anchor_source_position(\n",
                        "        _nmc.rolling_anchor_source_position(\n",
                    ),
                ]
            },
            r"chunk 1 of the episode began without the chunk-boundary hook: soakd expected "
            r"_rolling_anchor_source_position\(local_chunk_idx=i, \.\.\.\) once at the start "
            r"of chunk i",
        ),
        (  # the boundary call changed: was "the camera poses would not match" in episode 2
            {
                "diffsynth/core/data/nonlocal_memory_context.py": [
                    ("local_chunk_idx", "chunk_index")
                ],
                _ROLLOUT: [("local_chunk_idx=i", "chunk_index=i")],
            },
            r"their _rolling_anchor_source_position\(chunk_index, frames_per_chunk, "
            r"window_chunks, initial_anchor_source_position\) has no keyword local_chunk_idx: "
            r"soakd expected _rolling_anchor_source_position\(\.\.\., local_chunk_idx=\.\.\.\)",
        ),
    ],
    ids=["renamed-bank-method", "renamed-keyword", "aliased-boundary", "changed-boundary"],
)
def test_a_hook_that_no_longer_attaches_ends_setup_in_one_line(
    inputs: dict[str, str], tmp_path: Path, edits: dict[str, Any], message: str
) -> None:
    """A release whose names moved (a renamed memory-bank method or model_fn_causal_kv
    keyword, the boundary helper called through another name, a changed boundary call)
    ends setup with one line naming the stage or hook and what soakd expected, exit 2,
    before any row is written: never a silently missing stage."""
    inputs["repo"] = _drifted(tmp_path, edits)
    with pytest.raises(UsageError, match=message) as e:
        run_soak(load_settings(overrides=_overrides(inputs, tmp_path)))
    assert "\n" not in str(e.value) and int(e.value.exit_code) == 2
    assert "camera poses" not in str(e.value)
    db = tmp_path / "soakd.db"
    if db.exists():
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM frames").fetchone() == (0,)


def test_allow_missing_stages_runs_with_a_warning_event(
    inputs: dict[str, str], tmp_path: Path
) -> None:
    """workload.allow_missing_stages = true: the renamed memory-bank method does not stop
    the run; it completes and its events carry one missing_stage event naming the stage."""
    inputs["repo"] = _drifted(tmp_path, _RENAMED_BANK)
    res = run_soak(
        load_settings(
            overrides=_overrides(
                inputs, tmp_path, **{"workload.allow_missing_stages": "true", "run.duration": 1}
            )
        ),
        judge=False,
    )
    assert res.status == "completed", res.reason
    with sqlite3.connect(tmp_path / "soakd.db") as conn:
        events = conn.execute(
            "SELECT message FROM events WHERE kind = 'missing_stage' AND run_id = ?",
            (res.run_id,),
        ).fetchall()
    assert len(events) == 1
    assert events[0][0].startswith("stage memory_bank was expected and never timed")
    assert "FrustumHandler.register_source_sequence" in events[0][0]


def test_episode_frames_0_runs_one_rollout_for_the_whole_soak(
    inputs: dict[str, str], tmp_path: Path
) -> None:
    """workload.episode_frames = 0: their rollout is called once for the whole soak (its
    blocks cover run.duration x run.fps chunks), so the chunks run on past the 6 of a
    default episode in one episode, and the report says 1 episode."""
    overrides = _overrides(inputs, tmp_path, **{"workload.episode_frames": 0})
    overrides.remove("workload.num_blocks=3")
    res, (data, verdict), (_, chunks) = _soak_with(overrides, tmp_path)
    assert res.status == "completed", res.reason
    assert len(chunks) > 6 and res.summary["rollout_episodes"] == 1
    with sqlite3.connect(tmp_path / "soakd.db") as conn:
        (described,) = conn.execute("SELECT workload FROM runs").fetchone()
    assert json.loads(described)["blocks_per_episode"] * 2 >= 3 * 8 + 1  # 2 chunks a block
    assert "; 1 episode (one rollout for the whole run)" in render("md", data, verdict)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("repo", "", "workload.repo is empty: name a checkout of Matrix-Game-3.5"),
        ("camera", "damaged", "is not a camera track soakd can read"),
    ],
)
def test_an_empty_repo_or_a_damaged_camera_file_is_one_line_exit_2(
    inputs: dict[str, str], tmp_path: Path, key: str, value: str, message: str
) -> None:
    """`soakd run` with workload.repo = "" (which would be the current directory) or a
    camera .npz that is not one (numpy would suggest allow_pickle) says so on one line,
    exit 2, and never suggests unsafe loading."""
    if value == "damaged":
        value = str(tmp_path / "camera-damaged.npz")
        Path(value).write_bytes(b"\x93NUMPY-not-really" + os.urandom(256))
    inputs[key] = value
    cfg = tmp_path / "mg.toml"
    cfg.write_text(
        "[workload]\nkind = 'matrix_game'\ndevice = 'cpu'\nprompt = 'a street'\n"
        + "".join(f"{k} = '{v}'\n" for k, v in inputs.items())
        + f"[run]\ndb = '{tmp_path / 'soakd.db'}'\nduration = 2\n"
    )
    out = run_cli("run", str(cfg), "--no-live")
    assert out.returncode == 2, out.stderr
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith("soakd: error: workload 'matrix_game': ")
    assert message in lines[0]
    assert "pickle" not in out.stderr.lower()
