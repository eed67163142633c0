"""The one interface every output format implements."""

from __future__ import annotations

import abc

from placecheck.report import Report


class Formatter(abc.ABC):
    """Turns a report into text. Formatters return strings; the CLI writes them."""

    @abc.abstractmethod
    def format(self, report: Report) -> str:
        """Render ``report``; the result ends with a newline."""
