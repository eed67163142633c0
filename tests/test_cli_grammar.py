"""One command-line grammar, on every typer of the supported range (``pytest -m cli``).

Table-driven: :data:`FLAGS` is every flag of every command and :data:`VALUES` a value each
takes. The tests check that ``--help`` documents exactly those flags, that each of them (long
and short spelling) parses to its value, that every flag README.md and docs/*.md show is one of
them, that a shared option has one help, metavar, panel and default in every command that has
it, and that a usage error is one line and exit 2 through the console-script entry point.
typer 0.27.0 to 0.27.3 name an option declared with only a metavar from its metavar
(``--ENGINE``); on typer before 0.27.2 ``typer.TyperException`` does not exist: both broke the
command line once, and either fails here.
"""

from __future__ import annotations

import enum
import json
import re
import shlex
import sys
from typing import Any

import pytest
import typer
from cli_runner import CliRunner
from conftest import REPO, assert_usage_error, unwrapped

from placecheck.cli import app, common

pytestmark = pytest.mark.cli

FLAGS: dict[str, set[str]] = {
    "audit": {
        "--kwargs", "--arg", "--checkpoint", "--key", "--trust",
        "-d", "--device", "--engine", "--gpus", "--init", "--wrap", "--world-size", "--device-map",
        "--gpu-memory", "--cpu-memory",
        "-i", "--input", "--example-inputs", "--train", "--no-forward", "--no-reuse-calls", "--timeout",
        "--fix",
        "--select", "--ignore", "--library-findings", "-f", "--format", "-o", "--output", "--no-group",
        "--hints", "--debug",
        "--fail-on", "--exit-zero", "-c", "--config", "-j", "--jobs", "--isolation", "--progress",
        "--shard", "--baseline", "--write-baseline",
    },
    "checkpoint": {
        "--model", "--kwargs", "--arg", "--key", "--trust", "-d", "--device", "--engine", "--gpus",
        "--select", "--ignore", "-f", "--format", "-o", "--output", "--no-group", "--hints", "--debug",
        "--fail-on", "--exit-zero",
    },
    "run": {
        "-m", "--module", "--gpus", "--engine", "--steps", "--timeout", "--select", "--ignore", "-f",
        "--format", "-o", "--output", "--no-group", "--hints", "--debug", "--fail-on", "--exit-zero",
        "--nproc-per-node", "--nproc_per_node", "--standalone", "--keep-scratch",
    },
    "fix": {
        "--run", "--kwargs", "--arg", "-d", "--device", "--engine", "--gpus", "--init", "-i", "--input",
        "--example-inputs", "--steps", "--timeout", "--diff", "--write", "--check", "--unsafe", "--select",
        "--ignore", "-f", "--format", "--debug",
    },
    "merge": {
        "-f", "--format", "-o", "--output", "--debug", "--fail-on", "--exit-zero", "--baseline",
        "--write-baseline",
    },
    "rules": {"--debug"},
    "explain": {"--debug"},
    "example-config": {"--debug"},
}
"""Every flag of every command (``-h``/``--help`` aside). A flag added to a command is added here."""

POSITIONAL = {"audit": ["m.py:Net"], "checkpoint": ["model.pt"], "run": ["train.py"], "fix": ["m.py:Net"],
              "merge": ["shard.json"], "rules": [], "explain": ["PC101"], "example-config": []}
"""Arguments that make each command's line complete."""

