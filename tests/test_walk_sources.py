"""End to end: a walk finding's ``source`` survives a ``--config`` run (a child process per model) and
is where SARIF and GitHub annotations point, the line that assigned the attribute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import CliRunner
from conftest import EXAMPLES

from placecheck.cli import app

BUGGY_FILE = EXAMPLES / "buggy.py"


def _assignment_line(text: str) -> int:
    lines = BUGGY_FILE.read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(f'[[models]]\ntarget = "{BUGGY_FILE}:BuggyNet"\nname = "buggy"\n'
                    'device = "cuda"\nengine = "fake"\nforward = false\n', encoding="utf-8")
    return path


def test_config_run_sarif_and_github_point_walk_findings_at_the_assignment_line(config: Path) -> None:
    expected = {"PC101": {_assignment_line("self.mask ="), _assignment_line("self.cache ="),
                          _assignment_line("self.rope =")},
                "PC102": {_assignment_line("self.heads =")}, "PC103": {_assignment_line("self.scales =")}}
    sarif = CliRunner().invoke(app, ["audit", "--config", str(config), "--format", "sarif"])
    assert sarif.exit_code == 1, sarif.stderr
    lines: dict[str, set[int]] = {}
    for result in json.loads(sarif.stdout)["runs"][0]["results"]:
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uri"].endswith("examples/buggy.py")
        lines.setdefault(result["ruleId"], set()).add(location["region"]["startLine"])
    assert lines == expected
    github = CliRunner().invoke(app, ["audit", "--config", str(config), "--format", "github"])
    annotations = [line for line in github.stdout.splitlines() if line.startswith("::")]
    assert annotations and all("examples/buggy.py,line=" in line for line in annotations)
    shown = {int(line.split("line=", 1)[1].split(",", 1)[0]) for line in annotations}
    assert shown == set().union(*expected.values())


def test_a_copy_of_an_examples_file_gets_its_own_sources_in_the_same_process(tmp_path: Path) -> None:
    # code objects compare equal across files (co_filename is not compared): a cache per code object
    # read the copy's frames as the example's, placecheck's own, and lost every forward source
    from placecheck.basics.options import AuditOptions
    from placecheck.commands.api import audit
    from placecheck.model.load import model_factory

    def sources(target: str) -> list[tuple[str, str]]:
        report = audit(model_factory(target, {}), options=AuditOptions(target=target, copy_model=False))
        return sorted((f.code, f.source.rpartition(":")[2]) for f in report.findings)

    example = EXAMPLES / "buggy.py"
    copy = tmp_path / "copied_net.py"
    copy.write_bytes(example.read_bytes())
    first = sources(f"{example}:BuggyNet")
    assert ("PC202", "54") in first
    assert sources(f"{copy}:BuggyNet") == first
