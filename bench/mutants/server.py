"""Issue 35's mutants of the served model's server: the probe (soakd/telemetry/server.py:
who the server is, how its tree is summed, when it is followed or lost, the /metrics
scrape), its samples read back per lifetime (soakd/analysis/server.py), its memory judged per
lifetime (soakd/analysis/criteria/memory.py) and its queue (server_queue). Each names the
fast tests that must catch it (tests/test_pins_server.py, and single fast tests of
tests/test_server_telemetry.py and tests/test_server_followed.py by node id)."""

from __future__ import annotations

from bench.mutants.base import Mutant

PINS = "tests/test_pins_server.py::"
TEL = "tests/test_server_telemetry.py::"
FOL = "tests/test_server_followed.py::"

PROBE = "soakd/telemetry/server.py"
PROCFS = "soakd/telemetry/procfs.py"
LIFE = "soakd/analysis/server.py"
MEM = "soakd/analysis/criteria/memory.py"
QUEUE = "soakd/analysis/criteria/server_queue.py"
BASE = "soakd/analysis/criteria/base.py"
EARLY = "soakd/run/early_stop.py"
STORE = "soakd/store/server_metrics.py"

# the tests, by what they pin
NESTED = PINS + "test_the_server_s_rss_sums_every_descendant_not_only_its_children"
LATER = PINS + "test_a_worker_started_later_is_counted_within_a_few_refresh_periods"
LOST_TWICE = PINS + "test_a_server_lost_then_replaced_then_lost_again_says_so_each_time"
REUSED = PINS + "test_a_new_process_given_the_server_s_pid_is_a_replacement_not_the_server"
SCRAPE = PINS + "test_each_scrape_reads_the_page_anew_never_the_last_tick_s_rows"
STEP = PINS + "test_each_lifetime_is_judged_alone_so_a_step_at_the_replacement_is_no_leak"
LEAKS = PINS + "test_any_lifetime_that_leaks_fails_and_the_steepest_leak_is_reported"
OWN_WARMUP = FOL + "test_a_server_that_took_over_has_a_warm_up_of_its_own"
EACH_LOOK = FOL + "test_an_early_look_judges_each_server_process_alone"
LOST = PINS + "test_a_lost_server_is_invalid_never_a_pass_on_the_dead_process_s_samples"
LATE = PINS + "test_the_last_server_decides_only_when_it_lived_12_floor_windows"
NEVER = PINS + "test_a_served_run_whose_server_was_never_sampled_is_invalid"
WARM = PINS + "test_the_server_s_warmup_is_out_of_its_memory_evidence"
RISING = PINS + "test_a_queue_rising_faster_than_its_tolerance_per_minute_fails"
Q_WARM = PINS + "test_the_queue_s_warmup_is_out_of_its_evidence"
KV = PINS + "test_a_rising_kv_cache_fails_though_the_waiting_queue_is_flat"
MEDIANS = PINS + "test_the_queue_trend_is_of_window_medians_not_floors"
SUMMED = TEL + "test_rss_is_summed_over_the_server_and_all_its_children"
ZOMBIE = TEL + "test_a_server_that_dies_mid_run_leaves_its_keys_none_without_raising"
GPU = TEL + "test_gpu_memory_sums_the_server_s_processes_over_every_gpu"
GPU_NONE = TEL + "test_gpu_memory_is_none_when_nvml_fails_and_unsupported_is_not_asked_again"
LABELS = TEL + "test_rows_written_by_the_run_s_writer_load_back_per_name_summed_over_labels"
FOLLOW = FOL + "test_the_probe_follows_the_port_to_a_new_process_and_says_so"
HANDS = FOL + "test_a_port_that_changes_hands_is_followed_though_the_old_server_lives_on"
WALKS = FOL + "test_the_process_tree_is_not_walked_every_tick_yet_workers_are_followed"
UNLOADED = FOL + "test_server_changes_beyond_the_loaded_events_make_memory_invalid_not_pass"

