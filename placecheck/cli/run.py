"""``placecheck run``: a whole training or inference script on a simulated GPU."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from placecheck.basics.options import RunOptions
from placecheck.cli.app import app
from placecheck.cli.common import PanelCommand, configured, declared_options, options_from
from placecheck.cli.output import errors_reported, interrupted
from placecheck.findings.output import OutputOptions, emit, model_output_to_stderr, output_format, say
from placecheck.findings.report import Report

RUN_HELP = """Run a training or inference script on a simulated GPU: every placement problem it meets.

The script REALLY RUNS, as `python SCRIPT.py ARGS` would (as __main__, with
sys.argv, its directory on sys.path, the current working directory), but it
never changes your files: what it writes lands in a scratch area it reads
back, removed after the run (--keep-scratch keeps it); data it downloads is
downloaded. --steps bounds the work
(it stops after that many optimizer.step() calls), --timeout bounds the time;
stopping early is not an error. placecheck's options go before SCRIPT (or -m
MODULE): what follows it is the script's, as with python, torchrun and
coverage run (`placecheck run --steps 3 train.py --epochs 1`).

Simulated: torch.cuda.is_available() is True and device_count() is --gpus;
CUDA tensors hold real values on the CPU and report their CUDA device, so
.item(), printed losses, data-driven branches and backward all run (with
--engine fake, or auto when a real-valued step would not fit: fake tensors,
no memory for data, host reads assumed with a note each); an op
mixing devices is reported (with the batch element or the module buffer at
fault, and its line) and the run goes on. DataLoader workers run on the CPU,
as on a GPU machine. Not simulated: GPU speed and memory, CUDA kernels,
graphs and NCCL, pinned memory (pin_memory is a CPU copy), asynchrony (host
syncs are counted, not timed).

A device error the script raises is a finding at its line; any other
exception of its own (a KeyError in its config) is not: the run did not run
through, one line on stderr names it and its line, the script's own frames
of the traceback under it. Exit status: 0 when no finding is at or above
--fail-on, 1 when one is, 2 for a missing script or module or a syntax
error, and 2 when no finding is but the script did not run through (its own
exception or non-zero sys.exit, code the simulation cannot run: a note says
which); 3 for an internal error.
"""

ARGV = "placecheck.run.argv"
"""Where :class:`ScriptCommand` keeps the command line as given (``ctx.meta``), for the error that
names the corrected command."""


class ScriptCommand(PanelCommand):
    """``placecheck run``'s grammar: the first argument that is not one of placecheck's options (or the
    value of ``-m``/``--module``) is the script, and everything after it is the script's, unparsed.

    click would read a ``--steps 3`` or an unknown ``--epochs 1`` after the script as options (and
    refuse the second); python, torchrun and coverage run hand them to the script. The boundary is
    marked with ``--`` before click parses, so the behaviour is the same on every typer of the
    supported range (click's own ``allow_interspersed_args``/``ignore_unknown_options`` differ in
    how they treat an unknown option before the script, which must stay an error).
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta[ARGV] = list(args)
        return super().parse_args(ctx, script_boundary(self.get_params(ctx), args))  # type: ignore[no-any-return]


def _valued(params: Sequence[Any]) -> tuple[dict[str, Any], set[str]]:
    """Every flag of the command's options -> its option, and the flags that take a value."""
    flags: dict[str, Any] = {}
    valued: set[str] = set()
    for param in params:
        if param.param_type_name != "option":
            continue
        for flag in [*param.opts, *param.secondary_opts]:
            flags[flag] = param
            if not param.is_flag and not param.count:
                valued.add(flag)
    return flags, valued


def script_boundary(params: Sequence[Any], args: list[str]) -> list[str]:
    """``args`` with ``--`` inserted where the script's part begins: before the first argument that is
    neither an option of the command nor an option's value, or after ``-m MODULE``'s value; unchanged
    when the user already wrote ``--`` before it, or when there is no script."""
    flags, valued = _valued(params)
    module = {f for f, p in flags.items() if p.name == "module"}
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return args
        if not token.startswith("-") or token == "-":
            return [*args[:i], "--", *args[i:]]
        name, has_value, _ = token.partition("=")
        attached = not has_value and not token.startswith("--") and len(token) > 2 \
            and token[:2] in valued  # -mpkg.train, -fjson
        flag = token[:2] if attached else name
        step = 2 if flag in valued and not (has_value or attached) else 1
        if flag in module:
            return [*args[:i + step], "--", *args[i + step:]]
        i += step
    return args


