"""The README's quick start works as a new user runs it.

The three commands between ``<!-- quick-start:start -->`` and
``<!-- quick-start:end -->`` run as they are written, each in its own
``placecheck`` process, from a fresh project directory holding the two files
they name: ``model.py`` (a copy of the buggy example model, its class named
``Net``) and ``train.py`` (a copy of the example training loop that forgets the
labels). The example files themselves are never touched: ``fix --write`` edits
the copy.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "placecheck" / "examples"
START, END = "<!-- quick-start:start -->", "<!-- quick-start:end -->"


def _commands() -> list[list[str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text[text.index(START):text.index(END)]
    [console] = re.findall(r"```console\n(.*?)```", block, re.S)
    return [shlex.split(line, comments=True) for line in console.splitlines() if line.strip()]


def _placecheck() -> list[str]:
    """The console script a user calls, from the environment running the tests."""
    script = Path(sys.executable).parent / "placecheck"
    return [str(script)] if script.exists() else [sys.executable, "-m", "placecheck"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    model = (EXAMPLES / "buggy.py").read_text(encoding="utf-8")
    (tmp_path / "model.py").write_text(model + "\n\nNet = BuggyNet\n", encoding="utf-8")
    (tmp_path / "train.py").write_text((EXAMPLES / "train_buggy.py").read_text(encoding="utf-8"),
                                       encoding="utf-8")
    return tmp_path


def _run(words: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert words[0] == "placecheck"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run([*_placecheck(), *words[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_quick_start_names_audit_run_and_fix() -> None:
    assert [words[:2] for words in _commands()] == [
        ["placecheck", "audit"], ["placecheck", "run"], ["placecheck", "fix"]]


def test_the_quick_start_runs_as_written(project: Path) -> None:
    pytest.importorskip("torchvision")  # resnet18 and the loop's FakeData (not beside the CPU-only build)
    audit, run, fix = _commands()
    example_before = (EXAMPLES / "buggy.py").read_bytes()

    audited = _run(audit, project)
    assert audited.returncode == 0, audited.stderr
    assert "no placement problems found on cuda:0" in audited.stdout

    ran = _run(run, project)
    assert ran.returncode == 1, ran.stderr  # the labels are never moved: an error
    assert re.search(r"^error +PC201 labels +train\.py:\d+$", ran.stdout, re.M), ran.stdout

    model_before = (project / "model.py").read_text(encoding="utf-8")
    fixed = _run(fix, project)
    assert fixed.returncode == 1, fixed.stderr  # what fix cannot rewrite remains
    summary = "wrote model.py\nfixed 16 of 18 instances (6 of 7 problems) with 6 edits"
    assert fixed.stdout.startswith(summary), fixed.stdout
    model_after = (project / "model.py").read_text(encoding="utf-8")
    assert 'self.register_buffer("mask", torch.tril(' in model_after
    assert "self.heads = nn.ModuleList([" in model_after and model_after != model_before
    assert (EXAMPLES / "buggy.py").read_bytes() == example_before

    # what remains after the fix is what the fix said it could not rewrite
    after = _run(["placecheck", "audit", "model.py:Net", "--format", "json"], project)
    assert after.returncode == 1, after.stderr
    remaining = {(f["code"], f["where"]) for f in json.loads(after.stdout)["findings"]}
    assert ("PC101", "blocks.0.mask") not in remaining and ("PC102", "heads[0]") not in remaining
    assert ("PC203", "gate") in remaining
