"""``soakd sweep``: one variable at a time, a profile per value, and where the usable range
ends.

Each value is applied to the validated settings exactly as ``--set KEY=VALUE`` would be and
re-validated; a value the configuration rejects (``ConfigError``), a workload that cannot be
built with it (``UsageError``/``WorkloadError``) or a first frame that raises is reported as
*rejected* with its one-line reason, and the sweep goes on. Sweeping ``run.fps`` runs each
point paced (at that rate) instead of back to back; its knee is the first rate whose drop
fraction exceeds ``criteria.max_drop_fraction``.

The knee (``find_knee``) is the first point whose time jumps out of proportion to the
previous steps; the usable range ends at the point before it.

Sweeping ``run.streams`` answers "how many streams at ``run.fps`` each does this host hold?":
each point is a paced soak of ``run.duration`` judged per stream and together (the run's
verdict), and its knee is the first stream count whose run does not PASS; the usable range
ends at the largest count below it whose every stream passed.

Each point's host load is sampled as in a run (``host``); a point measured while other
processes held half the host's CPUs or more is marked ``host busy``. A point whose total
p50 falls below the point before it (in increasing value) by more than their frames'
spread (the sum of their half-IQRs) and by more than 10 % of the earlier p50 is flagged
non-monotone (``non_monotone``): no knee and no usable range are read from such a sweep,
which says so instead of "no knee found".
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from soakd.analysis.model import OVERALL_PASS, Verdict
from soakd.analysis.streams import streams_of
from soakd.config import ConfigError, Settings, parse_set
from soakd.errors import SoakdError
from soakd.observers.base import Observer
from soakd.report.svg import Series, VLine, line_chart, nice_ticks
from soakd.run.runner import run_soak
from soakd.store import profiling_queries as q
from soakd.store.db import connect
from soakd.studies.profiling import ProfileResult, profile, profile_from_db
from soakd.workloads.base import WorkloadError

SCHEMA = "soakd.sweep/1"
KNEE_K = 3.0
KNEE_MIN_JUMP = 0.2
#: the key whose points are judged soaks (``streams_point``), its knee the first not to PASS
STREAMS_KEY = "run.streams"
ProgressFn = Callable[[int, int, Any], None]


# --- knee detection (pure)


def find_knee(
    values: Sequence[Any],
    totals: Sequence[float | None],
    *,
    k: float = KNEE_K,
    min_jump: float = KNEE_MIN_JUMP,
) -> int | None:
    """Index (into ``values``) of the first point whose total jumps out of proportion to the
    previous steps, or None.

    Points without a total (rejected) or with a non-numeric value are skipped; the rest are
    taken in increasing value. For each step *i* the slope ``s_i = (T_i - T_{i-1}) /
    (x_i - x_{i-1})`` is the time added per unit of the varied value. Point *i* is the knee
    when, with at least one earlier step to compare against,

    * every earlier step rose (``s_1 .. s_{i-1} > 0``): a step that fell or stayed flat is
      noise, and after noise there is no rate to be out of proportion with (a first slope
      below zero once made noise followed by ordinary growth a "knee");
    * ``s_i > k * median(s_1 .. s_{i-1})`` (default k = 3): the time per unit grew more
      than threefold over the typical earlier step, and
    * ``T_i - T_{i-1} > min_jump * T_{i-1}`` (default 20 %): the jump is material, so noise
      on a flat curve is not a knee.

    Growth in proportion to the value (linear), and even quadratic growth (slopes rising
    steadily, e.g. time against an image side), is not a knee; a sudden step after rising
    steps is. A step after a flat or falling one is not called (no earlier rate to judge it
    by).
    """
    pts = []
    for i, (x, t) in enumerate(zip(values, totals, strict=True)):
        if t is None or isinstance(x, bool) or not isinstance(x, int | float):
            continue
        if math.isfinite(float(x)) and math.isfinite(float(t)):
            pts.append((float(x), float(t), i))
    pts.sort()
    slopes: list[float] = []
    for (x0, t0, _), (x1, t1, i1) in itertools.pairwise(pts):
        if x1 <= x0:
            continue
        s = (t1 - t0) / (x1 - x0)
        if slopes and min(slopes) <= 0:
            return None  # noise before: no rate to judge a later step by
        if slopes and s > k * statistics.median(slopes) and (t1 - t0) > min_jump * t0:
            return i1
        slopes.append(s)
    return None


# --- settings for one point


def parse_vary(spec: str) -> tuple[str, list[Any]]:
    """``KEY=V1,V2,...`` -> (KEY, [values]); each value is read like ``--set`` reads it."""
    if "=" not in spec:
        raise ConfigError(f"--vary {spec}: expected KEY=V1,V2,...")
    key, raw = spec.split("=", 1)
    key = key.strip()
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not parts:
        raise ConfigError(f"--vary {spec}: no values")
    return key, [parse_set(f"{key}={p}")[1] for p in parts]


def check_key(settings: Settings, key: str) -> None:
    """Raise ConfigError unless ``key`` names a setting (or a key inside a free-form
    ``options`` table)."""
    flat = settings.flat()
    if key in flat:
        return
    parent = key.rsplit(".", 1)[0]
    # an empty table is a leaf of its own; a filled one shows as its dotted keys
    in_options = isinstance(flat.get(parent), Mapping) or any(
        k.startswith(parent + ".") for k in flat
    )
    if (parent.endswith(".options") or parent == "options") and in_options:
        return
    raise ConfigError(f"--vary {key}: unknown key")


# --- the sweep


def _tok(v: float | None) -> str:
    return "–" if v is None else f"{v:g}"


def _media(p: SweepPoint) -> str:
    return f" {_tok(p.vision_tokens)} | {_tok(p.audio_tokens)} |"


# a fall in total p50 smaller than this share of the earlier point's is never "not monotone"
NON_MONOTONE_MIN_FALL = 0.10
# the same where other processes held the host at either point: a scheduler shared with them
# moves a few frames' median further (two 10 ms points of 8 frames each, beside two CPU
# spinners and a busy test suite, read more than 10 % apart)
NON_MONOTONE_BUSY_FALL = 0.25


@dataclass
class SweepPoint:
    value: Any
    status: str  # ok | rejected
    reason: str | None = None
    run_id: str | None = None
    pre_median_ms: float | None = None
    pre_max_ms: float | None = None
    infer_median_ms: float | None = None
    infer_max_ms: float | None = None
    decode_median_ms: float | None = None
    total_median_ms: float | None = None
    peak_rss_bytes: int | None = None
    peak_gpu_mem_bytes: int | None = None
    out_tokens: float | None = None
    vision_tokens: float | None = None  # media tokens per request (median), where reported
    audio_tokens: float | None = None
    sample_output: str | None = None
    age_p95_ms: float | None = None  # paced points (run.fps sweeps)
    drop_fraction: float | None = None  # paced points: (drops + stale) / captured
    verdict: str | None = None  # run.streams points: the run's verdict (every stream)
    streams_passed: int | None = None  # run.streams points: streams whose own verdict passed
    total_iqr_ms: float | None = None  # the spread of total over the frames after the first
    host: dict[str, Any] | None = None  # the host's load beside the point (HostLoad.to_dict)
    profile: ProfileResult | None = None

    @property
    def host_busy(self) -> bool:
        """Other processes held half the host's CPUs or more while it was measured."""
        return bool(self.host and self.host.get("contended"))


