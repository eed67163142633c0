"""Output formats: a str enum of choices and the formatter for each.

Adding a format: one file with a :class:`Formatter` subclass, one enum member (in
:mod:`placecheck.basics.choices`), one ``case`` below; ``tests/test_formats.py`` checks every choice has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from placecheck.basics.choices import OutputFormat as OutputFormat
from placecheck.findings.formats.base import Formatter


def assert_never(value: NoReturn) -> NoReturn:
    """``typing.assert_never`` (Python 3.11+), here so that Python 3.10 can import placecheck.

    mypy checks the ``match`` below is exhaustive through the ``NoReturn`` parameter, as it does
    for the typing one.
    """
    raise AssertionError(f"unhandled output format: {value!r}")


def formatter_for(fmt: OutputFormat, width: int | None = None, hints: bool = False,
                  run: Mapping[str, Any] | None = None) -> Formatter:
    """The formatter for one ``--format`` choice.

    ``width``: the terminal's, when writing to one; ``hints``: the table shows
    the fix under every problem (``--hints``) instead of once per rule; ``run``:
    a shard's ``run`` object, which the JSON run shape carries for ``placecheck merge``.
    """
    match fmt:
        case OutputFormat.TABLE:
            from placecheck.findings.formats.table import TableFormatter

            return TableFormatter(width, hints)
        case OutputFormat.JSON:
            from placecheck.findings.formats.json import JsonFormatter

            return JsonFormatter(run)
        case OutputFormat.SARIF:
            from placecheck.findings.formats.sarif import SarifFormatter

            return SarifFormatter()
        case OutputFormat.JUNIT:
            from placecheck.findings.formats.junit import JunitFormatter

            return JunitFormatter()
        case OutputFormat.GITHUB:
            from placecheck.findings.formats.github import GithubFormatter

            return GithubFormatter()
        case OutputFormat.MARKDOWN:
            from placecheck.findings.formats.markdown import MarkdownFormatter

            return MarkdownFormatter()
        case _:
            assert_never(fmt)


__all__ = ["Formatter", "OutputFormat", "formatter_for"]
