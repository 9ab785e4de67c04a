"""Issue 35's mutants of stopping a run early and ``run.duration = "auto"``: the looks'
alpha spending and its bookkeeping, each early_fail boundary, which events mean decided,
stopped or an early stop confirmed. Each names, by node id, the pins of
tests/test_pins_early.py (or the existing unit tests) that state its rule, so that each runs
seconds of tests; the (#22) and (#31) mutants in verdict.py are not repeated.
`--only "(#35 early)"` runs these."""

from __future__ import annotations

from bench.mutants.base import Mutant

P = "tests/test_pins_early.py::"
#: the pins each mutant must fail (node ids: each mutant runs only the tests of its rule)
L1 = "test_each_criterion_looks_every_every_s_from_the_warm_up_s_end_until_the_planned_end"
L2 = "test_a_look_spends_the_pocock_increment_since_its_last_and_the_looks_add_up"
W64 = "test_a_look_tests_at_most_64_windows_however_long_the_run"
DROPS = "test_drops_stop_a_run_past_max_drop_fraction_of_the_planned_run_s_ticks"
ERRS = "test_errors_stop_a_run_past_max_errors_and_never_on_the_warm_up_s"
OOMS = "test_the_torch_oom_counter_stops_a_run_on_its_rise_not_its_first_reading"
JIT = "test_jitter_stops_a_run_past_the_allowance_of_the_planned_run_not_of_the_frames_so_far"
FEW = "test_a_look_on_too_few_windows_to_test_stops_nothing"
MEM_ALPHA = "test_a_memory_look_tests_the_leak_at_the_alpha_spent_by_then_not_the_full_alpha"
UNDEC = "test_an_auto_run_undecided_at_max_duration_is_invalid_and_names_what_it_waited_on"
CUT = "test_an_early_stopped_auto_run_is_fail_confirmed_and_never_reads_as_decided"
FAILING = "test_a_look_shows_a_failing_criterion_as_failing"
LOOKS = "test_an_auto_run_looks_from_min_duration_s_on_and_an_undecided_look_stops_nothing"
DECIDES = "test_a_decided_look_stores_when_and_stops_the_run_once"
SOAK = "test_an_auto_soak_stopped_early_is_aborted_fail_and_not_decided"
CR = "soakd/analysis/criteria/"
EC = "tests/test_early_contention.py::"
BASE = CR + "base.py"
VALIDITY = CR + "validity.py"
AUTO = "soakd/run/auto_duration.py"
EARLY = "soakd/run/early_stop.py"
AUTO_UNIT = "tests/test_auto_duration.py::"
#: the unit tests of test_auto_duration.py that pin undecided trends (no soak)
UNDECIDED = (
    AUTO_UNIT + "test_a_look_waits_on_every_criterion_that_is_not_pass_but_the_run_itself",
    AUTO_UNIT + "test_a_flat_but_noisy_trend_passes_a_fixed_run_and_is_undecided_in_an_auto_one",
    AUTO_UNIT + "test_a_run_stopped_as_decided_is_not_undecided_by_the_second_after_the_look",
)

#: the criteria a running auto run waits on (``criteria.base.undecided``)
WAITS = 'return [name for name, status in statuses if name != "run" and status not in (PASS, NA)]'

