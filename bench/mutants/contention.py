"""Issue 31's mutants of host contention: which frames, windows and ticks a contended host
excuses (soakd/analysis/contention.py, the one definition every criterion reads) and what
each criterion makes of them. Each is a bug that would blame the host on the model (a false
FAIL) or the model on the host (INVALID or PASS where a quiet host FAILs). Every name ends
"(#31 contention)": ``--only "(#31 contention)"`` runs just these."""

from __future__ import annotations

from bench.mutants.base import Mutant

HOST = "soakd/analysis/contention.py"
CR = "soakd/analysis/criteria/"
AGE = "tests/test_contention_frame_age.py"
RULES = "tests/test_verdict_rules.py"
EC = "tests/test_early_contention.py::"
#: the fed looks of jitter and drops on a quiet and a contended host (both parameters)
QUIET_OR_NOT = (
    EC + "test_jitter_and_drops_stop_a_run_on_a_quiet_host_and_never_once_it_was_contended"
)
#: a running look's withholding on a contended host (each criterion's early_fail)
WITHHELD = "    if host.withholds_looks(live.contended_ticks):\n        return None\n"
DRAIN = EC + "test_a_backlog_draining_after_contention_is_the_host_s_not_the_model_s"
STAGE_LOOK = EC + "test_a_stage_slowing_toward_the_frame_budget_stops_the_run_on_a_quiet_host"
PAUSES = "tests/test_drops_pauses.py"
QUEUE = "tests/test_contention_server_queue.py"
STARVED = (
    PAUSES + "::test_losses_counted_just_after_a_contended_spell_the_model_could_not_run_in_are"
    "_the_host_s"
)
SIGSTOP = PAUSES + "::test_a_real_sigstop_fails_on_a_quiet_host_and_is_invalid_on_a_contended_one"

