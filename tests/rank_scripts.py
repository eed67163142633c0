"""The torchrun fixtures of ``tests/fixtures/run/ranks/`` and how their tests read a merged report
(``tests/test_run_ranks.py``, ``tests/test_run_fsdp.py``)."""

from __future__ import annotations

import os
from pathlib import Path

from placecheck.findings.finding import Severity
from placecheck.findings.report import Report

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run" / "ranks"


def script(name: str) -> str:
    """A fixture's path as the user would type it from the working directory."""
    return os.path.relpath(FIXTURES / name)


def at(name: str, line: int) -> str:
    return f"{script(name)}:{line}"


def failing(report: Report) -> list[tuple[str, str, str]]:
    """``(code, source, ranks)`` of every finding at warning or above."""
    return sorted((f.code, f.source, dict(f.details).get("ranks", "")) for f in report.findings
                  if f.severity is not Severity.INFO)
