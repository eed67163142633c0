"""``placecheck merge``: the JSON reports of a config's shards (``--shard K/N``) as one run."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from placecheck.cli.app import app
from placecheck.cli.common import PanelCommand, declared_options
from placecheck.cli.output import errors_reported
from placecheck.findings.output import OutputOptions, output_format

MERGE_HELP = """Combine the JSON reports of a config's shards into one run's report.

Each REPORT is the --format json output of `placecheck audit --config FILE
--shard K/N`; every shard of the split must be given once, all made by the
same placecheck from the same config and options. The result is what one
`placecheck audit --config FILE` run would write, in any --format, with its
exit code: the baseline (the shards' --baseline, else the config's; or
--baseline here) is applied once, to every model, and the config's allow
entries were applied by the one shard that audited their model.

Exit status: 0 when no finding is at or above --fail-on, 1 when one is, 2 for
reports that are not the shards of one run, a missing shard, or a model that
did not load, 3 for an internal error.
"""


@app.command(cls=PanelCommand, help=MERGE_HELP)
@declared_options("merge")
def merge(
    reports: Annotated[list[str], typer.Argument(
        metavar="REPORT", show_default=False,
        help="The --format json report of every shard.")],
    **given: Any,
) -> None:
    debug = given["debug"]
    with errors_reported(debug):
        from placecheck.cli.ci import merge_reports

        out = OutputOptions(format=output_format(given["fmt"]), output=given["output"],
                            exit_zero=given["exit_zero"], debug=debug)
        raise typer.Exit(merge_reports(reports, out, given["fail_on"], given["baseline"],
                                       given["write_baseline"]))
