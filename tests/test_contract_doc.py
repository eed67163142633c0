"""docs/contract.md, the finding contract users read, agrees with the rules, with `rules`/`explain`,
with the JSON output and with the JSON Schema shipped in the package."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from cli_runner import CliRunner
from report_schema import SCHEMA

from placecheck.cli import app
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.rules import RULES

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
    assert sorted(documented) == sorted(in_code), \
        "docs/contract.md and placecheck.findings.rules list other codes"
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


# ---- the JSON Schema shipped in the package agrees with this page, the rules and the output -----

def _doc_table(after: str) -> list[list[str]]:
    """The cells of the first markdown table after the text ``after``, header and rule rows dropped."""
    lines = DOC.read_text(encoding="utf-8").split(after, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return [row for row in rows[1:] if not set(row[0]) <= {"-", " "}]


def _names(cell: str) -> list[str]:
    return re.findall(r"`([a-z_][a-z0-9_]*)`", cell)


def test_the_schema_is_a_valid_schema_shipped_as_package_data() -> None:
    import tomllib

    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    pyproject = tomllib.loads((DOC.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert "schema/*.json" in pyproject["tool"]["setuptools"]["package-data"]["placecheck"]
    assert "placecheck/schema/report.schema.json" in DOC.read_text(encoding="utf-8")


def test_the_schema_accepts_every_rule_and_refuses_what_is_not_one() -> None:
    defs = SCHEMA["$defs"]
    assert defs["severity"]["enum"] == [s.value for s in Severity]
    for r in RULES.values():
        jsonschema.validate(r.code, defs["code"])
        jsonschema.validate(r.kind, defs["kind"])
    for bad, name in (("P101", "code"), ("PC1011", "code"), ("Stray_Tensor", "kind")):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, defs[name])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("fatal", defs["severity"])


def test_the_documented_finding_fields_are_the_schemas_and_the_codes() -> None:
    required = _names(" ".join(row[0] for row in _doc_table("Every finding has at least these fields:")))
    others = _names(" ".join(row[0] for row in _doc_table("Other fields, present in every finding")))
    finding = SCHEMA["$defs"]["finding"]
    assert finding["required"] == required + others
    assert set(finding["properties"]) == set(required + others)
    emitted = Finding(code="PC101", kind="stray-tensor", severity=Severity.ERROR, where="m", message="m",
                      hint="h").to_dict()
    assert sorted(emitted) == sorted(required + others), "a Finding field is missing from the contract"
    evidence = _doc_table("Other fields, present in every finding")[-1]
    assert evidence[0] == "`evidence`"
    assert _names(evidence[1]) == SCHEMA["$defs"]["evidence"]["required"]


def test_the_documented_report_fields_are_the_schemas() -> None:
    from placecheck.findings.report import Report

    top = [row[0].strip("`") for row in _doc_table("One model gives an object with these fields:")]
    report = SCHEMA["$defs"]["report"]
    assert report["required"] == top
    text = DOC.read_text(encoding="utf-8")
    summary = _names(text.split("`summary` has ", 1)[1].split(".\n", 1)[0])
    assert SCHEMA["$defs"]["summary"]["required"] == summary
    assert list(Report.build("Net", "cuda:0", "x", []).summary()) == summary
    run = _names(text.split("A `--config` run gives ", 1)[1].split("reads;", 1)[0])
    config_run = SCHEMA["$defs"]["config_run"]
    assert run[:8] == ["schema_version", "summary", "models", "models_with_problems", "problems",
                       "instances", "models", "findings"]
    assert config_run["required"] == ["schema_version", "summary", "models", "findings"]
    assert config_run["properties"]["summary"]["required"] == run[2:6]
    shard_run = _names(text.split("adds a `run` object", 1)[1].split("which `placecheck merge`", 1)[0])
    assert SCHEMA["$defs"]["run_info"]["required"] == [n for n in shard_run if n not in ("index", "count")]
    assert SCHEMA["$defs"]["run_info"]["properties"]["shard"]["required"] == ["index", "count"]


def _audit_json(*args: str) -> dict[str, object]:
    from conftest import REPO

    result = CliRunner().invoke(app, ["audit", str(REPO / "placecheck/examples/buggy.py") + ":BuggyNet",
                                      "--engine", "fake", "--init", "cpu", "--format", "json", *args])
    assert result.exit_code == 1, result.stderr
    data: dict[str, object] = json.loads(result.stdout)
    return data


@pytest.mark.parametrize("grouping", [(), ("--no-group",)], ids=["grouped", "ungrouped"])
def test_a_real_report_is_what_the_schema_the_rules_and_the_doc_say(grouping: tuple[str, ...]) -> None:
    data = _audit_json(*grouping)
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    documented = _documented()
    findings = data["findings"]
    assert isinstance(findings, list) and findings
    for f in findings:
        kind, severity, _ = documented[f["code"]]
        assert f["kind"] == kind == RULES[f["code"]].kind
        # a severity may be lowered by what the forward showed; raised only by what the problem caused
        caused = [Severity(e["severity"]).rank for e in f["evidence"]]
        assert Severity(f["severity"]).rank <= max([Severity(severity).rank, *caused])
        for e in f["evidence"]:
            assert e["kind"] == documented[e["code"]][0]
    # and the schema really constrains the output: a report missing a contract field is refused
    broken = json.loads(json.dumps(data))
    del broken["findings"][0]["where"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(broken)


def test_the_documented_exit_codes_are_the_codes() -> None:
    import importlib

    documented = {int(row[0].strip("`")) for row in _doc_table("One row per exit code;")}
    in_code = set()
    for name in ("placecheck.findings.report", "placecheck.basics.errors", "placecheck.cli.common",
                 "placecheck.cli.app"):
        module = importlib.import_module(name)
        in_code |= {v for k, v in vars(module).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert documented == in_code
