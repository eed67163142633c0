"""``placecheck rules`` and ``placecheck explain``: the finding codes, their severities and what they mean.

Both fit the terminal's width (``$COLUMNS``, else the terminal's, else 80): the table wraps its
titles, and explain re-wraps its prose; the code examples are printed as written.
"""

from __future__ import annotations

import textwrap
from typing import Annotated, Any

import typer

from placecheck.cli.app import app
from placecheck.cli.common import PanelCommand, declared_options
from placecheck.cli.output import errors_reported, fail
from placecheck.findings.output import terminal_width


@app.command("rules", cls=PanelCommand)
@declared_options("rules")
def rules_command(**given: Any) -> None:
    """List every finding code with its severity, when that severity changes, and its title."""
    with errors_reported(given["debug"]):
        typer.echo(rules_text(terminal_width()))


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False) or [first.rstrip()]


def rules_text(width: int = 80) -> str:
    """The table ``placecheck rules`` prints, ``width`` columns at most: each code's kind, default
    severity and the phase that finds it (the columns of docs/contract.md's table), its title (beside,
    when the terminal is wide enough, else under it), under it each declared severity change
    (:data:`placecheck.findings.rules.SEVERITY_CHANGES`), then the policy every code shares."""
    from placecheck.findings.rules import RAISED_BY_EVIDENCE, RULES, severity_changes

    widths = (5, max(len(r.kind) for r in RULES.values()), len("severity"), len("checkpoint"))
    title_at = sum(w + 2 for w in widths)
    beside = width - title_at >= 30  # else the title goes under its row
    under = " " * 7

    def row(*cells: str) -> str:
        return "".join(f"{cell:<{w + 2}}" for cell, w in zip(cells, widths, strict=True))

    lines = [(row("code", "kind", "severity", "found by") + ("title" if beside else "")).rstrip()]
    for r in RULES.values():
        head = row(r.code, r.kind, r.severity.value, r.phase)
        if beside:
            lines += _wrap(r.title, width, head, " " * title_at)
        else:
            lines += [head.rstrip(), *_wrap(r.title, width, under, under)]
        for change in severity_changes(r.code):
            lines += _wrap(f"{change.severity.value} when {change.when}", width, under + "-> ",
                           under + "   ")
    return "\n".join([
        *lines, "",
        *_wrap(f"Severity: each code's default above, changed only as its -> lines say; and for every "
               f"code, {RAISED_BY_EVIDENCE}.", width, "", "  "), "",
        *_wrap("placecheck explain CODE shows what a code means, why it matters and how to fix it.", width),
    ])


@app.command(cls=PanelCommand)
@declared_options("explain")
def explain(
    code: Annotated[str, typer.Argument(
        metavar="CODE", help="A finding code (PC101) or its kind (stray-tensor).", show_default=False)],
    **given: Any,
) -> None:
    """Explain a finding code: what it means, its severity, why it matters, a wrong and a right example."""
    debug = given["debug"]
    with errors_reported(debug):
        from placecheck.findings.rules import RULES, Rule

        wanted = code.strip()
        found: Rule | None = RULES.get(wanted.upper()) or next(
            (r for r in RULES.values() if r.kind == wanted.lower()), None)
        if found is None:
            raise fail(f"unknown code {code!r}: `placecheck rules` lists them (PC101 ... {list(RULES)[-1]})")
        width = terminal_width()
        typer.echo(explain_text(found, width))
        from placecheck.fix.codes import fixable_text

        typer.echo("\n" + "\n".join(_wrap(f"placecheck fix: {fixable_text(found.code)}", width, "", "  ")))


def severity_text(r: Any) -> str:
    """``error by default; warning when ...``: a rule's severity policy in one sentence."""
    from placecheck.findings.rules import severity_changes

    changes = "".join(f"; {c.severity.value} when {c.when}" for c in severity_changes(r.code))
    return (f"{r.severity.value} by default{changes}; a problem is raised to the worst severity of the "
            "findings it caused")


def explain_text(r: Any, width: int = 80) -> str:
    """The text ``placecheck explain`` prints for one rule, its prose within ``width`` columns."""
    def indent(text: str) -> str:
        # code is printed as written (a wrapped line of code would not be code)
        return "\n".join(f"    {line}" if line else "" for line in text.splitlines())

    def prose(text: str) -> str:
        if all(len(line) <= width for line in text.splitlines()):
            return text
        paragraphs = text.split("\n\n")
        return "\n\n".join("\n".join(_wrap(" ".join(p.split()), width)) for p in paragraphs)

    return ("\n".join(_wrap(f"{r.code} {r.kind} ({r.severity.value}, found by the {r.phase} phase)", width,
                           "", "  "))
            + f"\n{prose(r.title)}\n\n{prose(r.explanation)}\n\n"
            + "\n".join(_wrap(f"Severity: {severity_text(r)}.", width, "", "  "))
            + f"\n\nWrong:\n{indent(r.wrong)}\n\nRight:\n{indent(r.right)}")
