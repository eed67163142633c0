"""``placecheck fix --check``: the dry run's output, exit 1 when a proven edit is left, 0 when none is.

For pre-commit and CI: the check never writes, and findings no edit fixes (a layer built in forward)
do not fail it, so a clean tree passes even when the audit still reports something.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import CliRunner
from conftest import TESTS

pytest.importorskip("libcst")  # the fix extra

from placecheck.cli import app

pytestmark = pytest.mark.compat

STRAY = '''import torch
from torch import nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.scale = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.scale
'''

LAZY = '''import torch
from torch import nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.extra: nn.Linear | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra is None:
            self.extra = nn.Linear(x.shape[-1], x.shape[-1])  # sizes read from the input: no edit moves it
        return self.extra(self.proj(x))
'''

STRAY_CHECKED = '''--- a/stray.py
+++ b/stray.py
@@ -6,7 +6,7 @@
     def __init__(self) -> None:
         super().__init__()
         self.proj = nn.Linear(4, 4)
-        self.scale = torch.ones(4)
+        self.register_buffer("scale", torch.ones(4), persistent=False)
{blank}
     def forward(self, x: torch.Tensor) -> torch.Tensor:
         return self.proj(x) * self.scale
would fix 2 of 2 instances (1 of 1 problem) with 1 edit
  would fix: PC101 scale: edit at stray.py:9
  would fix: PC201 stray.py:12: edit at its origin stray.py:9
nothing written: --write applies the edits
'''.format(blank=" ")  # a diff's context line of an empty line is one space


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")  # the summary is wrapped to the terminal's width
    (tmp_path / "stray.py").write_text(STRAY)
    (tmp_path / "lazy.py").write_text(LAZY)
    return tmp_path


def test_check_prints_the_dry_run_and_exits_1_while_an_edit_is_left_then_0(folder: Path) -> None:
    runner = CliRunner()
    checked = runner.invoke(app, ["fix", "stray.py:Model", "--check"])
    assert (checked.exit_code, checked.stdout) == (1, STRAY_CHECKED), checked.output
    assert (folder / "stray.py").read_text() == STRAY, "--check wrote"
    dry = runner.invoke(app, ["fix", "stray.py:Model"])
    # the same words as the dry run, whose status is for what the edits would leave: nothing
    assert (dry.exit_code, dry.stdout) == (0, STRAY_CHECKED)
    assert runner.invoke(app, ["fix", "stray.py:Model", "--write"]).exit_code == 0
    clean = runner.invoke(app, ["fix", "stray.py:Model", "--check"])
    nothing = "would fix 0 of 0 instances (0 of 0 problems) with 0 edits\n"
    assert (clean.exit_code, clean.stdout) == (0, nothing), clean.output


def test_check_passes_when_what_is_left_has_no_edit_though_fix_exits_1(folder: Path) -> None:
    # the layer built in forward (PC203) and the mismatch it causes: reported, no edit to make
    runner = CliRunner()
    checked = runner.invoke(app, ["fix", "lazy.py:Model", "--check"])
    assert checked.exit_code == 0, checked.output
    assert checked.stdout.startswith("would fix 0 of 2 instances (0 of 1 problem) with 0 edits; 2 not fixed "
                                     "(PC201 1, PC203 1)\n")
    assert "\n  not fixed: PC203 extra: a layer built in forward" in checked.stdout
    assert runner.invoke(app, ["fix", "lazy.py:Model"]).exit_code == 1  # without --check: findings remain
    assert (folder / "lazy.py").read_text() == LAZY


def test_check_never_writes_and_refuses_write(folder: Path) -> None:
    refused = CliRunner().invoke(app, ["fix", "stray.py:Model", "--check", "--write"])
    assert refused.exit_code == 2 and refused.stdout == ""
    # one error, wrapped to the terminal's width where the CLI wraps errors
    assert " ".join(refused.stderr.split()) == (
        "placecheck: error: --check and --write cannot be combined: --check never writes (it exits 1 when "
        "an edit is left to make); --write applies the edits")
    assert (folder / "stray.py").read_text() == STRAY


def test_check_with_json_lists_the_edit_and_writes_nothing(folder: Path) -> None:
    out = CliRunner().invoke(app, ["fix", "stray.py:Model", "--check", "--format", "json"])
    assert out.exit_code == 1, out.output
    data = json.loads(out.stdout)
    assert data["written"] == [] and [(e["code"], e["start_line"]) for e in data["edits"]] == [("PC101", 9)]
    assert (folder / "stray.py").read_text() == STRAY


def test_check_of_a_script_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.nn as nn
    from checkpoint_writer import save_with_locations

    checkpoint = tmp_path / "saved_on_cuda3.pt"
    save_with_locations(dict(nn.Linear(8, 2).state_dict()), checkpoint, default="cuda:3")
    source = TESTS / "fixtures" / "fix" / "run" / "pc301_map_location.py"
    shutil.copy(source, tmp_path / source.name)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    checked = runner.invoke(app, ["fix", "--run", source.name, "--check", "--", str(checkpoint)])
    assert checked.exit_code == 1, checked.output
    assert '+    map_location="cpu",' in checked.stdout
    assert (tmp_path / source.name).read_bytes() == source.read_bytes()
    shutil.copy(source.with_name("pc301_map_location.fixed.py"), tmp_path / source.name)
    clean = runner.invoke(app, ["fix", "--run", source.name, "--check", "--", str(checkpoint)])
    assert clean.exit_code == 0 and "with 0 edits" in clean.stdout, clean.output
