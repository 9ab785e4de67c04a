"""Matrix-Game-3.5's distilled causal rollout, driven chunk by chunk from the authors' code.

``kind = "matrix_game"`` takes a checkout of Riemann-Dynamics/Matrix-Game-3.5 (``repo``) and
the inputs their ``infer_distilled.py`` takes (YAML config, checkpoint, image, camera .npz,
prompt or caption), imports their pipeline from the checkout and runs their rollout loop as
a soakd ``RolloutWorkload``. Nothing of theirs is copied here: every step below calls the
named upstream function (paths relative to the checkout; ``mosaic`` =
``examples/wanvideo/pipeline/mosaic``).

setup(), in the order of their ``infer_distilled.main`` and
``tools/run_distilled_inference.main``:

1. ``distilled_config.load_inference_config`` reads the YAML; the knobs set in soakd
   (``schedule``, ``student_cfg_scale``, ``chunk_size``, ``latent_window_size``,
   ``context_chunks``, ``num_blocks``, ``memory_mode``, ``height``/``width``) replace its
   values and ``distilled_config.validate_inference_config`` checks the result;
2. ``infer.resolve_weight`` finds the Wan2.2, tokenizer and (online depth only)
   Depth-Anything-3 folders; ``infer_distilled._workspace_args`` +
   ``infer.build_input_workspace`` + ``infer.build_index`` turn the inputs into their
   one-scene workspace;
3. ``mosaic/causal_config.build_runtime_args`` makes their pipeline arguments,
   ``accelerate.Accelerator()`` the single-process accelerator,
   ``mosaic/datasets.build_mosaic_validation_dataset`` the input dataset and
   ``tools/run_distilled_inference.build_model`` the ``WanMosaicPipelineModule``;
4. as ``mosaic/causal_inference.run_distilled_inference`` does before its rollout: the
   memory-mode helpers it imports from ``causal_rollout``, ``_init_registration_estimator``
   (depth for the memory bank), the data row through ``accelerator.prepare(DataLoader)``,
   ``model._materialize_data`` and ``model._ensure_batched_latents`` (the C0 latents).

5. the hook check: ``model_fn_causal_kv`` and the boundary helper still take the keywords
   soakd reads (``READS``), then their rollout runs one chunk (``_FirstChunk``, not
   recorded) and every stage this configuration runs must have been timed, by the hook
   soakd expects (``expected_stages``); one that was not ends setup in one line (or, with
   ``allow_missing_stages``, is a ``setup_warnings`` line the driver stores as a
   ``missing_stage`` event).

rollout(run): one *episode* is one call of ``mosaic/causal_rollout._run_causal_kv_rollout``
(``num_blocks`` blocks of ``latent_window_size / chunk_size`` chunks, or blocks enough for
``episode_frames``; 0: for every chunk the soak can ask for) with a fresh memory bank
(``causal_inference._build_handler``); episodes follow each other until the run ends
(``episodes`` counts them).
That function is one monolithic loop, so at setup the module-level callables it looks up
in ``causal_rollout``'s namespace are wrapped with timing shims (restored at close), and
the memory bank's methods on the handler and context pool it is given:

* a chunk starts at ``_rolling_anchor_source_position(local_chunk_idx=i)`` (the first call
  of each iteration): for i > 0 it asks ``run.next_condition()`` (the episode's chunk 0 asks
  before the episode, so first output counts the episode's setup); ``None`` ends the
  rollout. The condition's ``index`` picks the chunk's poses from the camera file: chunk
  ``index mod chunks-per-episode``, poses ``[1 + 4·chunk_size·k ...]`` as their
  ``infer.py`` lays them out (checked against the loop's own chunk number). A call without
  ``local_chunk_idx`` of this chunk or the next, or a chunk whose denoise starts after the
  previous chunk's cache-fill without the boundary (their loop calls the helper by another
  name), is a one-line error naming the hook and the call soakd expected;
* ``context``: ``_build_initial_causal_kv_dynamic_context_pool`` and the pool's
  ``select_for_chunk``;
* ``kv_seed``: ``model_fn_causal_kv(write_cache=True)`` without a read chunk (the C0
  anchor and each chunk's dynamic-context KV);
* ``denoise``: ``model_fn_causal_kv(write_cache=False)`` (the CFG batch, once per step of
  ``schedule``) and ``_causal_dmd_validation_transition``;
* ``kv_write``: the cache-fill ``model_fn_causal_kv(write_cache=True,
  cache_read_chunk_id=i)`` at t=0 and ``_causal_kv_trim_rolling_window``;
* ``vae_decode``: ``_decode_generated_chunk_from_prefix_latents`` (a chunk's RGB frames;
  ``run.emit(n)`` follows it) and ``_decode_latents_to_numpy_frames`` (C0). A chunk their
  loop does not decode (``memory_mode = "empty"``, the episode's last chunk) is decoded
  by soakd with the same ``_decode_generated_chunk_from_prefix_latents`` when it ends, so
  every chunk emits its ``4·chunk_size`` frames;
* ``memory_bank``: ``_encode_frames_per_frame`` (VAE re-encode), the pool's
  ``add_generated_chunk`` and the handler's ``register_source_sequence`` (depth +
  registration), ``query_hits_mode_new``, ``fuse_candidates``, ``align_w2c_trajectory``.

A stage already open is not opened again by a nested call. tests/stand_ins/matrix_game is a
tiny checkout with the same module paths and signatures (CI); bench/upstream_check.py runs
this workload against a real checkout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Literal

import numpy as np

from soakd.workloads.base import RolloutRun, WorkloadContext, WorkloadError
from soakd.workloads.matrix_game_settings import MatrixGameWorkloadSettings

_MOSAIC = "examples.wanvideo.pipeline.mosaic"
#: the checkout's modules the workload imports, by their file in the checkout
MODULES: dict[str, str] = {
    "distilled_config": "distilled_config.py",
    "infer": "infer.py",
    "infer_distilled": "infer_distilled.py",
    "causal_config": "examples/wanvideo/pipeline/mosaic/causal_config.py",
    "datasets": "examples/wanvideo/pipeline/mosaic/datasets.py",
    "causal_inference": "examples/wanvideo/pipeline/mosaic/causal_inference.py",
    "causal_rollout": "examples/wanvideo/pipeline/mosaic/causal_rollout.py",
}
#: loaded from its file (tools/ is no package): build_model(args, accelerator)
RUNNER_FILE = "tools/run_distilled_inference.py"
#: top-level packages of a checkout (forgotten when another checkout was imported before)
TOP_LEVEL = ("distilled_config", "infer", "infer_distilled", "examples", "diffsynth", "frustum")
#: the knobs soakd sets on the authors' DistilledInferenceConfig
KNOBS: tuple[str, ...] = (
    "schedule",
    "student_cfg_scale",
    "chunk_size",
    "latent_window_size",
    "context_chunks",
    "num_blocks",
    "memory_mode",
    "height",
    "width",
)
#: causal_rollout's module-level callables wrapped with a stage (see the module docstring)
SHIMMED: dict[str, str] = {
    "_causal_dmd_validation_transition": "denoise",
    "_causal_kv_trim_rolling_window": "kv_write",
    "_decode_latents_to_numpy_frames": "vae_decode",
    "_encode_frames_per_frame": "memory_bank",
    "_build_initial_causal_kv_dynamic_context_pool": "context",
}
HANDLER_METHODS = (
    "register_source_sequence",
    "query_hits_mode_new",
    "fuse_candidates",
    "align_w2c_trajectory",
)
POOL_METHODS = {"select_for_chunk": "context", "add_generated_chunk": "memory_bank"}
RGB_PER_LATENT = 4  # Wan VAE: one latent frame = 4 RGB frames
CONTENT_FPS = 16.0  # their _write_video plays the result at 16 fps
#: the keywords soakd reads from the calls it wraps (the stage of a model_fn_causal_kv
#: call, the chunk of a boundary); a callee without one of them is a changed release
READS: dict[str, tuple[str, ...]] = {
    "model_fn_causal_kv": ("latents_chunk", "write_cache", "cache_read_chunk_id"),
    "_rolling_anchor_source_position": ("local_chunk_idx",),
}
#: how soakd tells the DiT's stages apart: the model_fn_causal_kv call each one makes
DIT_CALLS = {
    "kv_seed": "model_fn_causal_kv(write_cache=True) without cache_read_chunk_id",
    "denoise": "model_fn_causal_kv(write_cache=False)",
    "kv_write": "model_fn_causal_kv(write_cache=True, cache_read_chunk_id=i)",
}
BOUNDARY = "_rolling_anchor_source_position"
BOUNDARY_CALL = (
    "_rolling_anchor_source_position(local_chunk_idx=i, ...) once at the start of chunk i"
)


def _line(exc: BaseException | object) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line.removeprefix("ERROR: ")


class _RolloutEnded(BaseException):
    """Raised from the chunk-boundary shim when the run ends: unwinds their loop (a
    BaseException, so no ``except Exception`` of theirs takes it)."""


class _HookChanged(BaseException):
    """A hook was called as soakd does not expect (a changed release): unwinds their loop
    and becomes a one-line WorkloadError naming the hook."""


# --------------------------------------------------------------------------------------
# the checkout


def _under(mod: ModuleType, root: Path) -> bool:
    f = getattr(mod, "__file__", None)
    paths = [f] if f else list(getattr(mod, "__path__", []) or [])
    return any(Path(p).resolve().is_relative_to(root) for p in paths)


def _forget_other_checkout(root: Path) -> None:
    """Drop a checkout's modules imported from elsewhere (another checkout, a stand-in)."""
    for name in list(sys.modules):
        top = name.partition(".")[0]
        if top in TOP_LEVEL and not _under(sys.modules[name], root):
            del sys.modules[name]


