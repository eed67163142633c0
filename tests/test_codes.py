"""``placecheck.basics.codes.Code``: the one typed home of the finding codes.

A check names a code as ``Code.PC201``; a string ``"PC201"`` written in the
package would let a typo match nothing, silently. The scan below reads every
module with ``ast`` and fails on a string constant that is exactly a code,
outside the rules package and ``basics/codes.py``.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import placecheck
from placecheck.basics.codes import Code
from placecheck.findings.rules import RULES, rule

HOMES = ("basics/codes.py", "findings/rules/")
"""Where a code may be written as a string: the enum, and the rules that declare each code."""

_CODE = re.compile(r"PC\d{3}")


def code_strings(root: Path) -> Counter[str]:
    """How many string constants in each module under ``root`` are exactly a code (``"PC201"``, or
    ``"PC299"``, which names no rule), outside :data:`HOMES`; docstrings and comments never match."""
    found: Counter[str] = Counter()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(HOMES):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CODE.fullmatch(node.value):
                found[relative] += 1
    return found


def test_no_code_is_written_as_a_string_outside_its_home() -> None:
    found = code_strings(Path(placecheck.__file__).parent)
    assert dict(found) == {}, "name the code as placecheck.basics.codes.Code.PCnnn, not as a string"


def test_the_scan_finds_a_code_written_as_a_string(tmp_path: Path) -> None:
    (tmp_path / "findings" / "rules").mkdir(parents=True)
    (tmp_path / "findings" / "rules" / "walk.py").write_text('declare("PC101")\n')  # a home: skipped
    (tmp_path / "check.py").write_text('"""PC201 in a docstring is prose."""\n'
                                       'from placecheck.basics.codes import Code\n'
                                       'ok = f.code == Code.PC201  # PC201 in a comment\n'
                                       'bad = f.code == "PC201" or f.code in ("PC104", "pc105")\n'
                                       'typo = rule("PC299")\n'
                                       'words = f"{count(\'PC303\')} keys, PC304 in a sentence"\n')
    assert code_strings(tmp_path) == {"check.py": 4}


def test_every_code_has_a_rule_and_every_rule_a_code() -> None:
    assert list(RULES) == sorted(Code)
    assert all(type(r.code) is Code and rule(code) is r for code, r in RULES.items())


@pytest.mark.parametrize("code", list(Code))
def test_a_code_reads_writes_and_compares_as_its_plain_string(code: Code) -> None:
    # JSON, SARIF, baselines and configs carry "PC201"; a message says PC201, never Code.PC201
    assert code.name == code.value and code == code.value and hash(code) == hash(code.value)
    assert str(code) == f"{code}" == "".join([code]) == code.value
    assert f"{code:>7}" == f"{code.value:>7}"
    assert json.dumps({code: [code]}) == json.dumps({code.value: [code.value]})
    assert Code(code.value) is code


def test_a_mistyped_code_fails_at_once() -> None:
    with pytest.raises(AttributeError):
        Code.PC2011  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ValueError, match="not a valid Code"):
        Code("PC299")


FINDING_BUILDERS = {"findings/rules/registry.py": "make_finding: a finding of a rule",
                    "findings/finding.py": "Finding.from_dict: a finding read back from a report"}
"""The only modules that call ``Finding(...)`` (issue 41 item 4: a rule is a place)."""


def finding_calls(root: Path) -> Counter[str]:
    """How many calls of ``Finding(...)`` each module under ``root`` makes."""
    found: Counter[str] = Counter()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name == "Finding":
                    found[path.relative_to(root).as_posix()] += 1
    return found


def test_findings_are_built_only_by_the_rules() -> None:
    calls = finding_calls(Path(placecheck.__file__).parent)
    assert set(calls) == set(FINDING_BUILDERS), "build a finding with rules.make_finding(Code.PCnnn, ...)"


def _calls(root: Path, outside: str) -> Iterator[tuple[str, str, ast.Call]]:
    """``(module, called name, call)`` for every call in the modules under ``root`` but ``outside``."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(outside):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                yield rel, name, node


def make_finding_calls(root: Path) -> Counter[str]:
    """How many calls of ``make_finding(...)`` each module under ``root`` makes, ``findings/rules/`` aside."""
    return Counter(rel for rel, name, _ in _calls(root, "findings/rules/") if name == "make_finding")


def test_findings_are_made_only_in_the_rule_families() -> None:
    """Issue 41 item 4, a rule is a place: the rooms record events or plain evidence, and a family of
    ``findings/rules/`` decides the code, the severity and the words and builds the finding."""
    calls = make_finding_calls(Path(placecheck.__file__).parent)
    assert calls == {}, "build these findings in a family of findings/rules/, from the room's evidence"


def severity_decisions(root: Path) -> list[str]:
    """``module:line`` of each call of the rules' ``severity(...)`` and each ``severity=`` keyword outside
    ``findings/`` (the report's grouping there takes a problem's worst severity, deciding none)."""
    return [f"{rel}:{call.lineno}" for rel, name, call in _calls(root, "findings/")
            if name == "severity" or any(k.arg == "severity" for k in call.keywords)]


def test_severity_is_decided_only_in_the_rule_families() -> None:
    """A rule's severity changes (a scalar, a cache, a library's own sync) are its family's, beside its
    words: no room picks a severity."""
    assert severity_decisions(Path(placecheck.__file__).parent) == []


def test_the_severity_scan_sees_a_choice(tmp_path: Path) -> None:
    (tmp_path / "findings").mkdir()
    (tmp_path / "findings" / "report.py").write_text("s = severity(c)\n")
    (tmp_path / "room.py").write_text("a = rules.severity(c, 'scalar')\nb = replace(f, severity=s)\n"
                                      "f.severity\n")
    assert severity_decisions(tmp_path) == ["room.py:1", "room.py:2"]


def test_the_make_finding_scan_sees_a_call_and_skips_the_rules(tmp_path: Path) -> None:
    (tmp_path / "findings" / "rules").mkdir(parents=True)
    (tmp_path / "findings" / "rules" / "walk.py").write_text("f = make_finding(c)\n")
    (tmp_path / "room.py").write_text("a = rules.make_finding(c)\nb = make_finding(c)\nmake_finding\n")
    assert make_finding_calls(tmp_path) == {"room.py": 2}


def test_the_finding_scan_sees_a_call(tmp_path: Path) -> None:
    (tmp_path / "check.py").write_text("from placecheck.findings import finding\n"
                                       "a = Finding(code=c)\nb = finding.Finding(code=c)\nFinding\n")
    assert finding_calls(tmp_path) == {"check.py": 2}
