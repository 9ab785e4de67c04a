"""The per-chunk conditioning a rollout is fed: ``workload.conditions``.

* ``"synthetic"``: a fixed, deterministic path: a WASD key held for 8 chunks in turn and a
  slow mouse sweep (``{"keyboard": "w", "mouse": [dx, dy]}``), the shape of Matrix-Game's
  action conditioning;
* ``"none"``: no action (``Condition.action`` is None), the source frame alone;
* a path to a JSON-lines file: one JSON object per line (an action, a camera pose...),
  handed to the chunks in order and cycled when the run outlasts the file. Blank lines are
  skipped; anything else that is not an object is a one-line error naming the line.

``load_conditions`` reads and checks it before the run starts (the generator's ``build``
calls it, so a bad file is a usage error with nothing written); ``Conditions.action(i)``
is what chunk ``i`` gets.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soakd.workloads.base import WorkloadError

_KEYS = ("w", "a", "s", "d")
_HOLD = 8  # chunks each synthetic key is held


@dataclass(frozen=True, slots=True)
class Conditions:
    """``kind``: "synthetic", "none" or "file"; ``rows``: a file's objects in order."""

    kind: str
    rows: tuple[dict[str, Any], ...] = ()
    source: str | None = None

    def action(self, index: int) -> dict[str, Any] | None:
        if self.kind == "none":
            return None
        if self.kind == "file":
            return dict(self.rows[index % len(self.rows)])
        return synthetic_action(index)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"conditions": self.source or self.kind}
        if self.kind == "file":
            out["conditions_rows"] = len(self.rows)
        return out


def synthetic_action(index: int) -> dict[str, Any]:
    """Chunk ``index``'s action on the synthetic path."""
    key = _KEYS[(index // _HOLD) % len(_KEYS)]
    dx = round(0.1 * math.sin(index / 5.0), 4)
    dy = round(0.05 * math.cos(index / 7.0), 4)
    return {"keyboard": key, "mouse": [dx, dy]}


def load_conditions(spec: str | None) -> Conditions:
    """``workload.conditions`` read and checked (WorkloadError: one line naming the
    problem). None or "synthetic": the synthetic path."""
    if spec is None or spec == "synthetic":
        return Conditions("synthetic")
    if spec == "none":
        return Conditions("none")
    path = Path(spec).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"workload.conditions: {spec}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"workload.conditions: {spec}: cannot read it: {exc}") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"workload.conditions: {spec}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(
                f"workload.conditions: {spec}:{n}: a line must be a JSON object, "
                f"got {type(obj).__name__}"
            )
        rows.append(obj)
    if not rows:
        raise WorkloadError(f"workload.conditions: {spec}: no conditions in the file")
    return Conditions("file", tuple(rows), str(spec))
