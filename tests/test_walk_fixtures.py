"""One fixture model per walk pattern, beside its expected findings, collected automatically.

Each ``tests/fixtures/walk/NAME.py`` defines ``Model`` (built with no
arguments); ``NAME.expected`` lists the findings the walk must produce, one
``CODE where`` per line (none for a clean fixture). The model is audited for
``cuda`` under simulated CUDA, so this runs the same on a CPU-only machine.

Lines ``#= WHERE FIELD TEXT`` pin more of the finding at ``WHERE`` (a comment
to the shared ``read_expected``): ``hint``/``message`` must contain TEXT,
``severity``/``count``/``nbytes`` must equal it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TESTS, fixture_cases, load_file, read_expected, walk_findings

from placecheck.finding import Finding

FIXTURES = TESTS / "fixtures" / "walk"
CASES = fixture_cases(FIXTURES)


_FIELDS = ("hint", "message", "severity", "count", "nbytes")


def read_field_checks(path: Path) -> list[tuple[str, str, str]]:
    """``(where, field, text)`` from the ``#= WHERE FIELD TEXT`` lines of an ``.expected`` file."""
    checks = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#= "):
            continue
        where, field, text = line[3:].strip().split(" ", 2)
        assert field in _FIELDS, f"{path.name}: unknown field {field!r} in {line!r}"
        checks.append((where, field, text))
    return checks


def check_fields(findings: tuple[Finding, ...], checks: list[tuple[str, str, str]]) -> None:
    by_where = {f.where: f for f in findings}
    for where, field, text in checks:
        assert where in by_where, f"no finding at {where!r}"
        value = getattr(by_where[where], field)
        if field in ("hint", "message"):
            assert text in value, f"{where} {field}: {value!r} lacks {text!r}"
        else:
            assert str(value) == text, f"{where} {field}: {value!r} != {text!r}"


def test_fixture_directory_is_populated() -> None:
    # guards against a parametrize over an empty glob silently testing nothing
    assert len(CASES) >= 15


@pytest.mark.parametrize("source, expected", CASES)
def test_walk_fixture(source: Path, expected: Path) -> None:
    assert expected.is_file(), f"{source.name} has no {expected.name} beside it"
    model_class = load_file(source)
    assert walk_findings(model_class) == read_expected(expected)
    checks = read_field_checks(expected)
    if checks:
        import placecheck

        report = placecheck.audit(model_class, device="cuda", engine="fake", select=["PC1"], forward=False)
        check_fields(report.findings, checks)


@pytest.mark.parametrize("source, expected", CASES)
def test_walk_fixture_is_stable_on_a_second_gpu(source: Path, expected: Path) -> None:
    # cuda:1 with two simulated GPUs: the same paths, the expected device follows the target
    import placecheck

    report = placecheck.audit(load_file(source), device="cuda:1", engine="fake", select=["PC1"])
    assert sorted((f.code, f.where) for f in report.findings) == read_expected(expected)
    assert all(f.expected == "cuda:1" for f in report.findings)
