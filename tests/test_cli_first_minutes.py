"""What a new user types first: errors about the target as typed, choices listed, Ctrl-C, labels.

Each command runs through the console script's entry point, in-process (as
tests/test_cli_internal_errors.py does); every error is one line on stderr and
exit 2, and each wrong form has its working twin beside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from conftest import unwrapped

from placecheck.basics.errors import LoadError, UsageError
from placecheck.cli import app
from placecheck.findings.report import EXIT_INTERRUPTED
from placecheck.model.load import defined_classes, resolve, split_target

pytestmark = pytest.mark.cli

MODEL = """\
import torch.nn as nn


class Block(nn.Module):
    pass


class Net(Block):
    def forward(self, x):
        return x


class Config:
    width = 4


def build():
    return Net()
"""


def _entrypoint(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                *argv: str) -> tuple[int, str, str]:
    from placecheck.cli import entrypoint

    monkeypatch.setattr(sys, "argv", ["placecheck", *argv])
    with pytest.raises(SystemExit) as info:
        entrypoint()
    captured = capsys.readouterr()
    code = info.value.code
    return code if isinstance(code, int) else 1, captured.out, captured.err


def _one_line_error(code: int, out: str, err: str) -> str:
    assert code == 2, err
    assert out == ""
    lines = unwrapped(err).strip().splitlines()  # one line, fitted to the width
    assert len(lines) == 1 and lines[0].startswith("placecheck: error: "), err
    return lines[0]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with a model file, a script, a notes file and a binary file, as the current one."""
    (tmp_path / "mymodel.py").write_text(MODEL)
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(2)\nprint('trained')\n")
    (tmp_path / "notes.md").write_text("# notes\n")
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_file_that_is_not_python_is_named_as_such(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, "audit", "notes.md:Net"))
    assert "'notes.md' is not a Python file" in line and "path/to/file.py:ATTR" in line
    assert "no module named" not in line
    with pytest.raises(LoadError, match="is not a Python file"):
        resolve("notes.md:Net", "audit")
    assert resolve("mymodel.py:Net").__name__ == "Net"  # the working twin


@pytest.mark.parametrize("target, said", [
    ("torchvision.models:resnet81",
     "'torchvision.models' has no attribute 'resnet81': did you mean resnet18, resnet152, resnet101?"),
    ("torchvison.models:resnet18", "no module named 'torchvison': did you mean torchvision?"),
    ("torchvision.model:resnet18", "no module named 'torchvision.model': did you mean torchvision.models?"),
    ("mymodle:Net", "no module named 'mymodle': did you mean mymodel?"),
    ("mymodel:Nte", "'mymodel' has no attribute 'Nte': did you mean Net?"),
    ("pc_nothing_like_it:Net", "no module named 'pc_nothing_like_it': run placecheck from the directory "
                               "that contains it, install it, or pass path/to/file.py:ATTR"),
])
def test_a_typo_gets_the_closest_names(target: str, said: str, project: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchvision")
    monkeypatch.setenv("COLUMNS", "200")
    assert _one_line_error(*_entrypoint(monkeypatch, capsys, "audit", target)) == f"placecheck: error: {said}"


def test_torchvision_missing_is_placechecks_vision_extra(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    class NotInstalled:
        def find_spec(self, name: str, path: object = None, target: object = None) -> None:
            if name == "torchvision":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [NotInstalled(), *sys.meta_path])
    monkeypatch.setenv("COLUMNS", "200")
    assert _one_line_error(*_entrypoint(monkeypatch, capsys, "audit", "torchvision.models:resnet18")) == (
        "placecheck: error: no module named 'torchvision': it is not installed: "
        "pip install 'placecheck[vision]' (or pip install torchvision)")


TRAINS_AT_IMPORT = MODEL + """

def train(model):
    raise RuntimeError("diverged")


for epoch in range(2):
    train(build())
"""


def test_a_model_file_that_trains_at_import_is_named_a_script(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (project / "train2.py").write_text(TRAINS_AT_IMPORT)
    monkeypatch.setenv("COLUMNS", "400")
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, "audit", "train2.py:Net"))
    assert line == ("placecheck: error: 'train2.py' runs code at import: line 25 (`for epoch in range(2):`) "
                    "raised RuntimeError: diverged; it is a script: check it with "
                    "`placecheck run train2.py`, or guard script code with `if __name__ == '__main__':` "
                    "to audit its models")
    # an import that fails in a definition or an import statement is the file's error, as before
    (project / "broken_import.py").write_text("import placecheck_absent_module\n" + MODEL)
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, "audit", "broken_import.py:Net"))
    assert line.startswith("placecheck: error: importing 'broken_import.py' raised ModuleNotFoundError") \
        and "placecheck run" not in line, line
    # guarded, the same file audits
    guarded = TRAINS_AT_IMPORT.replace("for epoch", "if __name__ == '__main__':\n  for epoch")
    (project / "train3.py").write_text(guarded)
    code, _, err = _entrypoint(monkeypatch, capsys, "audit", "train3.py:Net", "--input", "float32[2,4]")
    assert code == 0, err