MUTANTS: tuple[Mutant, ...] = (
    # -- the probe: how the tree is summed
    Mutant("only the server's direct children summed, not their workers (#35 server)", PROCFS,
           "            out += kids\n            todo += kids\n", "            out += kids\n",
           (NESTED,)),
    Mutant("the server's children not summed at all (#35 server)", PROBE,
           "        for pid in kids:\n", "        for pid in []:\n", (SUMMED,)),
    Mutant("the tree's RSS the largest process's, not the sum (#35 server)", PROBE,
           "rss, cpu = rss + r, cpu + c", "rss, cpu = max(rss, r), cpu + c", (SUMMED,)),
    Mutant("a worker started as another ended is left out of that tick (#35 server)", PROBE,
           "            if more is not None:\n", "            if False:\n", (NESTED,)),
    Mutant("a vanished worker does not list the tree again at once (#35 server)", PROBE,
           "                vanished = True\n", "                vanished = False\n",
           (NESTED, WALKS)),
    Mutant("the tree listed again every 30 s, not 2 s (#35 server)", PROBE,
           "TREE_REFRESH_S = 2.0", "TREE_REFRESH_S = 30.0", (LATER,)),
    Mutant("the tree listed again on every tick (#35 server)", PROBE,
           "self._next_refresh = time.monotonic() + TREE_REFRESH_S",
           "self._next_refresh = time.monotonic()", (WALKS,)),
    Mutant("another process's GPU memory counted as the server's (#35 server)", PROBE,
           "if p.pid in pids and p.usedGpuMemory is not None:",
           "if p.usedGpuMemory is not None:", (GPU,)),
    Mutant("only the root's GPU memory, not its workers' (#35 server)", PROBE,
           "self._gpu_bytes(set(self._procs))", "self._gpu_bytes({self.pid})", (GPU,)),
    Mutant("no GPU memory reported as 0 bytes, not None (#35 server)", PROBE,
           "return total if seen else None", "return total", (GPU_NONE,)),
    # -- the probe: who the server is, replaced, lost
    Mutant("an exited, unreaped server sampled as serving (#35 server)", PROBE,
           'return st.start == seen.start and st.state != "Z"', "return st.start == seen.start",
           (ZOMBIE,)),
    Mutant("a server that left its port sampled as still serving (#35 server)", PROBE,
           "and not self._still_listens(root, self.port))", "and False)", (HANDS,)),
    Mutant("a server lost said on every look, not once (#35 server)", PROBE,
           "            if not self._lost:\n", "            if True:\n", (LOST_TWICE,)),
    Mutant("a replacement's own loss never said (#35 server)", PROBE,
           "        self._adopt(found)\n        self._lost = False\n",
           "        self._adopt(found)\n", (LOST_TWICE,)),
    Mutant("server_replaced names the old and new pids swapped (#35 server)", PROBE,
           '"old_pid": old,\n                    "new_pid": found.pid,',
           '"old_pid": found.pid,\n                    "new_pid": old,', (FOLLOW,)),
    Mutant("a new process on the server's pid taken for the server (#35 server)", PROBE,
           "if found is not None and (found.pid, _created(found)) == (self.pid, self._born):",
           "if found is not None and found.pid == self.pid:", (REUSED,)),
    # -- the /metrics scrape and its gauges
    Mutant("a finished scrape's rows handed out again every tick (#35 server)", PROBE,
           "        self._inflight = None\n        if job.result is None:",
           "        if job.result is None:", (SCRAPE,)),
    Mutant("a gauge's label sets not summed (the largest engine's) (#35 server)", STORE,
           "SELECT name, min(t), sum(value)", "SELECT name, min(t), max(value)", (LABELS,)),
    # -- lifetimes: which events end one, and their boundaries
    Mutant("server_lost ends no lifetime (#35 server)", LIFE,
           'e.get("kind") in (REPLACED, LOST) and e.get("t") is not None',
           'e.get("kind") == REPLACED and e.get("t") is not None', (LOST,)),
    Mutant("a replacement's lifetime starts with the run, not at its event (#35 server)", LIFE,
           'start, pid, alive = t, _pid(data, "new_pid"), True',
           'pid, alive = _pid(data, "new_pid"), True', (STEP,)),
    Mutant("a replacement's lifetime named by the old pid (#35 server)", LIFE,
           'start, pid, alive = t, _pid(data, "new_pid"), True',
           'start, pid, alive = t, _pid(data, "old_pid"), True', (STEP,)),
    Mutant("a lifetime's samples run on past its end (#35 server)", MEM,
           "mine = ok & (t >= span[0]) & (t < span[1])", "mine = ok & (t >= span[0])", (LEAKS,)),
    Mutant("a lifetime judged in the whole run's window (#35 server)", MEM,
           "sub = replace(ctx, t0=span[0], t1=span[1])", "sub = ctx", (LATE,)),
    Mutant("a replacement too short to judge decides anyway (#35 server)", MEM,
           "long = w >= ctx.crit.floor_window_s * (1 - FLOOR_SLACK)", "long = True", (LATE,)),
    Mutant("a replacement long enough to judge is never judged (#35 server)", MEM,
           "long = w >= ctx.crit.floor_window_s * (1 - FLOOR_SLACK)", "long = False", (LATE,)),
    Mutant("a lone lost lifetime judged as one server to the end (#35 server)", MEM,
           "elif len(lives) == 1 and not lives[0].ended:", "elif len(lives) == 1:", (LOST,)),
    Mutant("server changes past the loaded events ignored (#35 server)", MEM,
           "        elif missing:\n", "        elif False:\n", (UNLOADED,)),
    Mutant("the server's warm-up samples in its memory evidence (#35 server)", MEM,
           "ok = post & np.isfinite(y)\n        if not ok.any():\n            out.append(server.",
           "ok = np.isfinite(y)\n        if not ok.any():\n            out.append(server.",
           (WARM,)),
    # -- combining the lifetimes
    Mutant("an earlier lifetime's leak hidden by the last one (#35 server)", LIFE,
           "    if fails:  # the steepest leak\n",
           "    if fails and judged[-1][1] in [f[3] for f in fails]:\n",
           (LEAKS,)),
    Mutant("the gentlest leak reported, not the steepest (#35 server)", LIFE,
           "max(fails, key=lambda f: f[0])", "min(fails, key=lambda f: f[0])", (LEAKS,)),
    Mutant("a lost last server judged on its dead process's samples (#35 server)", LIFE,
           '    if last.ended == "lost":\n', "    if False:\n", (LOST,)),
    Mutant("a server never sampled read as n/a, not INVALID (#35 server)", LIFE,
           'if name == "memory_server_rss":', 'if name == "memory_server_gpu":', (NEVER,)),
    Mutant("a local server taken for a remote one (its memory n/a) (#35 server)", LIFE,
           'return t.get("server_process") != "off" or',
           'return t.get("server_process") == "on" or', (NEVER,)),
    # -- server_queue
    Mutant("the queue's tolerance read per second, not per minute (#35 server)", QUEUE,
           "c.alpha, q.threshold / 60)", "c.alpha, q.threshold)", (RISING,)),
    Mutant("the queue's slope reported per second (#35 server)", QUEUE,
           "value=tr.slope * 60,", "value=tr.slope,", (RISING,)),
    Mutant("the waiting queue judged against the KV cache's tolerance (#35 server)", LIFE,
           "(SERVER_WAITING_METRICS, waiting_slope, ", "(SERVER_WAITING_METRICS, kv_slope, ",
           (RISING,)),
    Mutant("the best queue metric decides, not the worst (#35 server)", QUEUE,
           "min(calls, key=lambda x: order.get(x[1].status, 3))",
           "max(calls, key=lambda x: order.get(x[1].status, 3))", (KV,)),
    Mutant("the queue's trend over window floors, not medians (#35 server)", QUEUE,
           "tr = stats.trend(win.t[has], win.median[has], c.alpha)\n"
           "        call = call_trend(tr, win.t[has], win.median[has],",
           "tr = stats.trend(win.t[has], win.floor[has], c.alpha)\n"
           "        call = call_trend(tr, win.t[has], win.floor[has],", (MEDIANS,)),
    Mutant("the server's warm-up queue in the queue's evidence (#35 server)", LIFE,
           "keep = (t >= t0) & np.isfinite(y)", "keep = np.isfinite(y)", (Q_WARM,)),
    Mutant("a replaced server's loading judged as its growth (#31 server)", MEM,
           "span = life.window(ctx.t0, ctx.t1, warmup_s=max(ctx.t0, 0.0))",
           "span = life.window(ctx.t0, ctx.t1)", (OWN_WARMUP,)),
    Mutant("a server taking over has no warm-up in an early look (#31 server)", BASE,
           "starts = [self.t0, *(t + self.t0 for t in self.server_changes)]",
           "starts = [self.t0, *self.server_changes]", (EACH_LOOK,)),
    Mutant("an early look pools the server's processes (#31 server)", MEM,
           'for t0, t1 in servers if col.startswith("server_") else mine:',
           "for t0, t1 in mine:", (EACH_LOOK,)),
    Mutant("a server change is not told to the early looks (#31 server)", EARLY,
           "            self.live.server_changes.append(event.t)\n", "            pass\n",
           (EACH_LOOK,)),
)  # fmt: skip