@dataclass
class SweepResult:
    key: str
    values: list[Any]
    frames: int
    paced: bool
    points: list[SweepPoint]
    knee_metric: str
    knee_index: int | None
    usable_until: Any = None
    held_fixed: dict[str, Any] = field(default_factory=dict)
    max_drop_fraction: float = 0.05
    sample_interval_ms: float = 150.0

    @property
    def non_monotone(self) -> list[tuple[Any, Any]]:
        """(earlier value, later value) pairs, in increasing value, whose total p50 fell by
        more than the two points' spread (half their IQRs added) and by more than
        ``NON_MONOTONE_MIN_FALL`` of the earlier p50 (``NON_MONOTONE_BUSY_FALL`` where the
        host was busy at either point): the cost went down as the value went up, beyond the
        frames' own noise and beyond what a busy host moves a few frames' median between two
        points of equal cost (two 10 ms points of 8 frames each, beside two CPU spinners,
        once read apart by more than their tiny IQRs)."""
        if self.knee_metric != "total_median_ms":
            return []
        pts = [p for p in self.points if p.status == "ok" and p.total_median_ms is not None]
        try:
            pts.sort(key=lambda p: float(p.value))
        except (TypeError, ValueError):
            return []
        out = []
        for a, b in itertools.pairwise(pts):
            assert a.total_median_ms is not None and b.total_median_ms is not None
            noise = ((a.total_iqr_ms or 0.0) + (b.total_iqr_ms or 0.0)) / 2
            busy = a.host_busy or b.host_busy
            floor = (NON_MONOTONE_BUSY_FALL if busy else NON_MONOTONE_MIN_FALL) * a.total_median_ms
            if a.total_median_ms - b.total_median_ms > max(noise, floor):
                out.append((a.value, b.value))
        return out

    @property
    def summary(self) -> str:
        """One line: where the usable range ends (or that no knee was found)."""
        if self.non_monotone and self.knee_index is None:
            a, b = self.non_monotone[0]
            return (
                f"no knee read: total p50 at {self.key}={b} is below {self.key}={a} by more "
                "than their spread (not monotone); rerun the sweep on a quiet host"
            )
        if self.knee_index is None:
            ok = [p.value for p in self.points if p.status == "ok"]
            if not ok:
                return "no value could be profiled"
            return f"no knee found: usable over the whole range tried ({ok[0]}..{ok[-1]})"
        knee = self.points[self.knee_index].value
        if self.usable_until is None:
            return f"knee at {self.key}={knee}: no value below it was usable"
        return f"knee at {self.key}={knee}: usable range ends at {self.key}={self.usable_until}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for p in d["points"]:
            p.pop("profile", None)
        d["summary"] = self.summary
        d["non_monotone"] = [list(pair) for pair in self.non_monotone]
        for p, point in zip(d["points"], self.points, strict=True):
            p["host_busy"] = point.host_busy
        d["knee_rule"] = self.knee_rule
        d["notes"] = self.notes
        return {"schema": SCHEMA, **d}

    @property
    def notes(self) -> list[str]:
        """Why an accepted point shows "–" for its peak memory (no telemetry sample fell
        inside its run, or no GPU memory was sampled at all); the points measured on a busy
        host; the non-monotone steps; a built-in random-weight model's gibberish."""
        ok = [p for p in self.points if p.status == "ok"]
        no_rss = [p.value for p in ok if p.peak_rss_bytes is None]
        sampled = [p for p in ok if p.peak_rss_bytes is not None]
        no_gpu = [p.value for p in sampled if p.peak_gpu_mem_bytes is None]
        out = []
        if no_rss:
            out.append(
                f"peak RSS and GPU – at {self.key}={', '.join(map(str, no_rss))}: no telemetry"
                " sample fell inside that point (its frames took less than one sample interval,"
                f" run.sample_interval_ms = {self.sample_interval_ms:g} ms); more --frames"
                " would measure it"
            )
        if no_gpu:
            some = len(no_gpu) < len(sampled)
            where = f" at {self.key}={', '.join(map(str, no_gpu))}" if some else ""
            out.append(
                f"peak GPU –{where}: no GPU memory was sampled (the workload runs on the CPU,"
                " or NVML sees no GPU)"
            )
        busy = [p.value for p in ok if p.host_busy]
        if busy:
            out.append(
                f"host busy at {self.key}={', '.join(map(str, busy))}: other processes held "
                "half the host's CPUs or more while those points ran (status: host busy); their "
                "times are the host's as much as the model's"
            )
        for a, b in self.non_monotone:
            out.append(
                f"not monotone: total p50 at {self.key}={b} is below {self.key}={a} by more "
                "than the two points' spread (half their IQRs); noise or host load, not a "
                "knee"
            )
        if any(p.profile is not None and _random(p.profile) for p in ok):
            out.append(
                "a built-in tiny model with random weights: its sample outputs are gibberish "
                "and its times are not a real model's"
            )
        return out

    @property
    def knee_rule(self) -> str:
        """The knee rule applied, in words."""
        if self.knee_metric == "verdict":
            return (
                "the first stream count whose run (judged per stream and together, each "
                "stream at run.fps) does not PASS"
            )
        if self.paced:
            return (
                f"the first rate whose drop fraction exceeds criteria.max_drop_fraction "
                f"({self.max_drop_fraction:g})"
            )
        return (
            f"the first point whose total p50 per unit of {self.key} exceeds {KNEE_K:g}x "
            f"the median of the earlier steps (every one rising), with a jump over "
            f"{KNEE_MIN_JUMP:.0%}"
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_markdown(self) -> str:
        return render_markdown(self)

    def to_svg(self) -> str:
        return render_svg(self)


def _random(prof: ProfileResult) -> bool:
    return any(n.startswith("a built-in tiny model with random weights") for n in prof.notes)


def _one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, ConfigError | SoakdError | WorkloadError):
        return msg or type(exc).__name__
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _point(value: Any, prof: ProfileResult) -> SweepPoint:
    st = prof.stages
    p = SweepPoint(
        value=value,
        status="ok",
        run_id=prof.run_id,
        pre_median_ms=st["pre"].median,
        pre_max_ms=st["pre"].max,
        infer_median_ms=st["infer"].median,
        infer_max_ms=st["infer"].max,
        decode_median_ms=st["decode"].median,
        total_median_ms=st["total"].median,
        peak_rss_bytes=prof.peak_rss_bytes,
        peak_gpu_mem_bytes=prof.peak_gpu_mem_bytes,
        out_tokens=prof.out_tokens,
        vision_tokens=prof.vision_tokens,
        audio_tokens=prof.audio_tokens,
        sample_output=prof.sample_output,
        host=prof.host.to_dict() if prof.host is not None else None,
        profile=prof,
    )
    if prof.first_error is not None:
        p.status, p.reason = "rejected", f"first frame raised: {prof.first_error}"
    elif prof.measured == 0:
        p.status = "rejected"
        p.reason = prof.reason or "no frame finished without error"
    return p


