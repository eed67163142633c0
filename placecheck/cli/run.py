"""``placecheck run``: a whole training or inference script on a simulated GPU."""

from __future__ import annotations

from typing import Annotated

import typer

from placecheck.cli.app import app
from placecheck.cli.common import Debug, ExitZero, FailOn, Format, Hints, Ignore, NoGroup, Output, Select
from placecheck.errors import PlacecheckError
from placecheck.formats import OutputFormat
from placecheck.output import OutputOptions, emit, fail, model_output_to_stderr
from placecheck.report import FAIL_ON_CHOICES

RUN_HELP = """Run a training or inference script on a simulated GPU: every placement problem it meets.

The script REALLY RUNS, as `python SCRIPT.py ARGS` would (as __main__, with
sys.argv, its directory on sys.path, the current working directory): files it
writes are written, data it downloads is downloaded. --steps bounds the work
(it stops after that many optimizer.step() calls), --timeout bounds the time;
stopping early is not an error.

Simulated: torch.cuda.is_available() is True and device_count() is --gpus;
CUDA tensors hold real values on the CPU and report their CUDA device, so
.item(), printed losses, data-driven branches and backward all run; an op
mixing devices is reported (with the batch element or the module buffer at
fault, and its line) and the run goes on. DataLoader workers run on the CPU,
as on a GPU machine. Not simulated: GPU speed and memory, CUDA kernels,
graphs and NCCL, pinned memory (pin_memory is a CPU copy), asynchrony (host
syncs are counted, not timed).

The script's own exit code and exceptions are reported in the notes and as
PC207; exit status: 0 when no finding is at or above --fail-on, 1 when one
is, 2 for a missing script or module or a syntax error, and 2 when no
finding is but the script did not run through (its own non-zero sys.exit,
code the simulation cannot run: a note says which).
"""


@app.command(help=RUN_HELP, context_settings={"allow_interspersed_args": True})
def run(
    script: Annotated[str | None, typer.Argument(
        help="The script to run (omit with -m).", show_default=False)] = None,
    script_args: Annotated[list[str] | None, typer.Argument(
        help="Arguments for the script, after --.", show_default=False)] = None,
    module: Annotated[str | None, typer.Option(
        "-m", "--module", metavar="MODULE",
        help="Run a module as `python -m MODULE` would, instead of a script.")] = None,
    steps: Annotated[int, typer.Option(
        metavar="N", help="Stop after this many optimizer steps (0: run to the end).", min=0)] = 2,
    gpus: Annotated[int, typer.Option(metavar="N",
        help="Number of simulated GPUs (torch.cuda.device_count()).",
                                      min=1)] = 1,
    timeout: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="Stop the script after this many seconds.", min=0)] = None,
    select: Select = None,
    ignore: Ignore = None,
    fmt: Format = OutputFormat.TABLE,
    output: Output = "-",
    fail_on: FailOn = "warning",
    exit_zero: ExitZero = False,
    no_group: NoGroup = False,
    hints: Hints = False,
    debug: Debug = False,
) -> None:
    from placecheck.errors import UsageError

    try:
        if fail_on not in FAIL_ON_CHOICES:
            raise UsageError(f"--fail-on {fail_on!r} is not one of {', '.join(FAIL_ON_CHOICES)}")
        args = list(script_args or ())
        if module is not None:
            if script is not None:
                args.insert(0, script)  # with -m, every positional argument is the module's
            target = module
        elif script is None:
            raise UsageError("give a script to run (placecheck run SCRIPT.py) or a module (-m MODULE)")
        else:
            target = script
        out = OutputOptions(format=fmt, output=output, fail_on=fail_on, exit_zero=exit_zero, debug=debug,
                            group=not no_group, hints=hints)
        out.check()  # a bad --output fails before the script runs
        from placecheck.run import run as run_program

        with model_output_to_stderr():
            report = run_program(target, args, module=module is not None, steps=steps, gpus=gpus,
                                 timeout=timeout, select=_codes(select), ignore=_codes(ignore))
    except PlacecheckError as exc:
        raise fail(str(exc), debug) from None
    except ValueError as exc:  # a bad --select/--ignore selector
        raise fail(str(exc), debug) from None
    raise typer.Exit(emit(report, out))


def _codes(values: list[str] | None) -> tuple[str, ...]:
    """``["PC1,PC204", "PC3"]`` -> ``("PC1", "PC204", "PC3")``."""
    return tuple(c.strip() for v in values or () for c in v.split(",") if c.strip())
