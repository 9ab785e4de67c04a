"""Issue 35's mutants of host contention (filled in by its part of the work)."""

from __future__ import annotations

from bench.mutants.base import Mutant

MUTANTS: tuple[Mutant, ...] = ()
