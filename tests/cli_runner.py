"""typer's ``CliRunner`` with stdout and stderr kept apart on every click of the supported range.

click 8.2 and typer's own click copy (typer 0.27+) always capture stderr apart; click 8.1 (what
typer's floor, 0.15.4, runs on) mixes it into stdout unless asked with ``mix_stderr=False``, and
``result.stderr`` then raises. The tests read both, so they ask for it where it is a choice.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from typer.testing import CliRunner as _TyperRunner

_MIXES = "mix_stderr" in inspect.signature(_TyperRunner.__init__).parameters


class CliRunner(_TyperRunner):
    def __init__(self, **kwargs: Any) -> None:
        if _MIXES:
            kwargs.setdefault("mix_stderr", False)
        super().__init__(**kwargs)


separate_stderr_capture = pytest.mark.skipif(
    _MIXES, reason="click 8.1's CliRunner: result.output holds stdout only, and what a model prints to "
                   "sys.stderr is not captured; these tests read the streams as click 8.2 captures them "
                   "(the subprocess tests of tests/test_cli_internal_errors.py cover the streams there)")
"""For tests that read a model's prints or placecheck's errors in ``result.output``/``result.stderr``."""
