"""Diagnosis hints name a cause only when its evidence is in the data: which side lost the
ticks (source, machine, model), and what infer spikes coincide with."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.analysis import RunData, judge
from soakd.config import CriteriaSettings

from .conftest import SYNTH_CLI, soakd_cmd
from .test_verdict import MIB, planted

NCPU = os.cpu_count() or 1

CRIT = CriteriaSettings()


def _summary(d: RunData, **over: float) -> dict[str, Any]:
    n = d.n_frames
    s: dict[str, Any] = {
        "frames_captured": n,
        "drops": 0,
        "stale": 0,
        "queued_at_end": 0,
        "in_flight_at_end": 0,
        "pacer_missed_ticks": 0,
        "missed_ticks_source": 0,
        "missed_ticks_pause": 0,
    }
    s.update(over)
    return s


def _missed(source: int, pause: int) -> list[str]:
    d = planted(dur=20.0, fps=20.0, warm=2.0)
    d.meta.summary = _summary(
        d, pacer_missed_ticks=source + pause, missed_ticks_source=source, missed_ticks_pause=pause
    )
    return judge(d, CRIT).hints


def test_missed_ticks_from_slow_reads_blame_the_source() -> None:
    """Ticks missed because a read took a whole period: the source is the bottleneck, and
    neither the machine nor the model is named."""
    hints = _missed(source=306, pause=0)
    assert any("the source is the bottleneck" in h and "306" in h for h in hints)
    assert not any("machine is the bottleneck" in h or "model is" in h for h in hints)


def test_missed_ticks_from_a_pause_blame_the_machine() -> None:
    """Ticks missed while the process did not run (SIGSTOP): the machine, not the source."""
    hints = _missed(source=0, pause=199)
    assert any("the machine is the bottleneck" in h and "199" in h for h in hints)
    assert not any("source is the bottleneck" in h for h in hints)


def test_frames_lost_in_the_queue_blame_the_model() -> None:
    """Frames captured but dropped or left queued: the model is the bottleneck."""
    d = planted(dur=20.0, fps=20.0, warm=2.0)
    n = d.n_frames
    d.meta.summary = _summary(d, frames_captured=n + 64, queued_at_end=64)
    hints = judge(d, CRIT).hints
    assert any("the model is the bottleneck for 64" in h for h in hints)
    assert not any("source is" in h or "machine is" in h for h in hints)


def test_a_healthy_run_names_no_bottleneck() -> None:
    """Nothing lost: no bottleneck hint at all."""
    d = planted(dur=60.0)
    d.meta.summary = _summary(d)
    assert not any("bottleneck" in h for h in judge(d, CRIT).hints)


def test_jitter_hints_do_not_blame_memory_when_rss_is_flat() -> None:
    """Random infer spikes with a flat RSS and no allocator release near them: no hint says
    memory pressure (the evidence does not show it), and none claims contention."""

    def spikes(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(rng.normal(0, 0.05, t.size))
        y[rng.choice(t.size, 60, replace=False)] *= 8
        return y

    v = judge(planted(infer=spikes), CRIT)
    assert v.get("jitter").status == "fail"  # type: ignore[union-attr]
    assert not any("memory pressure" in h for h in v.hints), v.hints
    assert not any("contention" in h and "look for" not in h for h in v.hints), v.hints
    assert any("shows no cause" in h for h in v.hints)


def _spikes_at_releases(host_used: float) -> list[str]:
    """Infer spikes within a second of an RSS sawtooth's sharp drops, the host's memory
    ``host_used`` of its 16 GiB total in use: the hints."""
    period = 7.0

    def rss(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + 300 * MIB * ((t % period) / period) + rng.normal(0, 0.1 * MIB, t.size)

    def spikes(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(rng.normal(0, 0.05, t.size))
        at = (t % period) < 0.2  # right after each release
        y[at & (rng.random(t.size) < 0.3)] *= 8
        return y

    d = planted(rss=rss, infer=spikes)
    total = 16 * 1024 * MIB
    d.samples["sys_mem_total_bytes"] = np.full(d.samples["t"].size, float(total))
    d.samples["sys_mem_used_bytes"] = np.full(d.samples["t"].size, host_used * total)
    v = judge(d, CRIT)
    assert v.get("jitter").status == "fail"  # type: ignore[union-attr]
    return v.hints


def test_spikes_at_allocator_releases_near_the_memory_limit_are_called_memory_pressure() -> None:
    """Infer spikes within a second of the sawtooth's sharp drops with the host's memory 95 %
    used: memory pressure, with the figure."""
    hints = _spikes_at_releases(0.95)
    assert any("memory pressure" in h and "host memory 95% used" in h for h in hints), hints


def test_spikes_at_allocator_releases_far_from_any_limit_are_not_memory_pressure() -> None:
    """The same spikes at allocator releases with the host's memory 40 % used (no cgroup,
    no GPU): no hint says memory pressure; the release work itself is named."""
    hints = _spikes_at_releases(0.40)
    assert not any("memory pressure" in h for h in hints), hints
    assert any("the allocator's own release work" in h for h in hints), hints


def test_a_failing_headroom_is_never_said_to_grow() -> None:
    """Random infer spikes beside a failing memory headroom and a rising RSS: no hint says
    headroom grows (headroom is not a growth), and memory is not called steady."""

    def spikes(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(rng.normal(0, 0.05, t.size))
        y[rng.choice(t.size, 60, replace=False)] *= 8
        return y

    def leak(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + 5 * MIB * t / 60 + rng.normal(0, 0.1 * MIB, t.size)

    d = planted(infer=spikes, rss=leak)
    d.meta.environment = {"host_mem_total_bytes": 500 * MIB}
    v = judge(d, CRIT)
    assert v.get("memory_headroom").status == "fail"  # type: ignore[union-attr]
    assert not any("headroom" in h.lower() and "grow" in h for h in v.hints), v.hints
    assert not any("memory steady" in h for h in v.hints), v.hints


def test_spikes_beside_a_significant_slope_under_the_tolerance_do_not_call_memory_steady() -> None:
    """Random infer spikes while RSS creeps 0.6 MB/min (significant, under the 1.5 MB/min
    tolerance: memory_rss passes): the no-cause hint quotes the slope, not "memory steady"."""

    def spikes(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(rng.normal(0, 0.05, t.size))
        y[rng.choice(t.size, 60, replace=False)] *= 8
        return y

    def creep(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return 400 * MIB + 0.6 * MIB * t / 60 + rng.normal(0, 0.05 * MIB, t.size)

    v = judge(planted(infer=spikes, rss=creep), CRIT)
    rss = v.get("memory_rss")
    assert rss is not None and rss.status == "pass" and rss.evidence["p_value"] < 0.01
    assert not any("memory steady" in h for h in v.hints), v.hints
    assert any("shows no cause" in h and "RSS rising 0.5" in h for h in v.hints), v.hints


def test_spikes_periodic_in_time_but_not_in_frame_ids_are_called_periodic() -> None:
    """A spike every 2 s on a run whose frame rate wanders (the capture times jitter by up
    to half a period, so the spikes' frame ids are irregular): the hint says they recur
    every 2 s, periodic work."""
    rng = np.random.default_rng(5)
    steps = rng.uniform(0.5, 1.5, 18_000) / 30
    t = np.cumsum(steps)
    t = t[t < 600]

    def spikes(tt: np.ndarray, r: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(r.normal(0, 0.05, tt.size))
        beat = np.searchsorted(tt, np.arange(6, 600, 2.0))
        y[beat[beat < tt.size]] *= 8
        return y

    d = planted(infer=spikes, t_capture=t)
    for k, col in list(d.frames.items()):
        if k != "t_capture" and col.size != t.size:
            d.frames[k] = col[: t.size]
    d.frames["warmup"] = (t < 5).astype(float)
    d.frames["infer_ms"] = spikes(t, rng)
    ev = judge(d, CRIT).get("jitter").evidence  # type: ignore[union-attr]
    assert not ev["tail_periodic"], ev  # frame ids alone do not show it
    hints = judge(d, CRIT).hints
    assert any("recur every 2 s" in h and "periodic work" in h for h in hints), hints


def test_an_infer_rise_with_rising_host_load_is_not_blamed_on_the_model() -> None:
    """Infer time rising 2 ms/min while other processes' share of the host's CPUs rises from
    10 % to 90 %: the hint says host load can explain it, not that the model slows down;
    with the host quiet throughout, the model is said to slow down."""

    def slower(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return (20 + 2 * t / 60) * np.exp(rng.normal(0, 0.02, t.size))

    def hints(rising: bool) -> list[str]:
        d = planted(infer=slower)
        d.meta.environment = {"cpu_count": 2}
        st = d.samples["t"]
        others = 10 + 80 * st / st.max() if rising else np.full(st.size, 10.0)
        d.samples["host_cpu_pct"] = others + d.samples["cpu_pct"] / 2
        return judge(d, CRIT).hints

    loaded = hints(rising=True)
    assert not any("the model itself slows down" in h for h in loaded), loaded
    assert any("host load can explain it" in h for h in loaded), loaded
    assert any("the model itself slows down" in h for h in hints(rising=False))


def test_a_served_model_too_slow_for_the_rate_names_the_server() -> None:
    """A served model (workload kind openai) whose median total exceeds the frame period:
    the rate hint names the model server, not this machine."""
    d = planted(fps=30.0, infer=lambda t, rng: 60 * np.exp(rng.normal(0, 0.05, t.size)))
    d.meta.workload_kind = "openai"
    hints = judge(d, CRIT).hints
    assert any(h.startswith("the frame rate exceeds what the model server sustains") for h in hints)
    assert not any("this machine sustains" in h for h in hints), hints


def _host_loaded_at_spikes(
    host_at_spikes: float, steal: float = 0.0, elsewhere: float = 15.0
) -> list[str]:
    """Random infer spikes; the host's CPU (every process on it) at ``host_at_spikes`` % in
    the ticks covering them and ``elsewhere`` % in the rest; soakd's own CPU 50 % of one of
    2 CPUs. The hints."""
    rng = np.random.default_rng(3)
    t = np.arange(0, 600, 1 / 30)
    hits = np.sort(rng.choice(t.size, 60, replace=False))

    def spikes(t: np.ndarray, _rng: np.random.Generator) -> np.ndarray:
        y = 20 * np.exp(_rng.normal(0, 0.05, t.size))
        y[hits] *= 8
        return y

    d = planted(infer=spikes)
    d.meta.environment = {"cpu_count": 2}
    st = d.samples["t"]
    near = np.zeros(st.size, bool)
    for lag in range(4):  # the ticks in the 0.4 s from the spike's capture: it ran then
        near[np.clip(np.searchsorted(st, t[hits]) + lag, 0, st.size - 1)] = True
    d.samples["host_cpu_pct"] = np.where(near, host_at_spikes, elsewhere)
    d.samples["host_steal_pct"] = np.where(near, steal, 0.0)
    d.samples["host_run_queue"] = np.where(near, 6.0, 1.0)
    v = judge(d, CRIT)
    assert v.get("jitter").status == "fail"  # type: ignore[union-attr]
    return v.hints


def test_spikes_while_other_processes_load_the_host_name_host_load_with_its_figures() -> None:
    """Spikes in ticks where the host's CPUs are 95 % busy (70 % of them other processes',
    soakd's own 50 % of one core being 25 % of two) and 15 % elsewhere: the hint names host
    load as their cause, with the share, the CPU count and the run queue."""
    hints = _host_loaded_at_spikes(95.0)
    host = [h for h in hints if "host load" in h]
    assert len(host) == 1, hints
    assert host[0].startswith("spikes coincide with host load"), host
    assert "70 % of the host's 2 CPUs busy" in host[0] and "run queue 6" in host[0], host
    assert not any("shows no cause" in h for h in hints), hints


def test_a_host_loaded_throughout_is_named_but_not_as_the_spikes_cause() -> None:
    """The host as busy in the rest of the run as at the spikes (95 % throughout): the
    hint says host load throughout, with its figures, that contention may add to the
    spikes, and no hint after it says the telemetry shows no cause."""
    hints = _host_loaded_at_spikes(95.0, elsewhere=95.0)
    host = [h for h in hints if "host load" in h]
    assert len(host) == 1 and host[0].startswith("host load throughout the run"), hints
    assert "70 % of the host's 2 CPUs busy" in host[0], host
    assert not any("shows no cause" in h for h in hints), hints


def test_spikes_on_a_quiet_host_do_not_blame_host_load() -> None:
    """Spikes in ticks where other processes keep the host 40 % busy (under half of its
    CPUs): no host-load hint; the telemetry shows no cause."""
    hints = _host_loaded_at_spikes(40.0 + 25.0)
    assert not any("host load" in h or "steal" in h for h in hints), hints
    assert any("shows no cause" in h for h in hints), hints


def test_spikes_under_cpu_steal_name_the_hypervisor() -> None:
    """A quiet host whose hypervisor steals 12 % of the CPUs in the ticks of the spikes:
    the hint names CPU steal with its figure."""
    hints = _host_loaded_at_spikes(30.0, steal=12.0)
    assert any(h.startswith("spikes coincide with CPU steal") and "took 12 %" in h for h in hints)


_HOG = "import time\nend = time.monotonic() + 2.5\nwhile time.monotonic() < end: pass"


@pytest.mark.slow
def test_a_jitter_fail_under_a_real_cpu_hog_names_host_load(tmp_path: Path) -> None:
    """A real soak of a CPU-bound model (8 ms of its own CPU per infer, k = 1.5) with 2.5 s
    of spinning processes, three per CPU and two more, started in its middle: jitter FAILs
    and the printed diagnosis names host load with its figure, from the host telemetry
    sampled beside the run (as their cause on a quiet host; as load throughout the run on
    one the test suite already loads)."""
    db = tmp_path / "soakd.db"
    argv = soakd_cmd(
        "run", "--no-live", "--db", str(db), *SYNTH_CLI, "--duration", "9", "--fps", "20",
        "--set", "workload.cpu_bound=true", "--set", "workload.infer_ms=8",
        "--set", "workload.pre_ms=0", "--set", "workload.decode_ms=0",
        "--set", "workload.jitter=0.02", "--set", "criteria.jitter_k=1.5",
        "--set", "run.sample_interval_ms=100",
    )  # fmt: skip
    soak = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4.5)  # start-up and warm-up over: the hogs land in the measured window
    hogs = [subprocess.Popen([sys.executable, "-c", _HOG]) for _ in range(3 * NCPU + 2)]
    for h in hogs:
        h.wait(30)
    out, err = soak.communicate(timeout=60)
    # never PASS; INVALID beats FAIL where the starved run left another criterion unjudged
    assert soak.returncode in (1, 3), (out[-3000:], err[-2000:])
    with sqlite3.connect(db) as conn:
        jitter = conn.execute("SELECT status FROM verdicts WHERE criterion = 'jitter'").fetchone()
    assert jitter == ("fail",), out
    host = [line for line in out.splitlines() if "host load" in line]
    assert host and re.search(r"kept \d+ % of the host's \d+ CPUs busy", host[0]), out


def test_frames_dropped_while_the_host_is_contended_blame_the_host_not_the_model() -> None:
    """Frames dropped from the queue only in the second half of a run, where other
    processes hold 90 % of the host's 2 CPUs (10 % before): drops is INVALID for contention
    and the hint names the host as the bottleneck, not the model."""
    d = planted(dur=120.0, fps=30.0, warm=2.0)
    t = d.frames["t_capture"]
    lost = (t > 60) & (np.arange(t.size) % 5 == 0)  # a fifth of the second half's frames
    d.frames["drop_count"] = np.cumsum(lost).astype(float)
    n, dropped = d.n_frames, int(lost.sum())
    d.meta.summary = _summary(d, frames_captured=n + dropped, drops=dropped)
    d.meta.environment = {"cpu_count": 2}
    st = d.samples["t"]
    d.samples["host_cpu_pct"] = np.where(st > 60, 90.0, 10.0) + d.samples["cpu_pct"] / 2
    v = judge(d, CRIT)
    drops = v.get("drops")
    assert drops is not None and drops.status == "invalid", drops
    assert drops.detail.startswith("the host was contended"), drops.detail
    assert any(h.startswith("the host is the bottleneck") for h in v.hints), v.hints
    assert not any("the model is the bottleneck" in h for h in v.hints), v.hints
