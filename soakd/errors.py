"""Exit codes (part of the API, documented in the README) and the errors that map to them."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    PASS = 0
    FAIL = 1
    USAGE = 2  # usage or config error: bad flag, config typo, missing file, unopenable source
    INVALID = 3  # the run cannot be judged: too short, aborted, a criterion without data
    INTERNAL = 4  # a bug or an environment failure in soakd itself (disk full, store died)


class SoakdError(Exception):
    """An error with a one-line message and the exit code it maps to."""

    exit_code: ExitCode = ExitCode.INTERNAL


class UsageError(SoakdError):
    exit_code = ExitCode.USAGE


class SourceError(UsageError):
    """A frame or audio source that cannot be opened."""
