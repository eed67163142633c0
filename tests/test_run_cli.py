"""``placecheck run`` on the command line: options, formats carrying run findings, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_runner import CliRunner, separate_stderr_capture
from conftest import unwrapped
from kept_scratch import kept, remove_kept

from placecheck.cli import app
from placecheck.findings.formats import OutputFormat

pytestmark = [pytest.mark.compat, pytest.mark.cli]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run"
BUGGY = os.path.relpath(FIXTURES / "batch_buggy.py")


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["run", *args])
    return result.exit_code, result.stdout, result.stderr


def assert_one_line_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, err
    assert out == ""
    lines = unwrapped(err).strip().splitlines()  # one line, fitted to the width
    assert len(lines) == 1 and lines[0].startswith("placecheck: error: ") and needle in lines[0], err


def test_json_carries_the_run_finding_with_its_lines() -> None:
    code, out, err = invoke("--format", "json", BUGGY)
    assert code == 1, err
    [finding] = json.loads(out)["findings"]
    assert (finding["code"], finding["where"], finding["source"]) == ("PC201", "labels", f"{BUGGY}:16")
    assert finding["origin"] == f"{BUGGY}:14"


def test_sarif_and_table_carry_the_run_finding(tmp_path: Path) -> None:
    sarif = tmp_path / "run.sarif"
    code, out, _ = invoke("--format", "sarif", "-o", str(sarif), BUGGY)
    assert code == 1 and out == ""
    [result] = json.loads(sarif.read_text())["runs"][0]["results"]
    assert result["ruleId"] == "PC201"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == 16
    code, out, _ = invoke(BUGGY)
    assert "PC201" in out and f"{BUGGY}:16" in out


@pytest.mark.parametrize("fmt", [f.value for f in OutputFormat])
def test_every_format_carries_the_run_finding_and_its_line(fmt: str) -> None:
    code, out, err = invoke("--format", fmt, BUGGY)
    assert code == 1, err
    assert "PC201" in out and "batch_buggy.py" in out and "16" in out


PROBE = ("import sys\nimport torch\ntorch.ones(1, device='cuda') + 1\n"  # an op on the simulated GPU: a run
         "open(sys.argv[-1], 'w').write(repr(sys.argv[1:]))\n")           # that checked nothing is unfinished


def _seen_by_the_script(out: str, seen: Path) -> str:
    """What the probe wrote to ``seen``: in the kept scratch area, as ``placecheck run`` never changes the
    user's files."""
    writes = json.loads(out)["writes"]
    try:
        return kept(writes, seen).read_text()
    finally:
        remove_kept(writes)


@pytest.mark.parametrize("argv", [
    ["--steps", "1", "{probe}", "--lr", "0.1", "--steps", "3", "-f", "{seen}"],  # all after it: the script's
    ["--steps", "1", "{probe}", "--", "--lr", "0.1", "--steps", "3", "-f", "{seen}"],  # `--` still works
    ["--steps", "1", "--", "{probe}", "--lr", "0.1", "--steps", "3", "-f", "{seen}"],
], ids=["python-rule", "double-dash-after", "double-dash-before"])
def test_what_follows_the_script_is_the_scripts(tmp_path: Path, argv: list[str]) -> None:
    probe, seen = tmp_path / "probe.py", tmp_path / "seen.txt"
    probe.write_text(PROBE)
    given = [a.format(probe=probe, seen=seen) for a in argv]
    code, out, err = invoke("--keep-scratch", "--format", "json", *given)
    assert code == 0, err
    assert _seen_by_the_script(out, seen) == repr(["--lr", "0.1", "--steps", "3", "-f", str(seen)])


def test_what_follows_the_module_is_the_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "probe_module.py").write_text(PROBE)
    seen = tmp_path / "seen.txt"
    monkeypatch.chdir(tmp_path)
    code, out, err = invoke("--keep-scratch", "--format", "json", "--steps", "1", "-m", "probe_module",
                            "--epochs", "1", "--gpus", "2", str(seen))
    assert code == 0, err
    assert _seen_by_the_script(out, seen) == repr(["--epochs", "1", "--gpus", "2", str(seen)])


