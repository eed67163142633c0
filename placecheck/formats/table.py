"""``--format table`` (the default): a tabulate grid for a terminal or CI log."""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from placecheck.finding import Finding
from placecheck.formats.base import Formatter
from placecheck.report import Report, human_bytes, plural

HEADERS = ("severity", "code", "where", "device", "size", "problem / fix")


def _where(f: Finding) -> str:
    where = f.where or "<root>"
    return f"{where}\n{f.source}" if f.source else where


def _device(f: Finding) -> str:
    if not f.device and not f.expected:
        return ""
    return f"{f.device or '?'} → {f.expected}"


def _size(f: Finding) -> str:
    if not f.nbytes and not f.count:
        return ""
    size = human_bytes(f.nbytes)
    return f"{size} ({f.count} tensors)" if f.count > 1 else size


def _problem(f: Finding) -> str:
    text = f.message
    if f.origin:
        text += f"\nfrom: {f.origin}"
    return f"{text}\nfix: {f.hint}" if f.hint else text


class TableFormatter(Formatter):
    """A header line, notes, one grid row per finding, then the summary line."""

    def format(self, report: Report) -> str:
        lines = [f"placecheck: {report.target} on {report.device} ({report.engine})"]
        lines += [f"note: {n}" for n in report.notes]
        if report.findings:
            rows = [
                (f.severity.value, f"{f.code} {f.kind}", _where(f), _device(f), _size(f), _problem(f))
                for f in report.findings
            ]
            lines.append(tabulate(rows, headers=HEADERS, tablefmt="simple_grid",
                                  maxcolwidths=[None, None, 40, None, None, 60]))
        lines.append(report.summary_line())
        return "\n".join(lines) + "\n"

    def format_reports(self, reports: Sequence[Report]) -> str:
        if len(reports) == 1:
            return self.format(reports[0])
        failing = sum(1 for r in reports if r.findings)
        total = sum(len(r.findings) for r in reports)
        head = f"placecheck: {len(reports)} models"
        tail = (f"{head}, {failing} with problems, {plural(total, 'problem')} in all"
                if total else f"{head}, no placement problems")
        return "\n".join(self.format(r) for r in reports) + "\n" + tail + "\n"
