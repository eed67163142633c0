"""The README shows what placecheck really prints and names only real flags.

The block between ``<!-- demo-output:start -->`` and ``<!-- demo-output:end -->``
is the output of the command ``make demo`` runs; ``pytest --update-golden``
rewrites it from a real run. Every ``placecheck ...`` line in a ``console``
block of the README must use flags the command has.
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