def test_the_example_config_names_models_that_import_outside_the_clone(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    code, out, _ = _entrypoint(monkeypatch, capsys, "example-config")
    assert code == 0
    targets = [m["target"] for m in tomllib.loads(out)["models"]]
    assert targets == ["placecheck.examples.clean:CleanNet", "placecheck.examples.buggy:BuggyNet"]
    for target in targets:  # from a directory that is not the clone: importable, not repo-relative
        assert resolve(target).__name__ == target.rpartition(":")[2]


def test_the_top_level_help_lists_each_command_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    from cli_runner import CliRunner

    monkeypatch.setenv("COLUMNS", "80")
    text = CliRunner().invoke(app, ["--help"]).stdout
    commands = text.split("Commands:\n", 1)[1]
    assert "..." not in commands
    assert ("  audit           Load a model, move it to DEVICE as a training script would,\n"
            "                  and report what did not follow.\n") in commands
    assert all(len(line) <= 80 for line in text.splitlines())


@pytest.mark.parametrize("command", ["checkpoint", "fix"])
def test_a_commands_help_speaks_of_itself(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from cli_runner import CliRunner

    # typer 0.15 escapes the brackets it adds ("\\[default: cuda]") for rich even with rich_markup_mode=None:
    # typer's own rendering, read here as later typers print it
    text = " ".join(CliRunner().invoke(app, [command, "--help"]).stdout.replace("\\[", "[").split())
    assert "-d, --device DEVICE Target device: cuda, cuda:N, cpu, mps or meta. [default: cuda]" in text
    assert "audit also" not in text and "keep" not in text
    audit = " ".join(CliRunner().invoke(app, ["audit", "--help"]).stdout.split())
    assert "or keep (no .to(): the model is audited as its own code places it" in audit


NO_NUMPY = """\
import sys

class NotInstalled:  # numpy as a fresh venv from the wheel has it: absent
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NotInstalled())
"""


def test_torchs_missing_numpy_warning_is_not_printed() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    torch_alone = subprocess.run([sys.executable, "-c", NO_NUMPY + "import torch\ntorch.ones(1).cpu()\n"],
                                 capture_output=True, text=True, env=env, timeout=300)
    if "Failed to initialize NumPy" not in torch_alone.stderr:
        pytest.skip("this torch does not warn about a missing numpy")
    cli = NO_NUMPY + ("sys.argv = ['placecheck', '--version']\n"
                      "from placecheck.cli import entrypoint\nentrypoint()\n")
    done = subprocess.run([sys.executable, "-c", cli], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("placecheck "), done.stderr
    assert done.stderr == ""


def test_an_error_fits_the_terminals_width(project: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (project / "train2.py").write_text(TRAINS_AT_IMPORT)
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = _entrypoint(monkeypatch, capsys, "audit", "train2.py:Net")
    assert (code, out) == (2, "")
    assert err == (
        "placecheck: error: 'train2.py' runs code at import: line 25 (`for epoch in\n"
        "  range(2):`) raised RuntimeError: diverged; it is a script: check it with\n"
        "  `placecheck run train2.py`, or guard script code with `if __name__ ==\n"
        "  '__main__':` to audit its models\n")
    monkeypatch.setenv("COLUMNS", "60")
    err = _entrypoint(monkeypatch, capsys, "audit", "train2.py:Net")[2]
    assert max(len(line) for line in err.splitlines()) <= 60 and len(err.splitlines()) == 5


def test_a_progress_line_fits_the_terminals_width(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from placecheck.basics.config import ModelConfig, RunConfig
    from placecheck.commands import runner
    from placecheck.findings.report import Report

    def clean(model: ModelConfig, timeout: float, workdir: str | None) -> runner.ModelOutcome:
        return runner.ModelOutcome(model, Report.build(model.target, "cuda:0", "fake", []))

    monkeypatch.setenv("COLUMNS", "80")
    config = RunConfig(path="x", models=(ModelConfig(target="placecheck/examples/transformers_models.py:"
                                                             "tiny_llama"),))
    runner.run_models(config, jobs=1, progress="lines", audit_one=clean)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "placecheck: [1/1] placecheck/examples/transformers_models.py:tiny_llama: clean"
    assert lines[1].startswith("  in 0.0 s (0 running, 0 failed, 0 s elapsed)") and len(lines) == 2


def test_pytest_double_colon_suggests_the_one_colon_form(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, "audit", "mymodel.py::Net"))
    assert "mymodel.py:Net" in line and "'::'" in line
    assert split_target("mymodel.py:Net") == ("mymodel.py", "Net")


def test_a_file_without_attr_lists_its_classes_without_importing_it(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # were the file imported, this line would end the test with its own error
    (project / "mymodel.py").write_text(MODEL + "raise SystemExit('imported')\n")
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, "audit", "mymodel.py"))
    assert "mymodel.py:Block" in line and "classes in it: Block, Net)" in line, line
    assert "Config" not in line and "build" not in line
    assert defined_classes(project / "mymodel.py") == ["Block", "Net"]
    # a file of plain classes lists them all; an unparsable one lists none
    (project / "plain.py").write_text("class A:\n    pass\nclass B(A):\n    pass\n")
    assert defined_classes(project / "plain.py") == ["A", "B"]
    (project / "broken.py").write_text("class (:\n")
    assert defined_classes(project / "broken.py") == []


@pytest.mark.parametrize("command, instead", [
    ("audit", "`placecheck run train.py`"),
    ("fix", "`placecheck fix --run train.py`"),
])
def test_a_script_given_as_a_model_says_which_command_takes_scripts(
        command: str, instead: str, project: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, command, "train.py"))
    assert "'train.py' defines no class" in line and instead in line, line
    with pytest.raises(UsageError, match="not MODULE:ATTR"):  # a name that is no file: the grammar
        split_target("train", command)


def test_run_of_a_binary_file_says_it_is_not_a_python_script(
        project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, "run", "blob.bin"))
    assert line.startswith("placecheck: error: blob.bin is not a Python script: "), line
    assert ":None:" not in line and "syntax error" not in line
    # a Python script with a syntax error still gets its line
    (project / "broken.py").write_text("def broken(:\n    pass\n")
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, "run", "broken.py"))
    assert "broken.py:1: syntax error" in line