MUTANTS: tuple[Mutant, ...] = (
    # the one definition
    Mutant("a share exactly at contended_cpu_pct read as quiet (#31 contention)", HOST,
           "return np.isfinite(o) & (o >= pct)", "return np.isfinite(o) & (o > pct)", (AGE,)),
    Mutant("soakd's own CPU counted as other processes' (#31 contention)", HOST,
           "own_cores = np.nan_to_num(own) + np.nan_to_num(server)",
           "own_cores = np.nan_to_num(server)", (AGE,)),
    Mutant("the served model's CPU counted as other processes' (#31 contention)", HOST,
           "own_cores = np.nan_to_num(own) + np.nan_to_num(server)",
           "own_cores = np.nan_to_num(own)", (AGE,)),
    Mutant("a backlog draining after contention judged as the model's (#31 contention)",
           HOST, "    return h._replace(busy=behind(h.busy, capture, dispatch, stream))\n",
           "    return h\n", (DRAIN,)),
    Mutant("the queue's chain never ends when the queue drained (#31 contention)", HOST,
           "link[1:] = dispatch[idx[:-1]] > capture[idx[1:]]", "link[1:] = True",
           (EC + "test_the_same_backlog_on_a_quiet_host_or_after_the_queue_drained_fails",)),
    # frame age
    Mutant("frame age judges the contended frames as the quiet ones (#31 contention)",
           CR + "frame_age.py", "quiet[ok] = h.quiet", "quiet[ok] = h.busy", (AGE,)),
    Mutant("a frame age only contention fails reads PASS, not INVALID (#31 contention)",
           CR + "frame_age.py", "res.status, res.detail = INVALID,",
           "res.status, res.detail = PASS,", (AGE,)),
    Mutant("frame age on a contended host never judges its quiet frames (#31 contention)",
           CR + "frame_age.py", "    if problems:\n        res.detail +=",
           "    if False:\n        res.detail +=", (AGE,)),
    Mutant("a model slower than its frame period excused by contention (#31 contention)",
           CR + "frame_age.py", "    if host.outpaced(ctx.data, ctx.measured):\n        return res",
           "    if False:\n        return res", (AGE,)),
    Mutant("the running frame-age look stops a run on a contended host (#31 contention)",
           CR + "frame_age.py", "if live.generates or host.withholds_looks(live.contended_ticks):",
           "if live.generates:", (AGE,)),
    # the running looks (soakd/run/early_stop.py asks them; contention.withholds_looks)
    Mutant("no running look is withheld on a contended host (#31 contention)", HOST,
           "    return contended_ticks > 0\n", "    return False\n",
           (QUIET_OR_NOT, STAGE_LOOK, AGE)),
    Mutant("the running jitter look stops a run on a contended host (#31 contention)",
           CR + "jitter.py", WITHHELD + "    col = next(", "    col = next(", (QUIET_OR_NOT,)),
    Mutant("the running drops look stops a run on a contended host (#31 contention)",
           CR + "drops.py", WITHHELD + "    most = live.planned_ticks()",
           "    most = live.planned_ticks()", (QUIET_OR_NOT,)),
    Mutant("the running stage_trend look stops a run on a contended host (#31 contention)",
           CR + "stage_trend.py",
           WITHHELD + "    alpha = live.look(\"stage_trend\"",
           "    alpha = live.look(\"stage_trend\"", (STAGE_LOOK,)),
    Mutant("a look counts frames before the tick that covers them has come (#31 contention)",
           "soakd/run/early_stop.py",
           "if self._tick is not None and (self._held or _end(rec) > self._tick):",
           "if False:", (QUIET_OR_NOT,)),
    Mutant("frames held for their tick are never counted (#31 contention)",
           "soakd/run/early_stop.py", "while held and _end(held[0]) <= t:", "while False:",
           (QUIET_OR_NOT, STAGE_LOOK)),
    # the other criteria read the same definition
    Mutant("jitter judges the contended frames as the quiet ones (#31 contention)",
           CR + "jitter.py", "busy, quiet = h.busy, h.quiet", "busy, quiet = h.quiet, h.busy",
           (AGE,)),
    Mutant("drops judges the contended windows' loss rate as the quiet one (#31 contention)",
           CR + "drops.py", "quiet = has & h.quiet", "quiet = has & h.busy", (AGE,)),
    # the pacer's pauses (contention.pauses; drops sets the contended ones' ticks aside)
    Mutant("a pause is the host's whether or not the host was contended (#31 contention)",
           HOST, "        contended=float(ticks[h.busy].sum()),",
           "        contended=float(ticks.sum()),", (PAUSES,)),
    Mutant("ticks missed in contended pauses counted as the model's (#31 contention)",
           CR + "drops.py", "excused = min(p.contended, paused, unwindowed) if p is not None",
           "excused = 0.0 if p is not None", (PAUSES,)),
    Mutant("the quiet windows' losses forgotten beside contended pauses (#31 contention)",
           CR + "drops.py", "at_rate = rate_q * (float(np.nansum(cap[has])) + excused)",
           "at_rate = 0.0", (PAUSES,)),
    # the server's queue (server_queue: the scrapes taken while the host was contended)
    Mutant("a server queue rising only while contended FAILs the model (#31 contention)",
           CR + "server_queue.py", "    if res.status == FAIL:\n        return [_against_host(",
           "    if False:\n        return [_against_host(", (QUEUE,)),
    Mutant("server_queue judges the contended scrapes as the quiet ones (#31 contention)",
           CR + "server_queue.py", "_quiet_trend(ctx, q, h.quiet, w)",
           "_quiet_trend(ctx, q, h.busy, w)", (QUEUE,)),
    Mutant("a server queue only contention fails reads PASS (#31 contention)",
           CR + "server_queue.py", "res.status, res.detail = INVALID,",
           "res.status, res.detail = PASS,", (QUEUE,)),
    Mutant("a queue the quiet scrapes raise too excused by contention (#31 contention)",
           CR + "server_queue.py", "    if rising:\n", "    if False:\n", (QUEUE,)),
    Mutant("the running server_queue look stops a run on a contended host (#31 contention)",
           CR + "server_queue.py", WITHHELD + "    if live.server is None",
           "    if live.server is None", (QUEUE,)),
    Mutant("only the pause events among the first 200 a run loads count (#31 contention)",
           "soakd/store/rundata.py", "kind = 'pause' ORDER BY t, id\"",
           "kind = 'pause' ORDER BY t, id LIMIT 199\"",
           (PAUSES + "::test_every_pause_event_counts_beyond_the_200_events_a_run_loads",)),
    Mutant("the pacer's pause event carries no tick count in its data (#31 contention)",
           "soakd/run/runner.py", 'data = {"ticks": n, "ms": ms}', "data = None",
           (SIGSTOP,)),
    # losses accrued in a contended spell, counted on the first row after it
    Mutant("losses counted just after a contended spell are the model's (#31 contention)",
           HOST, "    return None if h is None else h.busy\n", "    return None\n", (STARVED,)),
    Mutant("a row's losses judged by the tick of its dispatch alone (#31 contention)",
           HOST, "prev = np.concatenate([disp[:1], disp[:-1]])", "prev = disp", (STARVED,)),
    Mutant("losses carried out of a contended spell kept in the quiet rate (#31 contention)",
           CR + "drops.py", "rate_q = (float(np.nansum(lost[quiet])) - carried) / cap_q",
           "rate_q = float(np.nansum(lost[quiet])) / cap_q", (STARVED,)),
    Mutant("stage_trend never sees the contended ticks (#31 contention)",
           CR + "stage_trend.py", "share = h.share() if h is not None else 0.0",
           "share = 0.0", (RULES,)),
)  # fmt: skip
