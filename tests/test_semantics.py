"""Framework semantics without false findings (issue 33 item 3): one buggy/fixed fixture pair per idiom.

Each pair lives in ``tests/fixtures/semantics/``: the buggy script marks each line a finding must be
reported at with ``# expect PCnnn``; its fixed twin, the same program written correctly, must give no
warning or error (and none of the codes its twin expects, at any severity). Both run under both
engines of ``placecheck run``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from placecheck.finding import Severity
from placecheck.report import Report
from placecheck.run import run

pytestmark = [pytest.mark.compat]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "semantics"
ENGINES = ("tagged", "fake")


def script(name: str) -> str:
    """A fixture's path as the user would type it from the working directory."""
    return os.path.relpath(FIXTURES / name)


def expected(name: str) -> set[tuple[str, str]]:
    """(code, source) of every ``# expect PCnnn`` comment of a fixture."""
    found = set()
    for number, text in enumerate((FIXTURES / name).read_text().splitlines(), 1):
        for code in re.findall(r"# expect (PC\d{3})", text):
            found.add((code, f"{script(name)}:{number}"))
    assert found, f"{name} expects nothing"
    return found


def serious(report: Report) -> set[tuple[str, str]]:
    """(code, source) of every warning and error."""
    return {(f.code, f.source) for f in report.findings if f.severity.rank >= Severity.WARNING.rank}


RUN_PAIRS = ["gan", "ema"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pair", RUN_PAIRS)
def test_buggy_script_is_found_at_its_line(pair: str, engine: str) -> None:
    report = run(script(f"{pair}_buggy.py"), engine=engine, steps=3)
    assert serious(report) == expected(f"{pair}_buggy.py")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pair", RUN_PAIRS)
def test_fixed_script_is_clean(pair: str, engine: str) -> None:
    report = run(script(f"{pair}_fixed.py"), engine=engine, steps=3)
    codes = {code for code, _ in expected(f"{pair}_buggy.py")}
    assert serious(report) == set()
    assert not [f for f in report.findings if f.code in codes]
    assert dict(report.stats)["optimizer_steps"] == 3  # the whole loop ran
