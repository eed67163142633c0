"""``--format github``: GitHub Actions workflow commands, shown as annotations on the PR.

One ``::error``/``::warning``/``::notice`` line per problem, with ``file`` and
``line`` from its source (for a walk finding, the line that assigned the
attribute; else the first line where it did harm; else the file its model's
TARGET names), naming its instances and what it caused, then a summary line.
Values are escaped as the runner expects (``%``, CR, LF; and ``:`` and ``,``
inside properties).
"""

from __future__ import annotations

from collections.abc import Sequence

from placecheck.findings.finding import Finding, Severity
from placecheck.findings.formats.base import RunFormatter
from placecheck.findings.formats.location import repo_path, split_source, target_file
from placecheck.findings.formats.sarif import problem_source
from placecheck.findings.problems import where_label
from placecheck.findings.report import Report

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(text: str) -> str:
    """Escape a command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a command's property value (``file=``, ``title=``)."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(report: Report, f: Finding) -> str:
    """The workflow command for one problem."""
    source = problem_source(f)
    path, line = split_source(source) if source else ("", None)
    path = repo_path(path) if path else ""
    if not path:
        path, line = target_file(report.target)
    props = []
    if path:
        props.append(f"file={escape_property(path)}")
        if line:
            props.append(f"line={line}")
    props.append(f"title={escape_property(f'placecheck {f.code} {f.kind}')}")
    message = f"{report.target}: {where_label(f)}: {f.message}"
    message += "".join(f"\n{e.summary()}" for e in f.evidence)
    if f.hint:
        message += f"\nfix: {f.hint}"
    return f"::{_COMMAND[f.severity]} {','.join(props)}::{escape_data(message)}"


class GithubFormatter(RunFormatter):
    """Annotations, then one plain summary line per model."""

    def format_reports(self, reports: Sequence[Report]) -> str:
        lines = [annotation(r, f) for r in reports for f in r.findings]
        lines += [f"placecheck: {r.target}: {r.summary_line()}" for r in reports]
        return "\n".join(lines) + "\n"
