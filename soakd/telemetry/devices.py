"""Which GPUs a run samples, and the probe that samples several of them.

The rule (``gpus_of``), from the run's settings:

* ``run.gpus = [0, 1]``: those CUDA ordinals (as this process counts them, so through
  ``CUDA_VISIBLE_DEVICES``); one that is not visible is a usage error (exit 2).
* ``run.gpus = "auto"``: every GPU visible to this process, which is what
  ``device_map="auto"`` spreads a model over.
* unset (the default): where the workload says it runs: a ``device_map`` among its settings
  or its ``options`` (``"auto"``, ``"balanced"``, ``"sequential"``: every visible GPU; a
  mapping: the CUDA devices it names), else its ``device`` (``cuda:N``: GPU N alone, which
  is the one-GPU run as before; ``cpu``: none).

Each ordinal is mapped to its NVML device by ``soakd.environment.nvml_handle`` (the one
owner of "which physical GPU is cuda:N"), and stored and exported under its NVML index and
UUID. The primary GPU (the workload's ``device`` when it is sampled, else the first) also
fills the ``samples`` table's ``gpu_*`` columns. A run on one GPU keeps ``NvmlProbe`` and
writes no per-device rows; with two or more, ``GpuDevicesProbe`` asks each device the
``NvmlProbe`` queries every tick and returns one ``DeviceSample`` per device.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from soakd.environment import (
    GpuUnavailable,
    device_uuid,
    nvml_handle,
    nvml_index,
    visible_ordinals,
)
from soakd.errors import UsageError
from soakd.records import SAMPLE_FIELDS, DeviceSample
from soakd.telemetry.probes import (
    NvmlProbe,
    Probe,
    ProcessProbe,
    TorchCudaProbe,
    Values,
    cuda_ordinal,
    default_probes,
)

AUTO: Literal["auto"] = "auto"
#: accelerate's device_map strategies: each may place layers on every visible GPU
_SPREADING_MAPS = frozenset({"auto", "balanced", "balanced_low_0", "sequential"})
#: the samples columns an NVML probe fills (every gpu_* column of the samples table)
_NVML_KEYS = tuple(k for k in SAMPLE_FIELDS if k.startswith("gpu_"))

Gpus = Literal["auto"] | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """The GPUs to sample: ``"auto"`` or CUDA ordinals; ``primary`` fills ``samples``;
    ``explicit``: asked for by ``run.gpus`` (a GPU missing is then an error)."""

    gpus: Gpus
    primary: int | None
    explicit: bool = False


def _map_ordinals(device_map: Any) -> Gpus | None:
    """A transformers/accelerate ``device_map`` -> the GPUs it may use (None: no GPU)."""
    if isinstance(device_map, str):
        if device_map in _SPREADING_MAPS:
            return AUTO
        return _one(device_map)
    if isinstance(device_map, Mapping):
        found = {o for v in device_map.values() for o in (_one(v) or ())}
        return tuple(sorted(found)) or None
    return None


def _one(place: Any) -> tuple[int, ...] | None:
    """One device_map value (``0``, ``"cuda:1"``, ``"cuda"``, ``"cpu"``, ``"disk"``)."""
    if isinstance(place, int) and not isinstance(place, bool):
        return (place,)
    try:
        return (cuda_ordinal(str(place)),)
    except GpuUnavailable:
        return None


def _device_map(workload: Any) -> Any:
    direct = getattr(workload, "device_map", None)
    options = getattr(workload, "options", None)
    if direct is None and isinstance(options, Mapping):
        return options.get("device_map")
    return direct


def gpus_of(settings: Any) -> GpuPlan:
    """The GPUs a run with these ``Settings`` samples (see the module's rule)."""
    wl = settings.workload
    try:
        primary: int | None = cuda_ordinal(getattr(wl, "device", None))
    except GpuUnavailable:
        primary = None
    asked = getattr(settings.run, "gpus", None)
    if asked is not None:
        gpus: Gpus = AUTO if asked == AUTO else tuple(int(g) for g in asked)
        return GpuPlan(gpus, primary, explicit=True)
    spread = _map_ordinals(_device_map(wl))
    if spread is not None:
        return GpuPlan(spread, primary)
    return GpuPlan((primary,) if primary is not None else (), primary)


def _load_nvml(nvml: Any) -> Any:
    if nvml is not None:
        return nvml
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise GpuUnavailable("nvidia-ml-py (pynvml) is not installed") from None


def open_gpus(plan: GpuPlan, nvml: Any = None) -> tuple[Probe | None, int | None]:
    """The NVML probe for ``plan`` and the CUDA ordinal of its primary GPU: (None, None)
    without a GPU to sample, an ``NvmlProbe`` for one, a ``GpuDevicesProbe`` for several.
    Raises ``GpuUnavailable`` saying why not (NVML missing, an ordinal not visible under
    CUDA_VISIBLE_DEVICES, an index NVML does not have)."""
    if plan.gpus == ():
        return None, None
    nvml = _load_nvml(nvml)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise GpuUnavailable(f"NVML cannot start: {exc} (no NVIDIA driver?)") from None
    try:
        return _probe(plan, nvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except BaseException:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
        raise


def _probe(plan: GpuPlan, nvml: Any, env: str | None) -> tuple[Probe, int]:
    ordinals: list[int] = (
        visible_ordinals(nvml, env) if isinstance(plan.gpus, str) else list(plan.gpus)
    )
    if not ordinals:
        raise GpuUnavailable(f"no GPU visible (CUDA_VISIBLE_DEVICES={env!r})")
    handles = [nvml_handle(nvml, o, env) for o in ordinals]
    primary = plan.primary if plan.primary is not None and plan.primary in ordinals else ordinals[0]
    if len(handles) == 1:
        return NvmlProbe(handles[0], nvml), primary
    devices = [(nvml_index(nvml, h), device_uuid(nvml, h), NvmlProbe(h, nvml)) for h in handles]
    main = devices[ordinals.index(primary)][0]
    return GpuDevicesProbe(devices, primary=main), primary


def run_probes(settings: Any, log: Any = None) -> list[Probe]:
    """The probes of a run with these ``Settings``. A run that samples at most one GPU and
    did not set ``run.gpus`` gets ``default_probes`` exactly as before; otherwise
    ``ProcessProbe``, the NVML probe of its GPUs and ``TorchCudaProbe`` on the primary one.
    A GPU that ``run.gpus`` names but this host does not show raises ``UsageError``."""
    plan = gpus_of(settings)
    if not plan.explicit and plan.gpus != AUTO and len(plan.gpus) <= 1:
        device = f"cuda:{plan.gpus[0]}" if plan.gpus else getattr(settings.workload, "device", None)
        return default_probes(device, log)
    probes: list[Probe] = [ProcessProbe()]
    try:
        nv, primary = open_gpus(plan)
    except GpuUnavailable as exc:
        if plan.explicit:
            raise UsageError(f"run.gpus = {_shown(plan.gpus)}: {exc}") from None
        if log is not None:
            log.warning(f"GPU telemetry off, GPU columns will be NULL: {exc}")
        return probes
    if nv is not None:
        probes.append(nv)
    if primary is not None:
        probes.append(TorchCudaProbe(primary))
    return probes


def _shown(gpus: Gpus) -> str:
    return f'"{gpus}"' if gpus == AUTO else f"[{', '.join(map(str, gpus))}]"


class GpuDevicesProbe:
    """Several GPUs through NVML: one ``NvmlProbe`` per device (the same queries, the same
    "not supported -> never again" rule), read once per tick. ``sample_devices`` returns a
    ``DeviceSample`` per device and fills ``into`` (the ``samples`` row) from the primary
    GPU's reading, so both tables hold the same numbers for it."""

    name = "nvml"

    def __init__(self, devices: Sequence[tuple[int, str, NvmlProbe]], *, primary: int) -> None:
        if len({gpu for gpu, _, _ in devices}) != len(devices):
            raise GpuUnavailable("the same GPU is listed twice")
        self.devices = list(devices)
        self.primary = primary  # NVML index
        self.nvml = devices[0][2].nvml

    @property
    def gpus(self) -> list[tuple[int, str]]:
        """(NVML index, UUID) of each sampled GPU, in order."""
        return [(gpu, uuid) for gpu, uuid, _ in self.devices]

    def sample(self, into: Values) -> None:
        self.sample_devices(into, 0, 0.0)

    def sample_devices(self, into: Values, seq: int, t: float) -> list[DeviceSample]:
        """Read every device for tick ``seq`` (at ``t`` s since the run's start)."""
        out = []
        for gpu, uuid, probe in self.devices:
            v: Values = dict.fromkeys(_NVML_KEYS)
            probe.sample(v)
            if gpu == self.primary:
                into.update(v)
            out.append(_reading(seq, t, gpu, uuid, v))
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()  # initialised once for every device


def _reading(seq: int, t: float, gpu: int, uuid: str, v: Values) -> DeviceSample:
    def whole(key: str) -> int | None:
        x = v.get(key)
        return None if x is None else int(x)

    def real(key: str) -> float | None:
        x = v.get(key)
        return None if x is None else float(x)

    return DeviceSample(
        seq=seq,
        t=t,
        gpu=gpu,
        uuid=uuid,
        mem_used_bytes=whole("gpu_mem_used_bytes"),
        mem_total_bytes=whole("gpu_mem_total_bytes"),
        util_pct=real("gpu_util_pct"),
        proc_mem_bytes=whole("gpu_proc_mem_bytes"),
        temp_c=real("gpu_temp_c"),
        power_w=real("gpu_power_w"),
    )
