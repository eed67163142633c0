"""The CI formats (sarif, junit, github, markdown) and multi-model table/JSON, on a fixed run.

The run is built by hand (no torch): a model with findings (one with a source
line, one without), a clean model, and one whose audit crashed (PC901).
Golden files live in tests/golden/ci/ (``pytest --update-golden`` rewrites them).
"""

from __future__ import annotations

import ast
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from junitparser import Failure, JUnitXml
from report_schema import validate_json

from placecheck.findings.finding import Finding, Severity
from placecheck.findings.formats import OutputFormat, formatter_for
from placecheck.findings.formats.base import Formatter
from placecheck.findings.formats.github import escape_data, escape_property
from placecheck.findings.formats.markdown import cell
from placecheck.findings.report import Report
from placecheck.findings.rules import RULES

TESTS = Path(__file__).resolve().parent
SCHEMA = json.loads((TESTS / "schemas" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))

STRAY = Finding(code="PC101", kind="stray-tensor", severity=Severity.ERROR, where="encoder.mask",
                message="tensor attribute 'mask' float32[8,8] stays on cpu", hint="register_buffer(...)",
                device="cpu", expected="cuda:0", nbytes=256, count=1, module="encoder")
SYNC = Finding(code="PC204", kind="host-sync", severity=Severity.WARNING, where="head",
               message=".item() | waits for the GPU\nevery call", hint="keep it on the device",
               source="pkg/net.py:42", device="cuda:0", expected="cuda:0")
CRASH = Finding(code="PC901", kind="audit-incomplete", severity=Severity.ERROR, where="",
                message="the audit crashed the Python interpreter (SIGSEGV)", hint="run it alone",
                details=(("reason", "crash"),))

RUN = [
    Report.build("pkg/net.py:Net", "cuda:0", "simulated cuda", [SYNC, STRAY], ["engine: simulated"]),
    Report.build("torchvision.models:resnet18", "cuda:0", "simulated cuda", []),
    Report.build("pkg.crashy:Model", "cuda:0", "not run", [CRASH]),
]


@pytest.fixture(autouse=True)
def no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    # the table honours $COLUMNS when piped: the goldens are the 80-column default
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # locations depend on which files exist under the current directory: make that fixed
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "net.py").write_text("import torch\n\n\nclass Net:\n    pass\n")
    return tmp_path


def _render(fmt: OutputFormat, reports: list[Report] | None = None) -> str:
    text = formatter_for(fmt).format_reports(RUN if reports is None else reports)
    if fmt is OutputFormat.JSON:
        validate_json(text)  # every JSON output of these tests is what the shipped schema says
    return text


@pytest.mark.parametrize("fmt", list(OutputFormat), ids=str)
def test_every_choice_has_a_formatter_for_runs(fmt: OutputFormat) -> None:
    formatter = formatter_for(fmt)
    assert isinstance(formatter, Formatter)
    assert formatter.format_reports(RUN).endswith("\n")
    # one report renders the same through both entry points
    assert formatter.format(RUN[0]) == formatter.format_reports([RUN[0]])


@pytest.mark.usefixtures("in_tmp")
@pytest.mark.parametrize("fmt, name", [
    (OutputFormat.SARIF, "run.sarif"), (OutputFormat.JUNIT, "run.junit.xml"),
    (OutputFormat.GITHUB, "run.github.txt"), (OutputFormat.MARKDOWN, "run.md"),
    (OutputFormat.TABLE, "run.table.txt"), (OutputFormat.JSON, "run.json"),
], ids=str)
def test_golden(fmt: OutputFormat, name: str, golden: Callable[[str, str], None]) -> None:
    golden(f"ci/{name}", _render(fmt).replace(_version(), "VERSION"))


def _version() -> str:
    from placecheck import __version__

    return __version__


# ---- SARIF ---------------------------------------------------------------------------------------


def test_vendored_schema_is_the_oasis_one() -> None:
    assert SCHEMA["id"].startswith("https://docs.oasis-open.org/sarif/sarif/v2.1.0/")
    assert "2.1.0" in SCHEMA["title"]
    # the schema really constrains: a wrong version is refused
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"version": "2.0.0", "runs": []}, SCHEMA)


