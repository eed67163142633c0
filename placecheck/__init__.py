"""placecheck: find PyTorch device-placement bugs before they cost a GPU job.

The public API is :func:`audit` (one model), :func:`run` (a whole script) and
:func:`check_checkpoint` (a checkpoint file), each returning a :class:`Report` of :class:`Finding`
objects (``check_checkpoint`` inside its result), beside :func:`placecheck.fix.fix`;
:class:`AuditOptions` holds every audit option in one object
(``audit(model, options=...)``), :class:`RunOptions` every option of :func:`run`
(``run(script, options=...)``), as :class:`FixOptions` and :class:`CheckpointOptions` do for
:mod:`placecheck.fix` and :mod:`placecheck.checkpoint`. Importing this package does not import
torch; ``audit`` does, when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from placecheck.basics.options import AuditOptions, CheckpointOptions, FixOptions, RunOptions
from placecheck.basics.version import VERSION
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.report import Report

__version__ = VERSION

if TYPE_CHECKING:
    from placecheck.checkpoint import check_checkpoint
    from placecheck.commands.api import audit
    from placecheck.run import run


def __getattr__(name: str) -> Any:
    if name == "audit":
        from placecheck.commands.api import audit

        return audit
    if name == "run":  # importing the subpackage makes it this attribute; it is callable as run()
        from placecheck.run import run

        return run
    if name == "check_checkpoint":
        from placecheck.checkpoint import check_checkpoint

        return check_checkpoint
    raise AttributeError(f"module 'placecheck' has no attribute {name!r}")


__all__ = ["AuditOptions", "CheckpointOptions", "Finding", "FixOptions", "Report", "RunOptions", "Severity",
           "__version__", "audit", "check_checkpoint", "run"]
