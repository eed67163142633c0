"""The ``placecheck`` command line: a thin layer over :func:`placecheck.audit`.

One module per command, each registering itself on :data:`app`; adding a
command is a module here and one import line below. Options are parsed into
a frozen object, the same ``audit()`` Python users call does the work, a
formatter renders the report (:mod:`placecheck.findings.output`) and
:func:`placecheck.findings.report.exit_code` decides the exit status (0 clean, 1
findings at or above ``--fail-on``, 2 usage or load error, 3 an internal error:
:func:`placecheck.cli.output.errors_reported` guards every command). The options
several commands share are declared once, in :mod:`placecheck.cli.common`.
torch is imported only when an audit actually runs, so ``--help`` is fast.
"""

from __future__ import annotations

from placecheck.cli.app import app, entrypoint
from placecheck.cli.output import fail
from placecheck.findings.output import OutputOptions, emit, emit_reports

# each import registers its command(s) on `app`, in the order --help lists them
from placecheck.cli import audit as audit  # isort: skip
from placecheck.cli import checkpoint as checkpoint  # isort: skip
from placecheck.cli import rules as rules  # isort: skip
from placecheck.cli import example_config as example_config  # isort: skip
from placecheck.cli import run as run  # isort: skip
from placecheck.cli import merge as merge  # isort: skip
from placecheck.cli import fix as fix  # isort: skip

__all__ = ["OutputOptions", "app", "emit", "emit_reports", "entrypoint", "fail"]