@pytest.mark.usefixtures("in_tmp")
@pytest.mark.parametrize("reports", [RUN, [RUN[1]], []], ids=["run", "clean", "empty"])
def test_sarif_validates_against_the_official_schema(reports: list[Report]) -> None:
    log = json.loads(_render(OutputFormat.SARIF, reports))
    jsonschema.validate(log, SCHEMA, cls=jsonschema.Draft4Validator)


@pytest.mark.usefixtures("in_tmp")
def test_sarif_rules_results_and_locations() -> None:
    run = json.loads(_render(OutputFormat.SARIF))["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(RULES)
    assert all(r["help"]["text"] and r["fullDescription"]["text"] for r in rules)
    assert rules[0]["help"]["text"].startswith(RULES["PC101"].explanation)
    by_rule = {r["ruleId"]: r for r in run["results"]}
    assert set(by_rule) == {"PC101", "PC204", "PC901"}
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["partialFingerprints"]["placecheck/v3"]
    # a finding with a source line points at it
    sync = by_rule["PC204"]["locations"][0]["physicalLocation"]
    assert sync == {"artifactLocation": {"uri": "pkg/net.py", "uriBaseId": "%SRCROOT%"},
                    "region": {"startLine": 42}}
    assert by_rule["PC204"]["level"] == "warning"
    # one without points at its model's file (and the class's line when found)
    stray = by_rule["PC101"]["locations"][0]
    assert stray["physicalLocation"]["artifactLocation"]["uri"] == "pkg/net.py"
    assert stray["physicalLocation"]["region"] == {"startLine": 4}
    assert stray["logicalLocations"][0]["fullyQualifiedName"] == "pkg/net.py:Net.encoder.mask"
    # a module target names its module's file
    crash = by_rule["PC901"]["locations"][0]["physicalLocation"]
    assert crash["artifactLocation"]["uri"] == "pkg/crashy.py"


def test_sarif_fingerprint_ignores_the_line() -> None:
    moved = Report.build("pkg/net.py:Net", "cuda:0", "x", [Finding(**{**SYNC.to_dict(),
                                                                          "severity": Severity.WARNING,
                                                                          "shape": None, "details": (),
                                                                          "source": "pkg/net.py:99"})])
    before = json.loads(_render(OutputFormat.SARIF, [RUN[0]]))["runs"][0]["results"]
    after = json.loads(_render(OutputFormat.SARIF, [moved]))["runs"][0]["results"]
    sync_before = next(r for r in before if r["ruleId"] == "PC204")
    assert sync_before["partialFingerprints"] == after[0]["partialFingerprints"]


# ---- JUnit ---------------------------------------------------------------------------------------


def test_junit_parses_with_a_junit_parser(tmp_path: Path) -> None:
    path = tmp_path / "run.xml"
    path.write_text(_render(OutputFormat.JUNIT), encoding="utf-8")
    xml = JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert len(suites) == 1
    cases = {case.name: case for case in suites[0]}
    assert set(cases) == {r.target for r in RUN}
    failures = {name: [r for r in case.result if isinstance(r, Failure)] for name, case in cases.items()}
    assert [f.type for f in failures["pkg/net.py:Net"]] == ["PC101", "PC204"]
    assert failures["torchvision.models:resnet18"] == []
    assert [f.type for f in failures["pkg.crashy:Model"]] == ["PC901"]
    assert "SIGSEGV" in failures["pkg.crashy:Model"][0].message
    assert "source: pkg/net.py:42" in (failures["pkg/net.py:Net"][1].text or "")
    assert suites[0].tests == 3
    assert suites[0].failures == 2


# ---- GitHub workflow commands --------------------------------------------------------------------


@pytest.mark.usefixtures("in_tmp")
def test_github_annotations() -> None:
    lines = _render(OutputFormat.GITHUB).splitlines()
    annotations = [line for line in lines if line.startswith("::")]
    assert len(annotations) == 3
    pattern = re.compile(r"^::(error|warning|notice) (file=[^,:]+)(,line=\d+)?,title=[^:]+::\S.*$")
    assert all(pattern.match(a) for a in annotations), annotations
    sync = next(a for a in annotations if "PC204" in a)
    assert sync.startswith("::warning file=pkg/net.py,line=42,title=placecheck PC204 host-sync::")
    assert "\n" not in sync and "%0A" in sync  # the multi-line message is escaped


def test_github_escaping() -> None:
    assert escape_data("50%\nnext\r") == "50%25%0Anext%0D"
    assert escape_property("a:b,c") == "a%3Ab%2Cc"


# ---- Markdown ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("in_tmp")
def test_markdown_table_is_well_formed() -> None:
    text = _render(OutputFormat.MARKDOWN)
    assert text.startswith("### placecheck: 3 problems in 2 of 3 models")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 + 3  # header, rule, one row per finding
    # an escaped pipe does not add a column
    assert {len(re.split(r"(?<!\\)\|", row)) for row in rows} == {8}
    assert "<br>every call" in text


def test_markdown_clean_run() -> None:
    text = _render(OutputFormat.MARKDOWN, [RUN[1]])
    assert text.startswith("### placecheck: no placement problems in 1 model")


def test_markdown_cell_escaping() -> None:
    assert cell("a|b\nc <root>") == "a\\|b<br>c &lt;root&gt;"


# ---- multi-model table and JSON ------------------------------------------------------------------


def test_json_run_keeps_the_findings_contract() -> None:
    data = json.loads(_render(OutputFormat.JSON))
    assert [m["target"] for m in data["models"]] == [r.target for r in RUN]
    assert len(data["findings"]) == 4 - 1  # every finding, each with its model
    assert {f["target"] for f in data["findings"]} == {"pkg/net.py:Net", "pkg.crashy:Model"}
    assert data["summary"] == {"models": 3, "models_with_problems": 2, "problems": 3, "instances": 3}


def test_single_report_output_is_unchanged_by_the_run_interface() -> None:
    for fmt in (OutputFormat.TABLE, OutputFormat.JSON):
        formatter = formatter_for(fmt)
        assert formatter.format_reports([RUN[0]]) == formatter.format(RUN[0])


def test_junit_is_well_formed_xml() -> None:
    root = ET.fromstring(_render(OutputFormat.JUNIT).encode())
    assert root.tag == "testsuites"


# ---- fixes from review: fingerprints, the JSON run shape, PC901's stack, Python 3.10 --------------


def _mismatch(op: str, line: int, origin: str, what: str) -> Finding:
    return Finding(code="PC201", kind="device-mismatch", severity=Severity.ERROR, where="",
                   message=f"{op} mixed cpu and cuda:0: its argument is on cpu ({what}); a GPU raises",
                   hint="h", source=f"pkg/net.py:{line}", origin=origin, details=(("op", op),))


def _root_forward(shift: int) -> Report:
    # BuggyNet's root forward: three PC201 in one module, one file
    return Report.build("pkg/net.py:Net", "cuda:0", "x", [
        _mismatch("Tensor.add", 54 + shift, f"pkg/net.py:{54 + shift}",
                  f"created by torch.randn at pkg/net.py:{54 + shift}"),
        _mismatch("torch.linear", 61 + shift, "gate.weight", "from 'gate.weight', created during forward"),
        _mismatch("torch.linear", 62 + shift, "heads[0]", "from attribute 'heads[0].weight'"),
    ])


def _fingerprints(reports: list[Report]) -> list[str]:
    results = json.loads(_render(OutputFormat.SARIF, reports))["runs"][0]["results"]
    return [r["partialFingerprints"]["placecheck/v3"] for r in results]


def test_sarif_fingerprints_tell_findings_of_one_module_apart() -> None:
    # GitHub merges results that share a fingerprint into one alert
    before = _fingerprints([_root_forward(0)])
    assert len(set(before)) == 3
    # and each survives an edit above it that moves every line (in the message and origin too)
    assert _fingerprints([_root_forward(7)]) == before


def test_sarif_exact_duplicates_get_an_occurrence_index() -> None:
    # ungrouped (--no-group): grouped, the two identical findings are one problem
    twice = _mismatch("Tensor.add", 54, "x", "y")
    first = _fingerprints([Report.build("t:T", "cuda:0", "x", [twice, twice], group=False)])
    assert len(set(first)) == 2
    assert _fingerprints([Report.build("t:T", "cuda:0", "x", [twice])])[0] == first[0]


def test_json_config_run_shape_does_not_depend_on_the_number_of_models(tmp_path: Path) -> None:
    from placecheck.cli import OutputOptions
    from placecheck.cli.ci import finish_with_baseline

    shapes = []
    for reports in ([RUN[0]], RUN[:2]):
        out = OutputOptions(format=OutputFormat.JSON, output=str(tmp_path / "out.json"))
        finish_with_baseline(reports, out, None, None, load_error=False, config_run=True)
        data = validate_json((tmp_path / "out.json").read_text(encoding="utf-8"))
        shapes.append(sorted(data))
        assert [m["target"] for m in data["models"]] == [r.target for r in reports]
    assert shapes[0] == shapes[1] == ["findings", "models", "schema_version", "summary"]
    # one TARGET keeps the single-report object
    out = OutputOptions(format=OutputFormat.JSON, output=str(tmp_path / "one.json"))
    finish_with_baseline([RUN[0]], out, None, None, load_error=False)
    assert validate_json((tmp_path / "one.json").read_text(encoding="utf-8"))["target"] == RUN[0].target


def test_markdown_shows_a_dead_audits_last_stack_lines() -> None:
    stack = "Fatal Python error: Segmentation fault\n  File \"pkg/ext.py\", line 3 in build"
    crashed = Report.build("pkg.crashy:Model", "cuda:0", "not run",
                           [replace(CRASH, details=(("reason", "crash"), ("stderr", stack)))])
    text = _render(OutputFormat.MARKDOWN, [crashed])
    assert "**stderr:**<br>Fatal Python error: Segmentation fault<br>  File \"pkg/ext.py\", line 3" in text


# names the standard library gained after Python 3.10 (requires-python is >=3.10)
_NEWER_THAN_310 = {
    "typing": {"assert_never", "assert_type", "reveal_type", "Self", "Never", "LiteralString", "Required",
               "NotRequired", "TypeVarTuple", "Unpack", "dataclass_transform", "get_overloads",
               "clear_overloads", "override", "TypeAliasType", "ReadOnly", "TypeIs", "is_protocol",
               "get_protocol_members", "NoDefault"},
    "enum": {"StrEnum", "ReprEnum", "verify", "member", "nonmember", "property", "global_enum",
             "EnumCheck", "FlagBoundary"},
    "datetime": {"UTC"},
    "contextlib": {"chdir"},
    "hashlib": {"file_digest"},
    "asyncio": {"TaskGroup", "timeout", "Runner"},
}
_MODULES_NEWER_THAN_310 = {"tomllib", "wsgiref.types"}


def _version_guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "version_info" in ast.unparse(node.test):
            return True
    return False


def test_the_package_imports_nothing_python_3_10_lacks() -> None:
    problems = []
    for path in sorted((TESTS.parent / "placecheck").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if _version_guarded(node, parents):
                continue
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {a.name for a in node.names} & _NEWER_THAN_310.get(node.module, set())
                if names or node.module in _MODULES_NEWER_THAN_310:
                    problems.append(f"{path.name}:{node.lineno}: from {node.module} import {names or '...'}")
            elif isinstance(node, ast.Import):
                problems += [f"{path.name}:{node.lineno}: import {a.name}" for a in node.names
                             if a.name in _MODULES_NEWER_THAN_310]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.attr in _NEWER_THAN_310.get(node.value.id, set()):
                problems.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert problems == []


def test_table_run_summary_counts_in_good_english() -> None:
    one = [RUN[1], Report.build("pkg/net.py:Net", "cuda:0", "simulated cuda", [STRAY])]
    assert _render(OutputFormat.TABLE, one).endswith(
        "placecheck: 2 models, 1 with problems, 1 problem in all\n")
    assert _render(OutputFormat.TABLE).endswith("placecheck: 3 models, 2 with problems, 3 problems in all\n")


# ---- problems: instances and evidence (issue 10) --------------------------------------------------


def _blocks(n: int, source: str = "") -> Report:
    """``n`` blocks that each keep a stray mask, and the mismatch the first one causes; grouped."""
    strays = [replace(STRAY, where=f"blocks.{i}.mask", module=f"blocks.{i}", source=source) for i in range(n)]
    crash = Finding(code="PC201", kind="device-mismatch", severity=Severity.ERROR, where="blocks.0",
                    message="Tensor.mul mixed cpu and cuda:0: its argument is on cpu", hint="h",
                    source="pkg/net.py:33", origin="blocks.0.mask", details=(("op", "Tensor.mul"),))
    return Report.build("pkg/net.py:Net", "cuda:0", "simulated cuda", [*strays, crash], group=True)


@pytest.mark.usefixtures("in_tmp")
def test_sarif_one_result_per_problem_with_related_locations() -> None:
    log = json.loads(_render(OutputFormat.SARIF, [_blocks(3)]))
    jsonschema.validate(log, SCHEMA, cls=jsonschema.Draft4Validator)
    (result,) = log["runs"][0]["results"]
    related = result["relatedLocations"]
    assert [r["id"] for r in related] == [1, 2, 3]
    assert [r["logicalLocations"][0]["fullyQualifiedName"] for r in related] == [
        "pkg/net.py:Net.blocks.1.mask", "pkg/net.py:Net.blocks.2.mask", "pkg/net.py:Net.blocks.0"]
    crash = related[2]
    assert crash["physicalLocation"]["region"] == {"startLine": 33}  # the evidence at its own line
    assert crash["message"]["text"].startswith("PC201: crashes on a GPU at pkg/net.py:33 in blocks.0")
    # no source of its own: the problem points at the line where it crashes
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": 33}
    assert result["properties"]["instances"] == ["blocks.0.mask", "blocks.1.mask", "blocks.2.mask"]


def test_sarif_fingerprint_is_stable_when_the_instance_count_changes() -> None:
    assert _fingerprints([_blocks(2)]) == _fingerprints([_blocks(24)])
    assert _fingerprints([_blocks(2)]) != _fingerprints([_root_forward(0)])[:1]


@pytest.mark.usefixtures("in_tmp")
def test_walk_findings_of_a_config_run_point_at_their_assignment_line() -> None:
    # a --config run names its models by name: no file to fall back on, so the walk finding's
    # source (the line that assigned the attribute) is what SARIF and GitHub point at
    report = replace(_blocks(2, source="pkg/net.py:14"), target="encoder-small")
    sarif = json.loads(_render(OutputFormat.SARIF, [report]))["runs"][0]["results"][0]
    assert sarif["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "pkg/net.py", "uriBaseId": "%SRCROOT%"}, "region": {"startLine": 14}}
    (annotation,) = [line for line in _render(OutputFormat.GITHUB, [report]).splitlines()
                     if line.startswith("::")]
    assert annotation.startswith("::error file=pkg/net.py,line=14,title=placecheck PC101 stray-tensor::")
    assert "blocks.{0,1}.mask (2)" in annotation and "crashes on a GPU at pkg/net.py:33" in annotation


def test_junit_and_markdown_show_a_problem_once_with_its_instances_and_evidence() -> None:
    junit = _render(OutputFormat.JUNIT, [_blocks(3)])
    assert junit.count("<failure ") == 1
    assert "instances: blocks.0.mask, blocks.1.mask, blocks.2.mask" in junit
    assert "caused PC201: crashes on a GPU at pkg/net.py:33" in junit
    markdown = _render(OutputFormat.MARKDOWN, [_blocks(3)])
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 + 1 and "`blocks.{0..2}.mask (3)`" in rows[2]
    assert "→ crashes on a GPU at pkg/net.py:33" in rows[2]
