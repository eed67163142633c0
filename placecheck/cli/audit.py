"""``placecheck audit``: one model (TARGET) or every model of a config (``--config``).

A thin adapter: the command line becomes an :class:`~placecheck.basics.options.AuditOptions`
and an :class:`~placecheck.findings.output.OutputOptions`; :func:`run_audit` calls the
same :func:`placecheck.audit` Python users call; :func:`placecheck.findings.output.emit`
formats the report and gives the exit code. ``--config`` runs, ``--timeout``
and baselines go through :mod:`placecheck.cli.ci`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from placecheck.basics.errors import PlacecheckError
from placecheck.basics.options import AuditOptions
from placecheck.cli.app import app
from placecheck.cli.common import PanelCommand, declared_options, options_from
from placecheck.cli.output import errors_reported, fail, interrupted
from placecheck.findings.output import OutputOptions, emit, model_output_to_stderr, output_format
from placecheck.findings.report import Report


@app.command(cls=PanelCommand)
@declared_options("audit")
def audit(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Argument(
        metavar="TARGET", show_default=False,
        help="The model: MODULE:ATTR (e.g. torchvision.models:resnet18) or path/to/file.py:ATTR. "
             "ATTR names an nn.Module instance, an nn.Module subclass or a function returning one. "
             "Optional with --config, or when ./pyproject.toml has a [tool.placecheck] table.")] = None,
    **given: Any,
) -> None:
    """Load a model, move it to DEVICE as a training script would, and report what did not follow.

    Exit status: 0 when no finding is at or above --fail-on, 1 when one is,
    2 for usage errors and models that do not load, 3 for an internal error.
    """
    debug, config, timeout = given["debug"], given["config"], given["timeout"]
    baseline, write_baseline = given["baseline"], given["write_baseline"]
    with errors_reported(debug):
        out = OutputOptions(format=output_format(given["fmt"]), output=given["output"],
                            fail_on=given["fail_on"], exit_zero=given["exit_zero"], debug=debug,
                            group=not given["no_group"], hints=given["hints"])
        if given["fix_files"] and (target is None or config is not None or timeout is not None
                          or baseline is not None or write_baseline is not None):
            raise fail("--fix fixes one TARGET: it does not go with --config, --timeout, --baseline or "
                       "--write-baseline", debug)
        if target is None or config is not None:
            from placecheck.cli.ci import run_config_audit

            raise typer.Exit(run_config_audit(ctx, target, config, out))
        from placecheck.cli.ci import audit_with_timeout, finish_with_baseline, reject_run_options
        from placecheck.commands.api import AuditInterrupted
        from placecheck.findings.output import check_writable
        from placecheck.model.load import parse_kwargs

        try:
            out.check()
            check_writable(write_baseline, "--write-baseline")
            reject_run_options(ctx)
            options = options_from(AuditOptions, given, copy_model=False, target=target)
            constructor_kwargs = parse_kwargs(given["kwargs"], given["arg"] or ())
            if given["fix_files"]:
                from placecheck.cli.fix import fix_and_write

                report = fix_and_write(target, constructor_kwargs, options)
            elif timeout is not None:
                report = audit_with_timeout(target, constructor_kwargs, options, timeout)
            else:
                report = run_audit(target, constructor_kwargs, options)
        except AuditInterrupted as stop:  # Ctrl-C in the forward: what was found so far, then the line
            emit(stop.report, out)
            raise interrupted() from None
        except PlacecheckError as exc:
            refused = getattr(exc, "report", None)  # --checkpoint would run code: its PC306 report, then
            if refused is not None:                 # the line
                emit(refused, out)
            raise fail(str(exc), debug) from None
        if baseline is not None or write_baseline is not None:
            raise typer.Exit(finish_with_baseline([report], out, baseline, write_baseline, load_error=False))
        raise typer.Exit(emit(report, out))


def run_audit(target: str, constructor_kwargs: dict[str, Any], options: AuditOptions) -> Report:
    """Build ``target`` with ``constructor_kwargs`` and audit it; raises PlacecheckError subclasses."""
    from placecheck.commands.api import audit
    from placecheck.model.load import model_factory

    options.check()  # a bad device or code fails before any import of the target
    factory = model_factory(target, constructor_kwargs)
    with model_output_to_stderr():
        return audit(factory, options=options)
