"""Stand-in of ``infer_distilled.py`` (Matrix-Game-3.5): the public distilled entry point."""

from __future__ import annotations

from types import SimpleNamespace

import infer as base_infer  # noqa: F401  (imported as upstream does)
from distilled_config import load_inference_config  # noqa: F401


def _workspace_args(args, num_blocks):
    """Mirrors ``infer_distilled._workspace_args``."""
    return SimpleNamespace(
        person="first",
        image=str(args.image),
        camera=str(args.camera),
        caption=str(args.caption or ""),
        prompt=args.prompt,
        prompt_file=str(args.prompt_file or ""),
        refs="",
        num_blocks=num_blocks,
        camera_convention=args.camera_convention,
    )