ARGPARSE = """\
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
"""


@separate_stderr_capture
def test_placecheck_options_after_the_script_that_argparse_refuses_get_the_corrected_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "train.py").write_text(ARGPARSE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    code, _, err = invoke("--gpus", "1", "train.py", "--epochs", "1", "--steps", "3", "--format=json")
    assert code == 2
    assert unwrapped(err).splitlines()[-1] == (
        "placecheck: error: placecheck options go before the script: placecheck run --gpus 1 --steps 3 "
        "--format=json train.py --epochs 1 (the script exited with status 2 at train.py:5)")
    # without a placecheck option after it, the script's own refusal is all there is to say
    code, _, err = invoke("train.py", "--batch", "1")
    assert code == 2
    assert unwrapped(err).splitlines()[-1] == (
        "placecheck: error: the script exited with status 2 at train.py:5")


def test_an_unknown_option_before_the_script_is_still_placechecks_error(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    code, out, err = invoke("--stpes", "1", str(probe), "x")
    assert code == 2 and out == "" and "No such option: --stpes" in err, err


@separate_stderr_capture
def test_script_output_goes_to_stderr_so_json_stays_parseable() -> None:
    code, out, err = invoke("--format", "json", os.path.relpath(FIXTURES / "no_model.py"))
    assert code == 2  # it ran no op on a simulated GPU: nothing was checked (issue 40)
    assert json.loads(out)["summary"]["unfinished"].endswith("nothing was checked")
    assert "3.0" in err  # the script's print
    assert any("built no optimizer" in n for n in json.loads(out)["notes"])


def test_sys_exit_3_is_reported_and_fails_the_run_with_exit_code_2() -> None:
    code, out, _ = invoke("--format", "json", os.path.relpath(FIXTURES / "exits_3.py"))
    assert code == 2  # the script did not run through: the rest is unchecked
    report = json.loads(out)
    assert any("sys.exit(3)" in n for n in report["notes"])
    said = f"the script exited with status 3 at {os.path.relpath(FIXTURES / 'exits_3.py')}:9"
    assert report["summary"]["unfinished"] == said
    code, _, _ = invoke("--format", "json", os.path.relpath(FIXTURES / "exits_0.py"))
    assert code == 0


_OWN_ERROR = """import json
import torch

def learning_rate(text):
    return json.loads(text)["learning_rate"]  # MARK raises

model = torch.nn.Linear(2, 2).to("cuda")
lr = learning_rate(CONFIG)  # MARK calls
"""


def _line(text: str, mark: str) -> int:
    return next(i + 1 for i, s in enumerate(text.splitlines()) if f"MARK {mark}" in s)


@separate_stderr_capture
@pytest.mark.parametrize("fmt", ["json", "table"])
def test_the_scripts_own_error_is_one_line_exit_2_and_its_own_frames_not_a_finding(
        tmp_path: Path, fmt: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(_OWN_ERROR.replace("CONFIG", repr('{"lr": 0.1}')))
    name = os.path.relpath(script)
    code, out, err = invoke("--format", fmt, name)
    assert code == 2, err
    raises, calls = _line(_OWN_ERROR, "raises"), _line(_OWN_ERROR, "calls")
    said = f"the script raised KeyError at {name}:{raises}: 'learning_rate'"
    lines = unwrapped(err).strip().splitlines()
    assert lines[0] == f"placecheck: error: {said}", err
    # the script's frames only, outermost first: json's own frames (the standard library) are left out
    assert lines[1:] == ["Traceback of the script's own code (most recent call last):",
                         f'  File "{name}", line {calls}, in <module>',
                         "    " + script.read_text().splitlines()[calls - 1],
                         f'  File "{name}", line {raises}, in learning_rate',
                         '    return json.loads(text)["learning_rate"]  # MARK raises']
    if fmt == "json":
        report = json.loads(out)
        assert report["findings"] == [] and report["summary"]["unfinished"] == said
    else:
        assert "PC207" not in out and "no placement problems found" in out and "KeyError" in out
    # an error inside a library the script called is the script's too, at the script's line
    script.write_text(_OWN_ERROR.replace("CONFIG", repr("{not json")))
    code, out, err = invoke("--format", "json", name)
    assert code == 2 and json.loads(out)["findings"] == []
    said = f"placecheck: error: the script raised JSONDecodeError at {name}:{raises}: "
    assert unwrapped(err).splitlines()[0].startswith(said)
    assert all("json/" not in line for line in unwrapped(err).splitlines()[1:]), err


def test_a_device_error_the_script_raises_stays_a_finding(tmp_path: Path) -> None:
    script = tmp_path / "second_gpu.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2).to('cuda:1')\n")
    code, out, err = invoke("--format", "json", os.path.relpath(script))
    assert code == 1, err  # a GPU the machine lacks: what CUDA raises there, a placement finding
    [finding] = json.loads(out)["findings"]
    assert finding["code"] == "PC207" and finding["source"].endswith("second_gpu.py:2")
    assert json.loads(out)["summary"]["unfinished"] == "" and "placecheck: error" not in err
    code, out, err = invoke("--gpus", "2", "--format", "json", os.path.relpath(script))
    assert code == 0 and json.loads(out)["findings"] == [], err


def test_a_scripts_sys_exit_1_is_one_line_and_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "bail.py"
    script.write_text("import sys\nimport torch\ntorch.nn.Linear(2, 2).cuda()\nsys.exit(1)\n")
    code, out, err = invoke("--format", "json", os.path.relpath(script))
    assert code == 2 and json.loads(out)["findings"] == []
    assert unwrapped(err).strip() == (
        f"placecheck: error: the script exited with status 1 at {os.path.relpath(script)}:4")
    # after a forward pass (before any, sys.exit(0) stops a run that checked nothing: issue 40, exit 2)
    script.write_text("import sys\nimport torch\ntorch.nn.Linear(2, 2).cuda()(torch.ones(1, 2).cuda())\n"
                      "sys.exit(0)\n")
    code, out, err = invoke("--format", "json", os.path.relpath(script))
    assert code == 0 and "placecheck: error" not in err


def test_select_ignore_and_exit_code() -> None:
    code, out, _ = invoke("--ignore", "PC201", "--format", "json", BUGGY)
    assert code == 0 and json.loads(out)["findings"] == []


def test_module_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES)
    code, out, err = invoke("--format", "json", "-m", "batch_buggy")
    assert code == 1, err
    assert json.loads(out)["target"] == "-m batch_buggy"


def test_timeout_stops_a_hanging_script() -> None:
    code, out, err = invoke("--timeout", "0.5", "--format", "json", os.path.relpath(FIXTURES / "hangs.py"))
    # stopped before any forward pass: nothing was checked, which is no pass (issue 40 item 3)
    assert code == 2, err
    assert json.loads(out)["summary"]["unfinished"].startswith("the script stopped at --timeout 0.5 s at ")
    assert any("--timeout 0.5 s" in n for n in json.loads(out)["notes"])


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    assert_one_line_error(*invoke(str(tmp_path / "absent.py")), "no such script")
    broken = tmp_path / "broken.py"
    broken.write_text("def broken(:\n    pass\n")
    assert_one_line_error(*invoke(str(broken)), "broken.py:1: syntax error")
    assert_one_line_error(*invoke("-m", "placecheck_no_such_module"), "no module named")
    assert_one_line_error(*invoke(), "give a script to run")
    assert_one_line_error(*invoke("--select", "XX1", BUGGY), "invalid code selector")


def test_help_says_the_script_really_runs_and_what_is_simulated() -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    text = " ".join(out.split())
    assert "REALLY RUNS" in text and "--steps bounds the work" in text
    assert "Not simulated" in text and "device_count() is --gpus" in text


_LEGACY_CAST = """import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor

NO_DRIVER = ("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed "
             "a driver from http://www.nvidia.com/Download/index.aspx")


def fused_kernel(x):
    # a C extension's kernel: it needs a CUDA context for the tensor it is given, which a fake tensor
    # (no data, no driver) cannot give; on real values it runs
    if isinstance(x, FakeTensor):
        raise RuntimeError(NO_DRIVER)  # MARK legacy
    return x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 2)  # 2 KiB of parameters: over a 1 KiB budget as it is built

    def forward(self, x):
        return fused_kernel(self.fc(x))  # needs a CUDA driver under fake tensors


model = Net().to("cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(4, 256, device="cuda")
    y = torch.randint(0, 2, (4,)).to(LABELS)
    loss = nn.functional.cross_entropy(model(x), y)  # MARK loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_auto_does_not_give_up_where_the_fake_engine_needs_a_cuda_driver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from placecheck.engines import cudaapi

    if cudaapi.CPU_ONLY_BUILD:
        pytest.skip("auto keeps real values on a CPU-only build: it never reaches the fake engine")
    script = tmp_path / "legacy.py"
    script.write_text(_LEGACY_CAST.replace("LABELS", '"cpu"'))
    name = os.path.relpath(script)
    # auto on the fake path (a budget no model fits) goes back to real values and finds the labels
    monkeypatch.setenv("PLACECHECK_RUN_MEMORY", "1KiB")
    code, out, err = invoke("--format", "json", name)
    report = json.loads(out)
    assert code == 1, err
    loss, legacy = _line(_LEGACY_CAST, "loss"), _line(_LEGACY_CAST, "legacy")
    # the labels' creation without device= (PC202, the line to edit), the loss's crash its evidence
    assert [(f["code"], f["source"], [(e["code"], e["source"]) for e in f["evidence"]])
            for f in report["findings"]] == [("PC202", f"{name}:{loss - 1}", [("PC201", f"{name}:{loss}")])]
    assert any(n.startswith("engine: auto chose fake tensors") for n in report["notes"])
    # the fake engine stopped in the kernel (the bug after it out of its reach): said in a note
    assert any(n.startswith("engine: auto went back to real values") and f"{name}:{legacy}" in n
               for n in report["notes"]), report["notes"]
    assert report["engine"] == "simulated cuda (real values)" and report["summary"]["unfinished"] == ""
    # its fixed twin is clean the same way
    script.write_text(_LEGACY_CAST.replace("LABELS", '"cuda"'))
    code, out, err = invoke("--format", "json", name)
    assert code == 0 and json.loads(out)["findings"] == [], err


def test_auto_stops_with_a_note_when_real_values_would_not_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from placecheck.engines import cudaapi
    from placecheck.run import auto

    if cudaapi.CPU_ONLY_BUILD:
        pytest.skip("auto keeps real values on a CPU-only build: it never reaches the fake engine")
    script = tmp_path / "legacy.py"
    script.write_text(_LEGACY_CAST.replace("LABELS", '"cpu"'))
    monkeypatch.setenv("PLACECHECK_RUN_MEMORY", "1KiB")
    monkeypatch.setattr(auto, "available_memory", lambda: 1024)  # a machine with 1 KiB free: 512 B of room
    code, out, err = invoke("--format", "json", os.path.relpath(script))
    report = json.loads(out)
    assert code == 2 and report["findings"] == [], err  # never a finding: the simulation's stop, exit 2
    assert report["summary"]["unfinished"].startswith("the simulation stopped at ")
    assert any(n.startswith("engine: auto kept fake tensors") and "512 B" in n for n in report["notes"])
