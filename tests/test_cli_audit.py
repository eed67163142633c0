"""``placecheck audit`` end to end: exit codes, options, output, and every load/usage error.

Most tests drive :data:`placecheck.cli.app` with typer's ``CliRunner``; one
runs the real ``python -m placecheck`` in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import CliRunner, separate_stderr_capture
from conftest import BUGGY, CLEAN, TESTS, assert_usage_error, unwrapped

from placecheck.cli import app

pytestmark = [pytest.mark.compat, pytest.mark.cli]

TARGETS = TESTS / "fixtures" / "cli" / "targets.py"
BROKEN = TESTS / "fixtures" / "cli" / "broken_import.py"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def run(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["audit", *args])
    return result.exit_code, result.stdout, result.stderr


# -- exit codes ---------------------------------------------------------------------------


@pytest.mark.cpu_build
def test_clean_model_exits_0(runner: CliRunner) -> None:
    code, out, _ = run(runner, CLEAN)
    assert code == 0
    # "simulated (real values on the CPU)" on the CPU-only torch build, where auto falls back
    assert "no placement problems found on cuda:0, simulated (" in out


def test_buggy_model_exits_1(runner: CliRunner) -> None:
    code, out, _ = run(runner, BUGGY, "--no-group")
    assert code == 1
    assert "PC101" in out and "PC102" in out and "PC103" in out
    assert "PC201" in out and "PC202" in out and "PC203" in out  # the forward pass
    # one row per instance, counted as the grouped report counts them
    assert out.rstrip().splitlines()[-1].startswith("7 problems (18 instances) in 4 modules: 7 errors;")
    assert out.count("\nerror   PC") + out.count("\nwarning PC") == 18


def test_buggy_model_grouped_by_root_cause(runner: CliRunner) -> None:
    """By default one row per root cause: the 18 findings are 7 problems, the PC201s their evidence."""
    code, out, _ = run(runner, BUGGY)
    assert code == 1
    assert out.rstrip().splitlines()[-1].startswith("7 problems (18 instances) in 4 modules: 7 errors;")
    assert "blocks.{0,1}.mask (2)" in out
    assert "crashes on a GPU at line 33 in blocks.0: Tensor.mul mixed cpu and cuda:0" in " ".join(out.split())


def test_exit_zero(runner: CliRunner) -> None:
    code, out, _ = run(runner, BUGGY, "--exit-zero")
    assert code == 0 and "PC101" in out


@pytest.mark.parametrize("fail_on, expected", [("error", 1), ("warning", 1), ("info", 1), ("never", 0)])
def test_fail_on_with_errors(runner: CliRunner, fail_on: str, expected: int) -> None:
    assert run(runner, BUGGY, "--fail-on", fail_on)[0] == expected


@pytest.mark.parametrize("fail_on", ["error", "warning", "info", "never"])
def test_fail_on_with_a_clean_model(runner: CliRunner, fail_on: str) -> None:
    assert run(runner, CLEAN, "--fail-on", fail_on)[0] == 0


def test_fail_on_unknown_is_a_usage_error(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, BUGGY, "--fail-on", "fatal"), "--fail-on", "error, warning")


# -- output -------------------------------------------------------------------------------


def test_output_file(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "report.txt"
    code, out, _ = run(runner, BUGGY, "--output", str(target))
    assert code == 1
    assert out == ""
    assert "blocks.{0,1}.mask (2)" in target.read_text(encoding="utf-8")


def test_output_dash_is_stdout(runner: CliRunner) -> None:
    code, out, _ = run(runner, BUGGY, "-o", "-")
    assert code == 1 and "blocks.{0,1}.mask (2)" in out


def test_output_to_unwritable_path(runner: CliRunner, tmp_path: Path) -> None:
    assert_usage_error(*run(runner, BUGGY, "--output", str(tmp_path / "no" / "dir" / "r.txt")),
                       "--output")


def test_json_format(runner: CliRunner) -> None:
    code, out, _ = run(runner, BUGGY, "--format", "json", "--no-forward", "--no-group")
    assert code == 1
    data = json.loads(out)
    assert {"findings", "target", "device", "engine", "summary"} <= set(data)
    assert data["target"] == BUGGY
    assert (data["device"], data["engine"]) == ("cuda:0", "simulated cuda")
    assert data["summary"]["instances"] == len(data["findings"]) == 12  # --no-group: one per instance
    assert data["summary"]["problems"] == data["summary"]["errors"] == 5
    required = {"code", "kind", "severity", "where", "source", "device", "expected", "message", "hint"}
    for finding in data["findings"]:
        assert required <= set(finding), finding
        assert finding["expected"] == "cuda:0" and finding["device"] == "cpu"
    wheres = [f["where"] for f in data["findings"]]
    assert "rope.cos" in wheres and "heads[1]" in wheres and "blocks.1.cache['v']" in wheres


def test_json_clean(runner: CliRunner) -> None:
    code, out, _ = run(runner, CLEAN, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["findings"] == [] and data["summary"]["problems"] == 0


# -- select / ignore / device --------------------------------------------------------------


def _codes(out: str) -> list[str]:
    return sorted({f["code"] for f in json.loads(out)["findings"]})


def test_select_by_prefix(runner: CliRunner) -> None:
    code, out, _ = run(runner, BUGGY, "-f", "json", "--select", "PC102")
    assert code == 1 and _codes(out) == ["PC102"]
    code, out, _ = run(runner, BUGGY, "-f", "json", "--select", "PC1")
    assert _codes(out) == ["PC101", "PC102", "PC103"]


def test_ignore_by_prefix(runner: CliRunner) -> None:
    code, out, _ = run(runner, BUGGY, "-f", "json", "--ignore", "PC101,PC103,PC2")
    assert code == 1 and _codes(out) == ["PC102"]
    code, out, _ = run(runner, BUGGY, "-f", "json", "--ignore", "PC1", "--ignore", "PC2")
    assert code == 0 and _codes(out) == []


def test_select_all_and_repeated(runner: CliRunner) -> None:
    _, out, _ = run(runner, BUGGY, "-f", "json", "--select", "PC101", "--select", "PC103")
    assert _codes(out) == ["PC101", "PC103"]
    _, out, _ = run(runner, BUGGY, "-f", "json", "--select", "ALL", "--no-group")
    assert _codes(out) == ["PC101", "PC102", "PC103", "PC201", "PC202", "PC203"]


def test_bad_select_code(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, BUGGY, "--select", "PC999"), "PC999")
    assert_usage_error(*run(runner, BUGGY, "--ignore", "XYZ"), "XYZ")


def test_device_second_gpu(runner: CliRunner) -> None:
    code, out, _ = run(runner, BUGGY, "--device", "cuda:1", "-f", "json")
    assert code == 1
    data = json.loads(out)
    assert data["device"] == "cuda:1" and data["engine"] == "simulated cuda"
    assert {f["expected"] for f in data["findings"]} == {"cuda:1"}
    assert any("2 GPUs" in note for note in data["notes"]), data["notes"]


def test_device_second_gpu_is_visible_to_model_code(runner: CliRunner) -> None:
    code, out, _ = run(runner, f"{TARGETS}:UsesSecondGpu", "--device", "cuda:1", "-f", "json",
                       "--no-forward")
    assert code == 1
    assert [f["where"] for f in json.loads(out)["findings"]] == ["mask"]


def test_device_cpu_on_buggy_reports_what_state_dict_and_the_optimizer_miss(runner: CliRunner) -> None:
    # everything the buggy model holds is already on the cpu, but modules and parameters in plain
    # lists are missed by state_dict() and the optimizer on any device (errors); the layer it builds
    # in forward is on the cpu too, and an optimizer built before the first forward never sees it
    code, out, _ = run(runner, BUGGY, "--device", "cpu", "--format", "json")
    rows = [(f["code"], f["severity"], f["source"].rpartition("/")[2]) for f in json.loads(out)["findings"]]
    assert sorted(set(rows)) == [("PC102", "error", "buggy.py:46"), ("PC103", "error", "buggy.py:48"),
                                 ("PC203", "warning", "buggy.py:60")]
    assert code == 1
    code, _, _ = run(runner, BUGGY, "--device", "cpu", "--fail-on", "error")
    assert code == 1


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:1", ""])
def test_unknown_device(runner: CliRunner, device: str) -> None:
    assert_usage_error(*run(runner, BUGGY, "--device", device), "unknown device", "cuda, cuda:N")


# -- targets ------------------------------------------------------------------------------


def test_torchvision_resnet18_out_of_the_box(runner: CliRunner) -> None:
    pytest.importorskip("torchvision")  # absent on the CPU-only torch build
    code, out, _ = run(runner, "torchvision.models:resnet18", "--kwargs", '{"num_classes": 10}')
    assert code == 0, out
    assert "placecheck: torchvision.models:resnet18 on cuda:0, simulated (fake tensors, no\n  data)" in out


def test_dotted_attribute_from_a_package_in_the_current_directory(
        runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pc_cwd_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(TARGETS.read_text(encoding="utf-8"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code, out, err = run(runner, "pc_cwd_pkg.models:Holder.inner", "-f", "json", "--no-forward")
    assert code == 1, err
    assert [f["where"] for f in json.loads(out)["findings"]] == ["mask"]


def test_file_target_with_dotted_attribute(runner: CliRunner) -> None:
    code, out, _ = run(runner, f"{TARGETS}:Holder.inner", "-f", "json", "--no-forward")
    assert code == 1 and [f["where"] for f in json.loads(out)["findings"]] == ["mask"]


def test_instance_target(runner: CliRunner) -> None:
    assert run(runner, f"{TARGETS}:instance")[0] == 1


def test_factory_with_args(runner: CliRunner) -> None:
    assert run(runner, f"{TARGETS}:make_clean", "--arg", "width=8")[0] == 0
    assert run(runner, f"{TARGETS}:NeedsArgs", "--arg", "width=4", "--arg", "depth=2",
               "--arg", "bias=false")[0] == 0
    assert run(runner, f"{TARGETS}:NeedsArgs", "--kwargs", '{"width": 4, "depth": 1}')[0] == 0


# -- load and usage errors: exit 2, one line on stderr ------------------------------------


def test_module_does_not_exist(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, "pc_no_such_module_xyz:Model"), "no module named 'pc_no_such_module_xyz'")


def test_file_does_not_exist(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, "no/such/file.py:Model"), "no such file")


def test_module_raises_on_import(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{BROKEN}:Model"),
                       "ImportError: libfoo.so: cannot open shared object file")


def test_missing_attribute_lists_candidates(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{TARGETS}:Nope"), "no attribute 'Nope'", "NeedsArgs", "make_clean")


def test_missing_nested_attribute(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{TARGETS}:Holder.nope"), "'Holder.nope'")


def test_attribute_not_a_module(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{TARGETS}:NOT_A_MODEL"), "NOT_A_MODEL", "not an nn.Module")


def test_class_not_a_module(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{TARGETS}:NotAModule"), "NotAModule", "not an nn.Module subclass")


def test_constructor_missing_arguments_named(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{TARGETS}:NeedsArgs"), "width, depth", "--arg width=VALUE")
    assert_usage_error(*run(runner, f"{TARGETS}:NeedsArgs", "--arg", "width=4"), "depth")


def test_unknown_constructor_argument(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{TARGETS}:make_clean", "--arg", "height=3"), "'height'", "width")


def test_factory_returning_non_module(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{TARGETS}:returns_dict"), "returns_dict", "dict", "not an nn.Module")


def test_constructor_raising(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{TARGETS}:Raises"), "ValueError: width must be even")


def test_kwargs_for_an_instance(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{TARGETS}:instance", "--arg", "a=1"), "already a module instance")


@pytest.mark.parametrize("kwargs, needle", [("{num_classes: 10}", "not valid JSON"),
                                            ("[1, 2]", "JSON object"), ('"x"', "JSON object")])
def test_kwargs_not_a_json_object(runner: CliRunner, kwargs: str, needle: str) -> None:
    assert_usage_error(*run(runner, CLEAN, "--kwargs", kwargs), "--kwargs", needle)


def test_arg_without_equals(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, CLEAN, "--arg", "width"), "--arg 'width'", "KEY=VALUE")


def test_target_without_colon(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, "torchvision.models.resnet18"), "MODULE:ATTR")


def test_debug_shows_traceback(runner: CliRunner) -> None:
    code, _, err = run(runner, f"{TARGETS}:Raises", "--debug")
    assert code == 2
    assert "Traceback" in err and "width must be even" in err
    assert unwrapped(err).strip().splitlines()[-1].startswith("placecheck: error: ")


# -- the real process ---------------------------------------------------------------------


def test_python_m_placecheck_subprocess() -> None:
    proc = subprocess.run([sys.executable, "-m", "placecheck", "audit", BUGGY, "-f", "json", "--no-group"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr
    assert len(json.loads(proc.stdout)["findings"]) == 18


def test_python_m_placecheck_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "placecheck", "--help"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0
    assert "audit" in proc.stdout


def test_python_m_placecheck_load_error_has_no_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "placecheck", "audit", f"{TARGETS}:NeedsArgs"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert unwrapped(proc.stderr).count("\n") == 1 and "width, depth" in proc.stderr


# -- target code that prints, exits or lives in a package ------------------------------------

SCRIPT_LIKE = TESTS / "fixtures" / "cli" / "script_like.py"
CLI_FIXTURES = TESTS / "fixtures" / "cli"


@separate_stderr_capture
def test_what_the_model_prints_goes_to_stderr_and_json_stays_parseable(runner: CliRunner) -> None:
    code, out, err = run(runner, f"{SCRIPT_LIKE}:Chatty", "-f", "json", "-i", "float32[1,2]")
    assert code == 1, err
    data = json.loads(out)  # nothing but the report on stdout
    assert sorted(f["where"] for f in data["findings"] if f["code"] == "PC101") == ["mask", "table"]
    assert "building Chatty" in err and "forward of Chatty" in err


def test_a_load_error_after_the_model_printed_leaves_stdout_empty(runner: CliRunner) -> None:
    code, out, err = run(runner, f"{SCRIPT_LIKE}:Nope")
    assert code == 2 and out == ""
    assert unwrapped(err).strip().splitlines()[-1].startswith("placecheck: error: ")


@pytest.mark.parametrize("attr, needle", [("exits_zero", "called sys.exit(0)"),
                                          ("exits_with_message", "called sys.exit('no config found')")])
def test_sys_exit_in_a_factory_is_exit_2_not_its_status(runner: CliRunner, attr: str, needle: str) -> None:
    code, out, err = run(runner, f"{SCRIPT_LIKE}:{attr}")
    # the module's own print at import goes to stderr, once per process: whether this test is the
    # first to import it depends on the order the tests run in
    err = err.replace("script_like imported\n", "", 1)
    assert_usage_error(code, out, err, needle, "if __name__ == '__main__':")


def test_a_torchscript_module_is_exit_2_naming_what_to_audit_instead(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{CLI_FIXTURES / 'scripted.py'}:scripted", "-i", "float32[4,8]"),
                       "is a TorchScript module", "placecheck run")


def test_argparse_at_import_is_one_line_exit_2(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, f"{CLI_FIXTURES / 'argparse_at_import.py'}:Model"),
                       "called sys.exit(2)", "guard script code")


def test_debug_does_not_point_at_debug(runner: CliRunner) -> None:
    code, _, err = run(runner, f"{TARGETS}:Raises", "--debug")
    assert code == 2 and "Traceback" in err
    last = unwrapped(err).strip().splitlines()[-1]
    assert last.startswith("placecheck: error: ") and "--debug" not in last
    code, _, err = run(runner, f"{TARGETS}:Raises")
    assert code == 2 and "(--debug shows the traceback)" in err


def test_empty_kwargs_is_a_usage_error(runner: CliRunner) -> None:
    assert_usage_error(*run(runner, CLEAN, "--kwargs", ""), "--kwargs is empty")


@pytest.mark.parametrize("target", ["pkgdemo/net.py:Net", "pkgdemo/relnet.py:Net", "pkgdemo/sub/deep.py:Net"])
def test_file_target_inside_a_package_from_its_root(
        runner: CliRunner, target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(CLI_FIXTURES)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code, out, err = run(runner, target, "-f", "json", "--no-forward")
    assert code == 1, err
    assert [f["where"] for f in json.loads(out)["findings"]] == ["layer.mask"]


@separate_stderr_capture
def test_a_file_target_runs_its_top_level_once(runner: CliRunner, tmp_path: Path) -> None:
    # --init auto builds on meta first, then on the CPU: two builds, one import
    source = tmp_path / "pc_prints_on_import.py"
    source.write_text("import torch\nimport torch.nn as nn\nprint('imported pc_prints_on_import')\n"
                      "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                      "        self.proj = nn.Linear(2, 2)\n        self.mask = torch.ones(2)\n")
    code, out, err = run(runner, f"{source}:Model", "--no-forward")
    assert code == 1, err
    assert err.count("imported pc_prints_on_import") == 1
    assert "imported" not in out


def test_audit_help_shows_the_pyproject_table_and_engine_choices(runner: CliRunner) -> None:
    result = runner.invoke(app, ["audit", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())  # click wraps the help text at 80 columns
    assert "[tool.placecheck] table" in text
    assert "auto|real|fake|tagged" in text


def test_audit_help_reads_at_80_columns() -> None:
    # a real process: click measures the terminal from COLUMNS there
    proc = subprocess.run([sys.executable, "-m", "placecheck", "audit", "--help"], capture_output=True,
                          text=True, timeout=120, check=False, env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    # metavars say what to type, not a Python type; the --input grammar is shown whole
    for label in ("<bool>", "<list[str]>", "<int range>", "<float range>", "…"):
        assert label not in proc.stdout, label
    options = [line for line in proc.stdout.splitlines() if line.lstrip().startswith("-")]
    assert len(options) > 20 and not [line for line in options if "<" in line]
    assert "[NAME=]DTYPE[D0,D1,...][:LOW..HIGH]" in proc.stdout
    assert "input_ids=int64[2,128]:0..32000" in proc.stdout
    assert "--no-group" in proc.stdout and "--hints" in proc.stdout


# -- click's own usage errors from the console script -------------------------------------------


def _entrypoint(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                *argv: str) -> tuple[int, str, str]:
    from placecheck.cli import entrypoint

    monkeypatch.setattr(sys, "argv", ["placecheck", *argv])
    with pytest.raises(SystemExit) as info:
        entrypoint()
    captured = capsys.readouterr()
    code = info.value.code
    return code if isinstance(code, int) else 1, captured.out, captured.err


@pytest.mark.parametrize("argv, needle", [
    (["audit", "x:y", "--format", "bogus"], "unknown --format 'bogus': use one of table, json"),
    (["audit", "x:y", "--gpus", "0"], "--gpus"),
    (["audit", "x:y", "--gpus", "two"], "--gpus"),
    (["bogus"], "No such command 'bogus'"),
    (["checkpoint"], "Missing argument"),
])
def test_click_usage_errors_are_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                         argv: list[str], needle: str) -> None:
    assert_usage_error(*_entrypoint(monkeypatch, capsys, *argv), needle)


def test_entrypoint_help_version_and_findings(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _entrypoint(monkeypatch, capsys, "--version")
    assert code == 0 and out.startswith("placecheck ")
    code, out, _ = _entrypoint(monkeypatch, capsys, "audit", "--help")
    assert code == 0 and "--device" in out
    code, out, _ = _entrypoint(monkeypatch, capsys, "audit", f"{TARGETS}:Masked", "--no-forward")
    assert code == 1 and "PC101" in out
    code, out, _ = _entrypoint(monkeypatch, capsys, "rules")
    assert code == 0 and "PC101" in out


@separate_stderr_capture
def test_checkpoint_model_that_prints_keeps_json_on_stdout(runner: CliRunner, tmp_path: Path) -> None:
    import torch

    saved = tmp_path / "chatty.pt"
    torch.save({"proj.weight": torch.zeros(2, 2), "proj.bias": torch.zeros(2)}, saved)
    result = runner.invoke(app, ["checkpoint", str(saved), "--model", f"{SCRIPT_LIKE}:Chatty", "-f", "json"])
    assert result.exit_code in (0, 1), result.stderr
    json.loads(result.stdout)  # the report alone
    assert "building Chatty" in result.stderr


@separate_stderr_capture
@pytest.mark.parametrize("flag", ["--output", "--write-baseline"])
def test_an_unwritable_output_fails_before_the_model_is_built(runner: CliRunner, tmp_path: Path,
                                                              flag: str) -> None:
    import time

    marker = tmp_path / "imported"
    model = tmp_path / "model.py"
    model.write_text(f"open({str(marker)!r}, 'w').close()\nimport torch.nn as nn\nNet = nn.Linear\n")
    started = time.monotonic()
    result = runner.invoke(app, ["audit", f"{model}:Net", flag, "/nonexistent/x.json"])
    assert time.monotonic() - started < 1.0
    assert result.exit_code == 2
    assert f"cannot write {flag} '/nonexistent/x.json': No such file or directory" in unwrapped(result.output)
    assert not marker.exists()  # the target was never imported


@separate_stderr_capture
def test_an_unwritable_output_fails_before_a_config_run(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[[models]]\ntarget = "no.such.module:Net"\n')
    result = runner.invoke(app, ["audit", "--config", str(config), "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert f"cannot write --output {str(tmp_path)!r}: Is a directory" in unwrapped(result.output)


def test_no_group_and_hints_reach_the_output_options(runner: CliRunner, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    # the formats read OutputOptions.group / .hints: the command line and a config set them
    from placecheck.basics.config import ModelConfig
    from placecheck.cli import audit as audit_command
    from placecheck.cli import ci
    from placecheck.commands import runner as model_runner
    from placecheck.findings.output import OutputOptions
    from placecheck.findings.report import Report

    seen: list[OutputOptions] = []
    empty = Report.build("m:M", "cuda:0", "x", [])
    monkeypatch.setattr(audit_command, "run_audit", lambda *args: empty)
    monkeypatch.setattr(audit_command, "emit", lambda report, out: seen.append(out) or 0)
    assert runner.invoke(app, ["audit", "m:M"]).exit_code == 0
    assert runner.invoke(app, ["audit", "m:M", "--no-group", "--hints"]).exit_code == 0
    assert [(o.group, o.hints) for o in seen] == [(True, False), (False, True)]

    def emit_reports(reports: list[Report], out: OutputOptions, config_run: bool = False,
                     run: object = None) -> int:
        seen.append(out)
        return 0

    monkeypatch.setattr(ci, "emit_reports", emit_reports)
    monkeypatch.setattr(model_runner, "run_models", lambda config, **kw: [
        model_runner.ModelOutcome(ModelConfig(target="m:M"), empty)])
    config = tmp_path / "c.toml"
    config.write_text('group = false\nhints = true\n[[models]]\ntarget = "m:M"\n')
    assert runner.invoke(app, ["audit", "--config", str(config)]).exit_code == 0
    config.write_text('[[models]]\ntarget = "m:M"\n')
    assert runner.invoke(app, ["audit", "--config", str(config), "--hints", "--no-group"]).exit_code == 0
    assert [(o.group, o.hints) for o in seen[2:]] == [(False, True), (False, True)]