def run_point(
    settings: Settings,
    key: str,
    value: Any,
    *,
    frames: int,
    paced: bool,
    observers: Sequence[Observer] = (),
) -> SweepPoint:
    """Profile one value; any rejection becomes a ``rejected`` point with its reason."""
    try:
        s = settings.with_value(key, value)
    except ConfigError as exc:
        return SweepPoint(value=value, status="rejected", reason=_one_line(exc))
    try:
        prof = profile(s, frames=frames, observers=observers, paced=paced)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # the model rejected the value: reported, the sweep goes on
        return SweepPoint(value=value, status="rejected", reason=_one_line(exc))
    p = _point(value, prof)
    p.total_iqr_ms = _spread(s, prof.run_id)
    if paced and p.status == "ok":
        p.age_p95_ms, p.drop_fraction = _paced_stats(s, prof.run_id)
    return p


def _spread(settings: Settings, run_id: str) -> float | None:
    """The IQR of total over the frames after the first (None: under 4 of them)."""
    conn = connect(settings.resolved_db(), mark_orphans=False)
    try:
        total = q.frame_values(conn, run_id, ("total_ms",), profile=True)["total_ms"]
    finally:
        conn.close()
    total = total[np.isfinite(total)]
    if total.size < 4:
        return None
    q75, q25 = np.percentile(total, [75, 25])
    return float(q75 - q25)


