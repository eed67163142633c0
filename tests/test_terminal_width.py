"""Every command's text fits the terminal: ``$COLUMNS`` (else the terminal's width, else 80).

Each command runs in-process through the typer app with ``COLUMNS`` set, at 80 and at 60 columns:
``rules``, ``explain`` of every code, every ``--help``, and the table (or text) that ``audit``,
``run``, ``fix`` and ``checkpoint`` print for a fixture with findings. Two kinds of line are the
user's own code and are printed as written, as ruff prints them: a diff's lines (``fix``) and, under
80 columns, explain's code examples (which fit 80).
"""

from __future__ import annotations

import os
import re
from collections.abc import Set
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from cli_runner import CliRunner
from conftest import BUGGY, REPO, TESTS

from placecheck.cli import app
from placecheck.findings.rules import RULES

pytestmark = pytest.mark.cli

WIDTHS = (80, 60)

MODEL = """\
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.mask = torch.ones(4)

    def forward(self, x):
        return self.proj(x) * self.mask
"""


def _invoke(width: int, monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str]:
    monkeypatch.setenv("COLUMNS", str(width))
    result = CliRunner().invoke(app, list(argv))
    return result.exit_code, result.stdout


def _too_wide(text: str, width: int, code_lines: Set[str] = frozenset()) -> list[str]:
    """The lines of ``text`` wider than ``width``, but ``code_lines`` (the user's code, as written)."""
    return [line for line in text.splitlines() if len(line) > width and line not in code_lines]


def _commands() -> list[str]:
    import typer

    return sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("width", WIDTHS)
def test_rules_fits(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = _invoke(width, monkeypatch, "rules")
    assert code == 0
    assert _too_wide(out, width) == []
    assert all(f"\n{c} " in out for c in RULES)  # every code still listed, each on a line of its own
    # wider, the titles come back beside their kinds: the width is the terminal's, not a fixed one
    wide = _invoke(200, monkeypatch, "rules")[1]
    assert max(map(len, wide.splitlines())) > 100


@pytest.mark.parametrize("width", WIDTHS)
def test_explain_fits_for_every_code(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for code in RULES:
        r = RULES[code]
        examples = {f"    {line}" for line in (*r.wrong.splitlines(), *r.right.splitlines())}
        status, out = _invoke(width, monkeypatch, "explain", code)
        assert status == 0
        assert _too_wide(out, max(width, 80)) == [], code  # the examples fit 80 columns
        assert _too_wide(out, width, examples) == [], code  # the prose fits any width


@pytest.mark.parametrize("width", WIDTHS)
def test_every_help_fits(width: int, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    # through the console script's entry point: typer's CliRunner forces click's help to 80 columns
    import sys

    from placecheck.cli import entrypoint

    monkeypatch.setenv("COLUMNS", str(width))
    for command in ["", *_commands()]:
        monkeypatch.setattr(sys, "argv", ["placecheck", *([command] if command else []), "--help"])
        with pytest.raises(SystemExit) as info:
            entrypoint()
        out = capsys.readouterr().out
        assert info.value.code in (0, None) and "Usage:" in out
        assert _too_wide(out, width) == [], command


@pytest.mark.parametrize("width", WIDTHS)
def test_audit_table_fits(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    status, out = _invoke(width, monkeypatch, "audit", os.path.relpath(BUGGY.rsplit(":", 1)[0]) + ":BuggyNet",
                          "--engine", "fake")
    assert status == 1
    assert out.startswith("placecheck: placecheck/examples/buggy.py:BuggyNet on cuda:0,")
    assert _too_wide(out, width) == []


@pytest.mark.parametrize("width", WIDTHS)
def test_run_table_fits(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    script = os.path.relpath(TESTS / "fixtures" / "run" / "batch_buggy.py")
    status, out = _invoke(width, monkeypatch, "run", script)
    assert status == 1 and "PC201" in out
    assert _too_wide(out, width) == []


@pytest.mark.parametrize("width", WIDTHS)
def test_fix_text_fits_but_its_diff(width: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("libcst")
    (tmp_path / "net.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    status, out = _invoke(width, monkeypatch, "fix", "net.py:Net", "--input", "float32[2,4]")
    assert status == 0, out
    lines = out.splitlines()
    summary = next(i for i, line in enumerate(lines) if re.match(r"(would fix|fixed) \d", line))
    diff = set(lines[:summary])  # the user's code, as written
    assert any(line.startswith("+") for line in diff)
    assert _too_wide(out, width, diff) == []
    # the stray tensor and the mismatch it causes: one problem, two instances, as audit counts them
    assert "would fix 2 of 2 instances (1 of 1 problem) with 1 edit" in " ".join(out.split())


@pytest.mark.parametrize("width", WIDTHS)
def test_checkpoint_table_fits(width: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "net.py").write_text(MODEL)
    state = nn.Linear(4, 4).state_dict()
    state["a_key_the_model_does_not_have_and_that_is_long_enough_to_need_a_wrap"] = torch.zeros(2)
    torch.save({"proj." + k if k != next(reversed(state)) else k: v for k, v in state.items()},
               tmp_path / "w.pt")
    monkeypatch.chdir(tmp_path)
    status, out = _invoke(width, monkeypatch, "checkpoint", "w.pt", "--model", "net.py:Net")
    assert status == 1 and "PC303" in out, out
    assert _too_wide(out, width) == []


def test_example_config_fits_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    # a file to save (placecheck example-config > placecheck.toml), printed as written: its comments
    # are wrapped at 80 columns, the width a terminal has when nothing says otherwise
    status, out = _invoke(80, monkeypatch, "example-config")
    assert status == 0 and "[[models]]" in out
    assert _too_wide(out, 80) == []
