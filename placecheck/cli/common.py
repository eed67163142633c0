"""Options that several commands share, declared once: output, judging and selection.

Each alias is an ``Annotated`` type a command's parameter uses as is, so
``checkpoint`` and ``run`` describe ``--format``, ``--fail-on`` or
``--no-group`` in the same words, with metavars that say what to type.
torch-free, like the rest of the CLI.
"""

from __future__ import annotations

from typing import Annotated

import typer

from placecheck.formats import OutputFormat
from placecheck.report import FAIL_ON_CHOICES

FLAG = ""
"""The metavar of an on/off option: nothing after the flag in --help."""

Select = Annotated[list[str] | None, typer.Option(
    metavar="CODES",
    help="Report only these codes or prefixes (PC2, PC301, ALL); comma-separated or repeated.")]
Ignore = Annotated[list[str] | None, typer.Option(
    metavar="CODES", help="Do not report these codes or prefixes; comma-separated or repeated.")]
Format = Annotated[OutputFormat, typer.Option(
    "--format", "-f", metavar="FORMAT",
    help=f"Output format: {', '.join(f.value for f in OutputFormat)}.")]
Output = Annotated[str, typer.Option(
    "--output", "-o", metavar="FILE", help="Write the report to FILE ('-' is stdout).")]
FailOn = Annotated[str, typer.Option(
    metavar="SEVERITY",
    help=f"Exit 1 when a finding is at or above this severity: {', '.join(FAIL_ON_CHOICES)}.")]
ExitZero = Annotated[bool, typer.Option(
    "--exit-zero", metavar=FLAG, help="Exit 0 even when there are findings.")]
NoGroup = Annotated[bool, typer.Option(
    "--no-group", metavar=FLAG, help="One row per finding instance instead of one per problem.")]
Hints = Annotated[bool, typer.Option(
    "--hints", metavar=FLAG, help="Show the fix hint on every row, not once per rule.")]
Debug = Annotated[bool, typer.Option("--debug", metavar=FLAG, help="Show tracebacks for errors.")]
