"""The ``--format`` choices, apart from the formatters, so that the options' declaration
(:mod:`placecheck.basics.declared`) names them without importing any formatter."""

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
