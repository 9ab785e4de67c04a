"""Workloads that misbehave in ways a user's code can (``kind = "python"`` factories for
tests/test_hostile_input.py and bench/hostile.py)."""

from __future__ import annotations

from typing import Any, Literal

from soakd.records import Frame, StageOutput
from soakd.workloads.base import WorkloadContext

#: what ``raises`` raises on its Nth infer (``options.what``)
_RAISES: dict[str, Any] = {
    "system_exit": lambda: SystemExit(3),
    "surrogate": lambda: ValueError("bad byte \udcff in the model's output"),
    "keyboard_interrupt": lambda: KeyboardInterrupt(),
}


class Raises:
    """A staged workload whose ``infer`` raises ``what`` on every ``every``-th frame from
    frame ``after`` on (every frame: ``every = 1``)."""

    shape: Literal["staged"] = "staged"

    def __init__(self, what: str, every: int, after: int) -> None:
        self.make, self.every, self.after, self.n = _RAISES[what], every, after, 0

    def setup(self) -> None: ...

    def preprocess(self, frame: Frame) -> Any:
        return frame.id

    def infer(self, inputs: Any) -> Any:
        self.n += 1
        if self.n > self.after and (self.n - self.after) % self.every == 0:
            raise self.make()
        return inputs

    def decode(self, outputs: Any) -> StageOutput:
        return StageOutput(text="ok", tokens=1)

    def sync(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        return {"kind": "raises"}

    def close(self) -> None: ...


def raises(options: dict[str, Any], ctx: WorkloadContext) -> Raises:
    return Raises(str(options["what"]), int(options.get("every", 1)), int(options.get("after", 0)))
