"""Build a workload from its validated settings.

Built-in kinds map to a ``build(settings, ctx)`` function in their own module, imported only
when used (so a synthetic run never imports torch). Other packages register workloads in
the ``soakd.workloads`` entry-point group: ``name = "package.module:factory"``; the factory
is called as ``factory(options: dict, ctx: WorkloadContext)``.
"""

from __future__ import annotations

import importlib
from typing import Any

from soakd.config import entry_point_names
from soakd.workloads.base import Workload, WorkloadContext, WorkloadError

__all__ = ["BUILDERS", "build_workload", "entry_point_names", "resolve"]

BUILDERS: dict[str, str] = {
    "synthetic": "soakd.workloads.synthetic:build",
    "tiny-vlm": "soakd.workloads.hf:build_tiny",
    "hf": "soakd.workloads.hf:build_hf",
    "session": "soakd.workloads.session:build",
    "generator": "soakd.workloads.generator:build",
    "av": "soakd.workloads.av:build",
    "matrix_game": "soakd.workloads.matrix_game:build",
    "openai": "soakd.workloads.openai:build",
    "realtime": "soakd.workloads.realtime:build",
    "python": "soakd.workloads.plugin:build_python",
}


def resolve(ref: str) -> Any:
    """Import ``package.module:attr`` (attr may be dotted) or raise WorkloadError."""
    mod_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as exc:  # ImportError, or the module raising on import
        raise WorkloadError(f"cannot import {mod_name!r}: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise WorkloadError(f"{ref!r}: module {mod_name!r} has no attribute {attr!r}") from None
    return obj


def build_workload(settings: Any, ctx: WorkloadContext) -> Workload:
    """The workload ``settings.kind`` names, built (not yet ``setup()``): a built-in, or an
    entry point checked against the protocols."""
    kind = settings.kind
    if kind in BUILDERS:
        return resolve(BUILDERS[kind])(settings, ctx)
    # entry points: loaded, called and checked against the protocols in plugin.py
    return resolve("soakd.workloads.plugin:build_entry_point")(kind, settings.options, ctx)
