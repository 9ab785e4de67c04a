"""Stand-in of ``tools/run_distilled_inference.py``: builds the pipeline module."""

from __future__ import annotations

import sys
from pathlib import Path

import accelerate  # noqa: F401  (upstream imports it at the top)

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples.wanvideo.pipeline.mosaic.pipeline_module import (  # noqa: E402
    WanMosaicPipelineModule,
)


def build_model(args, accelerator):
    """Mirrors ``build_model``: the WanMosaicPipelineModule with inference settings."""
    return WanMosaicPipelineModule(
        device=accelerator.device,
        enable_mosaic=args.enable_mosaic,
        vae_decode_tiled=args.vae_decode_tiled,
    )