VALUES: dict[str, tuple[str | None, Any]] = {
    # flag: (what is typed after it, None for an on/off flag; what the command receives)
    "--kwargs": ('{"n": 1}', '{"n": 1}'), "--arg": ("n=1", ["n=1"]), "--checkpoint": ("w.pt", "w.pt"),
    "--key": ("model.ema", "model.ema"), "--trust": (None, True), "--model": ("m.py:Net", "m.py:Net"),
    "--device": ("cuda:1", "cuda:1"), "--engine": ("tagged", "tagged"), "--gpus": ("3", 3),
    "--init": ("meta", "meta"), "--wrap": ("ddp", "ddp"), "--world-size": ("4", 4),
    "--device-map": ("auto", "auto"), "--gpu-memory": ("24GiB", "24GiB"), "--cpu-memory": ("8GB", "8GB"),
    "--input": ("float32[2,3]", ["float32[2,3]"]), "--example-inputs": ("d.py:batch", "d.py:batch"),
    "--train": (None, True), "--no-forward": (None, True), "--no-reuse-calls": (None, True),
    "--timeout": ("2.5", 2.5), "--steps": ("0", 0), "--module": ("pkg.train", "pkg.train"),
    "--fix": (None, True), "--run": (None, True), "--diff": (None, True), "--write": (None, True),
    "--check": (None, True),
    "--unsafe": (None, True), "--select": ("PC2,PC301", ["PC2,PC301"]), "--ignore": ("PC204", ["PC204"]),
    "--library-findings": (None, True), "--output": ("r.json", "r.json"),
    "--no-group": (None, True), "--hints": (None, True), "--debug": (None, True),
    "--fail-on": ("error", "error"), "--exit-zero": (None, True), "--config": ("c.toml", "c.toml"),
    "--jobs": ("2", 2), "--isolation": ("spawn", "spawn"), "--progress": ("lines", "lines"),
    "--nproc-per-node": ("2", "2"), "--standalone": (None, True), "--keep-scratch": (None, True),
    "--shard": ("1/2", "1/2"), "--baseline": ("b.json", "b.json"), "--write-baseline": ("b.json", "b.json"),
}
FORMAT_VALUES = {"fix": ("json", "json")}
"""``--format``'s value per command (the report formats elsewhere: json, sarif, ...)."""

SHARED = ("--device", "--gpus", "--engine", "--select", "--ignore", "--format", "--output", "--fail-on",
          "--exit-zero", "--timeout", "--steps", "--debug")
"""The options issue 24 names: one meaning, help and default wherever they appear."""
DIFFERENT = {
    ("fix", "--format"): "fix prints a patch, not a report: text (the diff and summary) or json",
    ("merge", "--fail-on"): "merge's default is the shards' own --fail-on",
    ("audit", "--device"): "audit alone takes --device keep (the model as its own code placed it)",
    ("audit", "--gpus"): "audit's --device keep simulates 8 GPUs unless told",
    ("run", "--engine"): "run has no real-device engine (the script's own torch.cuda is what is simulated): "
                         "tagged or fake, auto picking fake when a real-valued step would not fit",
}
"""The only options that differ from another command's option of the same name, and why."""


def _root() -> Any:
    return typer.main.get_command(app)


def _command(name: str) -> Any:
    return _root().commands[name]


def _options(name: str) -> dict[str, Any]:
    """Long and short flag -> its click option, help aside."""
    return {flag: p for p in _command(name).params if p.param_type_name == "option"
            for flag in (*p.opts, *p.secondary_opts)}


def _plain(value: Any) -> Any:
    """A parsed value as a command receives it, alike on every typer (some convert enums and lists
    while parsing, older ones in the command's callback)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _parse(command: str, argv: list[str]) -> dict[str, Any]:
    """What ``placecheck COMMAND ARGV`` would pass the command (click parses; nothing runs)."""
    with _command(command).make_context(command, list(argv)) as ctx:
        return {name: _plain(value) for name, value in ctx.params.items()}


def _help_flags(command: str) -> set[str]:
    """The flags ``placecheck COMMAND --help`` shows, read off the text."""
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    flags: set[str] = set()
    sections = result.stdout.split("\n\n")
    first = next(i for i, part in enumerate(sections) if re.match(r"[A-Z][A-Za-z ]+:\n", part))
    for line in "\n\n".join(sections[first:]).splitlines():  # the options, not the description
        entry = re.match(r"^  (-[^ ].*?)(?:  |$)", line)  # an option's first line; wrapped help is deeper
        if entry:
            flags |= {part.split(" ")[0] for part in entry.group(1).split(", ")}
    return flags - {"-h", "--help"}


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_help_documents_exactly_the_flags_of_the_table(command: str) -> None:
    assert set(_root().commands) == set(FLAGS)
    assert _help_flags(command) == FLAGS[command] - HIDDEN
    assert set(_options(command)) == FLAGS[command]


@pytest.mark.parametrize("command, flag", sorted((c, f) for c, flags in FLAGS.items() for f in flags))
def test_every_flag_parses(command: str, flag: str) -> None:
    option = _options(command)[flag]
    long = max((*option.opts, *option.secondary_opts), key=len)
    typed, expected = FORMAT_VALUES.get(command, ("sarif", "sarif")) if long == "--format" else VALUES[long]
    argv = [flag, *([] if typed is None else [typed]), *POSITIONAL[command]]  # run: options before SCRIPT
    params = _parse(command, argv)
    assert params[option.name] == expected, (argv, params[option.name])
    assert params[option.name] != _plain(option.default)  # the flag, not the default, set it


HIDDEN = {"--standalone"}
"""Accepted, not shown: torchrun's ``--standalone`` (one node), which changes nothing in the simulation."""