def streams_point(
    settings: Settings, key: str, value: Any, *, observers: Sequence[Observer] = ()
) -> SweepPoint:
    """One ``run.streams`` value: a paced soak of ``run.duration``, judged; the point holds
    the run's verdict, how many streams passed on their own, the overall lost fraction and
    frame-age p95, and the stage medians of its frames. Rejections as in ``run_point``."""
    try:
        s = settings.with_value(key, value)
    except ConfigError as exc:
        return SweepPoint(value=value, status="rejected", reason=_one_line(exc))
    try:
        result = run_soak(s, observers=observers, mode="profile")
        conn = connect(s.resolved_db(), mark_orphans=False)
        try:
            prof = profile_from_db(conn, result.run_id)
        finally:
            conn.close()
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        return SweepPoint(value=value, status="rejected", reason=_one_line(exc))
    p = _point(value, prof)
    if result.verdict is not None:
        _judged(p, result.verdict)
    return p


def _judged(p: SweepPoint, v: Verdict) -> None:
    """A judged point's verdict, passing streams, lost fraction and frame-age p95."""
    per = streams_of(v)
    p.verdict = v.status
    p.streams_passed = (
        sum(r.get("status") == OVERALL_PASS for r in per) if per else int(v.status == "PASS")
    )
    drops, age = v.get("drops"), v.get("frame_age")
    p.drop_fraction = drops.value if drops is not None else None
    p.age_p95_ms = age.evidence.get("p95_ms") if age is not None else None


