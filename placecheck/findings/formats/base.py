"""The one interface every output format implements.

A run audits one model (``placecheck audit TARGET``) or many (``--config``).
:meth:`Formatter.format_reports` renders a run; :meth:`Formatter.format` is
the one-report case. Single-model formats (table, json) implement ``format``
and get a default ``format_reports``; multi-model ones (sarif, junit, ...)
implement ``format_reports`` and define ``format`` through it.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from placecheck.findings.report import Report


class Formatter(abc.ABC):
    """Turns reports into text. Formatters return strings; the CLI writes them."""

    @abc.abstractmethod
    def format(self, report: Report) -> str:
        """Render ``report``; the result ends with a newline."""

    def format_reports(self, reports: Sequence[Report]) -> str:
        """Render a run of several models; one report renders exactly as :meth:`format`."""
        if len(reports) == 1:
            return self.format(reports[0])
        return "\n".join(self.format(r) for r in reports)

    def format_run(self, reports: Sequence[Report]) -> str:
        """Render a ``--config`` run, however many models it has.

        The same as :meth:`format_reports` unless a format's shape for a run
        differs from its shape for one report (JSON): a consumer of a config
        run must not see the shape change when the config shrinks to one model.
        """
        return self.format_reports(reports)


class RunFormatter(Formatter):
    """A format whose natural unit is the whole run (one SARIF log, one JUnit file)."""

    def format(self, report: Report) -> str:
        return self.format_reports([report])

    @abc.abstractmethod
    def format_reports(self, reports: Sequence[Report]) -> str:
        """Render the run; the result ends with a newline."""
