"""``--format table`` (the default): a tabulate grid for a terminal or CI log."""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from placecheck.finding import Finding
from placecheck.formats.base import Formatter
from placecheck.report import Report, human_bytes, plural

HEADERS = ("severity", "code", "where", "device", "size", "problem / fix")


def _width(table: str) -> int:
    return len(table.partition("\n")[0])


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


# Widest and narrowest wrap widths of the two free-text columns (where, problem / fix).
_WHERE_MAX, _WHERE_MIN = 40, 16
_PROBLEM_MAX, _PROBLEM_MIN = 60, 24
_COMPACT_HEADERS = ("code", "where", "device", "size", "problem / fix")


def _row(f: Finding) -> tuple[str, ...]:
    return (f.severity.value, f"{f.code} {f.kind}", _where(f), _device(f), _size(f), _problem(f))


def _compact_row(f: Finding) -> tuple[str, ...]:
    """The same facts in narrower cells: severity beside the code, kind and tensor count below."""
    size = ""
    if f.nbytes or f.count:
        size = human_bytes(f.nbytes) + (f"\n{f.count} tensors" if f.count > 1 else "")
    return (f"{f.code} {f.severity.value}\n{f.kind}", _where(f), _device(f), size, _problem(f))


def _grid(rows: list[tuple[str, ...]], where: int, problem: int) -> str:
    compact = len(rows[0]) == len(_COMPACT_HEADERS)
    return tabulate(rows, headers=_COMPACT_HEADERS if compact else HEADERS, tablefmt="simple_grid",
                    maxcolwidths=[None, where, None, None, problem] if compact
                    else [None, None, where, None, None, problem])


class TableFormatter(Formatter):
    """A header line, notes, one grid row per finding, then the summary line.

    ``width``: the terminal's width, when the table goes to one; the free-text
    columns then wrap narrower so that the grid fits (down to a readable
    minimum), and when even that is too wide, the compact layout folds the
    severity, the kind and the tensor count into the neighbouring cells.
    Without it (a file, a pipe, a CI log) the layout is fixed, so that the
    output is the same wherever it is produced.
    """

    def __init__(self, width: int | None = None) -> None:
        self.width = width

    def format(self, report: Report) -> str:
        lines = [f"placecheck: {report.target} on {report.device} ({report.engine})"]
        lines += [f"note: {n}" for n in report.notes]
        if report.findings:
            table = self._fitted([_row(f) for f in report.findings])
            if self.width is not None and _width(table) > self.width:
                table = self._fitted([_compact_row(f) for f in report.findings])
            lines.append(table)
        lines.append(report.summary_line())
        return "\n".join(lines) + "\n"

    def _fitted(self, rows: list[tuple[str, ...]]) -> str:
        where, problem = _WHERE_MAX, _PROBLEM_MAX
        table = _grid(rows, where, problem)
        # narrow the problem column first, then where, each as far as its minimum
        while self.width is not None:
            over = _width(table) - self.width
            if over <= 0 or (where, problem) == (_WHERE_MIN, _PROBLEM_MIN):
                break
            if problem > _PROBLEM_MIN:
                problem = max(_PROBLEM_MIN, problem - over)
            else:
                where = max(_WHERE_MIN, where - over)
            table = _grid(rows, where, problem)
        return table

    def format_reports(self, reports: Sequence[Report]) -> str:
        if len(reports) == 1:
            return self.format(reports[0])
        failing = sum(1 for r in reports if r.findings)
        total = sum(len(r.findings) for r in reports)
        head = f"placecheck: {len(reports)} models"
        tail = (f"{head}, {failing} with problems, {plural(total, 'problem')} in all"
                if total else f"{head}, no placement problems")
        return "\n".join(self.format(r) for r in reports) + "\n" + tail + "\n"