TORCHRUN_SPELLINGS = {"--nproc_per_node"}
"""torchrun's own spelling, accepted beside the kebab-case flag so that a torchrun command line pastes."""


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_every_option_is_spelled_in_its_declaration(command: str) -> None:
    # a derived name (typer 0.27: from the metavar, --ENGINE) is never lower-case kebab
    for option in {id(o): o for o in _options(command).values()}.values():
        longs = [f for f in option.opts if f.startswith("--")]
        assert longs and all(re.fullmatch(r"--[a-z][a-z0-9-]*", f) or f in TORCHRUN_SPELLINGS
                             for f in longs), option.opts
        assert all(re.fullmatch(r"-[a-z]", f) for f in option.opts if not f.startswith("--")), option.opts


def test_a_short_flag_has_one_meaning() -> None:
    meaning: dict[str, set[str]] = {}
    for command in FLAGS:
        for flag, option in _options(command).items():
            if not flag.startswith("--"):
                meaning.setdefault(flag, set()).add(max(option.opts, key=len))
    assert {short: longs for short, longs in meaning.items() if len(longs) > 1} == {}
    assert meaning["-m"] == {"--module"} and "--model" in FLAGS["checkpoint"]


def _described(option: Any, ctx: Any) -> dict[str, Any]:
    return {"opts": sorted(option.opts), "default": _plain(option.default), "help": option.help,
            "metavar": option.metavar, "panel": getattr(option, "rich_help_panel", None),
            "shown": option.get_help_record(ctx)}


@pytest.mark.parametrize("flag", sorted({f for flags in FLAGS.values() for f in flags if f.startswith("--")}))
def test_a_shared_option_is_the_same_in_every_command(flag: str) -> None:
    having = [c for c in sorted(FLAGS) if flag in FLAGS[c] and (c, flag) not in DIFFERENT]
    described = {}
    for command in having:
        with _command(command).make_context(command, [*POSITIONAL[command]]) as ctx:
            described[command] = _described(_options(command)[flag], ctx)
    first = next(iter(described.values()), None)
    assert all(d == first for d in described.values()), described


def test_the_shared_options_are_where_issue_24_wants_them() -> None:
    # not vacuous: the options the grammar is about appear in the commands that run audits
    for flag in SHARED:
        having = {c for c in ("audit", "run", "fix", "checkpoint") if flag in FLAGS[c]}
        assert len(having) >= 2, (flag, having)
    assert all("--debug" in flags for flags in FLAGS.values())
    assert {c for c in FLAGS if "--steps" in FLAGS[c]} == {"run", "fix"}
    from placecheck.run import DEFAULT_STEPS

    assert common.DEFAULT_STEPS == DEFAULT_STEPS


def test_help_is_grouped_into_panels_in_one_order() -> None:
    for command in ("audit", "run", "fix", "checkpoint"):
        text = CliRunner().invoke(app, [command, "--help"]).stdout
        titles = [line[:-1] for line in text.splitlines() if re.fullmatch(r"[A-Z][A-Za-z ]+:", line)]
        panels = [t for t in titles if t in common.PANELS]
        assert len(panels) >= 3 and panels == sorted(panels, key=common.PANELS.index), (command, titles)
    audit_help = CliRunner().invoke(app, ["audit", "--help"]).stdout
    device_panel = audit_help.split("Device and engine:\n", 1)[1].split("\n\n", 1)[0]
    assert "--gpus" in device_panel and "--format" not in device_panel


