"""Writing a report where the user asked and turning it into an exit code.

Every command ends here: :func:`emit_reports` renders the reports with the
chosen formatter, writes them to stdout or ``--output`` and returns the exit
code from :func:`placecheck.findings.report.exit_code` (a number: raising the
exit is the CLI's, :mod:`placecheck.cli.output`). Never imports torch or typer.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placecheck.basics.choices import FAIL_ON_CHOICES
from placecheck.basics.errors import UsageError, unknown_choice
from placecheck.findings.formats import OutputFormat, formatter_for
from placecheck.findings.report import Report, exit_code


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
    print(stderr_text(line), file=sys.stderr, flush=True)


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
            raise UsageError(f"cannot write --output {out.output!r}: {exc.strerror or exc}") from None
    return exit_code(reports, out.fail_on, out.exit_zero)
