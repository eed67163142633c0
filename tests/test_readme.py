"""The README and every page of docs/ show what placecheck really prints and name only real flags.

The block between ``<!-- demo-output:start -->`` and ``<!-- demo-output:end -->``
(on one page) is the output of the command ``make demo`` runs; each block between
``<!-- run-output:start -->`` and ``<!-- run-output:end -->`` is the output of
the ``$ placecheck ...`` command on its own first line (a page adds one where it
shows a run). ``pytest --update-golden`` rewrites them all from real runs. Every
``placecheck ...`` line in a ``console`` block of a page must use flags the
command has, and every flag of every command is documented in docs/options.md.
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
from cli_runner import CliRunner

from placecheck.cli import app

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
"""Every page whose examples the tests re-run: the README and each page of docs/."""
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


# What an example script prints of its own: the loss of a model initialised at random.
_LOSS = re.compile(r"(?<=\bloss )\d+\.\d+")


def _normalise(text: str) -> str:
    # the table wraps notes at 80 columns, so where the free-memory figure breaks the line depends on
    # its width: compare the words (the layout is pinned by tests/golden/buggy.table.txt)
    return _LOSS.sub("L", _VOLATILE.sub("N GiB of memory available", " ".join(text.split())))


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
    [page] = [p for p in PAGES if START in p.read_text(encoding="utf-8")]
    text = page.read_text(encoding="utf-8")
    start, end = _demo_block(text)
    if update_golden:
        page.write_text(text[:start] + shown + text[end:], encoding="utf-8")
        return
    assert _normalise(text[start:end]) == _normalise(shown), (
        f"{page.name}'s demo output differs from a real run of the demo; run pytest --update-golden")


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


def _terminal(command: str, out: str, err: str) -> str:
    """What a terminal shows: for ``placecheck run``, what the script itself printed (placecheck sends it
    to stderr, keeping stdout for the report) comes first, as it is printed while the script runs."""
    return err + out if command.startswith("placecheck run ") else out


def _page_blocks() -> list[tuple[Path, int]]:
    """(page, index) of every run-output block of every page."""
    return [(page, i) for page in PAGES for i in range(len(_run_blocks(page.read_text(encoding="utf-8"))))]


def test_pages_have_run_output_blocks() -> None:
    # the test below would pass vacuously on pages without any
    commands = {page.name: [c for _, _, c in _run_blocks(page.read_text(encoding="utf-8"))] for page in PAGES}
    assert commands["README.md"] == ["placecheck run placecheck/examples/train_buggy.py"]
    pipeline = "placecheck audit placecheck/examples/pipeline.py:BuggyPipeline --device keep"
    assert pipeline in commands["many-gpus.md"]
    assert "placecheck fix placecheck/examples/buggy.py:BuggyNet" in commands["fix.md"]


@pytest.mark.skipif(torch.version.cuda is None,
                    reason="the outputs are recorded with the CUDA build of torch (the CPU-only build's "
                           "engine notes differ)")
@pytest.mark.parametrize("page, index", _page_blocks(),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_run_output_is_a_real_run(page: Path, index: int, update_golden: bool,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # in-process, through the same typer app the console script runs (the demo above and
    # test_cli_audit's subprocess test run the real process): as from the repository, no terminal width
    text = page.read_text(encoding="utf-8")
    start, end, command = _run_blocks(text)[index]
    monkeypatch.chdir(REPO)
    for name in ("COLUMNS", "LINES"):
        monkeypatch.delenv(name, raising=False)
    run = CliRunner().invoke(app, shlex.split(command)[1:])
    assert run.exit_code in (0, 1), (run.stderr, run.exception)
    shown = f"```text\n$ {command}\n{_terminal(command, run.stdout, run.stderr)}```\n"
    if update_golden:
        page.write_text(text[:start] + shown + text[end:], encoding="utf-8")
        return
    assert _normalise(text[start:end]) == _normalise(shown), (
        f"{page.name}'s output of `{command}` differs from a real run; run pytest --update-golden")


def _flags(command: str) -> set[str]:
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {opt for param in click_command.params for opt in param.opts}


def _readme_command_lines() -> list[str]:
    """Every ``placecheck ...`` line of a ``console`` block of a page."""
    text = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
    blocks = re.findall(r"```console\n(.*?)```", text, re.S)
    lines: list[str] = []
    for block in blocks:
        # join continuation lines, drop comments
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("placecheck "):
                lines.append(line)
    return lines


def test_console_lines_name_real_commands_and_flags() -> None:
    lines = _readme_command_lines()
    assert len(lines) >= 20
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    for line in lines:
        words = shlex.split(line.replace("[", " ").replace("]", " "))
        assert words[1] in commands, f"unknown command in the docs: {line!r}"
        own = words[2:words.index("--")] if "--" in words else words[2:]  # after --: the script's
        used = {w.split("=", 1)[0] for w in own if w.startswith("-")}
        unknown = used - _flags(words[1])
        assert not unknown, f"docs line {line!r} uses flags placecheck {words[1]} lacks: {unknown}"


def test_every_flag_of_every_command_is_documented() -> None:
    text = (REPO / "docs" / "options.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(--[a-z][a-z_-]*)", text))
    for name in typer.main.get_command(app).commands:  # type: ignore[attr-defined]
        missing = {f for f in _flags(name) if f.startswith("--") and f != "--help"} - documented
        assert not missing, f"docs/options.md does not document placecheck {name} {sorted(missing)}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_lead_somewhere() -> None:
    checked = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name} links to {target}, which does not exist"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), re.M)
                assert anchor in {_anchor(h) for h in headings}, f"{page.name}: no heading for {target}"
            checked += 1
    assert checked >= 20


def test_the_pre_commit_snippet_works_as_written() -> None:
    # no placeholder to replace: a local hook running the shipped hook's command in the project's own
    # environment (the audit imports the project's models and its torch)
    import yaml

    text = README.read_text(encoding="utf-8")
    assert "OWNER" not in text
    [shipped] = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    configs = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    [config] = [c for c in configs if isinstance(c, dict) and "repos" in c]
    [repo] = config["repos"]
    assert repo["repo"] == "local" and "rev" not in repo
    [hook] = repo["hooks"]
    assert hook["language"] == "system"  # needs no package index: the placecheck beside the torch
    for key in ("id", "entry", "pass_filenames", "types", "require_serial"):
        assert hook[key] == shipped[key], key


def test_readme_says_how_long_make_test_takes_and_shows_fix_run() -> None:
    text = README.read_text(encoding="utf-8")
    blocks = [block for block in re.findall(r"```console\n(.*?)```", text, re.S)
              if re.search(r"^make test +#", block, re.M)]
    assert len(blocks) == 2  # the fresh-clone setup and the development commands
    for block in blocks:
        said = block[block.index("make test "):].split("\nmake ", 1)[0]  # its comment, continued
        assert re.search(r"\d+-\d+ minutes", said), said
    assert "placecheck fix --run" in text
