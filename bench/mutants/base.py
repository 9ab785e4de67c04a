"""One mutant: a text replacement in one file, and the test files that must catch it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    # why the mutant cannot change any verdict or reported number (it is then listed, kept
    # non-stale by --check, and neither run nor counted); empty for a mutant that is run
    equivalent: str = ""
