"""A plan: a matrix of config overrides expanded into named cells, each cell one soak.

A plan file is TOML::

    [plan]
    name = "release-1.4.0"            # required; every cell's run is labelled plan=<name>
    config = "synthetic.toml"         # optional base config, relative to the plan file
    set = ["run.duration=10m"]        # optional overrides for every cell (--set syntax)
    labels = { release = "1.4.0" }    # optional labels for every cell

    [matrix]                          # each key a list of values
    "run.fps" = [2, 4]
    "workload.dtype" = ["float16", "bfloat16"]

    [[cell]]                          # optional extra cells, after the matrix ones
    name = "fps2-planted-leak"        # optional: else built from set, like a matrix cell's
    set = ["run.fps=2", "workload.leak_mb_per_min=30"]

The rules:

* the cells are the cartesian product of the ``[matrix]`` lists in file order (the first key
  varies slowest), then the ``[[cell]]`` tables in file order; a cell's ``index`` is its
  position, 0..N-1: the Slurm array task id, the Kubernetes completion index;
* a matrix cell's name is ``key=value`` per matrix key, comma-joined (``fps=2,dtype=float16``):
  the key's last dotted part (the whole key where two matrix keys share it), the value's
  text (``2``, ``2.5``, ``true``, a path's last component when those are unique for the
  key), each run of characters outside letters, digits and ``._+-`` replaced by ``_``.
  Names are unique and never all digits, so ``Plan.cell("3")`` is always an index;
* a cell's settings merge embedded defaults < ``config`` < ``[plan] set`` < the cell's
  overrides < the caller's extra overrides < flags; its labels are the plan's labels plus
  ``plan=<name>`` and ``cell=<cell name>``, which win over every layer (a run always says
  which cell of which plan it measured);
* everything is checked at load, every cell's settings included, so a typo fails before
  any run: ``ConfigError`` with one line naming the plan file, where, and the problem.

Pure: reads the plan and its base config, runs nothing.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

from soakd.config import ConfigError, Settings, flatten, load_settings, parse_set, read_toml
from soakd.errors import ExitCode

SCHEMA = "soakd.plan/1"
#: the most cells one plan may expand to (Slurm's default MaxArraySize is 1001)
MAX_CELLS = 4096
#: labels every cell's run gets from the plan itself
PLAN_LABEL, CELL_LABEL = "plan", "cell"
_TABLES = ("plan", "matrix", "cell")
_PLAN_KEYS = ("name", "config", "set", "labels")
_CELL_KEYS = ("name", "set")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
_PLAN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
_CELL_NAME = re.compile(r"[A-Za-z0-9._+=,-]+")
_NAMES_SHOWN = 6


@dataclass(frozen=True, slots=True)
class Cell:
    """One configuration of a plan: its array index, its name, the ``--set`` overrides that
    make it (``"run.fps=2"``) and the values they set (``{"run.fps": 2}``)."""

    index: int
    name: str
    overrides: tuple[str, ...]
    values: dict[str, Any] = field(hash=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "overrides": list(self.overrides),
            "values": dict(self.values),
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """A loaded, validated plan (``load_plan``)."""

    name: str
    path: Path
    labels: dict[str, str]
    cells: list[Cell]
    config: Path | None = None  # the base config, resolved against the plan file's folder
    overrides: tuple[str, ...] = ()  # [plan] set

    def cell_labels(self, cell: Cell) -> dict[str, str]:
        """The labels a cell's run carries: the plan's, ``plan=<name>``, ``cell=<name>``."""
        return {**self.labels, PLAN_LABEL: self.name, CELL_LABEL: cell.name}

    def settings(
        self,
        cell: Cell,
        extra_overrides: Iterable[str] = (),
        flags: Mapping[str, Any] | None = None,
    ) -> Settings:
        """The cell's validated settings: defaults < base config < ``[plan] set`` < the
        cell's overrides < ``extra_overrides`` < ``flags`` (dotted paths, as
        ``load_settings`` takes them), then the cell's labels over all of them. A cell stops
        as soon as a criterion can no longer pass (``run.stop_on_fail``) unless one of those
        layers says otherwise: a plan spends GPU hours on many cells."""
        flags = dict(flags or {})
        flags["run.labels"] = {**flags.get("run.labels", {}), **self.cell_labels(cell)}
        overrides = [*self.overrides, *cell.overrides, *extra_overrides]
        settings = load_settings(self.config, overrides=overrides, flags=flags)
        if "stop_on_fail" in settings.run.model_fields_set:
            return settings
        run = settings.run.model_copy(update={"stop_on_fail": True})
        return settings.model_copy(update={"run": run})

    def cell(self, ref: str) -> Cell:
        """The cell ``ref`` names: an index (``"3"``, what an array task passes) or a name;
        ``ConfigError`` naming the plan and what it has otherwise."""
        ref = ref.strip()
        if ref.isascii() and ref.isdigit():
            if int(ref) < len(self.cells):
                return self.cells[int(ref)]
            n = len(self.cells)
            raise ConfigError(f"{self.path}: no cell {ref}: the plan has {n} (0-{n - 1})")
        for c in self.cells:
            if c.name == ref:
                return c
        raise ConfigError(f"{self.path}: no cell named {ref!r} (cells: {_some_names(self)})")

    def as_dict(self) -> dict[str, Any]:
        """What ``soakd plan show -f json`` prints (``soakd.plan/1``)."""
        return {
            "schema": SCHEMA,
            "name": self.name,
            "path": str(self.path),
            "config": str(self.config) if self.config is not None else None,
            "set": list(self.overrides),
            "labels": dict(self.labels),
            "cells": [c.as_dict() for c in self.cells],
        }


def _some_names(plan: Plan) -> str:
    names = [c.name for c in plan.cells]
    more = len(names) - _NAMES_SHOWN
    return ", ".join(names[:_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


# --------------------------------------------------------------------------- loading


def load_plan(path: str | Path) -> Plan:
    """Read, expand and validate the plan at ``path`` (see the module docstring); any
    problem is a ``ConfigError`` of one line starting with the plan file's path."""
    p = Path(path)
    try:
        return _build(p, _read(p))
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def _read(p: Path) -> dict[str, Any]:
    if not p.is_file():
        raise ConfigError("plan file not found")
    try:
        return read_toml(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError("not a UTF-8 text file") from None


def _build(p: Path, doc: dict[str, Any]) -> Plan:
    _only(doc, _TABLES, "top level", "table")
    head = doc.get("plan")
    if not isinstance(head, dict):
        raise ConfigError("[plan]: required table is missing")
    _only(head, _PLAN_KEYS, "[plan]", "key")
    cells = [*_matrix_cells(doc.get("matrix", {})), *_extra_cells(doc.get("cell", []))]
    plan = Plan(
        name=_plan_name(head.get("name")),
        path=p,
        labels=_plan_labels(head.get("labels", {})),
        cells=_numbered(cells),
        config=_base_config(p, head.get("config")),
        overrides=_set_items(head.get("set", []), "[plan] set"),
    )
    for cell in plan.cells:
        try:
            plan.settings(cell)
        except ConfigError as exc:
            raise ConfigError(f"cell {cell.index} ({cell.name}): {exc}") from None
    return plan


def _only(table: Mapping[str, Any], known: Sequence[str], where: str, what: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{where}: unknown {what} {key!r} (known: {', '.join(known)})")


def _plan_name(name: Any) -> str:
    if name is None:
        raise ConfigError("[plan] name: required key is missing")
    if not isinstance(name, str) or not _PLAN_NAME.fullmatch(name):
        raise ConfigError(
            f"[plan] name: letters, digits and ._+- only (at most 100, starting with a letter"
            f" or digit), got {name!r}"
        )
    return name


def _plan_labels(labels: Any) -> dict[str, str]:
    """``[plan] labels``, checked and normalised by the config's own label rules."""
    if not isinstance(labels, dict):
        raise ConfigError(f"[plan] labels: must be a table of name = value, got {labels!r}")
    for reserved in (PLAN_LABEL, CELL_LABEL):
        if reserved in labels:
            raise ConfigError(f"[plan] labels: {reserved!r} is set by the plan itself")
    try:
        return dict(Settings().with_value("run.labels", labels).run.labels)
    except ConfigError as exc:
        raise ConfigError(f"[plan] labels: {str(exc).removeprefix('run.labels: ')}") from None


def _base_config(p: Path, config: Any) -> Path | None:
    if config is None:
        return None
    if not isinstance(config, str) or not config:
        raise ConfigError(f"[plan] config: must be a path to a config file, got {config!r}")
    base = (p.parent / config).expanduser()
    if not base.is_file():
        raise ConfigError(f"[plan] config: {base}: config file not found")
    return base


def _set_items(items: Any, where: str) -> tuple[str, ...]:
    """A ``set`` list: each a ``section.key=value`` string, as ``--set`` takes it."""
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f'{where}: must be a list of "section.key=value" strings')
    for item in items:
        try:
            parse_set(item)
        except ConfigError:
            raise ConfigError(f"{where}: {item!r}: expected section.key=value") from None
    return tuple(items)


def _numbered(cells: list[tuple[str, tuple[str, ...], dict[str, Any]]]) -> list[Cell]:
    """Index the cells; a plan without cells, or two cells with one name, is refused."""
    if not cells:
        raise ConfigError("no cells: give [matrix] lists or [[cell]] tables")
    first: dict[str, int] = {}
    for i, (name, _, _) in enumerate(cells):
        if name in first:
            raise ConfigError(
                f"cells {first[name]} and {i} are both named {name!r}"
                " (give [[cell]] names, or values whose texts differ)"
            )
        first[name] = i
    return [Cell(i, name, ov, values) for i, (name, ov, values) in enumerate(cells)]


# --------------------------------------------------------------------------- expanding


def _matrix_cells(matrix: Any) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
    """The matrix's cells as (name, overrides, values), the first key varying slowest.
    ``"run.fps" = [...]`` and ``run.fps = [...]`` (a nested table) mean the same."""
    if not isinstance(matrix, dict):
        raise ConfigError("[matrix]: must be a table of section.key = [values]")
    axes = {key: _axis(key, values) for key, values in flatten(matrix).items()}
    if not axes:
        return []
    size = math.prod(len(v) for v in axes.values())
    if size > MAX_CELLS:
        raise ConfigError(f"[matrix]: {size} cells, more than the {MAX_CELLS} a plan may have")
    keys = _short_keys(list(axes))
    texts = {key: _value_texts(values) for key, values in axes.items()}
    cells = []
    for combo in itertools.product(*(range(len(v)) for v in axes.values())):
        picked = dict(zip(axes, combo, strict=True))
        values = {key: axes[key][i] for key, i in picked.items()}
        name = ",".join(f"{keys[key]}={texts[key][i]}" for key, i in picked.items())
        cells.append((name, tuple(f"{k}={toml_value(v)}" for k, v in values.items()), values))
    return cells


def _axis(key: str, values: Any) -> list[Any]:
    """One matrix key's values: a non-empty list, no value twice."""
    if len([p for p in key.split(".") if p]) < 2:
        raise ConfigError(f"[matrix] {key}: expected section.key")
    if not isinstance(values, list) or not values:
        raise ConfigError(f"[matrix] {key}: must be a non-empty list of values, got {values!r}")
    seen: set[str] = set()
    for v in values:
        text = toml_value(v)
        if text in seen:
            raise ConfigError(f"[matrix] {key}: value {text} is given twice")
        seen.add(text)
    return values


def _short_keys(keys: list[str]) -> dict[str, str]:
    """Each key's name part: its last dotted component, the whole key where two share it."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last, strict=True)}


def _value_texts(values: list[Any]) -> list[str]:
    """The name texts of one key's values: a path's last component when those are unique
    for the key (``/models/a`` -> ``a``), else the whole value; made label-safe."""
    short = [_value_text(v, short=True) for v in values]
    chosen = short if len(set(short)) == len(short) else [_value_text(v) for v in values]
    return [_UNSAFE.sub("_", t) for t in chosen]


def _value_text(v: Any, *, short: bool = False) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return (v.rstrip("/").rsplit("/", 1)[-1] or v) if short else v
    return json.dumps(v, separators=(",", ":"), default=str)


def _extra_cells(tables: Any) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
    """The ``[[cell]]`` tables as (name, overrides, values)."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError("[[cell]]: must be an array of tables (name = ..., set = [...])")
    out = []
    for i, table in enumerate(tables):
        where = f"[[cell]] #{i + 1}"
        _only(table, _CELL_KEYS, where, "key")
        overrides = _set_items(table.get("set", []), f"{where} set")
        values = {".".join(path): value for path, value in map(parse_set, overrides)}
        out.append((_extra_name(table.get("name"), values, where), overrides, values))
    return out


def _extra_name(name: Any, values: dict[str, Any], where: str) -> str:
    """A ``[[cell]]``'s name: as given (label-safe, not all digits), else built from what
    its ``set`` sets, like a matrix cell's."""
    if name is None:
        if not values:
            raise ConfigError(f"{where}: give it a name or a set")
        keys = _short_keys(list(values))
        return ",".join(f"{keys[k]}={_UNSAFE.sub('_', _value_text(v))}" for k, v in values.items())
    if not isinstance(name, str) or not _CELL_NAME.fullmatch(name) or name.isdigit():
        raise ConfigError(
            f"{where} name: letters, digits and ._+=,- only, not all digits, got {name!r}"
        )
    return name


# --------------------------------------------------------------------------- outcomes

#: a plan's exit code is its worst cell's, worst first: a FAIL (a finding about the model),
#: soakd itself failing, a cell that could not start (its usage error), an INVALID cell
_SEVERITY = (ExitCode.FAIL, ExitCode.INTERNAL, ExitCode.USAGE, ExitCode.INVALID)


def plan_exit_code(codes: Iterable[int]) -> int:
    """The exit code of a plan whose cells exited with ``codes``: 1 if any failed, else 4
    if soakd failed on one, else 2 if one could not start, else 3 if one was INVALID, else
    0. An unknown non-zero code counts as soakd failing."""
    seen = {int(c) for c in codes}
    for code in _SEVERITY:
        if code in seen:
            return int(code)
    return int(ExitCode.INTERNAL) if seen - {0} else 0


# --------------------------------------------------------------------------- writing

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}  # fmt: skip


