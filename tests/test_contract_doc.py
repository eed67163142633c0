"""docs/contract.md, the finding contract users read, agrees with the rules and with `rules`/`explain`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placecheck.cli import app
from placecheck.finding import Finding, Severity
from placecheck.rules import RULES

DOC = Path(__file__).resolve().parents[1] / "docs" / "contract.md"
ROW = re.compile(r"^\| (PC\d{3}) \| ([a-z-]+) \| ([a-z]+) \| ([a-z]+) \| (.+) \|$", re.M)


def _documented() -> dict[str, tuple[str, str, str]]:
    rows = ROW.findall(DOC.read_text(encoding="utf-8"))
    table = {code: (kind, severity, phase) for code, kind, severity, phase, _ in rows}
    assert len(table) == len(rows), "a code is documented twice"
    return table


def test_the_doc_table_is_the_rule_table() -> None:
    documented = _documented()
    in_code = {r.code: (r.kind, r.severity.value, r.phase) for r in RULES.values()}
    assert sorted(documented) == sorted(in_code), "docs/contract.md and placecheck.rules list other codes"
    assert documented == in_code


def test_placecheck_rules_prints_what_the_doc_says() -> None:
    result = CliRunner().invoke(app, ["rules"])
    assert result.exit_code == 0
    printed = {line.split()[0]: tuple(line.split()[1:4]) for line in result.stdout.splitlines()
               if re.match(r"PC\d{3} ", line)}
    assert printed == _documented()


@pytest.mark.parametrize("code", sorted(RULES))
def test_explain_heads_its_text_with_the_documented_rule(code: str) -> None:
    kind, severity, phase = _documented()[code]
    for name in (code, kind):
        result = CliRunner().invoke(app, ["explain", name])
        assert result.exit_code == 0
        assert result.stdout.splitlines()[0] == f"{code} {kind} ({severity}, found by the {phase} phase)"


def test_the_documented_json_fields_are_in_every_finding() -> None:
    text = DOC.read_text(encoding="utf-8")
    table = text.split("Every finding has at least these fields:", 1)[1].split("\n\n", 2)[1]
    fields = re.findall(r"`([a-z_]+)`", "".join(line.split("|")[1] for line in table.splitlines()
                                                    if line.startswith("| `")))
    assert fields == ["code", "kind", "severity", "where", "source", "device", "expected", "message", "hint"]
    finding = Finding(code="PC101", kind="stray-tensor", severity=Severity.ERROR, where="mask",
                      message="m", hint="h")
    assert set(fields) <= set(json.loads(json.dumps(finding.to_dict())))
