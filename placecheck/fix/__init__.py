"""``placecheck fix``: each fixable finding becomes an edit of the user's code, proven by a re-audit.

    >>> from placecheck.fix import fix, write
    >>> from placecheck.basics.options import AuditOptions
    >>> result = fix("placecheck/examples/buggy.py:BuggyNet", AuditOptions(device="cuda"))
    >>> print(result.diff())        # nothing is written until write(result)

:mod:`placecheck.fix.codes` says which codes are rewritten (``placecheck
explain`` reads it without importing libcst or torch); :mod:`.edits` holds
one libcst transformer per code, :mod:`.plan` turns findings into edits,
:mod:`.proof` re-audits the edited sources in a forked child, and
:mod:`.fixer` puts them together (:func:`fix`, :func:`write`). The fixing
names below are imported on first use, so this package stays light.
"""

from __future__ import annotations

from typing import Any

from placecheck.fix.codes import AUTOFIX, NEVER, fixable_text

_FIXER_NAMES = frozenset({"Edit", "FixRefused", "FixResult", "Unfixed", "fix", "fix_report", "fix_run",
                          "write"})

__all__ = ["AUTOFIX", "NEVER", "fixable_text", *sorted(_FIXER_NAMES)]


def __getattr__(name: str) -> Any:
    """``fix``, ``write``, ... from :mod:`placecheck.fix.fixer` (libcst and torch load then)."""
    if name in _FIXER_NAMES:
        from placecheck.fix import fixer

        return getattr(fixer, name)
    raise AttributeError(f"module 'placecheck.fix' has no attribute {name!r}")
