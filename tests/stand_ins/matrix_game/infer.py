"""Stand-in of ``infer.py`` (Matrix-Game-3.5): weight lookup and the input workspace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np

REPO_DIR = os.path.dirname(os.path.abspath(__file__))
CKPT_DIR = os.path.join(REPO_DIR, "checkpoints")
MIN_POSES = 86
WEIGHTS = {
    "wan": ("WAN22_TI2V_5B_DIR", ["Wan2.2-TI2V-5B"], "Wan2.2-TI2V-5B base model directory"),
    "tokenizer": ("UMT5_TOKENIZER_DIR", ["umt5-xxl"], "umt5-xxl tokenizer directory"),
    "da3": ("DA3_MODEL_PATH", ["DA3NESTED-GIANT-LARGE-1.1"], "Depth-Anything-3 model directory"),
}


def resolve_weight(key, cli_value):
    """Mirrors ``infer.resolve_weight``: CLI value > env var > checkpoints/; sys.exit if none."""
    env_var, names, desc = WEIGHTS[key]
    candidates = ([cli_value] if cli_value else []) + (
        [os.environ[env_var]] if os.environ.get(env_var) else []
    )
    candidates += [os.path.join(CKPT_DIR, n) for n in names]
    for path in candidates:
        if os.path.exists(path):
            return os.path.abspath(path)
    sys.exit(f"ERROR: {desc} not found (tried: {', '.join(candidates)})")


def load_camera(path, convention):
    """Mirrors ``infer.load_camera``: (N,4,4) extrinsics and (N,4) intrinsics."""
    z = np.load(path)
    extr = np.asarray(z["extrinsics_c2w"] if "extrinsics_c2w" in z else z["extrinsics"], np.float32)
    if convention == "w2c":
        extr = np.linalg.inv(extr).astype(np.float32)
    intr = np.asarray(z["intrinsics"], np.float32)
    if intr.ndim == 1:
        intr = np.tile(intr[None], (extr.shape[0], 1))
    return extr, intr[: extr.shape[0]]


def build_input_workspace(args, tmp_root):
    """Mirrors ``infer.build_input_workspace``: inputs -> the one-scene workspace layout."""
    import cv2

    ws = os.path.join(tmp_root, "workspace")
    scene = os.path.join(ws, "scenes", "case")
    for sub in ("rgb", "pose", "intrinsics"):
        os.makedirs(os.path.join(scene, sub), exist_ok=True)
    frame = cv2.imread(args.image, cv2.IMREAD_COLOR)
    if frame is None:
        sys.exit(f"ERROR: cannot read image {args.image}")
    np.save(os.path.join(scene, "rgb", "anchor.npy"), frame[:, :, ::-1].copy())
    extr, intr = load_camera(args.camera, args.camera_convention)
    pad = max(0, MIN_POSES - extr.shape[0])
    extr = np.concatenate([extr, np.repeat(extr[-1:], pad, 0)])
    intr = np.concatenate([intr, np.repeat(intr[-1:], pad, 0)])
    np.savez_compressed(os.path.join(scene, "pose", "video.npz"), data=extr)
    np.savez_compressed(os.path.join(scene, "intrinsics", "video.npz"), data=intr)
    cap = os.path.join(ws, "caption", "case")
    os.makedirs(cap, exist_ok=True)
    if args.caption:
        shutil.copyfile(args.caption, os.path.join(cap, "video.json"))
    else:
        with open(os.path.join(cap, "video.json"), "w", encoding="utf-8") as f:
            json.dump({"detailed": {"0": {"start": "", "dynamic": args.prompt}}}, f)
    return ws


def build_index(ws, python_bin, env):
    """Mirrors ``infer.build_index``: runs their index scanner as a subprocess."""
    import sqlite3

    index_path = os.path.join(ws, "index.sqlite")
    cmd = [
        python_bin,
        "-m",
        "diffsynth.core.data.build_da3_video_index",
        "--camera_params_path",
        os.path.join(ws, "scenes"),
        "--output_path",
        index_path,
    ]
    subprocess.run(cmd, cwd=REPO_DIR, env=env, check=True, stdout=subprocess.DEVNULL)
    con = sqlite3.connect(index_path)
    rows = con.execute("SELECT clean_name, scan_error FROM records").fetchall()
    con.close()
    if not rows or any(e for _, e in rows):
        sys.exit(f"ERROR: input scene was rejected by the index scanner: {rows}")
    return index_path
