"""The README shows what placecheck really prints and names only real flags.

The block between ``<!-- demo-output:start -->`` and ``<!-- demo-output:end -->``
is the output of the command ``make demo`` runs; each block between
``<!-- run-output:start -->`` and ``<!-- run-output:end -->`` is the output of
the ``$ placecheck ...`` command on its own first line (a section of the README
adds one where it shows a run). ``pytest --update-golden`` rewrites them all
from real runs. Every ``placecheck ...`` line in a ``console`` block of the
README must use flags the command has.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from placecheck.cli import app

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
START, END = "<!-- demo-output:start -->\n", "<!-- demo-output:end -->"
# Machine-dependent figures in the notes, compared as placeholders.
_VOLATILE = re.compile(r"\d+(?:\.\d+)? GiB of memory available")


def _demo_command() -> list[str]:
    """The audit ``make demo`` runs, read from the Makefile (so the two cannot drift apart)."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^demo:.*?\n\t@echo '\$\$ (placecheck audit [^']*)'", makefile, re.M | re.S)
    assert match, "the Makefile's demo target no longer echoes its placecheck command"
    return shlex.split(match.group(1))


def _demo_block(text: str) -> tuple[int, int]:
    start = text.index(START) + len(START)
    return start, text.index(END, start)


def _normalise(text: str) -> str:
    # the table wraps notes at 80 columns, so where the free-memory figure breaks the line depends on
    # its width: compare the words (the layout is pinned by tests/golden/buggy.table.txt)
    return _VOLATILE.sub("N GiB of memory available", " ".join(text.split()))


@pytest.mark.skipif(torch.version.cuda is None,
                    reason="the demo output is recorded with the CUDA build of torch (the CPU-only build "
                           "simulates CUDA with real values, and its notes say so)")
def test_readme_shows_the_real_demo_output(update_golden: bool) -> None:
    command = _demo_command()
    assert command[:2] == ["placecheck", "audit"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    run = subprocess.run([sys.executable, "-m", "placecheck", *command[1:]], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr  # the buggy example has findings
    shown = f"```text\n$ {' '.join(command)}\n{run.stdout}```\n"
    text = README.read_text(encoding="utf-8")
    start, end = _demo_block(text)
    if update_golden:
        README.write_text(text[:start] + shown + text[end:], encoding="utf-8")
        return
    assert _normalise(text[start:end]) == _normalise(shown), (
        "README's demo output differs from a real run of the demo; run pytest --update-golden")


RUN_START, RUN_END = "<!-- run-output:start -->\n", "<!-- run-output:end -->"


def _run_blocks(text: str) -> list[tuple[int, int, str]]:
    """(start, end, command) of every run-output block, in order."""
    blocks = []
    at = 0
    while (found := text.find(RUN_START, at)) >= 0:
        start = found + len(RUN_START)
        end = text.index(RUN_END, start)
        first = text[start:end].split("\n", 2)[1]
        assert first.startswith("$ placecheck "), f"a run-output block must start with its command: {first!r}"
        blocks.append((start, end, first[2:]))
        at = end
    return blocks


def test_readme_has_run_output_blocks() -> None:
    # the test below would pass vacuously on a README without any
    commands = [c for _, _, c in _run_blocks(README.read_text(encoding="utf-8"))]
    assert "placecheck audit placecheck/examples/pipeline.py:BuggyPipeline --device keep" in commands


@pytest.mark.skipif(torch.version.cuda is None,
                    reason="the outputs are recorded with the CUDA build of torch (the CPU-only build's "
                           "engine notes differ)")
@pytest.mark.parametrize("index", range(len(_run_blocks(README.read_text(encoding="utf-8")))))
def test_readme_run_output_is_a_real_run(index: int, update_golden: bool,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # in-process, through the same typer app the console script runs (the demo above and
    # test_cli_audit's subprocess test run the real process): as from the repository, no terminal width
    text = README.read_text(encoding="utf-8")
    start, end, command = _run_blocks(text)[index]
    monkeypatch.chdir(REPO)
    for name in ("COLUMNS", "LINES"):
        monkeypatch.delenv(name, raising=False)
    run = CliRunner().invoke(app, shlex.split(command)[1:])
    assert run.exit_code in (0, 1), (run.stderr, run.exception)
    shown = f"```text\n$ {command}\n{run.stdout}```\n"
    if update_golden:
        README.write_text(text[:start] + shown + text[end:], encoding="utf-8")
        return
    assert _normalise(text[start:end]) == _normalise(shown), (
        f"README's output of `{command}` differs from a real run; run pytest --update-golden")


def _flags(command: str) -> set[str]:
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {opt for param in click_command.params for opt in param.opts}


def _readme_command_lines() -> list[str]:
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```console\n(.*?)```", text, re.S)
    lines: list[str] = []
    for block in blocks:
        # join continuation lines, drop comments
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("placecheck "):
                lines.append(line)
    return lines


def test_readme_console_lines_name_real_commands_and_flags() -> None:
    lines = _readme_command_lines()
    assert len(lines) >= 10
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    for line in lines:
        words = shlex.split(line.replace("[", " ").replace("]", " "))
        assert words[1] in commands, f"unknown command in README: {line!r}"
        used = {w.split("=", 1)[0] for w in words[2:] if w.startswith("-")}
        unknown = used - _flags(words[1])
        assert not unknown, f"README line {line!r} uses flags placecheck {words[1]} lacks: {unknown}"
