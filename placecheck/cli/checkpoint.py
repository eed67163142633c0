"""``placecheck checkpoint``: check a checkpoint file before a job loads it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from placecheck.basics.options import CheckpointOptions
from placecheck.cli.app import app
from placecheck.cli.common import (
    DEFAULT_DEVICE,
    PANEL_TARGET,
    Arg,
    Debug,
    Device,
    Engine,
    ExitZero,
    FailOn,
    Format,
    Gpus,
    Hints,
    Ignore,
    Key,
    Kwargs,
    NoGroup,
    Output,
    PanelCommand,
    Select,
    Trust,
    configured,
)
from placecheck.findings.formats import OutputFormat
from placecheck.findings.output import (
    OutputOptions,
    emit,
    errors_reported,
    model_output_to_stderr,
    output_format,
)
from placecheck.findings.report import EXIT_USAGE


@app.command(cls=PanelCommand)
def checkpoint(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(
        metavar="FILE",
        help="The checkpoint: a torch.save file (zip or legacy), a TorchScript archive, a .pt2 "
             "program or a .safetensors file.", show_default=False)],
    model: Annotated[str | None, typer.Option(
        "--model", metavar="TARGET", rich_help_panel=PANEL_TARGET,
        help="Compare with this model's state_dict(): MODULE:ATTR or path/to/file.py:ATTR.")] = None,
    kwargs: Kwargs = None,
    arg: Arg = None,
    key: Key = None,
    trust: Trust = False,
    device: Device = DEFAULT_DEVICE,
    engine: Engine = "auto",
    gpus: Gpus = None,
    select: Select = None,
    ignore: Ignore = None,
    fmt: Format = OutputFormat.TABLE,
    output: Output = "-",
    no_group: NoGroup = False,
    hints: Hints = False,
    debug: Debug = False,
    fail_on: FailOn = "warning",
    exit_zero: ExitZero = False,
) -> None:
    """Check a checkpoint before a job loads it: saved devices, keys against a model, and safety.

    Reads only the file's index (never its tensor data, never its pickled
    code) and never modifies it. Exit status: 0 when no finding is at or above
    --fail-on, 1 when one is, 2 for unreadable files, bad options and
    checkpoints that would run code (unless --trust), 3 for an internal error.
    """
    with errors_reported(debug):
        from placecheck.model.load import parse_kwargs

        options = CheckpointOptions(device=device, engine=engine, gpus=gpus, checkpoint_key=key, trust=trust,
                                    select=select, ignore=ignore,  # type: ignore[arg-type]  # split here
                                    group=not no_group)
        options = configured(ctx, options, {"key": "checkpoint_key", "no_group": "group"})
        out = OutputOptions(format=output_format(fmt), output=output, fail_on=fail_on, exit_zero=exit_zero,
                            debug=debug, group=options.group, hints=hints)
        out.check()
        options.check()  # a bad device or code fails before the model is imported
        constructor_kwargs = parse_kwargs(kwargs, arg or ())
        result = run_checkpoint(file, model, constructor_kwargs, options)
        code = emit(result.report, out)
        if result.refused:
            from placecheck.checkpoint.preflight import unsafe_globals_text

            names = unsafe_globals_text(result.meta)
            typer.echo(f"placecheck: error: {file!r} would run pickled code when loaded (it names {names}); "
                       "not loaded (pass --trust if you trust it)", err=True)
            code = EXIT_USAGE
    raise typer.Exit(code)


def run_checkpoint(file: str, model: str | None, kwargs: dict[str, Any], options: CheckpointOptions) -> Any:
    """Resolve ``--model`` (if any) and check the checkpoint with checked ``options``; raises
    PlacecheckError subclasses."""
    from placecheck.checkpoint import check_checkpoint
    from placecheck.model.load import build, resolve, split_target

    factory = None
    with model_output_to_stderr():
        if model is not None:
            _, attr = split_target(model)
            obj = resolve(model)

            def factory() -> Any:
                return build(obj, attr, kwargs)

        return check_checkpoint(file, model=factory, model_name=model, options=options)
