"""soakd sweep: the knee rule, one-variable overrides, rejected values, outputs, CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soakd.config import ConfigError, Settings
from soakd.records import Frame, StageOutput
from soakd.studies.sweep import SweepPoint, SweepResult, check_key, find_knee, parse_vary, sweep
from soakd.workloads.base import WorkloadError
from tests.test_compare import md_tables_consistent

REPO = Path(__file__).resolve().parents[1]


# --- the knee rule (pure)


def test_find_knee_examples() -> None:
    """A step is a knee; proportional growth, flat noise and too few points are not."""
    sizes = [224, 336, 448, 560, 672]
    assert find_knee(sizes, [10, 12, 14, 60, 63]) == 3
    assert find_knee(sizes, [10, 20, 30, 40, 50]) is None  # linear
    assert find_knee([5, 10, 15, 20, 80], [9, 14, 19, 24, 84]) is None  # proportional
    assert find_knee([5, 10, 15, 20, 25], [9, 14, 19, 24, 84]) == 4  # out of proportion
    assert find_knee(sizes, [10, 10.2, 9.9, 10.1, 10.3]) is None  # flat noise
    assert find_knee([1, 2], [1, 100]) is None  # no earlier step to compare with
    # rejected points (None) are skipped; the index is into the original list
    assert find_knee([224, 336, 400, 448, 560], [10, 12, None, 14, 60]) == 4
    # values are taken in increasing order
    assert find_knee([672, 560, 448, 336, 224], [63, 60, 14, 12, 10]) == 1
    assert find_knee(["a", "b", "c"], [1, 2, 30]) is None  # non-numeric: no knee


@given(
    x0=st.floats(1, 1000),
    h=st.floats(0.1, 1000),
    n=st.integers(3, 12),
    c=st.floats(0, 1000),
    b=st.one_of(st.just(0.0), st.floats(1e-3, 100)),
)
def test_linear_growth_is_never_a_knee(x0: float, h: float, n: int, c: float, b: float) -> None:
    """Time growing in proportion to the value (any offset and slope) has no knee."""
    xs = [x0 + i * h for i in range(n)]
    assert find_knee(xs, [c + b * x for x in xs]) is None


@given(x0=st.floats(1, 50), n=st.integers(3, 12), c=st.floats(0, 100), a=st.floats(1e-3, 10))
def test_quadratic_growth_is_not_a_knee(x0: float, n: int, c: float, a: float) -> None:
    """Time growing with the square of an evenly stepped value starting at least one step
    above zero (e.g. time against an image side) has no knee."""
    h = x0
    xs = [x0 + i * h for i in range(n)]
    assert find_knee(xs, [c + a * x * x for x in xs]) is None


def test_noise_then_rising_is_not_a_knee() -> None:
    """A first step that falls (noise) gives no rate to be out of proportion with: the
    ordinary rise after it is not a knee (the AV video_fps sweep once said "knee at 4")."""
    assert find_knee([1, 2, 4], [100, 95, 130]) is None
    assert find_knee([1, 2, 3, 4, 5], [30, 27, 29, 40, 52]) is None
    # a flat start (zero slope) is no rate either
    assert find_knee([1, 2, 3], [10, 10, 50]) is None
    assert find_knee([1, 2, 3, 4, 5], [100, 98, 103, 108, 160]) is None
    # rising steps before it: the same step out of proportion is the knee
    assert find_knee([1, 2, 3, 4, 5], [100, 102, 103, 108, 160]) == 4


@given(
    n=st.integers(1, 6),
    noise=st.lists(st.floats(0.1, 5), min_size=6, max_size=6),
    rise=st.floats(21, 100),
)
def test_falling_noise_then_any_rise_is_never_a_knee(
    n: int, noise: list[float], rise: float
) -> None:
    """Steps that only fall, then one rise of any size: never a knee."""
    ts = [100.0]
    for d in noise[:n]:
        ts.append(ts[-1] - d)
    ts.append(ts[-1] * (1 + rise / 100))
    assert find_knee(list(range(1, len(ts) + 1)), ts) is None


@given(n_before=st.integers(2, 8), jump=st.floats(4, 100), base=st.floats(1, 100))
def test_a_step_after_steady_growth_is_the_knee(n_before: int, jump: float, base: float) -> None:
    """A step of more than k x the earlier slope after steady growth is found at the step."""
    xs = list(range(1, n_before + 3))
    ts = [base + x for x in xs[: n_before + 1]]
    ts.append(ts[-1] + jump * max(1.0, 0.25 * ts[-1]))
    assert find_knee(xs, ts) == n_before + 1


# --- overrides


def test_with_value_revalidates_and_check_key_rejects_unknown(
    synthetic: Callable[..., Settings],
) -> None:
    """A value is applied like --set and re-validated; unknown keys and bad values raise
    ConfigError with the key named."""
    s = synthetic()
    assert s.with_value("workload.infer_ms", 7).workload.infer_ms == 7  # type: ignore[union-attr]
    assert s.with_value("run.fps", 3).run.fps == 3
    with pytest.raises(ConfigError, match=r"workload\.infer_ms"):
        s.with_value("workload.infer_ms", -1)
    with pytest.raises(ConfigError, match="unknown key"):
        check_key(s, "workload.nope")
    check_key(s, "workload.infer_ms")
    assert parse_vary("workload.short_side=336, 448,560") == (
        "workload.short_side",
        [336, 448, 560],
    )
    assert parse_vary("workload.prompt=hi,'a b'")[1] == ["hi", "a b"]
    with pytest.raises(ConfigError, match="expected KEY="):
        parse_vary("workload.short_side")


def test_check_key_accepts_keys_inside_options_tables() -> None:
    """Any key inside a free-form ``options`` table may be varied (empty or filled); other
    unknown keys may not."""
    empty = Settings().with_value("workload.kind", "generator")
    check_key(empty, "workload.options.steps")
    filled = empty.with_value("workload.options.steps", 4)
    assert filled.workload.options == {"steps": 4}  # type: ignore[union-attr]
    check_key(filled, "workload.options.other")
    with pytest.raises(ConfigError, match=r"--vary workload\.nope\.steps: unknown key"):
        check_key(filled, "workload.nope.steps")


# --- end to end with a workload whose infer time steps up past a known size


class Stepped:
    """Infer time 0.02 ms per unit of ``size`` up to 448, four times that above (the knee);
    sizes over 900 make every infer raise (a value the model rejects)."""

    shape: Literal["staged"] = "staged"

    def __init__(self, options: dict[str, Any]) -> None:
        self.size = int(options["size"])
        self._stop = threading.Event()

    def setup(self) -> None:
        return None

    def preprocess(self, frame: Frame) -> Any:
        return frame.id

    def infer(self, inputs: Any) -> Any:
        if self.size > 900:
            raise ValueError(f"input size {self.size} exceeds the model's maximum")
        per = 0.02 if self.size <= 448 else 0.08
        self._stop.wait(per * self.size / 1000)
        return inputs

    def decode(self, outputs: Any) -> StageOutput:
        return StageOutput(text=f"size {self.size}", tokens=3)

    def sync(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"size": self.size}

    def close(self) -> None:
        self._stop.set()


def build_stepped(options: dict[str, Any], ctx: Any) -> Stepped:
    if int(options["size"]) <= 0:
        raise WorkloadError(f"size must be > 0, got {options['size']}")
    return Stepped(options)


@pytest.fixture
def stepped(synthetic: Callable[..., Settings]) -> Settings:
    return synthetic(
        "workload.kind='python'",
        "workload.factory='tests.test_sweep:build_stepped'",
        "workload.options={size = 224}",
    )


@pytest.mark.slow
def test_sweep_finds_the_knee_and_reports_rejected_values(
    stepped: Settings, tmp_path: Path
) -> None:
    """Sizes 224..672 with a step above 448: the knee is 560 and the usable range ends at
    448; a size the factory refuses and one whose infer raises are rejected with their
    reason and the sweep goes on; Markdown, JSON and SVG outputs are valid."""
    calls: list[tuple[int, int, Any]] = []
    r = sweep(
        stepped,
        "workload.options.size",
        [224, 336, 0, 448, 560, 999, 672],
        frames=6,
        progress=lambda d, n, v: calls.append((d, n, v)),
    )
    assert calls[0] == (0, 7, 224) and calls[-1] == (7, 7, None)
    status = {p.value: p.status for p in r.points}
    assert status == {
        224: "ok",
        336: "ok",
        0: "rejected",
        448: "ok",
        560: "ok",
        999: "rejected",
        672: "ok",
    }
    reasons = {p.value: p.reason for p in r.points}
    assert "size must be > 0" in (reasons[0] or "")
    assert "exceeds the model's maximum" in (reasons[999] or "")
    assert r.knee_index is not None and r.points[r.knee_index].value == 560
    assert r.usable_until == 448
    assert "usable range ends at workload.options.size=448" in r.summary
    ok = [p for p in r.points if p.status == "ok"]
    assert all(p.out_tokens == 3 and p.sample_output == f"size {p.value}" for p in ok)
    d = json.loads(r.to_json())
    assert d["schema"] == "soakd.sweep/1" and d["knee_index"] == r.knee_index
    md = r.to_markdown()
    assert md_tables_consistent(md) == 1 and "**knee**" in md
    svg = ET.fromstring(r.to_svg())
    names = {e.get("data-series") for e in svg.iter("{http://www.w3.org/2000/svg}path")}
    assert {"total p50", "infer p50", "pre p50"} <= names


@pytest.mark.slow
def test_fps_sweep_is_paced_and_knee_is_the_first_dropping_rate(
    synthetic: Callable[..., Settings],
) -> None:
    """Sweeping run.fps runs each point paced; a rate far above what a 40 ms infer holds
    drops frames and is the knee, the rate below it ends the usable range."""
    s = synthetic(
        "workload.infer_ms=40", "workload.jitter=0", "workload.pre_ms=0", "workload.decode_ms=0"
    )
    r = sweep(s, "run.fps", [5, 100], frames=8)
    assert r.paced and r.knee_metric == "drop_fraction"
    slow, fast = r.points
    assert slow.drop_fraction == 0
    assert fast.drop_fraction is not None and fast.drop_fraction > 0.3
    assert r.knee_index == 1 and r.usable_until == 5
    assert md_tables_consistent(r.to_markdown()) == 1


@pytest.mark.slow
def test_cli_sweep_writes_json_and_plot_and_rejects_unknown_key(tmp_path: Path) -> None:
    """`soakd sweep --format json -o --plot` writes valid JSON and SVG; an unknown key
    exits 2 naming it."""
    db, out, plot = tmp_path / "s.db", tmp_path / "s.json", tmp_path / "s.svg"
    base = ["--db", str(db), "--set", "workload.kind=synthetic", "--frames", "4"]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "soakd",
            "sweep",
            "--vary",
            "workload.infer_ms=2,-1,6",
            *base,
            "--format",
            "json",
            "-o",
            str(out),
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert [p["status"] for p in d["points"]] == ["ok", "rejected", "ok"]
    assert "must be >= 0" in d["points"][1]["reason"]
    ET.fromstring(plot.read_text())
    r = subprocess.run(
        [sys.executable, "-m", "soakd", "sweep", "--vary", "workload.bogus=1,2", *base],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 2 and "workload.bogus" in r.stderr


@pytest.mark.model
@pytest.mark.slow
def test_sweep_of_the_real_tiny_model_over_input_sizes(tmp_path: Path) -> None:
    """The tiny VLM sweeps over input short sides; each point is profiled (or rejected with
    a reason), preprocessing is timed, outputs are valid."""
    from soakd.config import load_settings

    s = load_settings(
        overrides=[
            f"run.db={str(tmp_path / 'm.db')!r}",
            "run.log_every=0",
            "workload.kind=tiny-vlm",
            "workload.arch=llava",
            f"workload.cache_dir={str(tmp_path / 'cache')!r}",
        ]
    )
    r = sweep(s, "workload.short_side", [28, 56, 84], frames=4)
    ok = [p for p in r.points if p.status == "ok"]
    assert len(ok) >= 2, [p.reason for p in r.points]
    assert all((p.pre_median_ms or 0) > 0 and (p.infer_median_ms or 0) > 0 for p in ok)
    assert all(isinstance(p.sample_output, str) for p in ok)
    assert "workload.max_new_tokens" in r.held_fixed
    json.loads(r.to_json())
    assert md_tables_consistent(r.to_markdown()) == 1
    ET.fromstring(r.to_svg())


@pytest.mark.slow
def test_a_peak_memory_dash_says_why(tmp_path: Path) -> None:
    """A point whose frames all ran inside one telemetry interval has no peak RSS: the
    sweep's Markdown and JSON say so, naming the point and the interval; a point long
    enough to be sampled gets its peak, and a CPU workload's missing GPU peak is named."""
    base = ["--db", str(tmp_path / "s.db"), "--set", "workload.kind=synthetic"]
    vary = ["--vary", "workload.infer_ms=1,450", "--frames", "3"]
    sets = ["--set", "run.sample_interval_ms=1000"]
    r = subprocess.run(
        [sys.executable, "-m", "soakd", "sweep", *vary, *base, *sets, "-f", "json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    fast, slow = d["points"]
    assert fast["peak_rss_bytes"] is None and slow["peak_rss_bytes"] > 0
    assert d["notes"][0].startswith("peak RSS and GPU – at workload.infer_ms=1: no telemetry")
    assert "run.sample_interval_ms = 1000 ms" in d["notes"][0]
    assert d["notes"][1].startswith("peak GPU –: no GPU memory was sampled")
    md = subprocess.run(
        [sys.executable, "-m", "soakd", "sweep", *vary, *base, *sets, "-f", "md"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    ).stdout
    assert re.search(r"\| 1 \| ok( \(host busy\))? \|", md)
    assert "Note: peak RSS and GPU – at workload.infer_ms=1:" in md


def _sweep_of(*points: tuple[int, float, float], busy: bool = False) -> SweepResult:
    host = {"contended": busy}
    pts = [
        SweepPoint(v, "ok", total_median_ms=m, total_iqr_ms=iqr, host=host) for v, m, iqr in points
    ]
    return SweepResult("k", [p.value for p in pts], 8, False, pts, "total_median_ms", None)


@pytest.mark.parametrize(
    ("b_median", "b_iqr", "flagged"),
    [(8.9, 0.0, True), (9.1, 0.0, False), (7.0, 5.0, True), (7.0, 6.2, False)],
)
def test_a_fall_is_non_monotone_only_beyond_both_the_spread_and_a_tenth_of_the_p50(
    b_median: float, b_iqr: float, flagged: bool
) -> None:
    """A point whose total p50 is below the one before it is non-monotone only when the fall
    exceeds their spread (half their IQRs added) and a tenth of the earlier p50."""
    r = _sweep_of((1, 10.0, 0.0), (2, b_median, b_iqr))
    assert r.non_monotone == ([(1, 2)] if flagged else [])


@pytest.mark.parametrize(("b_median", "flagged"), [(7.4, True), (7.6, False)])
def test_a_fall_between_points_of_a_busy_host_is_non_monotone_only_beyond_a_quarter(
    b_median: float, flagged: bool
) -> None:
    """Where other processes held the host at a point, a fall is non-monotone only beyond a
    quarter of the earlier p50 (a shared scheduler moves a few frames' median further)."""
    r = _sweep_of((1, 10.0, 0.0), (2, b_median, 0.0), busy=True)
    assert r.non_monotone == ([(1, 2)] if flagged else [])


def test_a_sweep_beside_busy_cpus_flags_its_points_and_a_fall_beyond_noise(
    tmp_path: Path,
) -> None:
    """A sweep run while two CPU spinners hold the host marks every point 'host busy' with a
    note; a point cheaper than the smaller value before it by more than their spread is
    flagged non-monotone and no knee or usable range is read from it. Its SVG marks each
    point and has a tick at the first value."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        r = subprocess.run(
            [sys.executable, "-m", "soakd", "sweep", "--vary", "workload.options.size=28,56,112",
             "--frames", "8", "--db", str(tmp_path / "s.db"), "-f", "json",
             "--plot", str(tmp_path / "s.svg"), "--set", 'workload.kind="python"',
             "--set", 'workload.factory="tests.sweep_workloads:cheaper_when_larger"',
             "--set", "workload.options.size=28"],
            capture_output=True, text=True, cwd=REPO, timeout=180,
        )  # fmt: skip
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [p["host_busy"] for p in d["points"]] == [True, True, True]
    assert all(p["host"]["others_cpu_pct"] >= 50 for p in d["points"])
    assert d["non_monotone"] == [[28, 56]]
    assert d["knee_index"] is None and d["usable_until"] is None
    assert d["summary"].startswith("no knee read: total p50 at workload.options.size=56 is")
    notes = d["notes"]
    assert any(n.startswith("host busy at workload.options.size=28, 56, 112") for n in notes)
    assert any(n.startswith("not monotone: total p50 at workload.options.size=56") for n in notes)
    svg = (tmp_path / "s.svg").read_text()
    marks = re.findall(r'<g class="markers" data-series="total p50"[^>]*>(.*?)</g>', svg)
    assert len(marks) == 1 and marks[0].count("<circle") == 3
    ticks = re.findall(r'<text x="[\d.]+" y="[\d.]+" text-anchor="middle">([^<]+)</text>', svg)
    assert ticks[:3] == ["28", "56", "112"]
