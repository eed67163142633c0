"""``placecheck.findings.rules``: the codes are the public contract of docs/contract.md, declared once."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from placecheck.basics.codes import Code
from placecheck.findings.finding import Severity
from placecheck.findings.rules import RULES, expand, rule, selected
from placecheck.findings.rules.registry import declare

# The contract table of docs/contract.md: code -> (kind, phase).
CONTRACT = {
    "PC101": ("stray-tensor", "walk"),
    "PC102": ("unregistered-module", "walk"),
    "PC103": ("unregistered-parameter", "walk"),
    "PC104": ("param-off-device", "walk"),
    "PC105": ("buffer-off-device", "walk"),
    "PC201": ("device-mismatch", "forward"),
    "PC202": ("created-off-device", "forward"),
    "PC203": ("lazy-module", "forward"),
    "PC204": ("host-sync", "forward"),
    "PC205": ("implicit-transfer", "forward"),
    "PC206": ("output-off-device", "forward"),
    "PC207": ("forward-error", "forward"),
    "PC208": ("cross-device-ping-pong", "forward"),
    "PC209": ("repeated-transfer", "run"),
    "PC210": ("unsynchronized-read", "forward"),
    "PC301": ("checkpoint-device", "checkpoint"),
    "PC302": ("missing-key", "checkpoint"),
    "PC303": ("unexpected-key", "checkpoint"),
    "PC304": ("shape-mismatch", "checkpoint"),
    "PC305": ("dtype-mismatch", "checkpoint"),
    "PC306": ("unsafe-checkpoint", "checkpoint"),
    "PC307": ("optimizer-state-off-device", "run"),
    "PC308": ("optimizer-stale-params", "run"),
    "PC401": ("rank-device", "run"),
    "PC402": ("collective-off-device", "run"),
}


def test_rules_match_the_contract() -> None:
    assert {code: (RULES[code].kind, RULES[code].phase) for code in CONTRACT if code in RULES} == CONTRACT
    # codes beyond the table (e.g. PC9xx about the run itself) must not take a placement range
    assert all(not re.fullmatch(r"PC[123]\d\d", code) for code in set(RULES) - set(CONTRACT))


def test_codes_and_kinds_are_distinct() -> None:
    assert len({r.code for r in RULES.values()}) == len(RULES)
    assert len({r.kind for r in RULES.values()}) == len(RULES)
    assert all(code == r.code and re.fullmatch(r"PC\d{3}", code) for code, r in RULES.items())


def test_registering_a_duplicate_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="duplicate rule code PC101"):
        declare(Code.PC101, "other-kind", Severity.ERROR, "walk", "t", "e", "w", "r")
    monkeypatch.delitem(RULES, Code.PC901)  # a free code, to reach the kind's check
    with pytest.raises(ValueError, match="duplicate rule kind stray-tensor"):
        declare(Code.PC901, "stray-tensor", Severity.ERROR, "walk", "t", "e", "w", "r")
    with pytest.raises(ValueError, match="'PC999' is not a valid Code"):  # a rule's code is a Code member
        declare("PC999", "other-kind", Severity.ERROR, "walk", "t", "e", "w", "r")  # type: ignore[arg-type]
    assert "PC999" not in RULES and Code.PC901 not in RULES


def test_walk_rules_are_errors() -> None:
    # what .to() leaves behind crashes the first op that mixes it with moved weights
    assert {r.severity for r in RULES.values() if r.phase == "walk"} == {Severity.ERROR}


@pytest.mark.parametrize("code", sorted(RULES))
def test_every_rule_explains_itself(code: str) -> None:
    r = RULES[code]
    assert r.title and r.explanation and r.wrong and r.right
    assert "\n\n" not in r.explanation  # one paragraph


def test_explanations_state_the_true_rules() -> None:
    # the seed articles' folklore must not leak into placecheck's texts
    text = " ".join(r.explanation.lower() for r in RULES.values())
    assert "shallow" not in text
    assert "does not recurse" not in text
    assert "inherits the input's device" not in text
    assert "registered" in RULES["PC101"].explanation


def test_rule_lookup_is_case_insensitive() -> None:
    assert rule("pc101") is RULES["PC101"]
    with pytest.raises(KeyError):
        rule("PC999")


def test_expand_prefixes() -> None:
    assert expand(["PC1"]) == {"PC101", "PC102", "PC103", "PC104", "PC105"}
    assert expand(["pc204", " PC301 "]) == {"PC204", "PC301"}
    assert expand(["ALL"]) == set(RULES)
    assert expand(["PC"]) == set(RULES)
    assert expand(["", " "]) == set()


@pytest.mark.parametrize("bad, message", [("PC999", "matches no rule"), ("PC5", "matches no rule"),
                                          ("XYZ", "invalid code selector"), ("PC1234", "invalid")])
def test_expand_rejects_unknown(bad: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expand([bad])


def test_selected() -> None:
    assert selected(None, None) == frozenset(RULES)
    assert selected(["PC1"], ["PC101"]) == {"PC102", "PC103", "PC104", "PC105"}
    assert selected(None, ["PC2", "PC3"]) == set(RULES) - {c for c in RULES if c[:3] in ("PC2", "PC3")}
    assert selected(["PC204"], ["ALL"]) == frozenset()


def test_rules_import_no_torch() -> None:
    # `placecheck rules`/`explain` and --help must stay fast: no torch on their path
    code = ("import sys, placecheck.findings.rules, placecheck.findings.report, placecheck.findings.formats\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"


def test_cli_help_imports_no_torch() -> None:
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom placecheck.cli import app\n"
            "r = CliRunner().invoke(app, ['audit', '--help'])\nassert r.exit_code == 0, r.output\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"


# -- the severity policy: declared once, followed everywhere ------------------------------------------

def test_severity_is_the_default_or_a_declared_change() -> None:
    from placecheck.findings.rules import SEVERITY_CHANGES, severity

    for code, r in RULES.items():
        assert severity(code) is r.severity
    for code, changes in SEVERITY_CHANGES.items():
        assert code in RULES
        assert len({c.name for c in changes}) == len(changes)
        for change in changes:
            assert severity(code, change.name) is change.severity
            assert change.severity is not RULES[code].severity  # a change changes something
    with pytest.raises(KeyError, match="PC201 declares no severity change 'scalar'"):
        severity("PC201", "scalar")
    with pytest.raises(KeyError):
        severity("PC101", "library")  # PC101's library case is only the unused one


def _severity_literals_outside_rules() -> list[str]:
    """Every ``Severity.ERROR|WARNING|INFO`` in the package that gives a finding a severity: anything but
    a rank comparison (``.rank``), an identity test or a format's mapping key, outside the rules package
    and finding.py."""
    import ast
    from pathlib import Path

    import placecheck

    root = Path(placecheck.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("findings/rules/") or relative == "findings/finding.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "Severity" and node.attr in ("ERROR", "WARNING", "INFO")):
                continue
            parent = parents.get(node)
            if isinstance(parent, ast.Attribute) and parent.attr == "rank":
                continue
            if isinstance(parent, ast.Compare):
                continue
            if isinstance(parent, ast.Dict) and node in parent.keys:
                continue
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_severity_is_decided_outside_the_rule_table() -> None:
    # a check that wrote severity=Severity.INFO itself would make a report the rules table does not show
    assert _severity_literals_outside_rules() == []


def test_the_scan_finds_a_severity_written_outside(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    import placecheck

    fake = __import__("pathlib").Path(str(tmp_path)) / "placecheck"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "check.py").write_text("from placecheck.findings.finding import Severity\n"
                                   "ok = f.severity.rank >= Severity.WARNING.rank\n"
                                   "bad = dict(severity=Severity.INFO)\n")
    monkeypatch.setattr(placecheck, "__file__", str(fake / "__init__.py"))
    assert _severity_literals_outside_rules() == ["check.py:3"]


def test_rules_and_explain_print_every_declared_change() -> None:
    from placecheck.cli.rules import explain_text, rules_text
    from placecheck.findings.rules import RAISED_BY_EVIDENCE, SEVERITY_CHANGES

    table = " ".join(rules_text(200).split())
    assert " ".join(RAISED_BY_EVIDENCE.split()) in table
    for code, changes in SEVERITY_CHANGES.items():
        text = " ".join(explain_text(RULES[code], 200).split())
        assert f"Severity: {RULES[code].severity.value} by default" in text
        for change in changes:
            assert f"{change.severity.value} when {change.when}" in table
            assert f"{change.severity.value} when {change.when}" in text
    assert "Severity: error by default; a problem is raised" in " ".join(explain_text(RULES["PC201"]).split())


def test_docs_audit_shows_the_declared_policy(update_golden: bool) -> None:
    # docs/audit.md's table is the declaration itself (pytest --update-golden rewrites it)
    from pathlib import Path

    from placecheck.findings.rules import SEVERITY_CHANGES

    page = Path(__file__).resolve().parents[1] / "docs" / "audit.md"
    text = page.read_text(encoding="utf-8")
    start, end = "<!-- severity-policy:start -->\n", "<!-- severity-policy:end -->"
    rows = ["| code | default | changed to | when |", "| --- | --- | --- | --- |",
            *(f"| {code} | {RULES[code].severity.value} | {c.severity.value} | {c.when} |"
              for code, changes in SEVERITY_CHANGES.items() for c in changes)]
    at, stop = text.index(start) + len(start), text.index(end)
    if update_golden:
        page.write_text(text[:at] + "\n".join(rows) + "\n" + text[stop:], encoding="utf-8")
        return
    assert text[at:stop] == "\n".join(rows) + "\n"