def check_camera(path: Path) -> None:
    """A camera track soakd can read: an .npz archive of plain arrays (no pickled objects)
    with extrinsics (``extrinsics_c2w`` or ``extrinsics``) and ``intrinsics``, else a
    one-line WorkloadError (never numpy's own text)."""
    bad = f"workload.camera: {path} is not a camera track soakd can read"
    want = "an .npz archive of arrays: extrinsics_c2w (N,4,4) and intrinsics"
    try:
        z = np.load(path, allow_pickle=False)
    except Exception:
        raise WorkloadError(f"{bad} ({want})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise WorkloadError(f"{bad} (a single array; {want})")
    with z:
        keys = ("extrinsics_c2w" if "extrinsics_c2w" in z else "extrinsics", "intrinsics")
        for key in keys:
            if key not in z:
                raise WorkloadError(f"{bad} (no {key!r}; {want})")
            try:
                z[key]
            except Exception:
                raise WorkloadError(f"{bad} ({key!r} is damaged; {want})") from None


def check_layout(repo: Path) -> None:
    """A checkout has every file the workload imports, else a one-line WorkloadError."""
    for rel in (*MODULES.values(), RUNNER_FILE):
        if not (repo / rel).is_file():
            raise WorkloadError(
                f"workload.repo: {repo} is not a Matrix-Game-3.5 checkout (no {rel})"
            )


def import_checkout(repo: Path) -> dict[str, ModuleType]:
    """The checkout's modules (MODULES and the runner), imported from ``repo``; a missing
    module or dependency is a one-line WorkloadError."""
    root = repo.resolve()
    check_layout(root)
    _forget_other_checkout(root)
    if str(root) not in sys.path:  # stays while the workload runs (their lazy imports)
        sys.path.insert(0, str(root))
    out: dict[str, ModuleType] = {}
    for key, rel in MODULES.items():
        name = rel.removesuffix(".py").replace("/", ".")
        out[key] = _import(root, name, functools.partial(importlib.import_module, name))
    out["runner"] = _import(root, RUNNER_FILE, functools.partial(_load_file, root / RUNNER_FILE))
    return out


def _load_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_soakd_mg_run_distilled_inference", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _import(root: Path, what: str, load: Callable[[], ModuleType]) -> ModuleType:
    try:
        return load()
    except ModuleNotFoundError as exc:
        missing = (exc.name or _line(exc)).partition(".")[0]
        if missing in TOP_LEVEL:
            raise WorkloadError(
                f"workload.repo: {root} cannot import {exc.name!r} ({what}): not the "
                "Matrix-Game-3.5 layout this workload knows"
            ) from None
        raise WorkloadError(
            f"their {what} needs the package {missing!r}, which is not installed "
            f"(pip install -r {root}/requirements.txt)"
        ) from None
    except SystemExit as exc:
        raise WorkloadError(f"importing {what} exited: {_line(exc.code)}") from None
    except Exception as exc:
        raise WorkloadError(f"importing {what} failed: {type(exc).__name__}: {_line(exc)}") from exc


def upstream_commit(repo: Path) -> str | None:
    """The checkout's commit (``git rev-parse HEAD``), or None when ``repo`` is not the top of
    a git work tree (an extracted archive, a folder inside another repository)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    if out.returncode or len(lines) != 2 or Path(lines[0]).resolve() != repo.resolve():
        return None
    return lines[1]


# --------------------------------------------------------------------------------------
# timing shims


class Shims:
    """The stage timing around causal_rollout's callables, and the chunk bookkeeping:
    which chunk is current, whether it emitted, the latents soakd decodes when it did not.
    ``absent``: the methods soakd wraps that an object no longer has (a renamed method:
    its stage is not timed)."""

    def __init__(self, cr: ModuleType) -> None:
        self.cr = cr
        self.saved: dict[str, Any] = {}
        self.run: RolloutRun | None = None
        self.open: str | None = None  # the stage being timed (nested calls are inside it)
        self.out: dict[str, Any] = {}  # pipe, device, tiled, chunk_size, total_chunks
        self.chunk = 0  # the episode's current chunk
        self.emitted = False
        self.written = False  # the current chunk's cache-fill ran (its denoise is over)
        self.latents: Any = None  # the current chunk's final latents (the cache-fill input)
        self.anchor: Any = None  # the latent frame before the current chunk
        self.absent: dict[str, list[str]] = {}  # stage -> "Class.method" soakd found missing
        self.dit: set[str] = set()  # the stages model_fn_causal_kv calls were classified as

    # --- install / restore
    def install(self) -> None:
        wrappers: dict[str, Callable[..., Any]] = {
            "model_fn_causal_kv": self._model_fn,
            BOUNDARY: self._boundary,
            "_decode_generated_chunk_from_prefix_latents": self._decode_chunk,
        }
        for name, stage in SHIMMED.items():
            wrappers[name] = functools.partial(self._timed_call, stage, name)
        missing = [n for n in (*wrappers, "_run_causal_kv_rollout") if not hasattr(self.cr, n)]
        if missing:
            raise WorkloadError(
                f"{MODULES['causal_rollout']} has no {', '.join(missing)}: a "
                "Matrix-Game release this workload does not know"
            )
        for name, keywords in READS.items():
            _check_keywords(name, getattr(self.cr, name), keywords)
        for name, wrapper in wrappers.items():
            self.saved[name] = getattr(self.cr, name)
            setattr(self.cr, name, wrapper)

    def restore(self) -> None:
        for name, fn in self.saved.items():
            setattr(self.cr, name, fn)
        self.saved.clear()

    # --- timing
    def timed(self, stage: str, fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        run = self.run
        if run is None or self.open is not None:
            return fn(*a, **kw)
        self.open = stage
        try:
            with run.stage(stage):
                return fn(*a, **kw)
        finally:
            self.open = None

    def _timed_call(self, stage: str, name: str, *a: Any, **kw: Any) -> Any:
        result = self.timed(stage, self.saved[name], *a, **kw)
        if name == "_build_initial_causal_kv_dynamic_context_pool" and result[0] is not None:
            self.wrap_methods(result[0], POOL_METHODS)
        return result

    def wrap_methods(self, obj: Any, stages: dict[str, str]) -> None:
        """Time these methods of one object (the memory bank handler, the context pool); a
        method it does not have is noted in ``absent`` under its stage."""
        for method, stage in stages.items():
            fn = getattr(obj, method, None)
            if fn is None:
                where = f"{type(obj).__name__}.{method}"
                if where not in self.absent.setdefault(stage, []):
                    self.absent[stage].append(where)
                continue
            setattr(obj, method, functools.partial(self.timed, stage, fn))

    def _model_fn(self, *a: Any, **kw: Any) -> Any:
        if not kw.get("write_cache", False):
            stage = "denoise"
            if self.written and self.run is not None:
                raise _HookChanged(
                    f"chunk {self.chunk + 1} of the episode began without the chunk-boundary "
                    f"hook: soakd expected {BOUNDARY_CALL} (their loop no longer calls it "
                    "by that name, or skips it)"
                )
        elif kw.get("cache_read_chunk_id") is not None:
            stage = "kv_write"
            self.latents = kw.get("latents_chunk")
            self.written = True
        else:
            stage = "kv_seed"
        self.dit.add(stage)
        return self.timed(stage, self.saved["model_fn_causal_kv"], *a, **kw)

    def _decode_chunk(self, *a: Any, **kw: Any) -> Any:
        frames = self.timed("vae_decode", self.saved[_DECODE], *a, **kw)
        if self.run is not None and len(frames):
            self.run.emit(len(frames))
            self.emitted = True
        return frames

    # --- chunks
    def begin_episode(self, run: RolloutRun, index: int, c0: Any) -> None:
        if index % self.out["total_chunks"] != 0:
            raise _HookChanged(
                f"condition {index} starts an episode of {self.out['total_chunks']} chunks "
                f"after one that ended in chunk {self.chunk}: soakd expected {BOUNDARY_CALL}"
            )
        self.run, self.chunk, self.emitted, self.latents, self.anchor = run, 0, False, None, c0
        self.written = False

    def _boundary(self, *a: Any, **kw: Any) -> Any:
        value = self.saved[BOUNDARY](*a, **kw)
        run = self.run
        if run is None:
            return value
        i = kw.get("local_chunk_idx", a[0] if a else None)
        if not isinstance(i, int) or i not in (self.chunk, self.chunk + 1):
            raise _HookChanged(
                f"their loop called {BOUNDARY}({_call_words(a, kw)}) in chunk {self.chunk} "
                f"of the episode: soakd expected {BOUNDARY_CALL}"
            )
        if i == self.chunk:  # the chunk's own call (or a repeat of it)
            return value
        self.finish_chunk()
        cond = run.next_condition()
        if cond is None:
            raise _RolloutEnded
        self.chunk, self.emitted, self.latents, self.written = i, False, None, False
        if cond.index % self.out["total_chunks"] != i:
            raise _HookChanged(
                f"condition {cond.index} arrived for chunk {i} of an episode of "
                f"{self.out['total_chunks']} chunks: soakd expected {BOUNDARY_CALL}"
            )
        return value

    def finish_chunk(self) -> None:
        """End the current chunk: decode and emit its frames if their loop did not."""
        if self.latents is None or self.run is None:
            return
        import torch

        latents = self.latents.detach().cpu()
        if not self.emitted:
            o = self.out
            prefix = torch.cat([self.anchor.to(dtype=latents.dtype), latents], dim=2)
            frames = self.timed(
                "vae_decode",
                self.saved[_DECODE],
                o["pipe"],
                prefix,
                noisy_start=0,
                noisy_count=int(latents.shape[2]),
                device=o["device"],
                tiled=o["tiled"],
                context="soakd output decode",
            )
            self.run.emit(len(frames))
            self.emitted = True
        self.anchor = latents[:, :, -1:]
        self.latents = None


def _check_keywords(name: str, fn: Callable[..., Any], keywords: tuple[str, ...]) -> None:
    """``fn`` takes each of ``keywords`` (what soakd reads from its calls), else a one-line
    WorkloadError naming the hook and the signature soakd expected."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    lost = [k for k in keywords if k not in params]
    if lost:
        what = "the chunks apart" if name == BOUNDARY else "kv_seed, denoise and kv_write apart"
        raise WorkloadError(
            f"their {name}({', '.join(params)}) has no keyword {', '.join(lost)}: soakd "
            f"expected {name}(..., {', '.join(f'{k}=...' for k in keywords)}), which it reads "
            f"to tell {what} (a Matrix-Game release this workload does not know)"
        )


def _call_words(a: tuple[Any, ...], kw: dict[str, Any]) -> str:
    """How a hook was called: positional values' types, keyword names."""
    return ", ".join([type(v).__name__ for v in a] + [f"{k}=..." for k in kw])


_DECODE = "_decode_generated_chunk_from_prefix_latents"


# --------------------------------------------------------------------------------------
# the workload


class MatrixGameWorkload:
    """Their pipeline, loaded once; their rollout, one episode after another."""

    shape: Literal["rollout"] = "rollout"

    def __init__(self, settings: MatrixGameWorkloadSettings, ctx: WorkloadContext) -> None:
        self.s = settings
        self.ctx = ctx
        self.repo = Path(settings.repo).expanduser()
        self.config_path = (
            Path(settings.config).expanduser()
            if settings.config
            else self.repo / "configs" / "infer_distilled.yaml"
        )
        self._check_paths()
        self.response_timeout_s = settings.response_timeout_s
        self.mods: dict[str, ModuleType] = {}
        self.shims: Shims | None = None
        self.cfg: Any = None
        self.args: Any = None
        self.p: SimpleNamespace | None = None  # what every episode is called with
        self._tmp: Path | None = None
        self._torch: Any = None
        self.episodes = 0  # episodes begun in the soak (the run is cut into this many)
        self.setup_warnings: list[str] = []  # stages allowed missing: missing_stage events

    def _check_paths(self) -> None:
        s = self.s
        if (s.prompt is None) == (s.caption is None):
            raise WorkloadError("workload: give exactly one of prompt or caption")
        if s.num_blocks is not None and s.episode_frames is not None:
            raise WorkloadError("workload: give at most one of num_blocks or episode_frames")
        if not s.repo.strip():
            raise WorkloadError(
                "workload.repo is empty: name a checkout of Matrix-Game-3.5 (an empty path "
                "would be the current directory)"
            )
        if not self.repo.is_dir():
            raise WorkloadError(f"workload.repo: {self.repo} is not a directory")
        check_layout(self.repo)
        files: dict[str, str | Path | None] = {"config": self.config_path, "image": s.image}
        files |= {"checkpoint": s.checkpoint, "camera": s.camera, "caption": s.caption}
        for key, path in files.items():
            if path is not None and not Path(path).expanduser().is_file():
                raise WorkloadError(f"workload.{key}: {path} does not exist")
        check_camera(Path(s.camera).expanduser())

    # --- setup
    def setup(self) -> None:
        try:
            self._setup()
        except BaseException as exc:
            self.close()  # the shims come off, the temporary workspace goes
            if isinstance(exc, ModuleNotFoundError):  # imported lazily by their code
                raise WorkloadError(
                    f"their code needs the package {exc.name!r}, which is not installed "
                    f"(pip install -r {self.repo}/requirements.txt)"
                ) from None
            raise

    def _setup(self) -> None:
        self.ctx.phase("importing Matrix-Game")
        self.mods = import_checkout(self.repo)
        try:
            import accelerate
            import torch
        except ModuleNotFoundError as exc:
            raise WorkloadError(
                f"their pipeline needs the package {exc.name!r}, which is not "
                f"installed (pip install -r {self.repo}/requirements.txt)"
            ) from None
        self._torch = torch
        cr = self.mods["causal_rollout"]
        self.cfg = self._authors_config()
        self.shims = Shims(cr)
        self.shims.install()
        self.ctx.phase("building the Matrix-Game input workspace")
        self.args = self._runtime_args()
        self.ctx.phase("loading the Matrix-Game pipeline")
        self.ctx.extend_timeout(600.0)
        accelerator = accelerate.Accelerator()
        torch.manual_seed(self.cfg.seed)
        dataset = self.mods["datasets"].build_mosaic_validation_dataset(
            self.args, train_dataset=None
        )
        if len(dataset) != 1:
            raise WorkloadError(f"the input index holds {len(dataset)} samples, not 1")
        model = self.mods["runner"].build_model(self.args, accelerator)
        model.eval()
        self.p = self._prepare(accelerator, dataset, model)
        self.shims.out = {
            "pipe": self.p.model.pipe,
            "device": self.p.model.pipe.device,
            "tiled": self.p.tiled,
            "total_chunks": self.p.total_chunks,
        }
        self.ctx.phase("checking the timing hooks on a first chunk")
        self._check_first_chunk()

    # --- the first chunk: every expected stage timed
    def _check_first_chunk(self) -> None:
        """Run their rollout for one chunk (not recorded) and check that each stage this
        configuration runs was timed: a hook that no longer attaches (a renamed method or
        keyword, a helper called through another name) is one line naming the stage (exit
        2), or with ``allow_missing_stages`` a warning and a ``missing_stage`` event."""
        p, shims = self.p, self.shims
        assert p is not None and shims is not None
        first = _FirstChunk()
        shims.begin_episode(first, 0, p.history[:, :, -1:])
        try:
            self._episode()
        except _RolloutEnded:
            pass
        except _HookChanged as exc:
            raise WorkloadError(str(exc)) from None
        finally:
            shims.run = None
        lost = self._missing_stages(first.stages)
        if lost and not self.s.allow_missing_stages:
            raise WorkloadError(
                f"{'; '.join(lost)} (workload.allow_missing_stages = true runs without them)"
            )
        for line in lost:
            self.setup_warnings.append(line)
            if self.ctx.log is not None:
                self.ctx.log.warning("missing_stage", message=line)

    def expected_stages(self) -> list[str]:
        """The stages this configuration's first chunk runs: the DiT's three, the decode
        (theirs or soakd's), the dynamic context when their helper says it is on, the
        memory bank when the mode keeps one."""
        p, cr = self.p, self.mods["causal_rollout"]
        assert p is not None
        out = ["kv_seed", "denoise", "kv_write", "vae_decode"]
        enabled = getattr(cr, "_validation_dynamic_context_enabled_for_mode", None)
        if enabled is not None and p.use_mosaic and enabled(self.args, p.mode, t2v_no_ref=False):
            out.append("context")
        if p.needs_pool:
            out.append("memory_bank")
        return out

    def _missing_stages(self, timed: set[str]) -> list[str]:
        """One phrase per expected stage never timed, or whose wrapped method is gone."""
        shims = self.shims
        assert shims is not None
        out = []
        for stage in self.expected_stages():
            gone = shims.absent.get(stage, [])
            unseen = stage in DIT_CALLS and stage not in shims.dit
            if stage in timed and not gone and not unseen:
                continue
            why = f"no {', '.join(gone)}" if gone else "no hook of it ran"
            if unseen:
                why = f"no call {DIT_CALLS[stage]}"
            out.append(
                f"stage {stage} was expected and never timed in the first episode ({why}: "
                "a hook that no longer attaches)"
            )
        return out

    def _authors_config(self) -> Any:
        dc = self.mods["distilled_config"]
        try:
            cfg = dc.load_inference_config(self.config_path)
        except (OSError, ValueError, TypeError) as exc:
            raise WorkloadError(f"workload.config: {self.config_path}: {_line(exc)}") from None
        knobs = {k: getattr(self.s, k) for k in KNOBS if getattr(self.s, k) is not None}
        if "memory_mode" in knobs:
            try:
                self.mods["causal_rollout"]._normalize_causal_validation_memory_mode(
                    knobs["memory_mode"]
                )
            except ValueError as exc:
                raise WorkloadError(f"workload.memory_mode: {_line(exc)}") from None
        try:
            cfg = dataclasses.replace(cfg, **knobs)
            if self.s.episode_frames is not None:
                knobs["episode_frames"] = self.s.episode_frames
                cfg = dataclasses.replace(cfg, num_blocks=self._episode_blocks(cfg))
            dc.validate_inference_config(cfg)
        except (TypeError, ValueError) as exc:
            raise WorkloadError(f"workload ({', '.join(knobs)}): {_line(exc)}") from None
        return cfg

    def _episode_blocks(self, cfg: Any) -> int:
        """``episode_frames`` in blocks (rounded up); 0: enough for every chunk the soak
        can ask for (run.duration x run.fps, and one spare), so one episode runs it all."""
        window, cs = int(cfg.latent_window_size), int(cfg.chunk_size)
        frames = self.s.episode_frames or 0
        if frames > 0:
            return max(1, math.ceil(frames / (window * RGB_PER_LATENT)))
        chunks = math.ceil(self.ctx.duration_s * self.ctx.fps) + 1
        return max(1, math.ceil(chunks / max(1, window // cs)))

    def _weight(self, key: str, given: str | None) -> str:
        try:
            return str(self.mods["infer"].resolve_weight(key, given or ""))
        except SystemExit as exc:
            raise WorkloadError(f"workload.{key}_dir: {_line(exc.code)}") from None

    def _runtime_args(self) -> Any:
        """Their workspace, index and pipeline arguments, as infer_distilled.main builds them."""
        s, m, cfg, cr = self.s, self.mods, self.cfg, self.mods["causal_rollout"]
        os.environ.setdefault("DIFFSYNTH_SKIP_DOWNLOAD", "true")
        os.environ.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")
        mode = cr._normalize_causal_validation_memory_mode(cfg.memory_mode)
        if cr._validation_memory_mode_uses_online_depth(mode):
            os.environ["DA3_MODEL_PATH"] = self._weight("da3", s.da3_dir)
        wan, tok = self._weight("wan", s.wan_dir), self._weight("tokenizer", s.tokenizer_dir)
        if s.workdir:
            root = Path(s.workdir).expanduser()
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = self._tmp = Path(tempfile.mkdtemp(prefix="soakd-matrix-game-"))
        inputs = SimpleNamespace(
            image=Path(s.image),
            camera=Path(s.camera),
            caption=Path(s.caption) if s.caption else None,
            prompt=s.prompt or "",
            prompt_file=None,
            camera_convention=s.camera_convention,
        )
        env = os.environ.copy()
        env["PYTHONPATH"] = str(self.repo.resolve()) + os.pathsep + env.get("PYTHONPATH", "")
        try:
            ws_args = m["infer_distilled"]._workspace_args(inputs, cfg.num_blocks)
            workspace = Path(m["infer"].build_input_workspace(ws_args, str(root)))
            index = Path(m["infer"].build_index(str(workspace), sys.executable, env))
        except SystemExit as exc:
            raise WorkloadError(f"their input check: {_line(exc.code)}") from None
        except subprocess.CalledProcessError as exc:
            raise WorkloadError(f"their index scanner failed: {_line(exc)}") from None
        args = m["causal_config"].build_runtime_args(
            cfg,
            checkpoint=Path(s.checkpoint),
            dataset_index=index,
            workspace=workspace,
            wan_dir=Path(wan),
            tokenizer_dir=Path(tok),
            memory_cache_dir=root / "memory_latents",
        )
        args.dataset_pass_id = 0
        args.start_epoch = 0
        args.start_global_step = 0
        return args

    def _prepare(self, accelerator: Any, dataset: Any, model: Any) -> SimpleNamespace:
        """What causal_inference.run_distilled_inference computes before its rollout."""
        torch, ci, args = self._torch, self.mods["causal_inference"], self.args
        m = accelerator.unwrap_model(model)
        m.eval()
        mode = ci._normalize_causal_validation_memory_mode(args.causal_validation_memory_mode)
        use_mosaic = bool(m.enable_mosaic and not m.only_prope)
        needs_pool = use_mosaic and ci._validation_memory_mode_uses_runtime_pool(mode)
        needs_depth = needs_pool and ci._validation_memory_mode_uses_online_depth(mode)
        estimator = None
        if needs_depth:
            device = ci._rank_local_cuda_device() or m.pipe.device
            estimator = ci._init_registration_estimator(args, device=device)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=1, shuffle=False, collate_fn=_first_row, num_workers=0
        )
        with torch.no_grad():
            data = next(iter(accelerator.prepare(loader)))
            if data.get("needs_vae_materialization") or data.get(
                "needs_first_latent_materialization"
            ):
                data = m._materialize_data(data)
            history = m._ensure_batched_latents(data["clean_latents"]).detach().cpu()
        window = int(data["noisy_latent_indices"].shape[-1])
        lat_h, lat_w = (int(v) for v in history.shape[-2:])
        cs = int(getattr(args, "causal_chunk_size", self.cfg.chunk_size))
        return SimpleNamespace(
            accelerator=accelerator,
            dataset=dataset,
            model=m,
            data=data,
            history=history,
            window=window,
            lat_h=lat_h,
            lat_w=lat_w,
            tiled=bool(getattr(m, "vae_decode_tiled", False)),
            use_mosaic=use_mosaic,
            needs_pool=needs_pool,
            estimator=estimator,
            mode=mode,
            blocks=int(args.num_validation_blocks),
            chunk_size=cs,
            total_chunks=int(args.num_validation_blocks) * (window // cs),
        )

    # --- the hot path
    def rollout(self, run: RolloutRun) -> None:
        if self.p is None or self.shims is None:
            raise RuntimeError("MatrixGameWorkload.rollout called before setup()")
        try:
            while (cond := run.next_condition()) is not None:
                self.shims.begin_episode(run, cond.index, self.p.history[:, :, -1:])
                self.episodes += 1
                self._episode()
                self.shims.finish_chunk()
        except _RolloutEnded:
            return
        except _HookChanged as exc:
            raise WorkloadError(str(exc)) from None
        finally:
            self.shims.run = None

    def _episode(self) -> None:
        """One call of their _run_causal_kv_rollout, with a fresh memory bank."""
        p, ci, shims = self.p, self.mods["causal_inference"], self.shims
        assert p is not None and shims is not None
        handler = None
        if p.needs_pool:
            handler = ci._build_handler(
                p.data,
                self.args,
                height=p.lat_h * 16,
                width=p.lat_w * 16,
                latent_h=p.lat_h,
                latent_w=p.lat_w,
                estimator=p.estimator,
            )
            shims.wrap_methods(handler, dict.fromkeys(HANDLER_METHODS, "memory_bank"))
        with self._torch.no_grad():
            self.mods["causal_rollout"]._run_causal_kv_rollout(
                p.model,
                self.args,
                p.data,
                p.dataset,
                handler,
                p.history,
                p.lat_h,
                p.lat_w,
                p.lat_h * 16,
                p.lat_w * 16,
                p.tiled,
                p.blocks,
                p.window,
                p.use_mosaic,
                0,
                accelerator=p.accelerator,
            )

    def sync(self) -> None:
        torch = self._torch
        if torch is not None and self.s.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.synchronize()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": "matrix_game",
            "repo": str(self.repo),
            "upstream_commit": upstream_commit(self.repo),
            "config_file": str(self.config_path),
            "checkpoint": self.s.checkpoint,
            "camera": self.s.camera,
            "device": self.s.device,
            "content_fps": CONTENT_FPS,
            "stages": ["context", "kv_seed", "denoise", "kv_write", "vae_decode", "memory_bank"],
        }
        if self.cfg is not None:
            out["config"] = self.mods["distilled_config"].config_as_dict(self.cfg)
        if self.p is not None:
            out |= {
                "memory_mode": self.p.mode,
                "use_mosaic": self.p.use_mosaic,
                "chunks_per_episode": self.p.total_chunks,
                "blocks_per_episode": self.p.blocks,
                "episode_frames": self.p.total_chunks * self.p.chunk_size * RGB_PER_LATENT,
                "frames_per_chunk": self.p.chunk_size * RGB_PER_LATENT,
                "latent_grid": [self.p.lat_h, self.p.lat_w],
                "poses": "camera file chunk = condition index mod chunks_per_episode",
            }
        return out

    def close(self) -> None:
        if self.shims is not None:
            self.shims.restore()
            self.shims = None
        self.p = None
        torch = self._torch
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        with contextlib.suppress(ValueError):
            sys.path.remove(str(self.repo.resolve()))


class _FirstChunk:
    """The RolloutRun of the check at setup: chunk 0 only (its condition is handed before
    the episode, the next one is refused); records which stages were timed."""

    def __init__(self) -> None:
        self.stages: set[str] = set()

    def next_condition(self) -> None:
        return None

    @contextlib.contextmanager
    def stage(self, name: str) -> Any:
        self.stages.add(name)
        yield

    def emit(self, n: int) -> None:
        pass


def _first_row(rows: list[Any]) -> Any:
    return rows[0]


def build(settings: MatrixGameWorkloadSettings, ctx: WorkloadContext) -> MatrixGameWorkload:
    return MatrixGameWorkload(settings, ctx)
