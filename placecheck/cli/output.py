"""The command line's ends: one-line errors and the exit a command raises.

:func:`errors_reported` guards every command: placecheck's own errors end in
``placecheck: error: ...`` and exit 2, anything unexpected in one line and
exit 3, Ctrl-C in ``placecheck: interrupted`` and exit 130, a closed stdout
quietly. typer lives here and in the other modules of :mod:`placecheck.cli`,
nowhere below them (``tests/test_architecture.py``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator

import typer

from placecheck.basics.errors import PlacecheckError, one_line
from placecheck.findings.output import say, torch_version
from placecheck.findings.report import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_STDOUT_CLOSED, EXIT_USAGE


def fail(message: str, debug: bool = False) -> typer.Exit:
    """Print ``placecheck: error: ...`` (and the traceback under --debug); return the exit-2 exception."""
    if debug:
        traceback.print_exc()
        message = message.replace(" (--debug shows the traceback)", "")  # it just did
    say(f"placecheck: error: {message}")
    return typer.Exit(EXIT_USAGE)


def interrupted() -> typer.Exit:
    """Ctrl-C: print ``placecheck: interrupted``; return the exit-130 exception (128 + SIGINT, the status
    a shell gives a command it interrupted, as ruff and pip exit)."""
    print("placecheck: interrupted", file=sys.stderr, flush=True)
    return typer.Exit(EXIT_INTERRUPTED)


def stdout_closed() -> typer.Exit:
    """The reader of stdout went away (``| head``): nothing more to say, and nobody to say it to. stdout is
    pointed at the null device first, so that the interpreter's last flush raises nothing either."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return typer.Exit(EXIT_STDOUT_CLOSED)


def click_errors() -> tuple[type[Exception], ...]:
    """The base classes of click's usage errors on the typer installed.

    typer before 0.27 runs on click itself (``click.exceptions.ClickException``); 0.27.0 and 0.27.1
    carry their own copy of click (``typer._click``) and export none of its errors; from 0.27.2
    that copy's errors derive from the public ``typer.TyperException``. Each is looked up where it
    exists: beside a new typer, a click installed for another package is harmless here.
    """
    import importlib

    errors: list[type[Exception]] = []
    vendored = getattr(typer, "TyperException", None)
    if isinstance(vendored, type) and issubclass(vendored, Exception):
        errors.append(vendored)
    for module in ("typer._click.exceptions", "click.exceptions"):
        with contextlib.suppress(ImportError):
            errors.append(importlib.import_module(module).ClickException)
    return tuple(errors)


def internal_error(exc: BaseException, debug: bool = False) -> typer.Exit:
    """Print one line for an unexpected error (the traceback first under --debug); return the exit-3
    exception (:data:`~placecheck.findings.report.EXIT_INTERNAL`: neither "clean" nor "findings")."""
    from placecheck import __version__

    if debug:
        traceback.print_exc()
    ask = ("report it with the traceback above" if debug
           else "rerun with --debug for the traceback and report it")
    say(f"placecheck: internal error: unexpected {one_line(exc)} (placecheck {__version__}, torch "
        f"{torch_version()}): a bug in placecheck, or something it did not foresee; {ask}")
    return typer.Exit(EXIT_INTERNAL)


@contextlib.contextmanager
def errors_reported(debug: bool = False) -> Iterator[None]:
    """Around a command's work: placecheck's own errors (bad input, a target that does not load) end
    in one line and exit 2, anything unexpected in one line and exit 3; a traceback only with --debug.
    Ctrl-C ends in ``placecheck: interrupted`` and exit 130.

    The exits a command raises itself, and click's usage errors, pass through.
    """
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except KeyboardInterrupt:
        raise interrupted() from None
    except BrokenPipeError:
        raise stdout_closed() from None
    except PlacecheckError as exc:
        raise fail(str(exc), debug) from None
    except Exception as exc:
        if isinstance(exc, click_errors()):
            raise
        raise internal_error(exc, debug) from None