def verdict_knee(points: Sequence[SweepPoint]) -> int | None:
    """``run.streams`` sweeps: index of the first accepted point, in increasing value, whose
    run did not PASS."""
    order = sorted(
        (i for i, p in enumerate(points) if p.status == "ok" and p.verdict is not None),
        key=lambda i: float(points[i].value),
    )
    return next((i for i in order if points[i].verdict != OVERALL_PASS), None)


def _paced_stats(settings: Settings, run_id: str) -> tuple[float | None, float | None]:
    """Frame age p95 (after the first frame) and drop fraction of a paced point."""
    conn = connect(settings.resolved_db(), mark_orphans=False)
    try:
        age = q.frame_values(conn, run_id, ("frame_age_ms",), profile=True)["frame_age_ms"]
        c = q.frame_counts(conn, run_id)
    finally:
        conn.close()
    age = age[np.isfinite(age)]
    lost = c["drops"] + c["stale"]
    captured = c["rows"] + c["drops"]
    return (
        float(np.percentile(age, 95)) if age.size else None,
        lost / captured if captured else None,
    )


def drop_knee(points: Sequence[SweepPoint], max_drop_fraction: float) -> int | None:
    """Paced (run.fps) sweeps: index of the first point, in increasing rate, whose drop
    fraction exceeds ``max_drop_fraction``."""
    order = sorted(
        (i for i, p in enumerate(points) if p.status == "ok" and p.drop_fraction is not None),
        key=lambda i: float(points[i].value),
    )
    for i in order:
        frac = points[i].drop_fraction
        if frac is not None and frac > max_drop_fraction:
            return i
    return None


