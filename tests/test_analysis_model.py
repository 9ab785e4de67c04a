"""The analysis vocabulary (soakd.analysis.model), its console rendering
(soakd.report.console) and the JSON-safe copies shared by the store and the reports."""

from __future__ import annotations

import ast
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from soakd.analysis import CriterionResult, Verdict
from soakd.analysis.model import INVALID, NA, PASS
from soakd.errors import ExitCode
from soakd.jsonsafe import clean_json
from soakd.report.console import format_verdict_table


def _crit(status: str = PASS, **kw: object) -> CriterionResult:
    fields: dict[str, object] = {
        "criterion": "drops",
        "title": "Drop growth",
        "status": status,
        "value": 0.0125,
        "threshold": 0.01,
        "unit": "fraction",
        "detail": "3 of 240 frames lost",
    }
    fields.update(kw)
    return CriterionResult(**fields)  # type: ignore[arg-type]


def test_results_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        CriterionResult("run", "Run", PASS, 1.0, 1.0, "s", "ok")  # type: ignore[misc]
    with pytest.raises(TypeError):
        Verdict("r", "PASS", ExitCode.PASS, "ok", [])  # type: ignore[misc]


def test_named_constructors_have_no_value() -> None:
    inv = CriterionResult.invalid("jitter", "Infer jitter", threshold=5.0, unit="x median",
                                  detail="no infer timings after warm-up")  # fmt: skip
    na = CriterionResult.na("memory_gpu", "GPU memory used", threshold=5.0, unit="MB/min",
                            detail="not applicable: no GPU")  # fmt: skip
    assert (inv.status, inv.value, inv.evidence, inv.warnings) == (INVALID, None, {}, [])
    assert (na.status, na.value, na.threshold) == (NA, None, 5.0)


def test_console_table_shows_criteria_reason_warnings_and_hints() -> None:
    v = Verdict(
        run_id="run-1",
        status="FAIL",
        exit_code=ExitCode.FAIL,
        reason="drops: 3 of 240 frames lost",
        criteria=[_crit("fail"), _crit(criterion="oom", value=None, unit="count")],
        hints=["soak at 10-14 fps"],
        warnings=["floor window shortened"],
    )
    con = Console(width=160, record=True, color_system=None)
    con.print(format_verdict_table(v))
    out = con.export_text()
    for text in ("FAIL  run run-1", "FAIL", "1.25%", "1.00%", "reason: drops", "hint: soak at",
                 "warning: floor window"):  # fmt: skip
        assert text in out
    assert " - " in out  # a missing value


def test_clean_json_makes_numpy_and_non_finite_values_safe() -> None:
    got = clean_json({1: np.float32(1.5), "a": np.arange(3), "n": math.nan, "t": (np.int64(2),),
                      "o": object, "b": np.bool_(True)})  # fmt: skip
    assert got["1"] == 1.5 and got["a"] == [0, 1, 2] and got["n"] is None
    assert got["t"] == [2] and got["b"] is True and isinstance(got["o"], str)


ANALYSIS = Path(__file__).resolve().parents[1] / "soakd" / "analysis"
IMPURE = ("sqlite3", "soakd.store", "rich", "soakd.report", "soakd.analysis.data")


def _imports(path: Path) -> list[str]:
    out = []
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, ast.Import):
            out += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            out.append(n.module or "")
    return out


@pytest.mark.parametrize("name", ["verdict", "diagnosis", "stats", "model"])
def test_pure_analysis_modules_import_no_store_and_no_rich(name: str) -> None:
    """The pure modules import neither sqlite3, soakd.store nor rich (the package's glue in
    soakd/analysis/__init__.py and data.py is what reads the store)."""
    bad = [m for m in _imports(ANALYSIS / f"{name}.py") if m.startswith(IMPURE)]
    assert not bad, bad


def test_no_analysis_module_imports_rich() -> None:
    for path in ANALYSIS.glob("*.py"):
        assert not [m for m in _imports(path) if m.startswith("rich")], path


def test_diagnosis_imports_alone() -> None:
    """No import circle between verdict and diagnosis."""
    subprocess.run([sys.executable, "-c", "import soakd.analysis.diagnosis"], check=True)
