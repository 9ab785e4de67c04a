"""Users' own workloads: ``kind = "python"`` with ``factory = "package.module:function"``.

The factory is imported, called as ``factory(options, ctx)`` and must return an object that
satisfies one of the protocols of :mod:`soakd.workloads.base`: a ``shape`` attribute
(``"staged"``, ``"session"``, ``"generator"`` or ``"rollout"``) and that shape's methods.
Anything else is a ``WorkloadError`` naming what is missing, raised before the run starts.
"""

from __future__ import annotations

from typing import Any

from soakd.workloads.base import WorkloadContext, WorkloadError
from soakd.workloads.plugin_settings import PythonWorkload
from soakd.workloads.registry import resolve

#: the methods each shape must provide (``shape`` itself is checked separately)
REQUIRED_METHODS: dict[str, tuple[str, ...]] = {
    "staged": ("setup", "preprocess", "infer", "decode", "sync", "describe", "close"),
    "session": ("setup", "start", "push", "poll", "describe", "close"),
    "generator": ("setup", "generate", "describe", "close"),
    "rollout": ("setup", "rollout", "sync", "describe", "close"),
}


def check_workload(obj: Any, origin: str, expect: str | tuple[str, ...] | None = None) -> Any:
    """Return ``obj`` if it satisfies a workload protocol, else raise ``WorkloadError``.

    ``origin`` names where it came from in the message; ``expect`` pins the shape (or the
    shapes allowed).
    """
    shape = getattr(obj, "shape", None)
    if shape not in REQUIRED_METHODS:
        shapes = ", ".join(repr(s) for s in REQUIRED_METHODS)
        raise WorkloadError(
            f"{origin} returned {type(obj).__name__}, not a workload: its 'shape' attribute "
            f"must be one of {shapes}, got {shape!r}"
        )
    allowed = (expect,) if isinstance(expect, str) else expect
    if allowed is not None and shape not in allowed:
        want = " or ".join(repr(a) for a in allowed)
        raise WorkloadError(f"{origin} returned a {shape!r} workload, expected {want}")
    missing = [m for m in REQUIRED_METHODS[shape] if not callable(getattr(obj, m, None))]
    if missing:
        raise WorkloadError(
            f"{origin} returned a {shape!r} workload without method(s) {', '.join(missing)}"
        )
    return obj


def load_factory(
    ref: str,
    options: dict[str, Any],
    ctx: WorkloadContext,
    *,
    expect: str | tuple[str, ...] | None = None,
) -> Any:
    """Import ``ref``, call it with ``(options, ctx)`` and check what it returns."""
    factory = resolve(ref)
    if not callable(factory):
        raise WorkloadError(f"factory {ref!r} is a {type(factory).__name__}, not callable")
    try:
        obj = factory(options, ctx)
    except WorkloadError:
        raise
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else ""
        raise WorkloadError(f"factory {ref!r} failed: {type(exc).__name__}: {msg}") from exc
    return check_workload(obj, f"factory {ref!r}", expect)


def build_python(settings: PythonWorkload, ctx: WorkloadContext) -> Any:
    """``kind = "python"``: the user's factory, checked against the protocols."""
    return load_factory(settings.factory, dict(settings.options), ctx)


def build_entry_point(name: str, options: dict[str, Any], ctx: WorkloadContext) -> Any:
    """A workload registered under ``name`` in the ``soakd.workloads`` entry-point group."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="soakd.workloads"):
        if ep.name == name:
            try:
                factory = ep.load()
            except Exception as exc:
                raise WorkloadError(
                    f"workload {name!r}: cannot load entry point {ep.value!r}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            try:
                obj = factory(dict(options), ctx)
            except WorkloadError:
                raise
            except Exception as exc:
                raise WorkloadError(
                    f"workload {name!r} ({ep.value}) failed: {type(exc).__name__}: {exc}"
                ) from exc
            return check_workload(obj, f"entry point {name!r} ({ep.value})")
    raise WorkloadError(f"unknown workload kind {name!r}: no 'soakd.workloads' entry point")