def misplaced_options(params: Sequence[Any], script_args: Sequence[str]) -> list[str]:
    """The command's own options (with their values) among the script's arguments: the old order
    ``placecheck run train.py --steps 3`` gives them to the script."""
    flags, valued = _valued(params)
    moved: list[str] = []
    rest = list(script_args)
    while rest:
        token = rest.pop(0)
        name = token.partition("=")[0]
        if name.startswith("--") and name in flags and flags[name].name != "module":
            moved.append(token)
            if name in valued and "=" not in token and rest:
                moved.append(rest.pop(0))
    return moved


@app.command(cls=ScriptCommand, help=RUN_HELP, context_settings={"allow_interspersed_args": False})
@declared_options("run")
def run(
    ctx: typer.Context,
    script: Annotated[str | None, typer.Argument(
        metavar="SCRIPT", help="The script to run (omit with -m); placecheck's options go before it.",
        show_default=False)] = None,
    script_args: Annotated[list[str] | None, typer.Argument(
        metavar="ARGS", help="The script's arguments: everything after SCRIPT (or -m MODULE) is the "
                             "script's, as with python.", show_default=False)] = None,
    **given: Any,
) -> None:
    from placecheck.basics.errors import UsageError

    debug, module = given["debug"], given["module"]
    with errors_reported(debug):
        args = list(script_args or ())
        if args and args[0] == "--":  # the older spelling `placecheck run train.py -- --epochs 1`
            args.pop(0)
        if module is not None:
            if script is not None:
                args.insert(0, script)  # with -m, every positional argument is the module's
            target = module
        elif script is None:
            raise UsageError("give a script to run (placecheck run SCRIPT.py) or a module (-m MODULE)")
        else:
            target = script
        out = OutputOptions(format=output_format(given["fmt"]), output=given["output"],
                            fail_on=given["fail_on"], exit_zero=given["exit_zero"], debug=debug,
                            group=not given["no_group"], hints=given["hints"])
        out.check()  # a bad --fail-on or --output fails before the script runs
        # None (not given) is the default; lists of comma-separated codes are split
        options = options_from(RunOptions, given)
        options = configured(ctx, options)  # ./pyproject.toml's [tool.placecheck.run] for what is not given
        options.check()  # a bad selector fails before the script runs (and before torch loads)
        from placecheck.run import run as run_program
        from placecheck.run.script import RunInterrupted

        try:
            with model_output_to_stderr():
                report = run_program(target, args, options=options)
        except RunInterrupted as stop:  # Ctrl-C while the script ran: what was found so far, then the line
            emit(stop.report, out)
            raise interrupted() from None
        code = emit(report, out)
        if report.unfinished:
            _say_unfinished(report, _corrected(ctx, report, args))
        raise typer.Exit(code)


def _corrected(ctx: typer.Context, report: Report, script_args: list[str]) -> str:
    """The command line with placecheck's options moved before the script, when some stood after it
    and the script then exited with status 2, the status of a usage error in argparse (and click):
    it most likely refused them. "" otherwise."""
    from placecheck.run.script import exited

    moved = misplaced_options(ctx.command.get_params(ctx), script_args)
    argv: list[str] = ctx.meta.get(ARGV, [])
    if not moved or not report.unfinished.startswith(exited(2, "")) or len(argv) < len(script_args):
        return ""
    head = argv[:len(argv) - len(script_args)]
    if head and head[-1] == "--":
        head = head[:-1]
    rest = list(script_args)
    for token in moved:
        rest.remove(token)
    return shlex.join(["placecheck", "run", *head[:-1], *moved, *head[-1:], *rest])


def _say_unfinished(report: Report, corrected: str = "") -> None:
    """A script that did not run through is one line on stderr (the report, written before it, says the
    rest), the script's own frames of its traceback under it when it raised an error of its own.
    ``corrected``: the command with placecheck's options before the script, when those after it most
    likely made the script refuse its arguments."""
    why = report.unfinished
    if not why.startswith("the script "):  # the simulation's limit: the notes say which and where
        why = f"the script did not run through: {why} (see the notes)"
    if corrected:
        why = f"placecheck options go before the script: {corrected} ({why})"
    say(f"placecheck: error: {why}")
    if report.script_traceback:
        typer.echo("Traceback of the script's own code (most recent call last):", err=True)
        for line in report.script_traceback:
            typer.echo(line, err=True)
