"""Errors that end an audit before it starts: bad usage, a target that will not load.

Each carries a one-line message saying what to do; the CLI prints it and exits 2
(with the traceback only under ``--debug``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class PlacecheckError(Exception):
    """Base of placecheck's own errors: a one-line, actionable message."""


class UsageError(PlacecheckError):
    """Options that do not make sense (an unknown device, bad JSON, ...)."""


class LoadError(PlacecheckError):
    """The target could not be imported, found or constructed."""


def one_line(exc: BaseException) -> str:
    """``ExcType: first line of message``, for quoting the user's error in ours."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    name = type(exc).__name__
    return f"{name}: {first}" if first else name


def unknown_choice(flag: str, value: Any, choices: Iterable[str]) -> UsageError:
    """The error of a value that is not one of ``choices``: every choice listed, and the close one
    when there is one (``unknown --format 'jsn': use one of table, json, ...; did you mean json?``), as
    ruff and pip-audit list the possible values."""
    import difflib

    names = list(choices)
    close = difflib.get_close_matches(str(value), names, n=1)
    guess = f"; did you mean {close[0]}?" if close else ""
    return UsageError(f"unknown {flag} {value!r}: use one of {', '.join(names)}{guess}")
