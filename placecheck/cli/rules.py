"""``placecheck rules`` and ``placecheck explain``: the finding codes and what they mean."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from placecheck.cli.app import app
from placecheck.cli.common import Debug, PanelCommand
from placecheck.output import errors_reported, fail


@app.command("rules", cls=PanelCommand)
def rules_command(debug: Debug = False) -> None:
    """List every finding code with its severity and title."""
    with errors_reported(debug):
        typer.echo(rules_text())


def rules_text() -> str:
    """The table ``placecheck rules`` prints."""
    from tabulate import tabulate

    from placecheck.rules import RULES

    rows = [(r.code, r.kind, r.severity.value, r.phase, r.title) for r in RULES.values()]
    return (tabulate(rows, headers=("code", "kind", "severity", "found by", "title"), tablefmt="simple")
            + "\n\nplacecheck explain CODE shows what a code means, why it matters and how to fix it.")


@app.command(cls=PanelCommand)
def explain(
    code: Annotated[str, typer.Argument(metavar="CODE", help="A finding code (PC101) or its kind (stray-tensor).",
                                        show_default=False)],
    debug: Debug = False,
) -> None:
    """Explain a finding code: what it means, why it matters, a wrong and a right example."""
    with errors_reported(debug):
        from placecheck.rules import RULES, Rule

        wanted = code.strip()
        found: Rule | None = RULES.get(wanted.upper()) or next(
            (r for r in RULES.values() if r.kind == wanted.lower()), None)
        if found is None:
            raise fail(f"unknown code {code!r}: `placecheck rules` lists them (PC101 ... {list(RULES)[-1]})")
        typer.echo(explain_text(found))
        from placecheck.fix.codes import fixable_text

        typer.echo(f"\nplacecheck fix: {fixable_text(found.code)}")


def explain_text(r: Any) -> str:
    """The text ``placecheck explain`` prints for one rule."""
    def indent(text: str) -> str:
        return "\n".join(f"    {line}" if line else "" for line in text.splitlines())

    return (f"{r.code} {r.kind} ({r.severity.value}, found by the {r.phase} phase)\n"
            f"{r.title}\n\n{r.explanation}\n\nWrong:\n{indent(r.wrong)}\n\nRight:\n{indent(r.right)}")
