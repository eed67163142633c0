"""Output formats: every ``--format`` choice has a formatter, and the golden outputs match exactly.

The golden files under ``tests/golden/`` are the table and JSON reports of the
buggy example (``placecheck/examples/buggy.py:BuggyNet``) under simulated
CUDA. They are compared byte for byte; after an intended change, regenerate
them with ``pytest tests/test_formats.py --update-golden`` and review the diff.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_runner import CliRunner
from conftest import REPO, load_file
from report_schema import validate_json

import placecheck
from placecheck.cli import app
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.formats import Formatter, OutputFormat, formatter_for
from placecheck.findings.report import Report

# A relative target keeps the machine's paths out of the golden files; an explicit
# engine and init keep the machine's GPUs and free memory out of the notes.
TARGET = "placecheck/examples/buggy.py:BuggyNet"
STABLE = ["--engine", "fake", "--init", "cpu"]


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


@pytest.fixture(autouse=True)
def no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    # the table honours $COLUMNS when piped: the goldens are the 80-column default
    monkeypatch.delenv("COLUMNS", raising=False)


def _cli(*args: str) -> str:
    result = CliRunner().invoke(app, ["audit", TARGET, *STABLE, *args])
    assert result.exit_code == 1, result.stderr
    if "json" in args:
        validate_json(result.stdout)  # every JSON output of these tests is what the shipped schema says
    return result.stdout


def _python_report() -> Report:
    model = load_file(REPO / "placecheck" / "examples" / "buggy.py", "BuggyNet")
    return placecheck.audit(model, device="cuda", engine="fake", init="cpu", target=TARGET)


@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_every_format_choice_has_a_formatter(fmt: OutputFormat) -> None:
    formatter = formatter_for(fmt)
    assert isinstance(formatter, Formatter)
    empty = Report.build("t", "cuda:0", "simulated cuda", [])
    assert formatter.format(empty).endswith("\n")


@pytest.mark.usefixtures("in_repo")
def test_table_golden(golden: Callable[[str, str], None]) -> None:
    golden("buggy.table.txt", _cli())


@pytest.mark.usefixtures("in_repo")
def test_json_golden(golden: Callable[[str, str], None]) -> None:
    golden("buggy.json", _cli("--format", "json"))


@pytest.mark.usefixtures("in_repo")
@pytest.mark.parametrize("fmt, name", [(OutputFormat.TABLE, "buggy.grouped.table.txt"),
                                       (OutputFormat.JSON, "buggy.grouped.json"),
                                       (OutputFormat.SARIF, "buggy.grouped.sarif")], ids=str)
def test_grouped_golden(fmt: OutputFormat, name: str, golden: Callable[[str, str], None]) -> None:
    # the demo's 18 findings as problems: one per root cause, the mismatches as their evidence
    text = formatter_for(fmt).format(_python_report().grouped())
    if fmt is OutputFormat.JSON:
        validate_json(text)
    golden(name, text.replace(placecheck.__version__, "VERSION"))


@pytest.mark.usefixtures("in_repo")
def test_formatters_usable_from_python_give_the_cli_output() -> None:
    # the CLI shows problems (one per root cause); audit() returns instances, report.grouped() problems
    report = _python_report().grouped()
    assert formatter_for(OutputFormat.TABLE).format(report) == _cli()
    assert formatter_for(OutputFormat.JSON).format(report) == _cli("--format", "json")
    ungrouped = _python_report()
    assert formatter_for(OutputFormat.JSON).format(ungrouped) == _cli("--format", "json", "--no-group")


@pytest.mark.usefixtures("in_repo")
def test_output_is_deterministic() -> None:
    assert _cli() == _cli()
    assert _cli("-f", "json") == _cli("-f", "json")


def test_table_shows_problem_fix_and_summary() -> None:
    # the device and size columns are gone (issue 10: severity, code, where, source, problem per row);
    # the bytes off the device are in the summary line, the rest in --format json
    finding = Finding(code="PC102", kind="unregistered-module", severity=Severity.ERROR,
                      where="heads[0]", message="m", hint="use nn.ModuleList", device="cpu",
                      expected="cuda:0", nbytes=2048, count=3, module="")
    text = formatter_for(OutputFormat.TABLE).format(Report.build("Net", "cuda:0", "cuda", [finding]))
    lines = text.splitlines()
    assert lines[0] == "placecheck: Net on cuda:0"  # a real device: the engine says nothing more
    assert lines[2:4] == ["error   PC102 heads[0]", "              m"]
    assert "  PC102 unregistered-module: use nn.ModuleList" in lines
    assert lines[-1] == "1 problem in 1 module: 1 error; 2.0 KiB not on cuda:0"


def test_table_root_where_and_source() -> None:
    finding = Finding(code="PC202", kind="created-off-device", severity=Severity.WARNING, where="",
                      message="m", hint="h", source="model.py:12")
    text = formatter_for(OutputFormat.TABLE).format(Report.build("Net", "cuda:0", "cuda", [finding]))
    assert "<root>" in text and "model.py:12" in text


def test_json_contract_fields() -> None:
    finding = Finding(code="PC101", kind="stray-tensor", severity=Severity.ERROR, where="mask",
                      message="m", hint="h", device="cpu", expected="cuda:0", dtype="float32",
                      shape=(2, 3), nbytes=24, count=1)
    data = validate_json(formatter_for(OutputFormat.JSON).format(
        Report.build("Net", "cuda:0", "simulated cuda", [finding], notes=["n"], stats={"modules": 1})))
    assert (data["target"], data["device"], data["engine"]) == ("Net", "cuda:0", "simulated cuda")
    assert data["notes"] == ["n"] and data["stats"] == {"modules": 1}
    assert data["summary"]["line"] == "1 problem in 1 module: 1 error; 24 B not on cuda:0"
    (out,) = data["findings"]
    assert {k: out[k] for k in ("code", "kind", "severity", "where", "source", "device", "expected",
                                "message", "hint")} == {
        "code": "PC101", "kind": "stray-tensor", "severity": "error", "where": "mask", "source": "",
        "device": "cpu", "expected": "cuda:0", "message": "m", "hint": "h"}
    assert out["shape"] == [2, 3] and out["nbytes"] == 24


def _widest(text: str) -> int:
    """The widest line but the first, which names the TARGET and is never wrapped (a path cannot be)."""
    return max(len(line) for line in text.splitlines()[1:])


@pytest.mark.parametrize("grouped", [False, True], ids=["no-group", "group"])
@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_table_fits_the_terminal_it_is_written_to(width: int, grouped: bool) -> None:
    report = _python_report().grouped() if grouped else _python_report()
    fixed = formatter_for(OutputFormat.TABLE).format(report)
    assert 70 < _widest(fixed) <= 80  # a file, a pipe, a CI log: 80 columns, the same everywhere
    assert len(fixed.splitlines()[0]) <= 80
    fitted = formatter_for(OutputFormat.TABLE, width).format(report)
    assert _widest(fitted) <= width
    # wrapped at word boundaries only: the same words, none broken (``self.register_buffe`` / ``r(...)``)
    assert fitted.split() == fixed.split()
    assert 'self.register_buffer("mask",' in fitted.split()


def test_table_honours_columns_when_piped(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _python_report()
    monkeypatch.setenv("COLUMNS", "80")
    at_80 = formatter_for(OutputFormat.TABLE).format(report)
    assert _widest(at_80) <= 80
    monkeypatch.setenv("COLUMNS", "120")
    at_120 = formatter_for(OutputFormat.TABLE).format(report)
    assert 80 < _widest(at_120) <= 120
    assert at_120.split() == at_80.split()


def test_table_problem_takes_at_most_three_lines_at_100_columns() -> None:
    report = _python_report().grouped()
    text = formatter_for(OutputFormat.TABLE, 100).format(report)
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line[:7].rstrip() in ("error", "warning", "info") and line[8:10] == "PC":
            blocks.append([line])
        elif blocks and line.startswith(" " * 14) and not line.startswith(" " * 17) \
                and not line.lstrip().startswith("->"):
            blocks[-1].append(line)  # the problem's own lines (-> lines and theirs: what it caused)
        elif blocks and not line.startswith(" "):
            break
    assert len(blocks) == len(report.findings)
    assert max(len(b) for b in blocks) <= 3


def test_table_hints_once_per_rule_or_on_every_row() -> None:
    twice = [Finding(code="PC202", kind="created-off-device", severity=Severity.WARNING, where="",
                     message=f"m{n}", hint="pass device=x.device", source=f"net.py:{n}") for n in (3, 9)]
    report = Report.build("Net", "cuda:0", "cuda", twice, group=True)
    once = formatter_for(OutputFormat.TABLE).format(report)
    assert once.count("pass device=x.device") == 1
    assert "  PC202 created-off-device: pass device=x.device" in once.splitlines()
    every = formatter_for(OutputFormat.TABLE, hints=True).format(report)
    assert every.count("fix: pass device=x.device") == 2 and "how to fix" not in every


def test_table_width_reaches_the_formatter_only_for_a_terminal(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    import placecheck.findings.output as cli

    seen: list[int | None] = []
    hinted: list[bool] = []
    real = cli.formatter_for

    def spy(fmt: OutputFormat, width: int | None = None, hints: bool = False, run: Any = None) -> Formatter:
        seen.append(width)
        hinted.append(hints)
        return real(fmt, width, hints, run)

    monkeypatch.setattr(cli, "formatter_for", spy)
    monkeypatch.setattr(cli.shutil, "get_terminal_size", lambda: os.terminal_size((111, 40)))
    report = _python_report()
    options = cli.OutputOptions(format=OutputFormat.TABLE, output="-", fail_on="warning", exit_zero=True,
                                debug=False)
    monkeypatch.setattr(cli.sys.stdout, "isatty", lambda: True, raising=False)
    cli.emit(report, options)
    monkeypatch.setattr(cli.sys.stdout, "isatty", lambda: False, raising=False)
    cli.emit(report, options)
    cli.emit(report, dataclasses.replace(options, output=str(tmp_path / "report.txt"), hints=True))
    assert seen == [111, None, None]
    assert hinted == [False, False, True]  # --hints reaches the formatter


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.mask = torch.tril(torch.ones(4, 4))  # a plain attribute: .to() leaves it behind


class _Tower(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block() for _ in range(24)])


def test_24_blocks_with_one_stray_line_are_one_short_problem() -> None:
    report = placecheck.audit(_Tower(), device="cuda", engine="fake", forward=False).grouped()
    (problem,) = report.findings
    assert problem.code == "PC101" and len(problem.instances) == 24
    text = formatter_for(OutputFormat.TABLE).format(report)
    assert "PC101 blocks.{0..23}.mask (24)" in text
    assert text.count("\n") < 20 and _widest(text) <= 80  # was 24 grid rows, 135 lines, 96 columns


def test_no_group_hints_name_every_problem_they_cover_and_tell_roots_apart() -> None:
    from placecheck.findings.finding import Finding, Severity
    from placecheck.findings.formats.table import TableFormatter
    from placecheck.findings.report import Report

    def mismatch(where: str, source: str, hint: str) -> Finding:
        return Finding(code="PC201", kind="device-mismatch", severity=Severity.ERROR, where=where,
                       source=source, message="m", hint=hint)

    findings = [mismatch("", "train.py:3", "move x"), mismatch("", "train.py:5", "move y"),
                mismatch("", "train.py:9", "move z"), mismatch("c0", "train.py:12", "move the state"),
                mismatch("h0", "train.py:12", "move the state")]
    text = TableFormatter(width=80).format(Report.build("t", "cuda:0", "cuda", findings, group=False))
    hints = text.split("how to fix (placecheck explain CODE says more):\n", 1)[1].split("\n\n", 1)[0]
    assert hints.splitlines() == [
        "  PC201 <root> at train.py:3: move x",
        "  PC201 <root> at train.py:5: move y",
        "  PC201 <root> at train.py:9: move z",
        "  PC201 c0, h0: move the state",
    ]