@pytest.mark.parametrize("argv, choices", [
    (["audit", "mymodel.py:Net"], "table, json, sarif, junit, github, markdown"),
    (["run", "train.py"], "table, json, sarif, junit, github, markdown"),
    (["checkpoint", "w.pt"], "table, json, sarif, junit, github, markdown"),
    (["merge", "shard.json"], "table, json, sarif, junit, github, markdown"),
    (["fix", "mymodel.py:Net"], "text, json"),
])
def test_a_bad_format_lists_the_choices(argv: list[str], choices: str, project: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, argv[0], "--format", "jsn", *argv[1:]))
    assert line == f"placecheck: error: unknown --format 'jsn': use one of {choices}; did you mean json?"
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, argv[0], "--format", "xml", *argv[1:]))
    assert line == f"placecheck: error: unknown --format 'xml': use one of {choices}"


def test_a_bad_fail_on_lists_the_choices(project: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(*_entrypoint(monkeypatch, capsys, "run", "--fail-on", "warn", "train.py"))
    assert line.endswith("unknown --fail-on 'warn': use one of error, warning, info, never; "
                         "did you mean warning?")


def _interrupt(*args: object, **kwargs: object) -> object:
    raise KeyboardInterrupt


@pytest.mark.parametrize("argv, where", [
    (["rules"], "placecheck.cli.rules.rules_text"),
    (["audit", "mymodel.py:Net"], "placecheck.cli.audit.run_audit"),
    (["run", "train.py"], "placecheck.run.run"),
])
def test_ctrl_c_exits_130_with_one_line(argv: list[str], where: str, project: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    module, name = where.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), name, _interrupt)
    code, out, err = _entrypoint(monkeypatch, capsys, *argv)
    assert code == EXIT_INTERRUPTED == 130
    assert out == "" and err.strip() == "placecheck: interrupted", err
    # the same command, not interrupted, ends otherwise
    monkeypatch.undo()
    monkeypatch.chdir(project)
    if argv == ["rules"]:
        assert _entrypoint(monkeypatch, capsys, *argv)[0] == 0


