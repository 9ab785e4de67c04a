"""``[workload]`` of ``kind = "python"`` and of the kinds other packages register (the
workloads: plugin.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from soakd.sections import Device, FactoryRef, StageTiming, _check_device, _Section


class _DeclaredDevice(_Section):
    """A workload soakd does not build itself declares where it runs, so the run samples
    that GPU (NVML, torch allocator) and judges its memory: ``device`` (``cuda:N``) or a
    ``device_map`` over several GPUs. The factory sees them as ``ctx.device`` and
    ``ctx.device_map``. Given only in ``options`` (where a factory reads its own settings),
    they are taken from there; given in both places, they must agree."""

    options: dict[str, Any] = Field(default_factory=dict)
    device: Device = "cpu"
    device_map: str | dict[str, Any] | None = None
    timing: StageTiming = "sync"  # a staged workload on device (one GPU): sync | events

    @model_validator(mode="before")
    @classmethod
    def _declared_in_options(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("options"), Mapping):
            return data
        data = dict(data)
        for key in ("device", "device_map"):
            if key not in data["options"]:
                continue
            given = data["options"][key]
            if key == "device":
                try:
                    _check_device(str(given))
                except ValueError as exc:
                    raise ValueError(f"options.device: {exc}") from None
            if key in data and data[key] != given:
                raise ValueError(
                    f"{key} = {data[key]!r} but options.{key} = {given!r}: say it once"
                )
            data[key] = given
        return data


class PythonWorkload(_DeclaredDevice):
    """A user's own workload: ``factory = "package.module:function"``."""

    kind: Literal["python"] = "python"
    factory: FactoryRef


class PluginWorkload(_DeclaredDevice):
    """A workload registered by another package in the ``soakd.workloads`` entry points."""

    kind: str
