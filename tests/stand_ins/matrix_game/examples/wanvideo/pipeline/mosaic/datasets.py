"""Stand-in of ``examples/wanvideo/pipeline/mosaic/datasets.py``: the one-sample dataset."""

from __future__ import annotations

import json
import os
import sqlite3

import numpy as np
import torch

RGB_PER_LATENT = 4


class _ValidationDataset(torch.utils.data.Dataset):
    """Mirrors the validation dataset (``__getitem__``, ``read_camera_params``)."""

    def __init__(self, args, scenes):
        self.args, self.scenes = args, scenes

    def __len__(self):
        return len(self.scenes)

    def _poses(self):
        scene = os.path.join(self.args.camera_params_path, self.scenes[0])
        extr = np.load(os.path.join(scene, "pose", "video.npz"))["data"]
        intr = np.load(os.path.join(scene, "intrinsics", "video.npz"))["data"]
        return scene, torch.as_tensor(extr), torch.as_tensor(intr)

    def _prompt(self):
        path = os.path.join(self.args.dataset_base_path, "caption", self.scenes[0], "video.json")
        with open(path, encoding="utf-8") as f:
            return json.load(f)["detailed"]["0"]["dynamic"]

    def __getitem__(self, idx):
        scene, extr, intr = self._poses()
        window = int(self.args.latent_window_size)
        return {
            "image": np.load(os.path.join(scene, "rgb", "anchor.npy")),
            "clean_latents": None,
            "needs_first_latent_materialization": True,
            "clean_latent_indices_start": torch.tensor([0]),
            "clean_latent_indices": torch.tensor([0]),
            "noisy_latent_indices": torch.arange(1, window + 1)[None],
            "clean_latent_indices_prope_intrinsic": intr[:1],
            "clean_latent_indices_prope_extrinsic": extr[:1],
            "info": {"generating_first_frame_idx": 0},
            "prompt": self._prompt(),
        }

    def read_camera_params(self, batch, info=None, lookup=None):
        """Mirrors ``read_camera_params``: the poses of one window's noisy latents (4 RGB
        poses each, starting after the anchor; clamped to the last pose)."""
        _, extr, intr = self._poses()
        first = int(batch["noisy_latent_indices"].reshape(-1)[0])
        n = int(batch["noisy_latent_indices"].numel()) * RGB_PER_LATENT
        idx = (1 + (first - 1) * RGB_PER_LATENT + torch.arange(n)).clamp(max=len(extr) - 1)
        return {
            "clean_latent_indices_prope_intrinsic": intr[:1],
            "clean_latent_indices_prope_extrinsic": extr[:1],
            "noisy_latent_indices_prope_intrinsic": intr[idx],
            "noisy_latent_indices_prope_extrinsic": extr[idx],
        }


def build_mosaic_validation_dataset(args, train_dataset, dataset_cls=None):
    """Mirrors ``build_mosaic_validation_dataset``: the scenes of the dataset index."""
    con = sqlite3.connect(args.dataset_index_path)
    scenes = [r[0] for r in con.execute("SELECT clean_name FROM records")]
    con.close()
    return _ValidationDataset(args, scenes)
