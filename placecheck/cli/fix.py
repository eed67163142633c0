"""``placecheck fix``: the audit's fixable findings as a proven patch (a diff, or the files written).

A thin adapter over :func:`placecheck.fix.fix` and :func:`~placecheck.fix.fix_run`: the
options become a :class:`~placecheck.basics.options.FixOptions`; the result is printed as a unified
diff and a summary (or JSON), and ``--write`` applies it. Exit 0 when no
selected finding is left, 1 when some are, 2 for usage errors, a target that
does not load, or a file changed since the audit (FixRefused: nothing written then),
3 for an internal error. ``--check`` prints the same and never writes; its 1 means a proven edit is
left to make (0: none is, whatever else the audit reports).
"""

from __future__ import annotations

import enum
import json
from dataclasses import replace
from typing import Annotated, Any

import typer

from placecheck.basics.errors import UsageError, unknown_choice
from placecheck.basics.options import SCRIPT_ONLY, AuditOptions, FixOptions
from placecheck.cli.app import app
from placecheck.cli.common import PanelCommand, configured, declared_options, options_from
from placecheck.cli.output import errors_reported
from placecheck.findings.output import model_output_to_stderr, terminal_width
from placecheck.findings.report import Report


class FixFormat(str, enum.Enum):
    """How ``placecheck fix`` prints its result."""

    TEXT = "text"
    JSON = "json"


@app.command(cls=PanelCommand, context_settings={"allow_interspersed_args": True})
@declared_options("fix")
def fix(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(
        metavar="TARGET", show_default=False,
        help="The model, as for audit: MODULE:ATTR or path/to/file.py:ATTR; with --run, the script.")],
    script_args: Annotated[list[str] | None, typer.Argument(
        metavar="ARGS", show_default=False,
        help="With --run: the script's arguments, after --.")] = None,
    **given: Any,
) -> None:
    """Turn each fixable finding into an edit of your code, proven by a second audit.

    Prints a unified diff and a summary in the audit's words (would fix N of M
    instances, P of Q problems, with K edits; what is not fixed, and why);
    --write applies it. Exit status: 0 when nothing selected is left, 1 when
    findings remain, 2 for usage errors and targets that do not load, 3 for an
    internal error. With --check (pre-commit, CI): the same output, nothing
    written, exit 1 when a proven edit is left to make, 0 when none is.
    """
    debug, fmt, kwargs, arg = given["debug"], given["fmt"], given["kwargs"], given["arg"]
    run_script, write_files, check_only = given["run_script"], given["write_files"], given["check_only"]
    with errors_reported(debug):
        if fmt not in {f.value for f in FixFormat}:
            raise unknown_choice("--format", fmt, (f.value for f in FixFormat))
        try:
            if given["show_diff"] and write_files:
                raise UsageError("--diff and --write cannot be combined: --diff prints the patch, --write "
                                 "applies it")
            if check_only and write_files:
                raise UsageError("--check and --write cannot be combined: --check never writes (it exits 1 "
                                 "when an edit is left to make); --write applies the edits")
            from placecheck.fix import fix as run_fix
            from placecheck.fix import fix_run, write
            from placecheck.model.load import parse_kwargs, split_target

            options = configured(ctx, options_from(FixOptions, given))
            if run_script:
                constructor = [flag for flag, given in (("--kwargs", kwargs is not None),
                                                        ("--arg", bool(arg))) if given]
                FixOptions.refuse_model_flags([*options.model_flags(), *constructor])
                options.check()
                with model_output_to_stderr():
                    result = fix_run(target, script_args_of(script_args), options=options)
            else:
                if script_args:
                    raise UsageError(SCRIPT_ONLY)
                split_target(target, "fix")  # a script given without --run: say so before any work
                options.check()
                constructor_kwargs = parse_kwargs(kwargs, arg or ())
                with model_output_to_stderr():
                    result = run_fix(target, options, kwargs=constructor_kwargs)
            written = write(result) if write_files else []
        except ModuleNotFoundError as exc:
            if exc.name != "libcst":
                raise
            raise UsageError("placecheck fix needs libcst: pip install 'placecheck[fix]'") from None
        if fmt == FixFormat.JSON.value:
            data = result.to_dict()
            data["written"] = written
            typer.echo(json.dumps(data, indent=2))
        else:
            if write_files:
                typer.echo("".join(f"wrote {path}\n" for path in written), nl=False)
            else:
                typer.echo(result.diff(), nl=False)
            typer.echo(result.summary(written=write_files, width=terminal_width()), nl=False)
        raise typer.Exit(result.check_exit_code if check_only else result.exit_code)


def fix_and_write(target: str, constructor_kwargs: dict[str, Any], options: AuditOptions) -> Report:
    """``placecheck audit --fix``: :func:`placecheck.fix.fix` and :func:`~placecheck.fix.write`, as
    ``placecheck fix --write`` does; the report of what remains, the fix's summary in its notes."""
    from placecheck.fix import fix as run_fix
    from placecheck.fix import write

    options.check()
    try:
        with model_output_to_stderr():
            result = run_fix(target, options, kwargs=constructor_kwargs)
    except ModuleNotFoundError as exc:
        if exc.name != "libcst":
            raise
        raise UsageError("--fix needs libcst: pip install 'placecheck[fix]'") from None
    written = write(result)
    summary = result.summary(written=True).splitlines()
    notes = [f"--fix: {summary[0]}", *(f"--fix: wrote {path}" for path in written),
             *(f"--fix: failed proof: {e.code} {e.file}:{e.start}: {reason}" for e, reason in result.failed)]
    remains: Report = replace(result.report, findings=tuple(result.remaining),
                              notes=(*result.report.notes, *notes))
    return remains


def script_args_of(values: list[str] | None) -> tuple[str, ...]:
    """The script's arguments, a leading ``--`` separator dropped (as ``placecheck run`` takes them)."""
    items = list(values or ())
    return tuple(items[1:] if items and items[0] == "--" else items)
