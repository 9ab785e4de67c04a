"""The bottom of the settings: what every ``[section]`` model is built of.

``_Section`` (every table refuses unknown keys, NaN and infinity, and bounds its numbers),
the value types several sections share (``Duration``, ``Device``, ``EnvName``, ...) and
``GenerationSettings``, the generation knobs of the transformers-based workload kinds.
``soakd.config`` (the run-level sections and the loading) and each workload kind's own
settings module (``soakd/workloads/<kind>_settings.py``, ``realtime/settings.py``) import
this module; it imports pydantic and the standard library only, so reading a config never
imports a model, an image or a network library.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

_DURATION_RE = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m(?!s))?\s*"
    r"(?:(\d+(?:\.\d+)?)\s*s)?\s*(?:(\d+(?:\.\d+)?)\s*ms)?\s*$"
)


#: the longest a run, or any time setting, may be: a year. Longer is a typo, and a time far
#: past it overflows the clocks and timers it is handed to (OverflowError mid-run)
MAX_DURATION_S = 365 * 86_400
#: the largest size of any other number setting (counts, sizes, rates, seeds): 2**53, the
#: largest integer a float (and a JSON reader) holds exactly
MAX_NUMBER = 2**53
#: a number setting's unit, read from the end of its name (before any ``_per_``): its bound
#: is a year in that unit
_TIME_UNITS: dict[str, float] = {"ms": 1000.0, "s": 1.0, "seconds": 1.0}


def _finite(seconds: float, value: Any) -> float:
    if not math.isfinite(seconds):
        raise ValueError(f"must be a finite number, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"must be at most {MAX_DURATION_S} s (a year), got {value!r}")
    return seconds


def _bounded(name: str, v: Any) -> Any:
    """``v`` (a number or a tuple of them, of the setting ``name``) within its bound: a
    year for a time (``*_ms``, ``*_s``), MAX_NUMBER for any other number (a criterion's
    hours, ``min_headroom_hours``, may ask for more than a year of headroom)."""
    unit = name.split("_per_")[0].rsplit("_", 1)[-1]
    per_s = _TIME_UNITS.get(unit) if "_" in name else None
    limit = MAX_DURATION_S * per_s if per_s else MAX_NUMBER
    what = f"{limit:.0f} {unit} (a year)" if per_s else f"{limit} (2**53)"
    for x in v if isinstance(v, tuple) else (v,):
        if isinstance(x, int | float) and not isinstance(x, bool) and abs(x) > limit:
            side = "at most " if x > 0 else "at least -"
            raise ValueError(f"must be {side}{what}, got {x!r}")
    return v


def parse_duration(value: Any) -> float:
    """``"10m"``, ``"1h30m"``, ``"45s"``, ``"250ms"``, ``90`` or ``"90"`` -> seconds.
    NaN and infinity (``"inf"``, ``1e400``) are refused with ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '10m' or 600, got {value!r}")
    if isinstance(value, int | float):
        return _finite(float(value), value)
    bad = ValueError(f"expected a duration such as '10m', '90s' or 600, got {value!r}")
    if not isinstance(value, str):
        raise bad
    s = value.strip()
    try:
        seconds = float(s)
    except ValueError:
        m = _DURATION_RE.match(s)
        if not (m and any(m.groups())):
            raise bad from None
        h, mi, sec, ms = (float(g) if g else 0.0 for g in m.groups())
        seconds = h * 3600 + mi * 60 + sec + ms / 1000
    return _finite(seconds, value)


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _check_device(v: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", v):
        raise ValueError(f"must be cpu, cuda or cuda:N, got {v!r}")
    return v


def _check_factory(v: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", v):
        raise ValueError(f"must look like 'package.module:function', got {v!r}")
    return v


Device = Annotated[str, AfterValidator(_check_device)]  # cpu | cuda | cuda:N | mps
FactoryRef = Annotated[str, AfterValidator(_check_factory)]  # "package.module:function"
# how a staged workload on a torch device is timed: "sync" ends each stage after
# workload.sync() (torch.cuda.synchronize); "events" records CUDA events at stage boundaries
# (run/drivers/timing.py); on a CPU device both read the host clock
StageTiming = Literal["sync", "events"]


class _Section(BaseModel):
    # allow_inf_nan=False: every float of every section refuses NaN and +-infinity (also
    # given as strings or TOML nan/inf literals): "must be a finite number, got nan"
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _within_bounds(cls, v: Any, info: ValidationInfo) -> Any:
        """Every number setting of every section is bounded (``_bounded``)."""
        return _bounded(info.field_name or "", v)


#: the most paced sources one run may drive (``run.streams``)
MAX_STREAMS = 256


def _check_base_url(v: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http(s):// URL such as 'http://127.0.0.1:8000/v1', got {v!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"must not carry a query or fragment, got {v!r}")
    return v.rstrip("/")


BaseUrl = Annotated[str, AfterValidator(_check_base_url)]


def _check_env_name(v: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
        raise ValueError(f"must name an environment variable, got {v!r}")
    return v


#: the name of an environment variable (a served workload's ``api_key_env``)
EnvName = Annotated[str, AfterValidator(_check_env_name)]


class GenerationSettings(_Section):
    """Generation settings shared by the transformers-based workloads; each changes timing,
    each is stored with the run."""

    prompt: str = "Describe what is happening in this frame."
    max_new_tokens: int = Field(16, ge=1, le=65536)
    min_new_tokens: int | None = Field(None, ge=0)
    num_beams: int = Field(1, ge=1, le=64)
    do_sample: bool = False
    use_cache: bool = True


class SessionQuestion(_Section):
    """One question of ``workload.questions``: pushed ``at_s`` seconds after the run starts;
    its answer latency is the time to the first text chunk after the push."""

    at_s: Duration = Field(ge=0)
    text: str = Field(min_length=1)


def _in_time_order(v: tuple[SessionQuestion, ...]) -> tuple[SessionQuestion, ...]:
    for a, b in itertools.pairwise(v):
        if b.at_s < a.at_s:
            raise ValueError(f"questions must be in time order (at_s {b.at_s:g} < {a.at_s:g})")
    return v


#: timed questions (``workload.questions`` of the session and realtime kinds), in time order
Questions = Annotated[tuple[SessionQuestion, ...], AfterValidator(_in_time_order)]