# -- what the README and docs show ---------------------------------------------------------------

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FOREIGN = {"--index-url": "pip", "--extra-index-url": "pip", "--no-deps": "pip", "--upgrade": "pip",
           "--update-golden": "pytest (tests/conftest.py)", "--no-index": "pip",
           "--reference": "benchmarks/fidelity.py", "--only": "benchmarks/fidelity.py",
           "--corpus": "benchmarks/bench_fast_forward.py and tests/corpus_gate.py",
           "--workers": "tests/corpus_gate.py",
           "--nnodes": "torchrun (placecheck run -m torch.distributed.run refuses more than one node)"}
"""Flags the docs show for other tools."""


def _doc_command_lines() -> list[tuple[str, str]]:
    """(file, line) of every ``placecheck COMMAND ...`` line in a fenced block of the docs."""
    lines = []
    for path in DOCS:
        for block in re.findall(r"```[a-z]*\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                found = re.search(r"(?:^|[$:] |\brun: )(placecheck [a-z-]+.*)", line)
                if found and found.group(1).split()[1] in FLAGS:
                    lines.append((path.name, found.group(1).split("  #")[0].strip()))
    return lines


def test_every_command_line_the_docs_show_names_real_flags() -> None:
    lines = _doc_command_lines()
    assert len(lines) >= 10
    for source, line in lines:
        words = shlex.split(line.replace("[", " ").replace("]", " ").replace("|", " "))
        command = words[1]
        used = {w.split("=", 1)[0] for w in words[2:] if re.fullmatch(r"--?[a-zA-Z][\w-]*(=.*)?", w)}
        assert used <= FLAGS[command], f"{source}: {line!r} uses flags placecheck {command} lacks"


def test_every_complete_command_line_the_docs_show_parses() -> None:
    # a line without placeholders ([--device cuda], ARGS...) is parsed whole, its values included
    complete = [(s, line) for s, line in _doc_command_lines()
                if not re.search(r"[\[\]]|\.\.\.|\bTARGET\b|\bFILE\b|\bSCRIPT\b", line)]
    assert len(complete) >= 5
    for _source, line in complete:
        words = shlex.split(line)
        for redirect in (">", "|", "&&"):
            words = words[:words.index(redirect)] if redirect in words else words
        _parse(words[1], words[2:])


def test_every_flag_the_docs_mention_exists() -> None:
    every = set().union(*FLAGS.values()) | {"-h", "--help", "--version"}
    for path in DOCS:
        mentioned = set(re.findall(r"`(--[a-z][a-z0-9_-]*)", path.read_text(encoding="utf-8")))
        unknown = mentioned - every - set(FOREIGN)
        assert not unknown, f"{path.name} mentions flags no placecheck command has: {sorted(unknown)}"


# -- usage errors through the console script ------------------------------------------------------


def _entrypoint(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                *argv: str) -> tuple[int, str, str]:
    from placecheck.cli import entrypoint

    monkeypatch.setattr(sys, "argv", ["placecheck", *argv])
    with pytest.raises(SystemExit) as info:
        entrypoint()
    captured = capsys.readouterr()
    code = info.value.code
    return code if isinstance(code, int) else 1, captured.out, captured.err


BAD_VALUES = [("--gpus", "0"), ("--gpus", "two"), ("--format", "nope"), ("--steps", "-1"),
              ("--timeout", "0"), ("--jobs", "0"), ("--world-size", "0")]


@pytest.mark.parametrize("command, argv, needle", [
    *[(c, ["--no-such-flag"], "--no-such-flag") for c in sorted(FLAGS)],
    *[(c, [flag, value], flag) for c in sorted(FLAGS) for flag, value in BAD_VALUES if flag in FLAGS[c]],
])
def test_a_usage_error_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str],
                                              command: str, argv: list[str], needle: str) -> None:
    assert_usage_error(*_entrypoint(monkeypatch, capsys, command, *argv, *POSITIONAL[command]), needle)


def test_an_option_missing_its_value_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert_usage_error(*_entrypoint(monkeypatch, capsys, "audit", "m.py:Net", "--engine"), "--engine")


# -- one options object per command: a shared option means the same in each ----------------------

