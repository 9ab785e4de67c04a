"""Check soakd's built-in workloads against the authors' own code (docs/upstream.md).

    python -m bench.upstream_check --matrix-game PATH [--tiny | --checkpoint F --wan-dir D
        --tokenizer-dir D --da3-dir D] [--knob NAME VALUE] [--seconds 20] [--fps 1.33]
        [--device cuda]
    python -m bench.upstream_check --moss PATH [--moss-tiny] [--seconds 20] [--moss-fps 2]
        [--moss-set KEY VALUE] [--device cpu] [--moss-venv DIR | --moss-here]

``--matrix-game PATH``: a local checkout of Riemann-Dynamics/Matrix-Game-3.5 (fetched by
the person running the check; nothing of it is copied into soakd).

1. **signatures**: every function the ``matrix_game`` workload calls or wraps, read from the
   checkout and from the CI stand-in (tests/stand_ins/matrix_game) with ``ast`` (no
   import, no dependency): the parameter names and kinds must be the same, so the stand-in
   that CI runs against still mirrors the real API;
2. **import**: the workload imports the checkout (``import_checkout``), naming the first
   package their code needs that is not installed here;
3. **setup + soak**: the ``matrix_game`` workload's own setup, with the authors' sample
   inputs (``samples/distilled/suburban_street_6blocks``) and the weights given (without
   them, placeholders: the check then says which step of theirs needs the real files); when
   setup succeeds, a ``--seconds`` soak through ``run_soak``, printing each named stage's
   median per chunk, the first output, the interval p50/p95 and the verdict.
   ``--tiny``: no weights needed; random weights of their own ``WanModel``,
   ``WanTextEncoder`` and ``WanVideoVAE38`` (smaller settings of Wan2.2-TI2V-5B's) and a
   word-level tokenizer, registered in their model table, at 64x64 with
   ``memory_mode = "empty"`` (no Depth-Anything-3 weights); ``--knob`` overrides.

``--moss PATH`` runs under **transformers 4.57** (``MOSS_TRANSFORMERS``), the line the
authors' remote code is written for: on 5.x their ``apply_chat_template(...,
return_tensors="pt")`` returns a ``BatchEncoding`` and the generation thread dies at its first
step. Their files are never patched: when the interpreter running the check has another
transformers, the MOSS part runs in a separate venv (``--moss-venv``, default ``.venv-moss``
in the repository, git-ignored), built on first use with ``MOSS_VENV_PACKAGES`` (soakd is put
on its ``PYTHONPATH``, not installed: soakd's own venv keeps transformers 5), and the check
says so; ``--moss-here`` runs it in this interpreter anyway.

``--moss PATH``: a folder holding MOSS-VL-Realtime's remote-code files and weights (the
real checkpoint, or a small random-weight one saved from its own config class; with
``--moss-tiny`` only their ``*_moss_vl.py`` files, and ``moss_tiny`` saves random weights of
their ``MossVLForConditionalGeneration`` from their ``MossVLConfig``, a tiny tokenizer with
their special tokens and their processor config into a temporary folder); the sha256
of each ``*.py`` in it, then the session API soakd calls (``create_realtime_session`` and
``MossVLRealtimeSession``'s ``__init__``, ``active``, ``pending_frames``, ``start``,
``push_frame``, ``push_prompt``, ``poll_output``, ``close``) compared with the CI stand-in
(tests/tiny_session.py) by ``ast``, then a ``--seconds`` soak through soakd's built-in
``session`` workload (``trust_remote_code``; ``MOSS_KEYS``, ``--moss-set`` overrides) at
``--moss-fps``, printing the stages soakd's hooks time per frame (their processor call,
model step and detokenisation), consume
latency (push -> the model takes the frame), consume -> first output, capture -> next output,
the session counters (outputs by kind, drops, questions and their answer latency) and the
verdict. Prints one JSON document at the end (``--out`` writes it too); exit 0 when the
signatures are the same, the checkout imports and a soak that started completed with a
verdict (a short soak is often INVALID: too short to test the trends), 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "tests" / "stand_ins" / "matrix_game"
SAMPLE = "samples/distilled/suburban_street_6blocks"
_M = "examples/wanvideo/pipeline/mosaic"
#: (file in the checkout, function or Class.method): what soakd calls or wraps
SIGNATURES: tuple[tuple[str, str], ...] = (
    ("distilled_config.py", "load_inference_config"),
    ("distilled_config.py", "validate_inference_config"),
    ("distilled_config.py", "config_as_dict"),
    ("infer.py", "resolve_weight"),
    ("infer.py", "build_input_workspace"),
    ("infer.py", "build_index"),
    ("infer_distilled.py", "_workspace_args"),
    ("tools/run_distilled_inference.py", "build_model"),
    (f"{_M}/causal_config.py", "build_runtime_args"),
    (f"{_M}/datasets.py", "build_mosaic_validation_dataset"),
    (f"{_M}/causal_inference.py", "_build_handler"),
    (f"{_M}/causal_rollout.py", "_run_causal_kv_rollout"),
    (f"{_M}/causal_rollout.py", "_normalize_causal_validation_memory_mode"),
    (f"{_M}/causal_rollout.py", "_validation_memory_mode_uses_runtime_pool"),
    (f"{_M}/causal_rollout.py", "_validation_memory_mode_uses_online_depth"),
    (f"{_M}/causal_rollout.py", "_causal_kv_trim_rolling_window"),
    (f"{_M}/causal_rollout.py", "_causal_dmd_validation_transition"),
    (f"{_M}/causal_memory.py", "_decode_generated_chunk_from_prefix_latents"),
    (f"{_M}/causal_memory.py", "_build_initial_causal_kv_dynamic_context_pool"),
    (f"{_M}/causal_memory.py", "_CausalKVDynamicContextPool.select_for_chunk"),
    (f"{_M}/causal_memory.py", "_CausalKVDynamicContextPool.add_generated_chunk"),
    (f"{_M}/video_io.py", "_decode_latents_to_numpy_frames"),
    (f"{_M}/video_io.py", "_encode_frames_per_frame"),
    (f"{_M}/video_io.py", "_init_registration_estimator"),
    (f"{_M}/cleanup.py", "_rank_local_cuda_device"),
    ("diffsynth/pipelines/wan_video.py", "model_fn_causal_kv"),
    ("diffsynth/core/data/nonlocal_memory_context.py", "rolling_anchor_source_position"),
)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- 1. signatures


def signature(root: Path, rel: str, qualname: str) -> list[str] | None:
    """``kind:name`` of each parameter of ``qualname`` in ``root/rel`` (None: not there)."""
    path = root / rel
    if not path.is_file():
        return None
    body: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    *owners, name = qualname.split(".")
    for owner in owners:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            return None
        body = cls.body
    fn = next(
        (
            n
            for n in body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
        ),
        None,
    )
    if fn is None:
        return None
    a = fn.args
    out = [f"pos:{p.arg}" for p in (*a.posonlyargs, *a.args)]
    out += [f"*{a.vararg.arg}"] if a.vararg else []
    out += [f"kw:{p.arg}" for p in a.kwonlyargs]
    out += [f"**{a.kwarg.arg}"] if a.kwarg else []
    return out


def check_signatures(checkout: Path) -> dict[str, Any]:
    rows = []
    for rel, qual in SIGNATURES:
        real, mine = signature(checkout, rel, qual), signature(STAND_IN, rel, qual)
        rows.append(
            {
                "function": f"{rel}:{qual}",
                "same": real == mine and real is not None,
                "upstream": real,
                "stand_in": mine,
            }
        )
    same = sum(r["same"] for r in rows)
    _log(f"signatures: {same}/{len(rows)} the same in the checkout and the stand-in")
    for r in rows:
        if not r["same"]:
            _log(
                f"  differs: {r['function']}\n    upstream {r['upstream']}\n"
                f"    stand-in {r['stand_in']}"
            )
    return {"same": same, "checked": len(rows), "differs": [r for r in rows if not r["same"]]}


# --- 2./3. the workload against the checkout


def _placeholders(tmp: Path, args: argparse.Namespace) -> dict[str, str]:
    """The weights given, else empty placeholders (setup then names the step needing them)."""
    ck = args.checkpoint or tmp / "placeholder-first-person.safetensors"
    if args.checkpoint is None:
        Path(ck).write_bytes(b"")
    dirs = {}
    for key in ("wan_dir", "tokenizer_dir", "da3_dir"):
        given = getattr(args, key)
        if given is None:
            given = tmp / f"placeholder-{key}"
            given.mkdir(exist_ok=True)
        dirs[key] = str(given)
    return {"checkpoint": str(ck), **dirs}


def matrix_game(args: argparse.Namespace) -> dict[str, Any]:
    from soakd.workloads.base import WorkloadError
    from soakd.workloads.matrix_game import import_checkout, upstream_commit

    checkout = args.matrix_game.resolve()
    out: dict[str, Any] = {"checkout": str(checkout), "commit": upstream_commit(checkout)}
    out["commit"] = out["commit"] or args.commit
    _log(f"Matrix-Game-3.5 checkout {checkout} at commit {out['commit']}")
    out["signatures"] = check_signatures(checkout)
    try:
        import_checkout(checkout)
        out["import"] = "ok"
    except WorkloadError as exc:
        out["import"] = str(exc)
        _log(f"import: {exc}")
        return out
    _log("import: ok")
    with tempfile.TemporaryDirectory(prefix="soakd-upstream-") as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # their dataset caches into ./.cache/dataset_cache of the cwd
        try:
            out |= soak_matrix_game(checkout, Path(tmp), args)
        finally:
            os.chdir(cwd)
    return out


#: tiny random-weight instances of the authors' own classes (Wan2.2-TI2V-5B's layout,
#: smaller): their DiT keeps 128-wide heads, as their PRoPE attention tiles 64-wide blocks
TINY_DIT = {
    "has_image_input": False,
    "patch_size": [1, 2, 2],
    "in_dim": 48,
    "dim": 128,
    "ffn_dim": 256,
    "freq_dim": 256,
    "text_dim": 32,
    "out_dim": 48,
    "num_heads": 1,
    "num_layers": 2,
    "eps": 1e-06,
    "seperated_timestep": True,
    "require_clip_embedding": False,
    "require_vae_embedding": False,
    "fuse_vae_embedding_in_latents": True,
}
TINY_T5 = {
    "vocab": 512,
    "dim": 32,
    "dim_attn": 32,
    "dim_ffn": 64,
    "num_heads": 2,
    "num_layers": 1,
    "num_buckets": 32,
}
TINY_VAE = {"z_dim": 48, "dim": 16}  # their WanVideoVAE38 keeps its decoder at dec_dim=256
#: the knobs a tiny run uses unless --knob says otherwise (no Depth-Anything-3 weights:
#: memory_mode = "empty" needs no depth estimator)
TINY_KNOBS = {
    "height": "64",
    "width": "64",
    "num_blocks": "1",
    "latent_window_size": "6",
    "context_chunks": "2",
    "memory_mode": "'empty'",
}


def tiny_weights(tmp: Path) -> dict[str, str]:
    """Random weights of their WanModel, WanTextEncoder and WanVideoVAE38 saved where
    their loader looks (``build_runtime_args``' file names), a word-level tokenizer, and the
    three registered in their model table (``MODEL_CONFIGS``: hash, class, kwargs), which
    is how their loader knows a model: by the hash of its keys and shapes."""
    import torch
    from diffsynth.core.loader.file import hash_model_file
    from diffsynth.models import model_loader
    from diffsynth.models.wan_video_dit import WanModel
    from diffsynth.models.wan_video_text_encoder import WanTextEncoder
    from diffsynth.models.wan_video_vae import WanVideoVAE38
    from safetensors.torch import save_file

    wan = tmp / "tiny-wan"
    wan.mkdir()
    torch.manual_seed(0)
    dit = {k: v.contiguous() for k, v in WanModel(**TINY_DIT).state_dict().items()}
    save_file(dit, str(wan / "diffusion_pytorch_model.safetensors"))
    save_file(dit, str(tmp / "tiny-first-person.safetensors"))  # the "distilled" DiT
    torch.save(WanTextEncoder(**TINY_T5).state_dict(), wan / "models_t5_umt5-xxl-enc-bf16.pth")
    vae = WanVideoVAE38(**TINY_VAE).state_dict()
    torch.save({k.removeprefix("model."): v for k, v in vae.items()}, wan / "Wan2.2_VAE.pth")
    tok = tiny_tokenizer(tmp / "tiny-tokenizer")
    m = "diffsynth.models"
    table = (
        (
            "diffusion_pytorch_model.safetensors",
            "wan_video_dit",
            f"{m}.wan_video_dit.WanModel",
            TINY_DIT,
            None,
        ),
        (
            "models_t5_umt5-xxl-enc-bf16.pth",
            "wan_video_text_encoder",
            f"{m}.wan_video_text_encoder.WanTextEncoder",
            TINY_T5,
            None,
        ),
        (
            "Wan2.2_VAE.pth",
            "wan_video_vae",
            f"{m}.wan_video_vae.WanVideoVAE38",
            TINY_VAE,
            "diffsynth.utils.state_dict_converters.wan_video_vae.WanVideoVAEStateDictConverter",
        ),
    )
    entries = []
    for file, name, cls, kwargs, converter in table:
        entry = {
            "model_hash": hash_model_file(str(wan / file)),
            "model_name": name,
            "model_class": cls,
            "extra_kwargs": kwargs,
        }
        entries.append(entry | ({"state_dict_converter": converter} if converter else {}))
    model_loader.MODEL_CONFIGS = (*model_loader.MODEL_CONFIGS, *entries)
    return {
        "checkpoint": str(tmp / "tiny-first-person.safetensors"),
        "wan_dir": str(wan),
        "tokenizer_dir": str(tok),
    }


def tiny_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer AutoTokenizer loads (their HuggingfaceTokenizer wraps it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "a the street walk forward left right camera scene house road tree car sky"
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2} | {w: 3 + i for i, w in enumerate(words.split())}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(folder)
    return folder


def soak_matrix_game(checkout: Path, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    from soakd.config import load_settings
    from soakd.errors import UsageError
    from soakd.observers.base import Observer
    from soakd.run.runner import run_soak

    phases: list[str] = []

    class Phases(Observer):
        def on_phase(self, name: str) -> None:
            phases.append(name)
            _log(f"  phase: {name}")

    sample = checkout / SAMPLE
    weights = tiny_weights(tmp) if args.tiny else {}
    keys = {
        "repo": str(checkout),
        "image": str(sample / "input.png"),
        "camera": str(sample / "camera.npz"),
        "caption": str(sample / "caption.json"),
        "workdir": str(tmp / "work"),
        **(_placeholders(tmp, args) | weights),
    }
    extra = dict(args.knob or [])
    tiny = {
        k: v for k, v in TINY_KNOBS.items() if k != "num_blocks" or "episode_frames" not in extra
    }
    knobs = (tiny if args.tiny else {}) | extra  # episode_frames replaces num_blocks
    ov = ["workload.kind=matrix_game", f"workload.device={args.device}"]  # kind first
    ov += [f"workload.{k}='{v}'" for k, v in keys.items()]
    ov += [f"workload.{k}={v}" for k, v in knobs.items()]
    ov += [
        f"run.db='{tmp / 'soakd.db'}'",
        f"run.duration={args.seconds}",
        f"run.fps={args.fps}",
        "run.warmup_s=0",
        "run.log_every=0",
        "run.stall_timeout_s=600",
        "criteria.content_fps=16",
        f"criteria.min_frames={args.min_frames}",
    ]
    t0 = time.perf_counter()
    try:
        res = run_soak(load_settings(overrides=ov), observers=[Phases()])
    except UsageError as exc:
        _log(f"setup: stopped after {phases[-1] if phases else 'nothing'}: {exc}")
        return {"phases": phases, "setup": str(exc), "setup_s": round(time.perf_counter() - t0, 1)}
    return {"phases": phases, "setup": "ok", **figures(tmp / "soakd.db", res)}


def figures(db: Path, res: Any) -> dict[str, Any]:
    """Stage medians per chunk, first output, the presentation interval and the per-frame
    average (the run summary's levels), what content_fps and jitter judged, the episodes
    and the verdict of a run."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT name, ms FROM chunk_stages WHERE run_id = ?", (res.run_id,)
        ).fetchall()
        n_chunks = conn.execute(
            "SELECT count(*) FROM frames WHERE run_id = ?", (res.run_id,)
        ).fetchone()[0]
    finally:
        conn.close()
    stages: dict[str, list[float]] = {}
    for name, ms in rows:
        stages.setdefault(name, []).append(ms)
    med = {k: round(float(np.median(v)), 2) for k, v in sorted(stages.items())}
    v, sm = res.verdict, res.summary
    judged = {
        c.criterion: {"status": c.status, "detail": c.detail}
        for c in getattr(v, "criteria", [])
        if c.criterion in ("content_fps", "jitter")
    }
    out = {
        "status": res.status,
        "reason": res.reason,
        "chunks": n_chunks,
        "episodes": sm.get("rollout_episodes"),
        "stage_median_ms": med,
        "first_output_ms": sm.get("first_output_ms"),
        "presentation_ms": sm.get("presentation_ms"),
        "per_frame_ms": sm.get("interval_ms"),
        "judged_on": sm.get("interval_judged_on"),
        "judged": judged,
        "verdict": getattr(v, "status", None),
        "verdict_reason": getattr(v, "reason", None),
        "hints": list(getattr(v, "hints", []) or []),
    }
    _log(f"  {n_chunks} chunks in {out['episodes']} episode(s); stage medians (ms): {med}")
    pr, pf = out["presentation_ms"] or {}, out["per_frame_ms"] or {}
    _log(
        f"  first output {out['first_output_ms']} ms; presentation interval p50 "
        f"{pr.get('p50')} p95 {pr.get('p95')} max {pr.get('max')} ms; per-frame average "
        f"p50 {pf.get('p50')} p95 {pf.get('p95')} max {pf.get('max')} ms; judged on "
        f"{out['judged_on']}"
    )
    for name, c in judged.items():
        _log(f"  {name}: {c['status']}: {c['detail']}")
    out["report_lines"] = report_lines(db, res.run_id)
    for line in out["report_lines"]:
        _log(f"  report: {line}")
    _log(f"  verdict {out['verdict']}: {out['verdict_reason']}")
    return out


def report_lines(db: Path, run_id: str) -> list[str]:
    """The Markdown report's first-output and interval lines of the run."""
    from soakd.analysis import evaluate
    from soakd.report import render
    from soakd.store import db as store

    conn = store.connect(db)
    try:
        md = render("md", *evaluate(conn, run_id))
    finally:
        conn.close()
    return [ln for ln in md.splitlines() if "First output" in ln or "interval**" in ln]


# --- MOSS-VL-Realtime

#: what the soak sets for a tiny checkpoint on a CPU (``--moss-set`` adds or overrides; the
#: rest are the workload's defaults, which follow the authors' runner): one torch thread
#: (OpenMP spinning beside soakd's threads costs ~4x on 2 cores), small frames, float32 (a
#: CPU), and one question pushed mid-run (``push_prompt``)
MOSS_KEYS = {
    "torch_threads": "1",
    "max_pixels": "16384",
    "dtype": "'float32'",
    "questions": "[{at_s = 8, text = 'What changed?'}]",
}
#: the transformers line the authors' remote code is written for (docs/upstream.md)
MOSS_TRANSFORMERS = "4.57"
#: the MOSS venv: their transformers, a torch with a torchvision that imports beside it (their
#: processing_moss_vl.py imports torchvision; beside the CPU torch 2.13.0 here torchvision
#: 0.28.0 fails: "operator torchvision::nms does not exist"), soakd's own dependencies but
#: transformers
MOSS_VENV_PACKAGES = (
    f"transformers=={MOSS_TRANSFORMERS}.*",
    "torch==2.14.1",
    "torchvision==0.29.1",
    *("numpy>=1.26", "pillow>=10", "psutil>=5.9", "opencv-python-headless>=4.9"),
    *("structlog>=24.1", "sqlite-utils>=3.36", "typer>=0.12", "rich>=13.7", "pydantic>=2.6"),
    *("scipy>=1.11", "prometheus-client>=0.20", "httpx>=0.27", "httpx-sse>=0.4"),
    "nvidia-ml-py>=12.535",
)
#: per-frame columns of a session run: the stages the model hides (NULL) and what soakd sees
MOSS_STAGES = ("pre_ms", "infer_ms", "decode_ms")
MOSS_LATENCIES = ("consume_ms", "consume_output_ms", "output_latency_ms")


#: (the authors' ``modeling_moss_vl.py``, the CI stand-in ``tests/tiny_session.py``): what
#: the ``session`` workload calls
MOSS_SIGNATURES: tuple[tuple[str, str], ...] = (
    (
        "MossVLForConditionalGeneration.create_realtime_session",
        "ScriptedModel.create_realtime_session",
    ),
    ("MossVLRealtimeSession.__init__", "ScriptedSession.__init__"),
    ("MossVLRealtimeSession.active", "ScriptedSession.active"),
    ("MossVLRealtimeSession.pending_frames", "ScriptedSession.pending_frames"),
    ("MossVLRealtimeSession.start", "ScriptedSession.start"),
    ("MossVLRealtimeSession.push_frame", "ScriptedSession.push_frame"),
    ("MossVLRealtimeSession.push_prompt", "ScriptedSession.push_prompt"),
    ("MossVLRealtimeSession.poll_output", "ScriptedSession.poll_output"),
    ("MossVLRealtimeSession.close", "ScriptedSession.close"),
)


def check_moss_signatures(folder: Path) -> dict[str, Any]:
    """The session API soakd calls, read with ``ast`` from the folder and the stand-in."""
    rows = []
    for real_name, mine_name in MOSS_SIGNATURES:
        real = signature(folder, "modeling_moss_vl.py", real_name)
        mine = signature(REPO / "tests", "tiny_session.py", mine_name)
        same = real == mine and real is not None
        rows.append({"function": real_name, "same": same, "upstream": real, "stand_in": mine})
    same_n = sum(r["same"] for r in rows)
    _log(f"signatures: {same_n}/{len(rows)} the same in modeling_moss_vl.py and the stand-in")
    for r in rows:
        if not r["same"]:
            _log(f"  differs: {r['function']}: upstream {r['upstream']}, stand-in {r['stand_in']}")
    return {"same": same_n, "checked": len(rows), "differs": [r for r in rows if not r["same"]]}


def transformers_version(python: str | None = None) -> str | None:
    """The transformers version ``python`` (default: this interpreter) imports, or None."""
    if python is None:
        try:
            import transformers
        except ImportError:
            return None
        return str(transformers.__version__)
    code = "import transformers; print(transformers.__version__)"
    got = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return (got.stdout.strip() or None) if got.returncode == 0 else None


def moss_venv(venv: Path) -> Path:
    """The MOSS venv's python: reused when it imports transformers ``MOSS_TRANSFORMERS``,
    else built (``python -m venv`` + ``pip install MOSS_VENV_PACKAGES``)."""
    python = venv / "bin" / "python"
    have = transformers_version(str(python)) if python.exists() else None
    if have is not None and have.startswith(MOSS_TRANSFORMERS + "."):
        _log(f"MOSS venv {venv}: transformers {have} (reused)")
        return python
    _log(f"MOSS venv {venv}: building (transformers {MOSS_TRANSFORMERS}; minutes)")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *MOSS_VENV_PACKAGES], check=True)
    return python


