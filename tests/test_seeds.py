"""The walk-detectable bugs the seed articles (``../shared/seeds/``) describe, as fixtures.

Each ``tests/fixtures/seeds/seed_NNN_*.py`` is the article's model (``Model``);
its ``.expected`` lists ``CODE where`` lines, or nothing where the article's
claim of a bug is false (docs/contract.md, "Some common claims about `.to()` are false").
Forward-time bugs (tensors or layers created in ``forward()``) belong to the
forward pass and are not here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TESTS, fixture_cases, load_file, read_expected, walk_findings

import placecheck

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

FIXTURES = TESTS / "fixtures" / "seeds"
CASES = fixture_cases(FIXTURES)


def test_every_seed_article_has_a_fixture() -> None:
    # one fixture per seed article 000-003, at least
    assert {p.stem.split("_")[1] for p in FIXTURES.glob("seed_*.py")} >= {"000", "001", "002", "003"}


@pytest.mark.parametrize("source, expected", CASES)
def test_seed_fixture(source: Path, expected: Path) -> None:
    assert expected.is_file(), f"{source.name} has no {expected.name} beside it"
    assert walk_findings(load_file(source)) == read_expected(expected)


def test_seed_001_some_tensor_finding_says_how_to_fix_it() -> None:
    report = placecheck.audit(load_file(FIXTURES / "seed_001_some_tensor.py"), device="cuda",
                              engine="fake", select=["PC1"])
    (finding,) = report.findings
    assert (finding.device, finding.expected, finding.shape) == ("cpu", "cuda:0", (5, 5))
    assert "register_buffer" in finding.hint
    assert not report.ok


def test_a_repaired_call_that_still_fails_on_the_inferred_input_stops_the_forward() -> None:
    """Seed 001 with the inferred batch of 2: a GPU raises the mismatch at the add (PC201 there), and
    with the devices agreeing the add still fails (a [5, 5] tensor does not broadcast to [2, 5]), so
    the forward did not get past that line: the report says so, as for any stop on an inferred input."""
    report = placecheck.audit(load_file(FIXTURES / "seed_001_some_tensor.py"), device="cuda",
                              engine="fake")
    assert sorted(f.code for f in report.findings) == ["PC101", "PC201"]
    crash = next(f for f in report.findings if f.code == "PC201")
    assert crash.source.endswith(":13")
    assert "stopped at" in report.incomplete and ":13" in report.incomplete
    assert "broadcast" in report.incomplete
    given = placecheck.audit(load_file(FIXTURES / "seed_001_some_tensor.py"), device="cuda",
                             engine="fake", inputs="float32[5,10]")
    assert not given.incomplete  # an input the model fits runs through


@pytest.mark.parametrize("engine", ["fake", "tagged"])
def test_a_repaired_call_that_still_fails_on_a_given_input_is_its_own_error(engine: str) -> None:
    """The same add with an input the user gave (batch 2): the add's shape error is the model's, for
    that input, once the device is fixed. It is a PC207 at the add beside the PC101 and its crash,
    never folded into the crash (which would read as a forward checked to its end)."""
    report = placecheck.audit(load_file(FIXTURES / "seed_001_some_tensor.py"), device="cuda",
                              engine=engine, inputs="float32[2,10]")
    codes = sorted(f.code for f in report.findings)
    assert codes == ["PC101", "PC201", "PC207"], codes
    error = next(f for f in report.findings if f.code == "PC207")
    assert error.source.endswith(":13") and error.severity == "error"
    assert "RuntimeError" in error.message and "once that is fixed the call still fails" in error.message
    assert not report.incomplete  # the input is the user's: the error is a finding, not a guess gone wrong
