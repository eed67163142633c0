"""One fixture model per walk pattern, beside its expected findings, collected automatically.

Each ``tests/fixtures/walk/NAME.py`` defines ``Model`` (built with no
arguments); ``NAME.expected`` lists the findings the walk must produce, one
``CODE where`` per line (none for a clean fixture). The model is audited for
``cuda`` under simulated CUDA, so this runs the same on a CPU-only machine.

Lines ``#= WHERE FIELD TEXT`` pin more of the finding at ``WHERE`` (a comment
to the shared ``read_expected``): ``hint``/``message`` must contain TEXT,
``severity``/``count``/``nbytes`` must equal it.

Every walk finding's ``source`` is the fixture's line that assigned the
attribute holding the tensor (``self.cache = {...}``, ``register_buffer("pos",
...)``, a class-level ``table = ...``): checked for every fixture, for a model
built by the audit (recorded while it is built) and for one passed in built
(read from the class's source).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import TESTS, fixture_cases, load_file, read_expected, walk_findings

from placecheck.findings.finding import Finding

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

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


def _attribute(finding: Finding) -> str:
    """The attribute of ``finding.module`` holding what the finding is about (``cache`` of ``cache[0]``)."""
    relative = finding.where[len(finding.module) + 1:] if finding.module else finding.where
    return re.split(r"[.\[{]", relative, maxsplit=1)[0]


def _assigns(line: str, attribute: str) -> bool:
    """True when ``line`` assigns ``attribute``: ``self.<attribute> =``, a class-level ``<attribute> =``,
    or ``self.register_buffer("<attribute>", ...)`` and the like."""
    name = re.escape(attribute)
    return bool(re.search(rf"\bself\.{name}\b[^=]*=(?!=)|^\s*{name}\s*(:[^=]*)?=(?!=)"
                          rf"|register_\w+\(\s*[\"']{name}[\"']", line))


def check_sources(findings: tuple[Finding, ...], source: Path) -> None:
    lines = source.read_text(encoding="utf-8").splitlines()
    for f in findings:
        filename, _, line = f.source.rpartition(":")
        assert filename and Path(filename).resolve() == source.resolve(), f"{f.where}: source {f.source!r}"
        text = lines[int(line) - 1]
        assert _assigns(text, _attribute(f)), f"{f.where}: {f.source} is {text.strip()!r}"


@pytest.mark.parametrize("source, expected", CASES)
def test_walk_fixture_findings_point_at_the_assignment_line(source: Path, expected: Path) -> None:
    import placecheck

    report = placecheck.audit(load_file(source), device="cuda", engine="fake", select=["PC1"], forward=False)
    assert bool(report.findings) == bool(read_expected(expected))
    check_sources(report.findings, source)


@pytest.mark.parametrize("source, expected", CASES)
def test_walk_fixture_passed_built_reads_the_line_from_the_class(source: Path, expected: Path) -> None:
    import placecheck

    model = load_file(source)()
    # not copied: deepcopy refuses a mapping proxy, which one fixture holds
    report = placecheck.audit(model, device="cuda", engine="fake", select=["PC1"], forward=False,
                              copy_model=False)
    assert bool(report.findings) == bool(read_expected(expected))
    check_sources(report.findings, source)
