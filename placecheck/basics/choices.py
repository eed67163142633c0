"""The ``--format`` and ``--fail-on`` choices, apart from the formatters and the report, so that the
options' declaration (:mod:`placecheck.basics.declared`) names them from the bottom layer."""

from __future__ import annotations

import enum


class OutputFormat(str, enum.Enum):
    """The ``--format`` choices."""

    TABLE = "table"
    JSON = "json"
    SARIF = "sarif"
    JUNIT = "junit"
    GITHUB = "github"
    MARKDOWN = "markdown"

    def __str__(self) -> str:
        return self.value


FAIL_ON_CHOICES = ("error", "warning", "info", "never")
"""``--fail-on``: the lowest severity that makes the exit code 1, or ``never``
(:func:`placecheck.findings.report.exit_code`)."""