MUTANTS: tuple[Mutant, ...] = (
    # the alpha spending and its bookkeeping (criteria/base.py)
    Mutant("a look's record of the alpha spent not updated (#35 early)", BASE,
           "        self.looked[name] = self.fraction\n", "", (P + L1, P + L2)),
    Mutant("a look tested at all the alpha spent so far, not its increment (#35 early)", BASE,
           "return max(spent(alpha, fraction) - spent(alpha, previous), 0.0)",
           "return spent(alpha, fraction)", (P + L2,)),
    Mutant("the spending function spends linearly, not Pocock's (#35 early)", BASE,
           "    return alpha * math.log1p((math.e - 1.0) * t)", "    return alpha * t", (P + L2,)),
    Mutant("the spending function not clamped to the planned run (#35 early)", BASE,
           "    t = min(max(fraction, 0.0), 1.0)\n", "    t = fraction\n", (P + L2,),
           equivalent="spent() is called only by look_alpha, only from Live.look, whose "
           "fractions (Live.fraction) are already clamped to [0, 1)"),
    Mutant("a look's alpha increment not floored at 0 (#35 early)", BASE,
           "return max(spent(alpha, fraction) - spent(alpha, previous), 0.0)",
           "return spent(alpha, fraction) - spent(alpha, previous)", (P + L2,),
           equivalent="Live.look records the fraction it looked at, and the run's elapsed "
           "time only grows: a look's fraction is never below its previous one, and spent() "
           "rises, so the increment is never negative"),
    Mutant("a look's spacing counted from the run's start, not its last look (#35 early)",
           BASE, "if (self.fraction - prev) * (self.planned_s - self.t0) < every_s:",
           "if self.fraction * (self.planned_s - self.t0) < every_s:", (P + L1,)),
    Mutant("a look exactly every_s after the last one refused (#35 early)", BASE,
           "if (self.fraction - prev) * (self.planned_s - self.t0) < every_s:",
           "if (self.fraction - prev) * (self.planned_s - self.t0) <= every_s:", (P + L1,)),
    Mutant("a look made at or past the planned end (#35 early)", BASE,
           "if self.t0 is None or self.fraction >= 1.0:", "if self.t0 is None:", (P + L1,)),
    Mutant("a look's record shared by every criterion (#35 early)", BASE,
           "prev = self.looked.get(name, 0.0)", "prev = max(self.looked.values(), default=0.0)",
           (P + L1,)),
    Mutant("the fraction of the run counted from time zero, not the warm-up (#35 early)",
           BASE, "return min(max((self.now - self.t0) / (self.planned_s - self.t0), 0.0), 1.0)",
           "return min(max(self.now / self.planned_s, 0.0), 1.0)", (P + L1, P + L2)),
    Mutant("the planned ticks of one stream only (#35 early)", BASE,
           "return self.streams * (self.fps * max(self.planned_s - t0, 0.0) + 1.0)",
           "return self.fps * max(self.planned_s - t0, 0.0) + 1.0", (P + DROPS,)),
    Mutant("the planned ticks counting the warm-up's (#35 early)", BASE,
           "return self.streams * (self.fps * max(self.planned_s - t0, 0.0) + 1.0)",
           "return self.streams * (self.fps * self.planned_s + 1.0)", (P + DROPS,)),
    Mutant("the planned ticks without the window's edge tick (#35 early)", BASE,
           "return self.streams * (self.fps * max(self.planned_s - t0, 0.0) + 1.0)",
           "return self.streams * (self.fps * max(self.planned_s - t0, 0.0) + 0.0)", (P + DROPS,)),
    Mutant("a look thins its windows to more than LOOK_MAX_WINDOWS (#35 early)", BASE,
           "    g = -(-n // most)\n", "    g = max(n // most, 1)\n", (P + W64,)),
    Mutant("a look tests ten times as many windows (#35 early)", BASE,
           "LOOK_MAX_WINDOWS = 64\n", "LOOK_MAX_WINDOWS = 640\n", (P + W64,)),
    # which events mean decided (criteria/base.py, validity.py)
    Mutant("an early-stopped auto run's trends counted as decided (#35 early)", BASE,
           "return any(e.get(\"kind\") == DECIDED_EVENT for e in self.data.events)",
           "return any(e.get(\"kind\") in (DECIDED_EVENT, EARLY_STOP_EVENT)"
           " for e in self.data.events)", (P + CUT,)),
    Mutant("an early-stopped auto run reads 'decided after' (#35 early)", VALIDITY,
           "        if e.get(\"kind\") == DECIDED_EVENT:",
           "        if e.get(\"kind\") in (DECIDED_EVENT, \"early_stop\"):", (P + CUT, P + SOAK)),
    Mutant("'decided after' read from the event's time, not its after_s (#35 early)", VALIDITY,
           "return float(data.get(\"after_s\", e.get(\"t\") or 0.0)), detect",
           "return float(e.get(\"t\") or 0.0), detect", (P + DECIDES,),
           equivalent="AutoDuration stores the decided event at t = elapsed with after_s = "
           "elapsed: the two are the same number"),
    Mutant("an auto run's decided event ignored by the verdict (#35 early)", BASE,
           "    if not ctx.auto or ctx.decided:", "    if not ctx.auto:", UNDECIDED),
    Mutant("a tested trend decided whatever it could detect (#35 early)", BASE,
           "if call.how == \"trend\" and math.isfinite(mds) and mds <= tol:",
           "if call.how == \"trend\":", UNDECIDED),
    Mutant("a look waits on the run's own validity (#35 early)", BASE,
           WAITS,
           "return [name for name, status in statuses if status not in (PASS, NA)]", UNDECIDED),
    Mutant("a look waits on an n/a criterion (#35 early)", BASE,
           WAITS,
           "return [name for name, status in statuses if name != \"run\" and status != PASS]",
           UNDECIDED),
    Mutant("an undecided auto run's convergence not named (#35 early)", VALIDITY,
           "still = [c.criterion for c in v.invalid if c.detail.startswith(\"undecided\")]",
           "still = []", (P + UNDEC,)),
    # run.duration = "auto" (run/auto_duration.py)
    Mutant("an auto run looks before criteria.min_duration_s (#35 early)", AUTO,
           "self._next = float(crit.min_duration_s)", "self._next = 0.0", (P + LOOKS,)),
    Mutant("an auto run's looks come at the shorter spacing (#35 early)", AUTO,
           "max(LOOK_MIN_S, LOOK_SHARE * progress.elapsed_s)",
           "min(LOOK_MIN_S, LOOK_SHARE * progress.elapsed_s)", (P + LOOKS,)),
    Mutant("a look stores decided while criteria still wait (#35 early)", AUTO,
           "if self.waiting or not rows:", "if not rows:", (P + LOOKS,)),
    Mutant("a look that judged nothing stores decided (#35 early)", AUTO,
           "if self.waiting or not rows:", "if self.waiting:", (P + LOOKS,),
           equivalent="every judgement holds the run's own validity row: a look's rows are "
           "never empty"),
    Mutant("'decided after' the next look's time, not this one's (#35 early)", AUTO,
           "data: dict[str, Any] = {\"after_s\": elapsed,",
           "data: dict[str, Any] = {\"after_s\": self._next,", (P + DECIDES,)),
    Mutant("a decided look does not stop the run (#35 early)", AUTO,
           "        self._event(Event(DECIDED_EVENT, elapsed, time.time(), msg, data=data))\n"
           "        self._stop()\n",
           "        self._event(Event(DECIDED_EVENT, elapsed, time.time(), msg, data=data))\n",
           (P + DECIDES,)),
    Mutant("a failing criterion shown decided at a look (#35 early)", AUTO,
           "state = {PASS: DECIDED, NA: DECIDED, FAIL: FAILING}",
           "state = {PASS: DECIDED, NA: DECIDED, FAIL: DECIDED}", (P + FAILING,)),
    # the running criteria (criteria/*.py: early_fail) and the observer that asks them
    Mutant("errors stop a run at max_errors, not past it (#35 early)", CR + "errors.py",
           "if live.errors > crit.max_errors:", "if live.errors >= crit.max_errors:", (P + ERRS,)),
    Mutant("the early drop stop judged against the frames seen so far (#35 early)",
           CR + "drops.py", "    most = live.planned_ticks()\n",
           "    most = live.rows + live.dropped\n", (P + DROPS,)),
    Mutant("drops stop a run at max_drop_fraction, not past it (#35 early)", CR + "drops.py",
           "if most > 0 and live.lost > crit.max_drop_fraction * most:",
           "if most > 0 and live.lost >= crit.max_drop_fraction * most:", (P + DROPS,)),
    Mutant("drops before the warm-up's end counted by the early stop (#35 early)", EARLY,
           "sum(d - base.get(s, (0, 0))[0] for s, (d, _) in last)",
           "sum(d for s, (d, _) in last)", (P + DROPS,)),
    Mutant("warm-up frames' errors counted by the early stop (#35 early)", EARLY,
           "if rec.warmup or live.t0 is None or rec.t_capture < live.t0:",
           "if live.t0 is None:", (P + ERRS,)),
    Mutant("the torch OOM counter's first reading counted as OOMs (#35 early)", EARLY,
           "            self._ooms_at = float(v)\n", "            self._ooms_at = 0.0\n",
           (P + OOMS,)),
    Mutant("an early stop names its reason, not its criterion (#35 early)", EARLY,
           "data = {\"criterion\": found.criterion, \"t\": progress.elapsed_s}",
           "data = {\"criterion\": found.reason, \"t\": progress.elapsed_s}",
           (P + ERRS, P + DROPS)),
    Mutant("an early stop ends the run completed, not aborted (#35 early)",
           "soakd/run/runner.py",
           "*watch_early_stop(settings, self._event, self.request_stop),",
           "*watch_early_stop(settings, self._event, lambda r: self.request_stop()),", (P + SOAK,)),
    Mutant("an untested memory floor stops a run (#35 early)", CR + "memory.py",
           "            if res.status == FAIL:\n                at = f\"alpha",
           "            if res.status != PASS:\n                at = f\"alpha", (P + FEW,)),
    Mutant("a memory look tested at the full alpha (#35 early)", CR + "memory.py",
           "look = crit.model_copy(update={\"alpha\": alpha, \"floor_window_s\": window})",
           "look = crit.model_copy(update={\"floor_window_s\": window})",
           (P + MEM_ALPHA,)),
    Mutant("an untested server queue stops a run (#35 early)", CR + "server_queue.py",
           "    if res.status != FAIL:\n        return None",
           "    if res.status == PASS:\n        return None", (P + FEW,)),
    Mutant("an untested stage trend stops a run (#31 early)", CR + "stage_trend.py",
           "    if res.status != FAIL:\n        return None\n    at = f\"alpha",
           "    if res.status == PASS:\n        return None\n    at = f\"alpha",
           (EC + "test_a_stage_look_on_too_few_windows_to_test_stops_nothing",)),
    Mutant("the stage_trend look never stops a run (#31 early)", CR + "stage_trend.py",
           "    if res.status != FAIL:\n        return None\n    at = f\"alpha",
           "    if True:\n        return None\n    at = f\"alpha",
           (EC + "test_a_stage_slowing_toward_the_frame_budget_stops_the_run_on_a_quiet_host",)),
    Mutant("jitter's allowance of the frames seen so far, not the planned run (#35 early)",
           CR + "jitter.py", "allowed = jitter_allowed(crit, int(live.planned_ticks()))",
           "allowed = jitter_allowed(crit, live.rows)", (P + JIT,)),
    Mutant("an early stop confirmed FAIL without '(stopped early)' (#35 early)",
           "soakd/analysis/verdict.py", "{cut.detail} (stopped early)\"", "{cut.detail}\"",
           (P + CUT, P + SOAK)),
    Mutant("numpy's small-buffer cache left to fill during the run (#31 early)",
           "soakd/run/early_stop.py", "    _rehearse(crit, asked)\n    _fill_numpy_cache()\n",
           "    _rehearse(crit, asked)\n",
           ("tests/test_look_memory.py",)),
)  # fmt: skip