def sweep(
    settings: Settings,
    key: str,
    values: Sequence[Any],
    *,
    frames: int = 20,
    progress: ProgressFn | None = None,
    observers: Sequence[Observer] = (),
) -> SweepResult:
    """Profile ``settings`` once per value of ``key`` (everything else held fixed) and find
    the knee. ``progress(done, total, value)`` is called before each point and at the end."""
    if frames < 2:
        raise ValueError("a sweep point needs at least 2 frames (the first is set apart)")
    check_key(settings, key)
    judged = key == STREAMS_KEY
    paced = key == "run.fps" or judged
    points: list[SweepPoint] = []
    for i, v in enumerate(values):
        if progress is not None:
            progress(i, len(values), v)
        if judged:
            points.append(streams_point(settings, key, v, observers=observers))
        else:
            points.append(
                run_point(settings, key, v, frames=frames, paced=paced, observers=observers)
            )
    if progress is not None:
        progress(len(values), len(values), None)
    if judged:
        metric, knee = "verdict", verdict_knee(points)
    elif paced:
        metric = "drop_fraction"
        knee = drop_knee(points, settings.criteria.max_drop_fraction)
    else:
        metric = "total_median_ms"
        ys = [p.total_median_ms if p.status == "ok" else None for p in points]
        knee = find_knee([p.value for p in points], ys)
    usable = None
    if knee is not None:
        before = _ok_below(points, knee)
        usable = before[-1].value if before else None
    fixed = {
        k: v
        for k, v in settings.flat().items()
        if k.split(".")[-1] in ("prompt", "max_new_tokens", "num_beams") and k != key
    }
    if judged:  # the per-stream rate and the soak length each point ran at
        fixed |= {"run.fps": settings.run.fps, "run.duration": settings.run.duration}
    return SweepResult(
        key=key,
        values=list(values),
        frames=frames,
        paced=paced,
        points=points,
        knee_metric=metric,
        knee_index=knee,
        usable_until=usable,
        held_fixed=fixed,
        max_drop_fraction=settings.criteria.max_drop_fraction,
        sample_interval_ms=settings.run.sample_interval_ms,
    )


def _ok_below(points: Sequence[SweepPoint], knee: int) -> list[SweepPoint]:
    """The accepted points whose value is below the knee's, in increasing value."""
    kv = points[knee].value
    try:
        below = [p for p in points if p.status == "ok" and p.value < kv]
        return sorted(below, key=lambda p: p.value)
    except TypeError:  # non-numeric values: sweep order
        return [p for p in points[:knee] if p.status == "ok"]


# --- rendering


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _mb(v: int | None) -> str:
    return "–" if v is None else f"{v / (1 << 20):.0f}"


def _cell(text: str | None, n: int = 60) -> str:
    if text is None:
        return "–"
    t = "".join(ch if ch.isprintable() else "\ufffd" for ch in text.replace("\n", " "))
    t = t.replace("|", "\\|")
    return t if len(t) <= n else t[: n - 1] + "…"


def render_markdown(r: SweepResult) -> str:
    """The sweep as a Markdown table, the knee line and the held-fixed note."""
    judged = r.knee_metric == "verdict"
    how = "paced at each rate" if r.paced else "back to back"
    each = "a judged soak" if judged else f"{r.frames} frames"
    if judged:
        how = "each stream paced at run.fps"
    lines = [f"## soakd sweep `{r.key}` ({len(r.values)} values, {each} each, {how})", ""]
    media = any(p.vision_tokens is not None or p.audio_tokens is not None for p in r.points)
    head = (
        "| value | status | pre p50 | pre max | infer p50 | infer max | total p50 |"
        + (" verdict | streams passing |" if judged else "")
        + (" age p95 | drops |" if r.paced else "")
        + (" vision tokens | audio tokens |" if media else "")
        + " peak RSS MB | peak GPU MB | out tokens | sample output |"
    )
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for i, p in enumerate(r.points):
        mark = " **knee**" if i == r.knee_index else ""
        if p.status != "ok":
            cols = head.count("|") - 3
            lines.append(f"| {p.value}{mark} | rejected: {_cell(p.reason, 120)} |" + " – |" * cols)
            continue
        drops = "–" if p.drop_fraction is None else f"{p.drop_fraction:.1%}"
        age = f" {_ms(p.age_p95_ms)} | {drops} |" if r.paced else ""
        if judged:
            age = f" {p.verdict or '–'} | {_tok(p.streams_passed)} of {p.value} |" + age
        status = "ok (host busy)" if p.host_busy else "ok"
        lines.append(
            f"| {p.value}{mark} | {status} | {_ms(p.pre_median_ms)} | {_ms(p.pre_max_ms)} | "
            f"{_ms(p.infer_median_ms)} | {_ms(p.infer_max_ms)} | {_ms(p.total_median_ms)} |"
            f"{age}{_media(p) if media else ''} {_mb(p.peak_rss_bytes)} | "
            f"{_mb(p.peak_gpu_mem_bytes)} | "
            f"{'–' if p.out_tokens is None else f'{p.out_tokens:g}'} | "
            f"{_cell(p.sample_output)} |"
        )
    lines += [
        "",
        f"**{r.summary}**",
        "",
        "Times in ms (p50 = median over the frames after the first; the first frame is "
        f"left out). Knee rule: {r.knee_rule}.",
    ]
    lines += [x for note in r.notes for x in ("", f"Note: {note}.")]
    if r.held_fixed:
        fixed = ", ".join(
            f"{k}={'unset' if v is None else repr(v)}" for k, v in r.held_fixed.items()
        )
        lines += ["", f"Held fixed: {fixed}."]
    return "\n".join(lines) + "\n"


