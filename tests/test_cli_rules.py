"""``placecheck rules`` and ``placecheck explain``; the help and rules paths never import torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_runner import CliRunner
from conftest import unwrapped

from placecheck.cli import app
from placecheck.findings.rules import RULES

pytestmark = pytest.mark.cli

runner = CliRunner()


@pytest.fixture(autouse=True)
def _columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here at 80 columns, whatever the terminal the suite runs in (tests/test_terminal_width.py
    checks the other widths)."""
    monkeypatch.setenv("COLUMNS", "80")


def test_rules_lists_every_code_with_severity_and_title(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # wide enough for every title on its code's line
    result = runner.invoke(app, ["rules"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    for r in RULES.values():
        [line] = [line for line in lines if line.startswith(r.code + " ")]
        assert r.kind in line and r.severity.value in line and r.title in line


@pytest.mark.parametrize("code", sorted(RULES))
def test_explain_prints_what_why_wrong_and_right(code: str) -> None:
    r = RULES[code]
    result = runner.invoke(app, ["explain", code.lower()])
    assert result.exit_code == 0
    text = result.output
    assert text.startswith(f"{r.code} {r.kind} ({r.severity.value}")
    assert r.title in text and r.explanation in text
    wrong, right = text.index("\nWrong:\n"), text.index("\nRight:\n")
    assert wrong < right
    assert r.wrong.splitlines()[0].strip() in text[wrong:right]
    assert r.right.splitlines()[0].strip() in text[right:]


def test_explain_by_kind() -> None:
    assert runner.invoke(app, ["explain", "host-sync"]).output.startswith("PC204 host-sync")


def test_explain_unknown_code() -> None:
    proc = subprocess.run([sys.executable, "-m", "placecheck", "explain", "PC999"], capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert unwrapped(proc.stderr).startswith(
        "placecheck: error: unknown code 'PC999': `placecheck rules` lists them")


@pytest.mark.parametrize("args", [["--help"], ["audit", "--help"], ["rules"], ["explain", "PC101"],
                                  ["checkpoint", "--help"], ["example-config"]], ids=" ".join)
def test_no_torch_import(args: list[str]) -> None:
    code = ("import sys\nfrom placecheck.cli import app\n"
            f"try:\n    app({args!r})\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert unwrapped(proc.stderr).strip().splitlines()[-1] == "False"


def test_explain_texts_state_what_pytorch_does() -> None:
    sync, transfer = RULES["PC204"].explanation, RULES["PC205"].explanation
    # .numpy() on a CUDA tensor raises ("can't convert cuda:0 device type tensor to numpy"); it is not a sync
    assert ".numpy() on a CUDA tensor does not sync: it raises TypeError" in sync
    assert ".item(), .tolist(), .cpu()" in sync and ".cpu().numpy()" in sync
    # a 0-dim CPU scalar is read on the host (no device copy, no sync); a CPU index is copied each call
    assert "copies the CPU tensor to the\ndevice on every call" not in transfer
    assert "(and sync)" not in transfer
    assert "0-dim CPU tensor\nused as a scalar is not copied" in transfer
    assert "CPU index tensor copies the index to the device on every call" in transfer
    assert "scalar" in RULES["PC205"].title and "index" in RULES["PC205"].title
