"""What a fixture script says it expects: its ``# expect PCnnn`` comments (``# expect PCnnn audit`` or
``run``: only that command reports it there), read by the buggy/correct pair tests of several files."""

from __future__ import annotations

import re
from pathlib import Path

from placecheck.findings.finding import Severity
from placecheck.findings.report import Report


def expected_at(path: str, command: str = "run") -> set[tuple[str, str]]:
    """(code, ``path:line``) of every ``# expect PCnnn`` comment of the script at ``path`` (as the user
    typed it, which is how findings name it)."""
    found = set()
    for number, text in enumerate(Path(path).read_text().splitlines(), 1):
        for code, only in re.findall(r"# expect (PC\d{3})(?: (audit|run))?", text):
            if only in ("", command):
                found.add((code, f"{path}:{number}"))
    assert found, f"{path} expects nothing"
    return found


def serious(report: Report) -> set[tuple[str, str]]:
    """(code, source) of every warning and error."""
    return {(f.code, f.source) for f in report.findings if f.severity.rank >= Severity.WARNING.rank}