def moss_in_venv(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """The MOSS part run by the MOSS venv's python (this check again with ``--moss-here``,
    soakd on its ``PYTHONPATH``): its document, with the venv and transformers named."""
    python = moss_venv(args.moss_venv.resolve())
    version = transformers_version(str(python))
    _log(f"MOSS-VL-Realtime runs in {python} (transformers {version}), not in this interpreter")
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="soakd-moss-") as tmp:
        out = Path(tmp) / "moss.json"
        cmd = [str(python), "-m", "bench.upstream_check", *_moss_argv(argv), "--moss-here"]
        cmd += ["--out", str(out)]
        proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=path), cwd=REPO, check=False)
        doc = json.loads(out.read_text()) if out.exists() else {}
    got = doc.get("moss") or {"setup": f"the MOSS venv's check exited {proc.returncode}"}
    return got | {"venv": str(args.moss_venv), "transformers": version}


#: options of the check the MOSS venv's run does not take (Matrix-Game's, --out), with
#: how many values each has
_NOT_FOR_MOSS = {
    **dict.fromkeys(("--matrix-game", "--commit", "--checkpoint", "--wan-dir"), 1),
    **dict.fromkeys(("--tokenizer-dir", "--da3-dir", "--out", "--fps", "--moss-venv"), 1),
    "--knob": 2,
    "--tiny": 0,
}


