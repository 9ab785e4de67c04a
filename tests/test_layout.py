"""The code's shape, as docs/architecture.md states it: imports run one way between layers,
no module imports another that imports it back, SQL lives in soakd/store/, each workload
kind's settings live beside its code and import nothing heavy, and functions stay short
enough to read at once."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from soakd.config import BUILTIN_WORKLOADS, PluginWorkload
from soakd.workloads.registry import BUILDERS

SOAKD = Path(__file__).resolve().parents[1] / "soakd"

#: each top-level part of soakd and its layer: a module may import its own part or a lower
#: layer, never a higher one nor a sibling part of the same layer (except the vocabulary)
LAYER = {
    **dict.fromkeys(("__init__", "config", "clock", "records", "errors", "environment"), 0),
    **dict.fromkeys(("jsonsafe", "redact", "sections", "kind_settings"), 0),
    **dict.fromkeys(("sources", "workloads", "telemetry", "store"), 1),
    **dict.fromkeys(("analysis", "observers"), 2),
    "report": 3,
    "run": 4,
    **dict.fromkeys(("studies", "service"), 5),
    **dict.fromkeys(("cli", "__main__"), 6),
}
MAX_FUNCTION_LINES = 80
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|BEGIN|PRAGMA)\b", re.I)
#: what a kind's settings module (and the settings base, soakd/sections.py) may import: the
#: standard library, pydantic and the vocabulary below config; config composes them, so
#: anything heavier here would load on every `soakd` command, whatever its kind
SETTINGS_IMPORTS = {"__future__", "pydantic", "pydantic_core", "soakd.sections", "soakd.records"}
#: libraries reading a config must never load (a model, images, the network)
HEAVY = ("torch", "transformers", "cv2", "PIL", "httpx", "websockets", "openai")


def _modules() -> dict[str, ast.Module]:
    """Every module by its import name (a package by its own name, not ``__init__``)."""
    out = {}
    for p in SOAKD.rglob("*.py"):
        parts = p.relative_to(SOAKD.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(p.read_text())
    return out


def _is_kind_settings(module: str) -> bool:
    """A workload kind's own settings: ``soakd/workloads/<kind>_settings.py``, or
    ``settings.py`` in a kind's folder. They sit beside their kind's code but are config's
    vocabulary (layer 0): config composes them into ``[workload]``."""
    return module.startswith("soakd.workloads.") and module.endswith(("_settings", ".settings"))


def _part(module: str) -> str:
    if _is_kind_settings(module):
        return "kind_settings"
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else "__init__"


def _imports(tree: ast.Module, *, top_level_only: bool) -> set[str]:
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("soakd"):
            out.add(n.module)  # and ``from pkg import mod`` names the submodule too
            out |= {f"{n.module}.{a.name}" for a in n.names}
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.startswith("soakd")}
    return out


def test_imports_run_one_way_between_layers() -> None:
    mods = _modules()
    bad = []
    for mod, tree in mods.items():
        a = _part(mod)
        for target in _imports(tree, top_level_only=False) & mods.keys():
            b = _part(target)
            upward = LAYER[b] > LAYER[a]
            sideways = LAYER[a] == LAYER[b] and a != b and LAYER[a] not in (0, 6)
            if upward or sideways:
                bad.append(f"{mod} -> {target}")
    assert not bad, bad


def test_no_module_imports_one_that_imports_it_back() -> None:
    mods = _modules()
    graph = {m: {t for t in _imports(tree, top_level_only=False) if t in mods and t != m}
             for m, tree in mods.items()}  # fmt: skip
    for m in graph:  # a package importing its own submodules, or one of them importing the
        # package for a sibling's name, is how packages work, not a cycle
        graph[m] = {t for t in graph[m] if not t.startswith(m + ".") and not m.startswith(t + ".")}
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    cycles.append(" -> ".join([*path, nxt]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert not cycles, cycles[:5]


def _all_imports(tree: ast.Module) -> set[str]:
    """Every module a tree imports, at any depth (``from x import y``: x)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):  # a relative import keeps its dots: never allowed
            out.add("." * n.level + (n.module or ""))
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
    return out


def test_a_kinds_settings_import_only_pydantic_and_the_settings_base() -> None:
    """A kind's settings module (and soakd/sections.py) imports the standard library,
    pydantic and the vocabulary below config only: config loads them on every command."""
    mods = _modules()
    settings = [m for m in mods if _is_kind_settings(m)] + ["soakd.sections"]
    assert len(settings) > len(BUILTIN_WORKLOADS) // 2, settings
    bad = [
        f"{mod} imports {name}"
        for mod in settings
        for name in _all_imports(mods[mod])
        if name not in SETTINGS_IMPORTS
        and name.split(".")[0] not in sys.stdlib_module_names
        and name.split(".")[0] not in ("pydantic", "pydantic_core")
    ]
    assert not bad, bad


def test_each_kinds_settings_live_beside_its_code() -> None:
    """Every built-in kind (and the plugins' settings) is defined in its code's settings
    module (``hf.py`` -> ``hf_settings.py``, ``realtime/`` -> ``realtime/settings.py``), not
    in config.py; every kind config knows has a builder and every builder a kind."""
    assert set(BUILTIN_WORKLOADS) == set(BUILDERS)
    beside = {kind: BUILDERS[kind].partition(":")[0] for kind in BUILDERS}
    beside["<plugin>"] = "soakd.workloads.plugin"
    models = {**BUILTIN_WORKLOADS, "<plugin>": PluginWorkload}
    bad = [
        f"{kind}: {m.__module__}.{m.__name__}, not beside {beside[kind]}"
        for kind, m in models.items()
        if m.__module__ not in (f"{beside[kind]}_settings", f"{beside[kind]}.settings")
    ]
    assert not bad, bad


def test_reading_a_config_loads_no_model_image_or_network_library() -> None:
    """`import soakd.config` (every `soakd` command, the kinds' settings with it) leaves
    torch, transformers, OpenCV, PIL, httpx, websockets and openai unloaded."""
    code = f"import sys, soakd.config\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout


def test_sql_is_written_only_in_the_store() -> None:
    bad = []
    for mod, tree in _modules().items():
        if _part(mod) == "store":
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and SQL.match(n.value):
                bad.append(f"{mod}:{n.lineno}: {n.value[:60]!r}")
    assert not bad, bad


def test_functions_are_short_enough_to_read_at_once() -> None:
    long = []
    for mod, tree in _modules().items():
        for n in ast.walk(tree):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (n.end_lineno or n.lineno) - n.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f"{mod}.{n.name}: {size} lines")
    assert not long, long
