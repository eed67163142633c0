"""One fixture model per walk pattern, beside its expected findings, collected automatically.

Each ``tests/fixtures/walk/NAME.py`` defines ``Model`` (built with no
arguments); ``NAME.expected`` lists the findings the walk must produce, one
``CODE where`` per line (none for a clean fixture). The model is audited for
``cuda`` under simulated CUDA, so this runs the same on a CPU-only machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TESTS, fixture_cases, load_file, read_expected, walk_findings

FIXTURES = TESTS / "fixtures" / "walk"
CASES = fixture_cases(FIXTURES)


def test_fixture_directory_is_populated() -> None:
    # guards against a parametrize over an empty glob silently testing nothing
    assert len(CASES) >= 15


@pytest.mark.parametrize("source, expected", CASES)
def test_walk_fixture(source: Path, expected: Path) -> None:
    assert expected.is_file(), f"{source.name} has no {expected.name} beside it"
    model_class = load_file(source)
    assert walk_findings(model_class) == read_expected(expected)


@pytest.mark.parametrize("source, expected", CASES)
def test_walk_fixture_is_stable_on_a_second_gpu(source: Path, expected: Path) -> None:
    # cuda:1 with two simulated GPUs: the same paths, the expected device follows the target
    import placecheck

    report = placecheck.audit(load_file(source), device="cuda:1", engine="fake", select=["PC1"])
    assert sorted((f.code, f.where) for f in report.findings) == read_expected(expected)
    assert all(f.expected == "cuda:1" for f in report.findings)