def _moss_argv(argv: list[str]) -> list[str]:
    """``argv`` without the options in ``_NOT_FOR_MOSS``."""
    out, i = [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in _NOT_FOR_MOSS:
            i += 1 if "=" in argv[i] else 1 + _NOT_FOR_MOSS[name]
            continue
        out.append(argv[i])
        i += 1
    return out


def moss(args: argparse.Namespace) -> dict[str, Any]:
    """Soak a MOSS-VL-Realtime folder (remote code + weights, or with ``--moss-tiny`` the
    remote code alone) through ``kind = "session"``."""
    folder = args.moss.resolve()
    out: dict[str, Any] = {
        "folder": str(folder),
        "files": remote_code_files(folder),
        "transformers": transformers_version(),
    }
    _log(f"MOSS-VL-Realtime folder {folder}")
    for name, digest in out["files"].items():
        _log(f"  {name} sha256 {digest}")
    out["signatures"] = check_moss_signatures(folder)
    with tempfile.TemporaryDirectory(prefix="soakd-upstream-") as tmp:
        if args.moss_tiny:
            try:
                folder = moss_tiny(folder, Path(tmp) / "moss_tiny")
            except Exception as exc:  # their code on this transformers: say where it broke
                _log(f"tiny checkpoint: {type(exc).__name__}: {exc}")
                return out | {"setup": f"tiny checkpoint: {type(exc).__name__}: {exc}"}
            _log(f"  tiny checkpoint {folder}")
        out |= soak_moss(folder, Path(tmp) / "soakd.db", args)
    return out


def soak_moss(folder: Path, db: Path, args: argparse.Namespace) -> dict[str, Any]:
    from soakd.config import load_settings
    from soakd.errors import UsageError
    from soakd.run.runner import run_soak

    keys = MOSS_KEYS | dict(args.moss_set or [])
    ov = ["workload.kind=session", f"workload.model_path='{folder}'"]
    ov += ["workload.trust_remote_code=true", f"workload.device={args.device}"]
    ov += [f"workload.{k}={v}" for k, v in keys.items()]
    ov += [f"run.db='{db}'", f"run.duration={args.seconds}", f"run.fps={args.moss_fps}"]
    # a 2 s warm-up: the session driver's pacing baseline (0.5 s) is measured inside it
    ov += ["run.warmup_s=2", "run.log_every=0", f"criteria.min_frames={args.min_frames}"]
    ov += [f"criteria.min_duration_s={min(args.seconds / 2, 60.0)}"]
    try:
        res = run_soak(load_settings(overrides=ov))
    except UsageError as exc:
        _log(f"setup: {exc}")
        return {"setup": str(exc)}
    return {"setup": "ok", **session_figures(db, res)}


#: ``--moss-tiny``: smaller settings of theirs (cross-attention every other layer, MRoPE
#: sections summing to head_dim / 2, DeepStack on the first vision block, no vision padding
#: as in the released config)
TINY_MOSS_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "cross_attention_layers": [1, 3],
    "max_position_embeddings": 32768,
    "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
}
TINY_MOSS_VISION = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 1,
    "out_hidden_size": 64,
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [0],
}
MOSS_SPECIAL = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|time_start|>",
    "<|time_end|>",
    "<|silence|>",
    "<|round_start|>",
    "<|round_end|>",
)
MOSS_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def moss_tiny(code: Path, out: Path) -> Path:
    """A checkpoint folder: their ``*_moss_vl.py`` files, random weights of their
    ``MossVLForConditionalGeneration`` from their ``MossVLConfig`` (``save_pretrained``),
    a tiny byte-level BPE tokenizer with their special tokens, their processor classes."""
    import importlib
    import shutil

    import torch

    out.mkdir(parents=True)
    for f in sorted(code.glob("*_moss_vl.py")):
        shutil.copy(f, out / f.name)
    sys.path.insert(0, str(out.parent))
    modeling = importlib.import_module(f"{out.name}.modeling_moss_vl")
    tok = moss_tiny_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in MOSS_SPECIAL}
    cfg = modeling.MossVLConfig(
        text_config=TINY_MOSS_TEXT | {"vocab_size": len(tok)},
        vision_config=TINY_MOSS_VISION,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        vision_seq_pad_multiple=1,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    cfg.auto_map = {
        "AutoConfig": "configuration_moss_vl.MossVLConfig",
        "AutoModelForCausalLM": "modeling_moss_vl.MossVLForConditionalGeneration",
    }
    cfg.architectures = ["MossVLForConditionalGeneration"]
    torch.manual_seed(0)
    modeling.MossVLForConditionalGeneration(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    moss_tiny_processor_files(out)
    return out


def moss_tiny_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[assignment]
    tk.decoder = decoders.ByteLevel()  # type: ignore[assignment]
    corpus = ["a person walks down the street, a car passes by; the scene is quiet."] * 20
    corpus += ["seconds 0.1 1.2 3.4 user assistant system helpful video frame"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=list(MOSS_SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(corpus, trainer)
    tok = Qwen2TokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None
    )
    tok.chat_template = MOSS_CHAT_TEMPLATE
    return tok


def moss_tiny_processor_files(out: Path) -> None:
    """Their processor (``auto_map``) at 64x64 to 128x128 pixels; transformers' own
    ``Qwen2VLVideoProcessor`` for videos (the realtime path sends frames as images)."""
    from transformers import Qwen2VLVideoProcessor

    image = {
        "auto_map": {
            "AutoProcessor": "processing_moss_vl.MossVLProcessor",
            "AutoImageProcessor": "processing_moss_vl.MossVLImageProcessorFast",
        },
        "size": {"longest_edge": 128 * 128, "shortest_edge": 64 * 64},
        "multi_image_max_pixels": 128 * 128 * 8,
        "patch_size": 16,
        "temporal_patch_size": 1,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "processor_class": "MossVLProcessor",
        "image_processor_type": "MossVLImageProcessorFast",
    }
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2))
    processor = {
        "auto_map": {"AutoProcessor": "processing_moss_vl.MossVLProcessor"},
        "processor_class": "MossVLProcessor",
    }
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2))
    Qwen2VLVideoProcessor(patch_size=16, temporal_patch_size=1, merge_size=2).save_pretrained(out)


