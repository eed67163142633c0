"""``--format table`` (the default): one short block per problem, for a terminal or a CI log.

Each problem takes a header line (severity, code, where with its instance
count, the source line) and its one-sentence problem under it, indented; the
findings it caused follow on ``->`` lines. The fix hints come once under the
table (one line per distinct hint, labelled with its rule), or under every
problem with ``hints=True``; ``placecheck explain CODE`` has the long text.

Every line is wrapped at word boundaries to the width (the TARGET in the
first line is never broken): the terminal's when writing to one, else
``$COLUMNS`` when set, else 80, so that a file, a pipe or a CI log looks the
same wherever it is produced. A multi-line note (a checkpoint's device table)
keeps its lines.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence

from placecheck.findings.finding import Finding
from placecheck.findings.formats.base import Formatter
from placecheck.findings.problems import where_label
from placecheck.findings.report import Report, plural

DEFAULT_WIDTH = 80
_MIN_WIDTH = 40
_INDENT = " " * 14
"""Continuation lines start under the ``where`` of the header (``warning PC101 ``)."""


def _columns_from_environment() -> int | None:
    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    # break_long_words only splits a word longer than a whole line (a long path), never a fitting one
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False) or [first.rstrip()]


def _wrap_lines(text: str, width: int, first: str, rest: str) -> list[str]:
    """Each line of ``text`` wrapped on its own: a note that holds a small table keeps its rows."""
    out: list[str] = []
    for i, line in enumerate(text.splitlines() or [""]):
        prefix = first if i == 0 else rest
        if len(prefix) + len(line) <= width:
            out.append((prefix + line).rstrip())
        else:
            indent = rest + " " * (len(line) - len(line.lstrip()))
            out += _wrap(line.strip(), width, prefix + " " * (len(line) - len(line.lstrip())), indent)
    return out


def _header_lines(report: Report, width: int) -> list[str]:
    """``placecheck: TARGET on DEVICE, ENGINE``: the TARGET whole on the first line, however long (a path
    cannot be broken usefully, and tools grep the first line for it), the rest wrapped after it."""
    first, rest = f"placecheck: {report.target}", f"on {report.run_on}".split()
    while rest and len(first) + 1 + len(rest[0]) <= width:
        first += " " + rest.pop(0)
    return [first, *(_wrap(" ".join(rest), width, "  ", "  ") if rest else [])]


def _header(f: Finding) -> str:
    parts = [f"{f.severity.value:<7} {f.code} {where_label(f)}"]
    if f.source:
        parts.append(f.source)
    return "  ".join(parts)


def _problem_lines(f: Finding, width: int, hints: bool) -> list[str]:
    lines = _wrap(_header(f), width, rest=_INDENT)
    shown = f.origin and f.origin != f.source and f.origin not in f.message
    message = f.message + (f" (from {f.origin})" if shown else "")
    lines += _wrap(message, width, _INDENT, _INDENT)
    same_file = f.source.rpartition(":")[0]
    for evidence in f.evidence:
        lines += _wrap(f"-> {evidence.summary(same_file)}", width, _INDENT, _INDENT + "   ")
    if hints and f.hint:
        lines += _wrap(f"fix: {f.hint}", width, _INDENT, _INDENT + "     ")
    return lines


def _hint_labels(covered: Sequence[Sequence[Finding]]) -> list[str]:
    """For a rule with several fixes: each fix's label, every problem it covers named (``c0, h0``), each
    with its line when two fixes would otherwise read alike (three fixes at ``<root>``)."""
    def named(group: Sequence[Finding], with_source: bool) -> str:
        names = [where_label(f) + (f" at {f.source}" if with_source and f.source else "") for f in group]
        return ", ".join(dict.fromkeys(names))

    plain = [named(group, False) for group in covered]
    return [named(group, True) if plain.count(label) > 1 else label for group, label in zip(covered, plain,
                                                                                              strict=True)]


def _hint_lines(findings: Sequence[Finding], width: int) -> list[str]:
    """Each distinct fix once, labelled with its rule (with the problems it covers, when a rule has
    several fixes)."""
    by_code: dict[str, dict[str, list[Finding]]] = {}
    for f in findings:
        if f.hint:
            by_code.setdefault(f.code, {}).setdefault(f.hint, []).append(f)
    lines = []
    for code, hints in by_code.items():
        groups = list(hints.values())
        labels = [groups[0][0].kind] if len(hints) == 1 else _hint_labels(groups)
        for hint, label in zip(hints, labels, strict=True):
            lines += _wrap(f"{code} {label}: {hint}", width, "  ", "    ")
    if lines:
        lines.insert(0, "how to fix (placecheck explain CODE says more):")
    return lines


class TableFormatter(Formatter):
    """A header line, notes, one block per problem, the fixes, then the summary line.

    ``width``: the terminal's width, when the table goes to one (else
    ``$COLUMNS``, else 80). ``hints``: the fix under every problem instead of
    once per rule under the table.
    """

    def __init__(self, width: int | None = None, hints: bool = False) -> None:
        self.width = max(_MIN_WIDTH, width or _columns_from_environment() or DEFAULT_WIDTH)
        self.hints = hints

    def format(self, report: Report) -> str:
        width = self.width
        lines = _header_lines(report, width)
        for note in report.notes:
            lines += _wrap_lines(note, width, "note: ", "      ")
        if report.findings:
            lines.append("")
            for f in report.findings:
                lines += _problem_lines(f, width, self.hints)
            if not self.hints:
                hint_lines = _hint_lines(report.findings, width)
                if hint_lines:
                    lines += ["", *hint_lines]
            lines.append("")
        if report.device_map is not None:
            # a short section after the findings: where the stages live, what the forward copied
            if not report.findings:
                lines.append("")
            lines += [*(line for text in report.device_map.lines()
                        for line in _wrap_lines(text, width, "", "      ")), ""]
        if report.coverage is not None:
            lines += _wrap(report.coverage.line(), width, rest="  ")
        lines += _wrap(report.summary_line(), width, rest="  ")
        return "\n".join(lines) + "\n"

    def format_reports(self, reports: Sequence[Report]) -> str:
        if len(reports) == 1:
            return self.format(reports[0])
        failing = sum(1 for r in reports if r.findings)
        total = sum(len(r.grouped().findings) for r in reports)  # problems, however the rows are grouped
        head = f"placecheck: {len(reports)} models"
        tail = (f"{head}, {failing} with problems, {plural(total, 'problem')} in all"
                if total else f"{head}, no placement problems")
        return "\n".join(self.format(r) for r in reports) + "\n" + tail + "\n"
