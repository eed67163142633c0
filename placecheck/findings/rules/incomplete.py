"""PC9xx, the run itself: an audit that did not finish (PC901). Not a placement rule.

Each rule's declaration (code, kind, default severity, title, explanation, wrong and right
code) comes first, then its builder: plain data in, the finding out. Shared machinery (the rule
table, the severity policy) is :mod:`.registry`'s. No torch here.
"""

from __future__ import annotations

from placecheck.basics.codes import Code
from placecheck.findings.finding import Finding
from placecheck.findings.rules.registry import E, declare, make_finding

declare(Code.PC901, "audit-incomplete", E, "run", "the audit of this model did not finish", """
The model's audit ran in its own process (placecheck audit --config) and did
not finish: the interpreter crashed (a segfault in an extension), it ran past
--timeout, it ran out of memory (MemoryError, or SIGKILL from the kernel's
out-of-memory killer), or the model could not be loaded at all. Nothing is
known about this model's placement; the other models' results are complete.
The finding's details keep the reason and the end of the process's stderr
(--format json, junit and markdown show them).
Not a placement rule, so --select PC1 does not hide it; --ignore PC901 does.""", """
[[models]]
target = "big.py:Model"     # builds 300 GB of weights on the CPU runner
""", """
[[models]]
target = "big.py:Model"
init = "meta"               # or a larger timeout = 1800
""")


_HINTS = {
    "timeout": "raise --timeout (or the model's timeout), or make the model smaller to build",
    "crash": "run `placecheck audit` on this model alone with --debug; the interpreter's last "
             "stack lines are in the finding's details (--format json or junit)",
    "out-of-memory": "give the runner more memory, or build the model with --init meta",
    "load-error": "fix the model's entry in the config (target, kwargs, inputs)",
    "error": "rerun this model alone with --debug and report it",
}
"""What to do, per reason a model's audit did not finish."""


def audit_incomplete(reason: str, message: str, stderr: str = "") -> Finding:
    """PC901: a model's audit did not finish, for ``reason`` (a key of :data:`_HINTS`): ``message`` says
    what happened; ``stderr``, the end of its process's stderr, goes in the details."""
    details = [("reason", reason)]
    if stderr:
        details.append(("stderr", stderr))
    return make_finding(Code.PC901, where="", message=message, hint=_HINTS[reason], details=tuple(details))