def test_ctrl_c_in_a_config_run_prints_what_was_found_so_far(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from placecheck.basics.config import ModelConfig
    from placecheck.commands import runner
    from placecheck.findings.finding import Finding, Severity
    from placecheck.findings.report import Report

    (project / "models.toml").write_text('[[models]]\ntarget = "mymodel.py:Net"\n\n'
                                         '[[models]]\ntarget = "mymodel.py:build"\n')
    stray = Finding(code="PC101", kind="stray-tensor", severity=Severity.ERROR, where="mask", message="m",
                    hint="h")
    done = runner.ModelOutcome(ModelConfig(target="mymodel.py:Net"),
                               Report.build("mymodel.py:Net", "cuda:0", "simulated cuda", [stray]))

    def interrupted(*args: object, **kwargs: object) -> object:
        raise runner.PartialRun([done], 2)

    monkeypatch.setattr(runner, "run_models", interrupted)
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = _entrypoint(monkeypatch, capsys, "audit", "--config", "models.toml")
    assert code == EXIT_INTERRUPTED
    assert "error   PC101 mask" in out and "placecheck: mymodel.py:Net on cuda:0" in out
    assert unwrapped(err).splitlines() == ["placecheck: 1 of 2 models audited, their findings above",
                                "placecheck: interrupted"]


def test_every_argument_is_labelled_in_capitals() -> None:
    # checkpoint's FILE, run's SCRIPT, explain's CODE: as audit's TARGET, never a parameter's name
    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            if param.param_type_name == "argument":
                label = param.metavar or param.name
                assert label == label.upper(), f"placecheck {name} labels an argument {label!r}"


def test_ctrl_c_while_the_cli_is_imported_exits_130_with_one_line() -> None:
    # the console script's main() imports the CLI itself, so an interrupt there is caught too
    script = ("import sys\n"
              "class Interrupted:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name == 'placecheck.cli':\n"
              "            raise KeyboardInterrupt\n"
              "sys.meta_path.insert(0, Interrupted())\n"
              "from placecheck.__main__ import main\n"
              "main()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr.strip()) == (130, "placecheck: interrupted")
    assert done.stdout == ""


@pytest.mark.parametrize("argv", [["rules"], ["explain", "PC209"]])
def test_a_closed_stdout_exits_141_quietly(argv: list[str]) -> None:
    # `placecheck rules | head -3`: the reader has gone before placecheck writes (here, before it starts)
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "placecheck", *argv], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")
