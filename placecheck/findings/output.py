"""Writing a report where the user asked and turning it into an exit code; one-line errors.

Every command ends here: :func:`emit_reports` renders the reports with the
chosen formatter, writes them to stdout or ``--output`` and returns the exit
code from :func:`placecheck.findings.report.exit_code`; :func:`fail` prints
``placecheck: error: ...`` and gives the exit-2 exception. This module sits
below :mod:`placecheck.cli` and :mod:`placecheck.commands.ci` (both use it) and never
imports torch.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from placecheck.basics.errors import PlacecheckError, UsageError, one_line
from placecheck.basics.options import unknown_choice
from placecheck.findings.formats import OutputFormat, formatter_for
from placecheck.findings.report import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_STDOUT_CLOSED,
    EXIT_USAGE,
    FAIL_ON_CHOICES,
    Report,
    exit_code,
)


@dataclass(frozen=True)
class OutputOptions:
    """How to render and judge a report."""

    format: OutputFormat = OutputFormat.TABLE
    output: str = "-"
    """Where the report goes: a file path, or ``-`` for stdout."""
    fail_on: str = "warning"
    """The lowest severity that makes the exit code 1."""
    exit_zero: bool = False
    debug: bool = False
    """Print the traceback of an error before its one-line message."""
    group: bool = True
    """One row per problem, its instances and evidence under it; False: one row per finding
    instance (``--no-group``, config key ``group = false``)."""
    hints: bool = False
    """The fix hint on every row instead of once per rule (``--hints``, config key ``hints``)."""

    def __post_init__(self) -> None:
        # the command line gives --format as typed: checked here, with placecheck's message (click's
        # enum check words it differently on each typer, "Value error, ..." on some)
        object.__setattr__(self, "format", output_format(self.format))

    def check(self) -> None:
        """Raise a :class:`UsageError` for a bad ``--fail-on`` or an ``--output`` that cannot be
        written, before any audit runs."""
        if self.fail_on not in FAIL_ON_CHOICES:
            raise unknown_choice("--fail-on", self.fail_on, FAIL_ON_CHOICES)
        check_writable(self.output, "--output")


def output_format(value: str) -> OutputFormat:
    """``--format``'s value as an :class:`OutputFormat`; a :class:`UsageError` listing the choices."""
    try:
        return OutputFormat(value)
    except ValueError:
        raise unknown_choice("--format", value, (f.value for f in OutputFormat)) from None


def check_writable(path: str | None, flag: str) -> None:
    """Raise a :class:`UsageError` when ``path`` (a file to be written; ``-`` is stdout) cannot be
    created or overwritten: a missing folder, a folder in its place, no permission."""
    if path is None or path == "-":
        return
    file = Path(path)
    folder = file.parent
    if file.is_dir():
        raise UsageError(f"cannot write {flag} {path!r}: {os.strerror(errno.EISDIR)}")
    if not folder.is_dir():
        raise UsageError(f"cannot write {flag} {path!r}: {os.strerror(errno.ENOENT)}")
    if not os.access(folder, os.W_OK) or (file.exists() and not os.access(file, os.W_OK)):
        raise UsageError(f"cannot write {flag} {path!r}: {os.strerror(errno.EACCES)}")


DEFAULT_WIDTH = 80
MIN_WIDTH = 40


def terminal_width() -> int:
    """The width every command's text fits: ``$COLUMNS`` when set, else the terminal's, else 80 (a
    pipe, a file, a CI log), never under 40."""
    return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def stderr_text(line: str, width: int | None = None) -> str:
    """``line`` (an error, a progress line) within ``width`` columns (:func:`terminal_width` by default),
    as the report fits them: broken at spaces, each continuation indented two spaces, a word longer than
    the width (a path) never cut. ``grep 'placecheck: error'`` still finds its first line."""
    import textwrap

    return "\n".join(textwrap.wrap(line, width=width or terminal_width(), subsequent_indent="  ",
                                    break_long_words=False, break_on_hyphens=False)) or line


def say(line: str) -> None:
    """Write ``line`` to stderr within the terminal's width (:func:`stderr_text`)."""
    typer.echo(stderr_text(line), err=True)


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
    typer.echo("placecheck: interrupted", err=True)
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


def torch_version() -> str:
    """The torch in use (the imported one, else the installed distribution's), without importing it."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(getattr(torch, "__version__", "unknown"))
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "not installed"


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


@contextlib.contextmanager
def model_output_to_stderr() -> Iterator[None]:
    """Send what the model's own code prints (import, constructor, forward) to stderr.

    stdout carries the report alone: ``--format json`` stays parseable, and an
    error leaves stdout empty.
    """
    with contextlib.redirect_stdout(sys.stderr):
        yield


def grouped(reports: list[Report], out: OutputOptions) -> list[Report]:
    """The reports as the user sees them: one problem per root cause, or per instance with ``--no-group``.

    Grouping is idempotent, so a report that is already grouped stays as it is.
    """
    return [r.grouped() for r in reports] if out.group else list(reports)


def emit(report: Report, out: OutputOptions) -> int:
    """Write the formatted report where ``--output`` says; return the exit code."""
    return emit_reports([report], out)


def emit_reports(reports: list[Report], out: OutputOptions, config_run: bool = False,
                 run: Mapping[str, Any] | None = None) -> int:
    """Write a run's reports (one or many models) where ``--output`` says; return the exit code.

    ``config_run``: a ``--config`` run, rendered in the run shape even with one model.
    Findings are grouped into problems unless ``out.group`` is False (``--no-group``).
    ``run``: a shard's ``run`` object (``--shard``), which ``--format json`` writes.
    """
    reports = grouped(reports, out)
    to_terminal = out.output == "-" and sys.stdout.isatty()
    formatter = formatter_for(out.format, shutil.get_terminal_size().columns if to_terminal else None,
                              hints=out.hints, run=run)
    text = formatter.format_run(reports) if config_run else formatter.format_reports(reports)
    if out.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:
            Path(out.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise fail(f"cannot write --output {out.output!r}: {exc.strerror or exc}") from None
    return exit_code(reports, out.fail_on, out.exit_zero)
