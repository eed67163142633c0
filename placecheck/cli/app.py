"""The ``placecheck`` typer application and its console-script entry point.

Each command lives in its own module of this package and registers itself on
:data:`app` with ``@app.command()``; :mod:`placecheck.cli` imports them all.
No torch import here: ``placecheck --help`` stays fast.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from placecheck import __version__
from placecheck.cli.output import click_errors, internal_error, interrupted
from placecheck.findings.output import say
from placecheck.findings.report import EXIT_USAGE

app = typer.Typer(
    name="placecheck",
    help="Find PyTorch device-placement bugs before they cost a GPU job.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: rich's boxed columns leave a 25-character help column at 80 columns
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from placecheck.engines.compat import torch_version  # torch is imported for --version only

        typer.echo(f"placecheck {__version__}\ntorch {torch_version()}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show placecheck's and torch's versions and exit.")] = False,
) -> None:
    """Find PyTorch device-placement bugs before they cost a GPU job."""


NUMPY_MISSING = "Failed to initialize NumPy"
"""The start of the UserWarning torch gives on its first tensor conversion when numpy is not installed:
placecheck needs no numpy, and would print it on every command that imports torch."""


def quiet_optional_dependencies() -> None:
    """Silence torch's warning about a missing numpy (an optional dependency of torch that placecheck does
    not use): a script that needs numpy still fails at its own ``import numpy``."""
    import warnings

    warnings.filterwarnings("ignore", message=NUMPY_MISSING, category=UserWarning)


def entrypoint() -> None:
    """Console-script entry point: click's own usage errors as one line, like placecheck's.

    typer would draw a usage block and an error box; a bad ``--format`` or
    ``--gpus`` gets ``placecheck: error: ...`` and exit 2 instead, like every
    other bad input. ``--help``, ``--version`` and bare ``placecheck`` are unchanged.
    """
    quiet_optional_dependencies()
    if len(sys.argv) <= 1:
        app()  # no arguments: typer's help screen, as before
        return
    try:
        code = app(standalone_mode=False)
    except KeyboardInterrupt:  # raised outside click's own guard (while a command's imports ran)
        sys.exit(interrupted().exit_code)
    except click_errors() as exc:  # click's ClickException, UsageError, BadParameter, ...
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()  # type: ignore[attr-defined]  # a subcommand's help screen, not an error
            sys.exit(EXIT_USAGE)
        message = " ".join(getattr(exc, "format_message", exc.__str__)().split())
        say(f"placecheck: error: {message}")
        sys.exit(getattr(exc, "exit_code", EXIT_USAGE))
    except typer.Abort as exc:
        # click turns Ctrl-C (KeyboardInterrupt) into Abort, after ending the ^C line
        if isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt):
            sys.exit(interrupted().exit_code)
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    except Exception as exc:  # escaped a command's own guard (output.errors_reported): never exit 1
        exit_ = internal_error(exc, "--debug" in sys.argv)
        sys.exit(exit_.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
