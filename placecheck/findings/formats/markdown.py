"""``--format markdown``: a pull-request comment.

A heading with the verdict, one table row per problem (model, code, where
with its instance count, source, problem, what it caused and fix; for a
PC901 whose audit process died, the last lines of its stderr), then each
model's summary line, and the device map of a model placed across devices
(``--device keep``) in a folded block. Text in cells is escaped so that a
``|`` or a newline in a message cannot break the table.
"""

from __future__ import annotations

from collections.abc import Sequence

from placecheck.findings.finding import Finding, Severity
from placecheck.findings.formats.base import RunFormatter
from placecheck.findings.problems import where_label
from placecheck.findings.report import Report

_ICON = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "info"}


def cell(text: str) -> str:
    """Escape text for one Markdown table cell."""
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\r", "").replace("\n", "<br>")


def _code(text: str) -> str:
    return f"`{text}`" if text and "`" not in text else cell(text)


def _row(report: Report, f: Finding) -> str:
    problem = cell(f.message + (f" (from {f.origin})" if f.origin else ""))
    problem += "".join(f"<br>→ {cell(e.summary())}" for e in f.evidence)
    if f.hint:
        problem += f"<br>**fix:** {cell(f.hint)}"
    stderr = dict(f.details).get("stderr", "")
    if stderr:  # a dead audit process's last stack lines (PC901): the only clue to why it died
        problem += f"<br>**stderr:**<br>{cell(stderr)}"
    cells = [_ICON[f.severity], f"{f.code} {f.kind}", _code(report.target), _code(where_label(f)),
             _code(f.source), problem]
    return "| " + " | ".join(cells) + " |"


class MarkdownFormatter(RunFormatter):
    """A verdict heading, a findings table, and each model's summary."""

    def format_reports(self, reports: Sequence[Report]) -> str:
        total = sum(len(r.grouped().findings) for r in reports)  # problems, however the rows are grouped
        failing = sum(1 for r in reports if r.findings)
        models = f"{len(reports)} model" + ("" if len(reports) == 1 else "s")
        if total:
            problems = f"{total} problem" + ("" if total == 1 else "s")
            lines = [f"### placecheck: {problems} in {failing} of {models}", ""]
            lines += ["| severity | code | model | where | source | problem |",
                      "| --- | --- | --- | --- | --- | --- |"]
            lines += [_row(r, f) for r in reports for f in r.findings]
        else:
            lines = [f"### placecheck: no placement problems in {models}"]
        lines += ["", *(f"- `{r.target}` on {r.run_on}: {cell(r.summary_line())}"
                        for r in reports)]
        for r in reports:  # a model placed across devices (--device keep): its device map, folded
            if r.device_map is not None:
                lines += ["", f"<details><summary>device map of <code>{cell(r.target)}</code></summary>", "",
                          "```text", *r.device_map.lines(), "```", "", "</details>"]
        lines += ["", "Run `placecheck explain CODE` for what a code means and how to fix it."]
        return "\n".join(lines) + "\n"