def cell_file_name(cell: Cell) -> str:
    """The file ``soakd plan write`` writes a cell's config to: ``<index>-<name>.toml``."""
    return f"{cell.index}-{cell.name}.toml"


def settings_toml(settings: Settings, comment: Sequence[str] = ()) -> str:
    """``settings`` as a TOML config file that ``load_settings`` reads back to the same
    settings (so the same config hash); ``comment`` lines first, as ``# ...``. Keys whose
    value is None are left out: none is ever set, so loading gives None again."""
    head = "".join(f"# {line}\n" for line in comment)
    return head + "\n".join(_table_lines(settings.to_dict(), ())) + "\n"


def _table_lines(table: Mapping[str, Any], path: tuple[str, ...]) -> list[str]:
    """``key = value`` lines of a table, then each non-empty sub-table as ``[a.b]``."""
    values = {k: v for k, v in table.items() if v is not None and not _is_table(v)}
    tables = {k: v for k, v in table.items() if _is_table(v)}
    lines = [f"[{'.'.join(map(_key, path))}]"] if path and (values or not tables) else []
    lines += [f"{_key(k)} = {toml_value(v)}" for k, v in values.items()]
    for k, sub in tables.items():
        lines += [""] if lines else []
        lines += _table_lines(sub, (*path, k))
    return lines


def _is_table(v: Any) -> bool:
    return isinstance(v, Mapping) and bool(v)


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else _toml_string(k)


def toml_value(v: Any) -> str:
    """A TOML value's text, one line (arrays and tables inline): what ``--set KEY=...``
    and a config file read back as ``v``."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("-inf", "inf")[v > 0])
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, datetime | date | time):
        return v.isoformat()
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        items = (f"{_key(k)} = {toml_value(x)}" for k, x in v.items() if x is not None)
        return "{" + ", ".join(items) + "}"
    raise ValueError(f"no TOML form for {type(v).__name__} {v!r}")


def _toml_string(s: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