OPTION_COMMANDS = ("audit", "run", "fix", "checkpoint")
"""The commands that parse their command line into an options object (placecheck.basics.options)."""
GOOD: dict[str, tuple[str, str, Any]] = {
    # flag: (what is typed, the options field it sets, the field's value)
    "--device": ("cuda:1", "device", "cuda:1"), "--engine": ("tagged", "engine", "tagged"),
    "--gpus": ("3", "gpus", 3), "--select": ("PC2,PC301", "select", ("PC2", "PC301")),
    "--ignore": ("PC204", "ignore", ("PC204",)), "--steps": ("0", "steps", 0),
    "--timeout": ("2.5", "timeout", 2.5),
}
NOT_A_FIELD = {("audit", "--timeout"): "audit's --timeout bounds the child process the audit runs in "
                                        "(placecheck.cli.ci), not the audit"}
"""A shared option a command has that is not a field of its options object, and why."""
BAD = [("--device", "gpu"), ("--engine", "warp"), ("--gpus", "0"), ("--gpus", "two"), ("--select", "PC9999"),
       ("--ignore", "XX1"), ("--steps", "-1"), ("--timeout", "0"), ("--fail-on", "bogus"),
       ("--format", "nope")]
"""A bad value of each shared option (the options object's checks and click's)."""
BAD_DIFFERENT = {("checkpoint", "--device"): "a checkpoint loads onto one device: its list of devices "
                                             "lacks audit's keep"}
"""A bad value whose error differs in one command, and why."""
SCRIPT = {"fix": ["--run"]}
"""What a command's line needs for --steps and --timeout (fix: TARGET is a script)."""


def _argv(command: str, flag: str, typed: str | None = None) -> list[str]:
    """A complete line of ``command`` for ``flag`` (with ``typed``, the flag and its value)."""
    script = SCRIPT.get(command, []) if flag in ("--steps", "--timeout") else []
    return [command, *script, *([flag, typed] if typed is not None else []), *POSITIONAL[command]]


def _built_options(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Any:
    """The options object ``placecheck ARGV`` hands to its Python function (which is not run)."""
    import placecheck.run
    from placecheck.basics.options import CommonOptions
    from placecheck.cli import audit, checkpoint
    from placecheck.fix import fixer

    built: list[Any] = []

    def record(*args: Any, **kwargs: Any) -> Any:
        built.extend(a for a in (*args, *kwargs.values()) if isinstance(a, CommonOptions))
        raise typer.Exit(0)

    with monkeypatch.context() as patched:
        for module, name in ((audit, "run_audit"), (checkpoint, "run_checkpoint"), (placecheck.run, "run"),
                             (fixer, "fix"), (fixer, "fix_run")):
            patched.setattr(module, name, record)
        result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, (argv, result.output, result.stderr)
    [options] = built
    return options


@pytest.mark.parametrize("command, flag", [(c, f) for f in GOOD for c in OPTION_COMMANDS if f in FLAGS[c]])
def test_a_shared_option_sets_the_same_field_in_every_command(monkeypatch: pytest.MonkeyPatch,
                                                                command: str, flag: str) -> None:
    from placecheck.basics.options import CommonOptions

    typed, field, value = GOOD[flag]
    if (command, flag) in NOT_A_FIELD:
        assert not hasattr(_built_options(monkeypatch, [command, *POSITIONAL[command]]), field)
        return
    options = _built_options(monkeypatch, _argv(command, flag, typed))
    assert isinstance(options, CommonOptions)
    assert command == options.COMMAND
    assert getattr(options, field) == value
    # and only that field: every other one is the command's default, as in Python
    default = _built_options(monkeypatch, _argv(command, flag))
    assert options == default.replace(**{field: value})


@pytest.mark.parametrize("flag, bad", BAD)
def test_a_bad_shared_value_is_the_same_error_in_every_command(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str],
                                                                flag: str, bad: str) -> None:
    having = [c for c in OPTION_COMMANDS if flag in FLAGS[c] and (c, flag) not in DIFFERENT]
    assert len(having) >= 2, (flag, having)
    errors = {}
    for command in having:
        code, out, err = _entrypoint(monkeypatch, capsys, *_argv(command, flag, bad))
        assert_usage_error(code, out, err)
        assert flag in err or repr(bad) in err, err  # click names the flag; the options' checks the value
        errors[command] = err
    same = {c: e for c, e in errors.items() if (c, flag) not in BAD_DIFFERENT}
    assert len(set(same.values())) == 1, errors