def remote_code_files(folder: Path) -> dict[str, str]:
    """sha256 of each ``*.py`` (the remote code) in the checkpoint folder."""
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.py"))}


def _levels(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None}
    return {
        "n": len(values),
        "p50": round(float(np.percentile(values, 50)), 2),
        "p95": round(float(np.percentile(values, 95)), 2),
    }


def session_figures(db: Path, res: Any) -> dict[str, Any]:
    """Stage medians (NULL: hidden by the session), consume / output latency levels, the
    session counters of the summary and the verdict of a session run."""
    conn = sqlite3.connect(db)
    try:
        cols = (*MOSS_STAGES, *MOSS_LATENCIES)
        rows = conn.execute(
            f"SELECT {', '.join(cols)} FROM frames WHERE run_id = ?", (res.run_id,)
        ).fetchall()
    finally:
        conn.close()
    column = {c: [r[i] for r in rows if r[i] is not None] for i, c in enumerate(cols)}
    stages = {c: _levels(column[c]) for c in MOSS_STAGES}
    v = res.verdict
    sm = res.summary
    out = {
        "status": res.status,
        "reason": res.reason,
        "frames": len(rows),
        "stage_median_ms": stages,
        **{c: _levels(column[c]) for c in MOSS_LATENCIES},
        "session": {
            k: sm.get(k) for k in sorted(sm) if k.startswith(("session_", "silence", "pacing"))
        },
        "verdict": getattr(v, "status", None),
        "verdict_reason": getattr(v, "reason", None),
        "jitter": _criterion(v, "jitter"),
        "hints": list(getattr(v, "hints", []) or []),
    }
    _log(f"  {len(rows)} frames; stages (ms, soakd's hooks): {stages}")
    for c in MOSS_LATENCIES:
        _log(f"  {c}: {out[c]}")
    _log(f"  session: {out['session']}")
    _log(f"  verdict {out['verdict']}: {out['verdict_reason']}")
    return out


