"""``placecheck.findings.baseline``: known findings hidden, new ones reported, stale entries named."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from cli_runner import CliRunner
from typer.testing import Result

from placecheck.basics.errors import UsageError
from placecheck.cli import app
from placecheck.findings import baseline
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.report import Report

REPO = Path(__file__).resolve().parents[1]


def _f(code: str, where: str, source: str = "", message: str = "m") -> Finding:
    return Finding(code=code, kind="k", severity=Severity.ERROR, where=where, message=message, hint="h",
                   source=source)


def _report(target: str, *findings: Finding, group: bool = True) -> Report:
    return Report.build(target, "cuda:0", "fake", findings, group=group)


def test_round_trip_hides_everything(tmp_path: Path) -> None:
    run = [_report("a:A", _f("PC101", "mask"), _f("PC202", "blk", "/x/net.py:10")), _report("b:B")]
    path = tmp_path / "b.json"
    assert baseline.write(path, run) == 2
    result = baseline.apply(run, baseline.read(path))
    assert [r.findings for r in result.reports] == [(), ()]
    assert result.suppressed == 2 and result.stale == ()
    assert "baseline: 2 known findings not shown" in result.reports[0].notes


def test_keys_survive_line_shifts_and_message_changes(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    baseline.write(path, [_report("a:A", _f("PC202", "blk", "pkg/net.py:10", "float32[4]"))])
    later = [_report("a:A", _f("PC202", "blk", "pkg/net.py:57", "float32[8]"))]
    assert baseline.apply(later, baseline.read(path)).reports[0].findings == ()


def test_new_findings_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    two = _f("PC202", "blk", "net.py:1")
    baseline.write(path, [_report("a:A", two, replace(two, source="net.py:2"))])
    assert json.loads(path.read_text())["entries"][0]["count"] == 2
    # a third finding with the same key, one in another module, one in another model: all new
    # (ungrouped: grouped, three identical findings are one problem)
    later = [_report("a:A", two, two, two, _f("PC202", "other", "net.py:1"), group=False),
             _report("b:B", two)]
    result = baseline.apply(later, baseline.read(path))
    assert [(f.code, f.where) for f in result.reports[0].findings] == [("PC202", "blk"), ("PC202", "other")]
    assert len(result.reports[1].findings) == 1


def test_stale_entries(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    baseline.write(path, [_report("a:A", _f("PC101", "mask"), _f("PC102", "heads[0]")),
                          _report("c:C", _f("PC101", "x"))])
    result = baseline.apply([_report("a:A", _f("PC101", "mask"))], baseline.read(path))
    # only models in this run are judged: c:C was not audited, so its entry is not stale
    assert [s.describe() for s in result.stale] == ["a:A: PC102 at heads[0]"]
    assert "baseline: stale entry, no longer found: a:A: PC102 at heads[0]" in result.reports[0].notes


def test_paths_are_repository_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    inside = baseline.finding_key("a:A", _f("PC202", "", f"{tmp_path}/pkg/net.py:3"))
    installed = baseline.finding_key("a:A", _f("PC202", "", "/usr/lib/python3/site-packages/tv/m.py:3"))
    assert (inside[3], installed[3]) == ("pkg/net.py", "tv/m.py")


@pytest.mark.parametrize("content, message", [
    (None, "cannot read --baseline"), ("{", "is not JSON"), ('{"x": 1}', "is not a placecheck baseline"),
    ('{"placecheck_baseline": 1, "entries": [{"code": "PC101"}]}', "entry 0 needs model, code and where"),
])
def test_bad_baseline_files(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "b.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=message):
        baseline.read(path)


def test_cli_adopts_then_fails_only_on_new_findings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # in-process (CliRunner), as the command line would run it from tmp_path: the edited file is
    # imported again each time (load.py keys file modules by mtime and size)
    monkeypatch.chdir(tmp_path)
    net = tmp_path / "net.py"
    net.write_text("import torch\nimport torch.nn as nn\n\n\nclass Net(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n"
                   "        self.fc = nn.Linear(4, 4)\n        self.mask = torch.ones(4)\n")
    path = tmp_path / "baseline.json"

    def placecheck(*args: str) -> Result:
        result = CliRunner().invoke(app, ["audit", f"{net}:Net", "--select", "PC1", *args])
        assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), \
            result.exception
        return result

    adopt = placecheck("--write-baseline", str(path))
    assert adopt.exit_code == 0, adopt.stderr
    assert "placecheck: recorded 1 finding in" in adopt.stderr
    assert placecheck("--baseline", str(path)).exit_code == 0
    net.write_text(net.read_text() + "        self.extra = [nn.Linear(4, 4)]\n")
    new = placecheck("--baseline", str(path), "--format", "json")
    assert new.exit_code == 1
    assert [f["code"] for f in json.loads(new.stdout)["findings"]] == ["PC102"]
    net.write_text(net.read_text().replace("self.mask = torch.ones(4)", "pass"))
    fixed = placecheck("--baseline", str(path))
    assert "1 stale entry" in fixed.stderr and "PC101 at mask" in fixed.stderr


def _incomplete() -> Finding:
    return Finding(code="PC901", kind="audit-incomplete", severity=Severity.ERROR, where="",
                   message="the audit crashed the Python interpreter (SIGSEGV)", hint="h")


def test_pc901_is_never_recorded(tmp_path: Path) -> None:
    # a model that segfaults today must not pass CI forever once a baseline is written
    path = tmp_path / "b.json"
    assert baseline.write(path, [_report("a:A", _incomplete(), _f("PC101", "mask"))]) == 1
    assert [e["code"] for e in json.loads(path.read_text())["entries"]] == ["PC101"]


def test_pc901_is_never_hidden(tmp_path: Path) -> None:
    # a baseline written by hand (or by an older placecheck) with a PC901 entry
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"placecheck_baseline": 1, "entries": [
        {"model": "a:A", "code": "PC901", "where": "", "file": "", "count": 1}]}))
    result = baseline.apply([_report("a:A", _incomplete())], baseline.read(path))
    assert [f.code for f in result.reports[0].findings] == ["PC901"]
    assert result.suppressed == 0


def test_a_complete_run_calls_entries_of_absent_models_stale(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    baseline.write(path, [_report("a:A", _f("PC101", "mask")), _report("gone:G", _f("PC101", "x"))])
    run = [_report("a:A", _f("PC101", "mask"))]
    assert baseline.apply(run, baseline.read(path)).stale == ()  # one TARGET: other models not judged
    stale = baseline.apply(run, baseline.read(path), complete=True).stale
    assert [s.describe() for s in stale] == ["gone:G: PC101 at x (model no longer in the config)"]


def test_a_config_run_reports_entries_of_models_no_longer_listed(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from placecheck.cli import OutputOptions
    from placecheck.cli.ci import finish_with_baseline

    path = tmp_path / "b.json"
    baseline.write(path, [_report("a:A"), _report("gone:G", _f("PC101", "x"))])
    out = OutputOptions(output=str(tmp_path / "out.txt"))
    code = finish_with_baseline([_report("a:A")], out, str(path), None, load_error=False, config_run=True)
    assert code == 0
    assert "1 stale entry" in capsys.readouterr().err
    assert finish_with_baseline([_report("a:A")], out, str(path), None, load_error=False) == 0
    assert "stale" not in capsys.readouterr().err


# ---- problems (issue 10): keyed by problem; version-1 files still read ----------------------------

V1_BASELINE = REPO / "tests" / "fixtures" / "baseline" / "buggy.v1.json"
"""Written by placecheck before grouping (baseline version 1, one entry per finding) for the demo model."""


def _buggy(monkeypatch: pytest.MonkeyPatch) -> Report:
    from conftest import load_file

    import placecheck

    monkeypatch.chdir(REPO)  # sources repository-relative, as when the file was written
    model = load_file(REPO / "placecheck" / "examples" / "buggy.py", "BuggyNet")
    return placecheck.audit(model, device="cuda", engine="fake", init="cpu",
                            target="placecheck/examples/buggy.py:BuggyNet")


def test_a_version_1_baseline_still_hides_what_it_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert json.loads(V1_BASELINE.read_text())["placecheck_baseline"] == 1
    report = _buggy(monkeypatch)
    for run in (report.grouped(), report):  # problems, and --no-group
        result = baseline.apply([run], baseline.read(V1_BASELINE))
        assert result.reports[0].findings == () and result.stale == ()
        assert result.suppressed == len(run.findings)
    # a new problem is still new, and an entry that matches nothing any more is stale
    extra = _f("PC102", "towers[0]")
    fixed = replace(report, findings=tuple(f for f in report.findings if not f.where.endswith("mask")))
    result = baseline.apply([replace(fixed, findings=(*fixed.findings, extra)).grouped()],
                            baseline.read(V1_BASELINE))
    assert [(f.code, f.where) for f in result.reports[0].findings] == [("PC102", "towers[0]")]
    assert sorted(s.where for s in result.stale) == ["blocks.0.mask", "blocks.1.mask"]


def test_a_version_1_walk_entry_matches_once_walk_findings_carry_their_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # version-1 walk entries have no file (walk findings had no source then)
    report = _buggy(monkeypatch)
    with_lines = [replace(f, source="placecheck/examples/buggy.py:27") if f.code.startswith("PC1") else f
                  for f in report.findings]
    run = replace(report, findings=tuple(with_lines)).grouped()
    assert baseline.apply([run], baseline.read(V1_BASELINE)).reports[0].findings == ()


def test_problem_keys_survive_a_change_in_the_instance_count(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    masks = [replace(_f("PC101", f"blocks.{i}.mask"), module=f"blocks.{i}") for i in range(24)]
    assert baseline.write(path, [_report("a:A", *masks[:12])]) == 1  # one problem recorded
    data = json.loads(path.read_text())
    (entry,) = data["entries"]
    assert (data["placecheck_baseline"], entry["where"], entry["instance"]) == (
        2, "blocks.*.mask", "blocks.0.mask")
    grown = baseline.apply([_report("a:A", *masks)], baseline.read(path))
    assert grown.reports[0].findings == () and grown.stale == ()
    other = baseline.apply([_report("a:A", _f("PC101", "blocks.0.bias"))], baseline.read(path))
    assert len(other.reports[0].findings) == 1
    assert [s.describe() for s in other.stale] == ["a:A: PC101 at blocks.0.mask"]


def test_a_version_1_pc203_entry_matches_the_layer_path_it_now_has(tmp_path: Path) -> None:
    # PC203's where was the module whose forward built the layer ("" for the root); it is now the layer
    path = tmp_path / "v1.json"
    path.write_text(json.dumps({"placecheck_baseline": 1, "entries": [
        {"model": "a:A", "code": "PC203", "where": "", "file": "net.py", "count": 1}]}))
    lazy = replace(_f("PC203", "gate", "net.py:60"), module="gate")
    result = baseline.apply([_report("a:A", lazy)], baseline.read(path))
    assert result.reports[0].findings == () and result.stale == ()
    elsewhere = baseline.apply([_report("a:A", replace(lazy, source="other.py:3"))], baseline.read(path))
    assert len(elsewhere.reports[0].findings) == 1 and len(elsewhere.stale) == 1
