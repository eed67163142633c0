"""``placecheck run``: a whole training or inference script on a simulated GPU."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from placecheck.basics.options import RunOptions
from placecheck.cli.app import app
from placecheck.cli.common import PanelCommand, configured, declared_options, options_from
from placecheck.findings.output import (
    OutputOptions,
    emit,
    errors_reported,
    model_output_to_stderr,
    output_format,
)
from placecheck.findings.report import Report

RUN_HELP = """Run a training or inference script on a simulated GPU: every placement problem it meets.

The script REALLY RUNS, as `python SCRIPT.py ARGS` would (as __main__, with
sys.argv, its directory on sys.path, the current working directory), but it
never changes your files: what it writes lands in a scratch area it reads
back, removed after the run (--keep-scratch keeps it); data it downloads is
downloaded. --steps bounds the work
(it stops after that many optimizer.step() calls), --timeout bounds the time;
stopping early is not an error.

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

@app.command(cls=PanelCommand, help=RUN_HELP, context_settings={"allow_interspersed_args": True})
@declared_options("run")
def run(
    ctx: typer.Context,
    script: Annotated[str | None, typer.Argument(
        metavar="SCRIPT", help="The script to run (omit with -m).", show_default=False)] = None,
    script_args: Annotated[list[str] | None, typer.Argument(
        metavar="ARGS", help="Arguments for the script, after --.", show_default=False)] = None,
    **given: Any,
) -> None:
    from placecheck.basics.errors import UsageError

    debug, module = given["debug"], given["module"]
    with errors_reported(debug):
        args = list(script_args or ())
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

        with model_output_to_stderr():
            report = run_program(target, args, options=options)
        code = emit(report, out)
        if report.unfinished:
            _say_unfinished(report)
        raise typer.Exit(code)


def _say_unfinished(report: Report) -> None:
    """A script that did not run through is one line on stderr (the report, written before it, says the
    rest), the script's own frames of its traceback under it when it raised an error of its own."""
    why = report.unfinished
    if not why.startswith("the script "):  # the simulation's limit: the notes say which and where
        why = f"the script did not run through: {why} (see the notes)"
    typer.echo(f"placecheck: error: {why}", err=True)
    if report.script_traceback:
        typer.echo("Traceback of the script's own code (most recent call last):", err=True)
        for line in report.script_traceback:
            typer.echo(line, err=True)