@pytest.mark.parametrize("flag, bad", [("--device", "gpu"), ("--engine", "warp"), ("--gpus", "0"),
                                       ("--select", "PC9999"), ("--ignore", "XX1"), ("--steps", "-1"),
                                       ("--timeout", "0")])
def test_python_and_a_config_refuse_a_bad_value_in_the_command_lines_words(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str, bad: str) -> None:
    # what the options object's check says is the command line's error, and a config's
    from placecheck.basics import config
    from placecheck.basics.errors import UsageError
    from placecheck.basics.options import check_value

    field = GOOD[flag][1]
    value: Any = {"--gpus": int, "--steps": int, "--timeout": float}.get(flag, str)(bad)
    if field in ("select", "ignore"):
        value = (bad,)
    with pytest.raises(UsageError) as python:
        check_value(field, value)
    command = "run" if flag not in ("--device", "--engine") else "fix"
    if flag in ("--gpus", "--steps", "--timeout"):  # click refuses these on the command line first
        command_line = None
    else:
        _, _, err = _entrypoint(monkeypatch, capsys, *_argv(command, flag, bad))
        command_line = unwrapped(err).strip().removeprefix("placecheck: error: ")
    assert command_line in (None, str(python.value))
    shown = json.dumps(list(value) if isinstance(value, tuple) else value)
    toml = f"[{command}]\n{field} = {shown}\n"
    with pytest.raises(UsageError) as configured:
        config.command_values(command, toml, "pyproject.toml")
    assert str(configured.value) == f"pyproject.toml:2: {command}.{field}: {python.value}"


class _Built(Exception):
    """Raised by a patched ``check()`` with the options object a Python call built."""


def _python_built(monkeypatch: pytest.MonkeyPatch, cls: type, call: Any) -> Any:
    """The options object ``call()`` (a Python API call) builds and checks (nothing runs after)."""
    def record(self: Any) -> None:
        raise _Built(self)

    with monkeypatch.context() as patched, pytest.raises(_Built) as built:
        patched.setattr(cls, "check", record)
        call()
    return built.value.args[0]


def test_the_command_line_a_config_table_and_python_build_equal_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import placecheck
    from placecheck.basics import config
    from placecheck.basics.options import AuditOptions, CheckpointOptions, FixOptions, RunOptions
    from placecheck.checkpoint import check_checkpoint
    from placecheck.fix import fix, fix_run

    run_line = _built_options(monkeypatch, ["run", "--gpus", "2", "--steps", "3", "--timeout", "5",
                                            "--select", "PC2", "--ignore", "PC204,PC205", "train.py"])
    run_table = config.command_options("run", '[run]\ngpus = 2\nsteps = 3\ntimeout = 5\nselect = ["PC2"]\n'
                                              'ignore = ["PC204", "PC205"]\n')
    run_python = _python_built(monkeypatch, RunOptions, lambda: placecheck.run(
        "train.py", gpus=2, steps=3, timeout=5, select=["PC2"], ignore="PC204,PC205"))
    assert run_line == run_table == run_python
    assert run_line == RunOptions(gpus=2, steps=3, timeout=5.0, select=("PC2",), ignore=("PC204", "PC205"))

    fix_line = _built_options(monkeypatch, ["fix", "m.py:Net", "--device", "cuda:1", "--engine", "tagged",
                                            "--gpus", "2", "--init", "cpu", "-i", "float32[2,3]",
                                            "--select", "PC1", "--unsafe"])
    fix_table = config.command_options("fix", '[fix]\ndevice = "cuda:1"\nengine = "tagged"\ngpus = 2\n'
                                              'init = "cpu"\ninputs = ["float32[2,3]"]\nselect = ["PC1"]\n'
                                              'unsafe = true\n')
    fix_python = _python_built(monkeypatch, FixOptions, lambda: fix(
        "m.py:Net", AuditOptions(device="cuda:1", engine="tagged", gpus=2, init="cpu", inputs="float32[2,3]"),
        select=["PC1"], unsafe=True))
    assert fix_line == fix_table == fix_python and isinstance(fix_line, FixOptions)

    script_line = _built_options(monkeypatch, ["fix", "--run", "train.py", "--gpus", "2", "--steps", "3",
                                               "--timeout", "5", "--select", "PC2", "--unsafe"])
    script_table = config.command_options("fix", '[fix]\ngpus = 2\nsteps = 3\ntimeout = 5\nselect = ["PC2"]\n'
                                                 "unsafe = true\n")
    script_python = _python_built(monkeypatch, FixOptions, lambda: fix_run(
        "train.py", gpus=2, steps=3, timeout=5, select=["PC2"], unsafe=True))
    assert script_line == script_table.replace(run=True) == script_python
    assert script_line.run_options() == run_line.replace(ignore=())

    checkpoint_line = _built_options(monkeypatch, ["checkpoint", "model.pt", "--device", "cuda:1", "--engine",
                                                   "fake", "--gpus", "2", "--key", "model.ema", "--trust",
                                                   "--select", "PC3", "--no-group"])
    checkpoint_table = config.command_options(
        "checkpoint", '[checkpoint]\ndevice = "cuda:1"\nengine = "fake"\ngpus = 2\n'
                      'checkpoint_key = "model.ema"\ntrust = true\nselect = ["PC3"]\ngroup = false\n')
    checkpoint_python = _python_built(monkeypatch, CheckpointOptions, lambda: check_checkpoint(
        "model.pt", device="cuda:1", engine="fake", gpus=2, key="model.ema", trust=True, select=["PC3"],
        group=False))
    assert checkpoint_line == checkpoint_table == checkpoint_python