def render_svg(r: SweepResult) -> str:
    """Total and per-stage medians against the varied value (an inline SVG chart)."""
    ok = [p for p in r.points if p.status == "ok"]
    numeric = all(isinstance(p.value, int | float) and not isinstance(p.value, bool) for p in ok)
    xs = [float(p.value) if numeric else float(i) for i, p in enumerate(ok)]
    series = [
        Series(
            name,
            xs,
            [math.nan if getattr(p, attr) is None else getattr(p, attr) for p in ok],
            markers=True,
        )
        for name, attr in (
            ("total p50", "total_median_ms"),
            ("pre p50", "pre_median_ms"),
            ("infer p50", "infer_median_ms"),
            ("infer max", "infer_max_ms"),
            ("decode p50", "decode_median_ms"),
        )
    ]
    if r.paced:
        ages = [math.nan if p.age_p95_ms is None else p.age_p95_ms for p in ok]
        series.append(Series("age p95", xs, ages, markers=True))
    series[3] = Series("infer max", series[3].x, series[3].y, dash="4 3", markers=True)
    vlines = []
    if r.knee_index is not None and numeric:
        v = r.points[r.knee_index].value
        vlines.append(VLine(float(v), f"knee at {v}", color="#d62728"))
    x_ticks, x_range = _sweep_axis(xs)
    return line_chart(
        series,
        x_label=r.key,
        y_label="ms",
        title=f"soakd sweep: {r.key}",
        vlines=vlines,
        y_zero=True,
        panel_id="sweep",
        x_ticks=x_ticks,
        x_range=x_range,
    )


#: the sweep plot's values are its x ticks when no two are closer than this share of the
#: axis (about 40 px of the 820 px plot area); otherwise round steps from one at or below
#: the first value
_TICK_GAP = 0.05


def _sweep_axis(xs: Sequence[float]) -> tuple[list[float] | None, tuple[float, float] | None]:
    """The x ticks and range of a sweep plot: the swept values themselves as ticks (each
    point has its tick, the first included) when they are far enough apart, else round
    steps over a range that starts at a tick at or below the first value."""
    vals = sorted(set(xs))
    if len(vals) < 2:
        return None, None
    lo, hi = vals[0], vals[-1]
    pad = (hi - lo) * 0.04
    if min(b - a for a, b in itertools.pairwise(vals)) >= _TICK_GAP * (hi - lo):
        return vals, (lo - pad, hi + pad)
    ticks = nice_ticks(lo, hi, 8)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else hi - lo
    return None, (math.floor(lo / step) * step, hi + pad)