def _criterion(v: Any, name: str) -> dict[str, Any] | None:
    c = v.get(name) if v is not None else None
    return None if c is None else {"status": c.status, "value": c.value, "detail": c.detail}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrix-game", type=Path, help="a checkout of Matrix-Game-3.5")
    p.add_argument("--commit", help="the checkout's commit, when it is not a git work tree")
    p.add_argument("--checkpoint", type=Path, help="the distilled first-person checkpoint")
    p.add_argument("--wan-dir", type=Path, help="Wan2.2-TI2V-5B")
    p.add_argument("--tokenizer-dir", type=Path, help="the umt5-xxl tokenizer")
    p.add_argument("--da3-dir", type=Path, help="Depth-Anything-3")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="random weights of their own model classes, no downloads (CPU)",
    )
    p.add_argument(
        "--knob",
        nargs=2,
        action="append",
        metavar=("NAME", "VALUE"),
        help="an authors' knob for the soak, e.g. --knob num_blocks 1",
    )
    p.add_argument("--moss", type=Path, help="a folder with MOSS-VL-Realtime's remote code")
    p.add_argument("--moss-fps", type=float, default=2.0, help="frames a second (MOSS)")
    p.add_argument(
        "--moss-tiny",
        action="store_true",
        help="--moss PATH holds only their *_moss_vl.py: random weights from their config class",
    )
    p.add_argument(
        "--moss-set",
        nargs=2,
        action="append",
        metavar=("KEY", "VALUE"),
        help="a [workload] key for the MOSS soak (TOML value), e.g. --moss-set torch_threads 2",
    )
    p.add_argument(
        "--moss-venv",
        type=Path,
        default=REPO / ".venv-moss",
        help=f"the venv with transformers {MOSS_TRANSFORMERS} for --moss (built when missing)",
    )
    p.add_argument(
        "--moss-here",
        action="store_true",
        help="run --moss in this interpreter whatever its transformers",
    )
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument(
        "--min-frames",
        type=int,
        default=3,
        help="criteria.min_frames for the short soak (chunks; soakd's default is 10)",
    )
    p.add_argument("--fps", type=float, default=1.33, help="chunks a second (Matrix-Game)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.matrix_game is None and args.moss is None:
        p.error("give --matrix-game PATH and/or --moss PATH")
    doc: dict[str, Any] = {"schema": "soakd.upstream_check/1"}
    if args.matrix_game is not None:
        doc["matrix_game"] = matrix_game(args)
    if args.moss is not None:
        here = transformers_version() or ""
        if args.moss_here or here.startswith(MOSS_TRANSFORMERS + "."):
            doc["moss"] = moss(args)
        else:
            _log(f"transformers {here} here; the authors' remote code needs {MOSS_TRANSFORMERS}")
            doc["moss"] = moss_in_venv(args, argv)
    text = json.dumps(doc, indent=2, default=str)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0 if _passed(doc) else 1


def _passed(doc: dict[str, Any]) -> bool:
    mg = doc.get("matrix_game")
    if mg is not None:
        if mg["signatures"]["differs"] or mg.get("import") != "ok":
            return False
        if mg.get("setup") == "ok" and (mg.get("status") != "completed" or not mg["verdict"]):
            return False  # a short soak may well be INVALID (too short to judge): it ran
    ms = doc.get("moss")
    if ms is None:
        return True
    if ms.get("signatures", {}).get("differs", True) or ms.get("setup") != "ok":
        return False
    return ms.get("status") == "completed" and bool(ms["verdict"])


if __name__ == "__main__":
    raise SystemExit(main())
