"""``placecheck checkpoint``: check a checkpoint file before a job loads it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from placecheck.basics.options import CheckpointOptions
from placecheck.cli.app import app
from placecheck.cli.common import PanelCommand, configured, declared_options, options_from
from placecheck.cli.output import errors_reported
from placecheck.findings.output import OutputOptions, emit, model_output_to_stderr, output_format, say
from placecheck.findings.report import EXIT_USAGE


@app.command(cls=PanelCommand)
@declared_options("checkpoint")
def checkpoint(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(
        metavar="FILE",
        help="The checkpoint: a torch.save file (zip or legacy), a TorchScript archive, a .pt2 "
             "program or a .safetensors file.", show_default=False)],
    **given: Any,
) -> None:
    """Check a checkpoint before a job loads it: saved devices, keys against a model, and safety.

    Reads only the file's index (never its tensor data, never its pickled
    code) and never modifies it. Exit status: 0 when no finding is at or above
    --fail-on, 1 when one is, 2 for unreadable files, bad options and
    checkpoints that would run code (unless --trust), 3 for an internal error.
    """
    debug = given["debug"]
    with errors_reported(debug):
        from placecheck.model.load import parse_kwargs

        options = configured(ctx, options_from(CheckpointOptions, given))
        out = OutputOptions(format=output_format(given["fmt"]), output=given["output"],
                            fail_on=given["fail_on"], exit_zero=given["exit_zero"], debug=debug,
                            group=options.group, hints=given["hints"])
        out.check()
        options.check()  # a bad device or code fails before the model is imported
        constructor_kwargs = parse_kwargs(given["kwargs"], given["arg"] or ())
        result = run_checkpoint(file, given["model"], constructor_kwargs, options)
        code = emit(result.report, out)
        if result.refused:
            from placecheck.checkpoint.preflight import unsafe_globals_text

            names = unsafe_globals_text(result.meta)
            say(f"placecheck: error: {file!r} would run pickled code when loaded (it names {names}); "
                "not loaded (pass --trust if you trust it)")
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