@pytest.mark.parametrize("command, table, argv, expected", [
    ("run", "steps = 5\ngpus = 2\nselect = [\"PC2\"]", ["--gpus", "3"],
     {"steps": 5, "gpus": 3, "select": ("PC2",)}),
    ("checkpoint", 'device = "cpu"\ntrust = true\ngroup = false', ["--device", "cuda"],
     {"device": "cuda", "trust": True, "group": False}),
    # [fix] holds a model's and a script's options: each applies where it means something
    ("fix", 'device = "cpu"\nsteps = 7\nunsafe = true', [], {"device": "cpu", "steps": None, "unsafe": True}),
    ("fix", 'device = "cpu"\nsteps = 7\nunsafe = true', ["--run"],
     {"device": "cuda", "steps": 7, "unsafe": True}),
])
def test_pyproject_gives_the_options_the_command_line_does_not(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, command: str, table: str, argv: list[str],
        expected: dict[str, Any]) -> None:
    (tmp_path / "pyproject.toml").write_text(f"[tool.placecheck.{command}]\n{table}\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    options = _built_options(monkeypatch, [command, *argv, *POSITIONAL[command]])
    assert {name: getattr(options, name) for name in expected} == expected


def test_a_bad_pyproject_table_is_one_line_naming_file_line_and_key(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Any) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.placecheck.run]\nsteps = 2\nselect = ["PC9999"]\n'
                                             'module = true\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert_usage_error(*_entrypoint(monkeypatch, capsys, "run", "train.py"),
                       "pyproject.toml:3: run.select: invalid code selector 'PC9999'")
    (tmp_path / "pyproject.toml").write_text("[tool.placecheck.run]\nmodule = true\n", encoding="utf-8")
    assert_usage_error(*_entrypoint(monkeypatch, capsys, "run", "train.py"),
                       "pyproject.toml:2: run.module: unknown key")


@pytest.mark.parametrize("command", OPTION_COMMANDS)
def test_the_command_lines_defaults_are_the_options_objects(monkeypatch: pytest.MonkeyPatch,
                                                            command: str) -> None:
    from placecheck.basics.options import AuditOptions, CheckpointOptions, FixOptions, RunOptions

    python = {"audit": AuditOptions(copy_model=False, target=POSITIONAL["audit"][0]),  # the CLI's own model
              "run": RunOptions(), "fix": FixOptions(), "checkpoint": CheckpointOptions()}[command]
    assert _built_options(monkeypatch, [command, *POSITIONAL[command]]) == python
    assert _built_options(monkeypatch, ["fix", "--run", "train.py"]) == FixOptions(run=True)
