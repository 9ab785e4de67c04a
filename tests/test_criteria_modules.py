"""soakd/analysis/criteria: one module per criterion, one protocol, and verdict.py only
composes them (a module missing from its list, or one without the protocol, fails here)."""

from __future__ import annotations

import inspect
import pkgutil
from importlib import import_module

from soakd.analysis import criteria
from soakd.analysis.criteria.base import Context
from soakd.analysis.verdict import CRITERIA

#: the package's modules that are not criteria
SHARED = {"base"}


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(criteria.__path__) if m.name not in SHARED)


def test_every_criterion_module_is_in_the_verdicts_list_once() -> None:
    """Each module of soakd/analysis/criteria (but base) is judged: listed in
    verdict.CRITERIA exactly once, and the list names nothing else."""
    listed = [m.__name__.rpartition(".")[2] for m in CRITERIA]
    assert sorted(listed) == _modules()
    assert len(set(listed)) == len(listed)


def test_every_criterion_module_has_the_protocol() -> None:
    """Each criterion module has ``judge(ctx: Context) -> list[CriterionResult]``."""
    for name in _modules():
        module = import_module(f"soakd.analysis.criteria.{name}")
        sig = inspect.signature(module.judge)
        assert list(sig.parameters) == ["ctx"], name
        hints = inspect.get_annotations(module.judge, eval_str=True)
        assert hints["ctx"] is Context, name
        assert str(hints["return"]) == "list[soakd.analysis.model.CriterionResult]", name


def test_headroom_is_judged_after_the_memory_it_reads() -> None:
    """headroom reads ctx.results["memory"]: memory comes before it in the list."""
    order = [m.__name__.rpartition(".")[2] for m in CRITERIA]
    assert order.index("memory") < order.index("headroom")


def test_verdict_module_only_composes() -> None:
    """verdict.py defines no criterion of its own: its functions are judge, the context the
    criteria share, the overall rule (with the early stop's confirmation) and the
    module-name helper."""
    from soakd.analysis import verdict

    own = {
        n
        for n, f in inspect.getmembers(verdict, inspect.isfunction)
        if f.__module__ == verdict.__name__
    }
    assert own == {"judge", "context", "ended_early", "_overall", "_name"}


#: the criteria that can end a run early (run.stop_on_fail; thresholds: abort_on_fail)
EARLY = {
    "errors", "oom", "drops", "memory", "frame_age", "thresholds", "jitter", "server_queue",
    "stage_trend",
}  # fmt: skip


def test_the_criteria_that_stop_a_run_early_have_the_running_half_of_the_protocol() -> None:
    """errors, oom, drops, memory (the server's too), frame_age, thresholds, jitter,
    server_queue and stage_trend have ``early_fail(live, crit) -> EarlyFail | None``; no
    other criterion claims one."""
    have = set()
    for name in _modules():
        module = import_module(f"soakd.analysis.criteria.{name}")
        if not hasattr(module, "early_fail"):
            continue
        have.add(name)
        assert list(inspect.signature(module.early_fail).parameters) == ["live", "crit"], name
    assert have == EARLY
