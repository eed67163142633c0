"""Every finding code, as one typed value: :class:`Code`.

The checks name a code as ``Code.PC201``, never as the string ``"PC201"``: a
mistyped member fails in mypy and at import, where a mistyped string would
silently match nothing. :mod:`placecheck.findings.rules` declares one rule for
each member and refuses a rule for a code not listed here, and its package
refuses to import while a member has no rule, so the enum and the rule table
cannot drift apart. ``tests/test_codes.py`` fails on a code written as a string
anywhere else in the package.

A ``Code`` is a ``str`` whose value is its name: it compares, hashes, sorts
and serialises (JSON, SARIF, baselines, configs) as the plain ``"PC201"``.
Here, at the bottom of the layers, not in the rules package: :mod:`placecheck.findings.finding`
needs it, and the options check ``--select`` and ``--ignore`` with :func:`expand`. No placecheck
imports: the CLI's ``--help`` path reads it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable


class Code(str, enum.Enum):
    """A finding code; the comment is the rule's ``kind`` (:data:`placecheck.findings.rules.RULES`)."""

    # PC1xx: what the walk after .to() finds (placecheck.findings.rules.walk)
    PC101 = "PC101"  # stray-tensor
    PC102 = "PC102"  # unregistered-module
    PC103 = "PC103"  # unregistered-parameter
    PC104 = "PC104"  # param-off-device
    PC105 = "PC105"  # buffer-off-device
    # PC2xx: the forward (rules.forward) and what only a script's loop shows (rules.script: PC209)
    PC201 = "PC201"  # device-mismatch
    PC202 = "PC202"  # created-off-device
    PC203 = "PC203"  # lazy-module
    PC204 = "PC204"  # host-sync
    PC205 = "PC205"  # implicit-transfer
    PC206 = "PC206"  # output-off-device
    PC207 = "PC207"  # forward-error
    PC208 = "PC208"  # cross-device-ping-pong
    PC209 = "PC209"  # repeated-transfer
    PC210 = "PC210"  # unsynchronized-read
    # PC3xx: checkpoints and optimizers (rules.training)
    PC301 = "PC301"  # checkpoint-device
    PC302 = "PC302"  # missing-key
    PC303 = "PC303"  # unexpected-key
    PC304 = "PC304"  # shape-mismatch
    PC305 = "PC305"  # dtype-mismatch
    PC306 = "PC306"  # unsafe-checkpoint
    PC307 = "PC307"  # optimizer-state-off-device
    PC308 = "PC308"  # optimizer-stale-params
    # PC4xx: the ranks of a torchrun launch (rules.ranks)
    PC401 = "PC401"  # rank-device
    PC402 = "PC402"  # collective-off-device
    # PC9xx: the run itself (rules.incomplete)
    PC901 = "PC901"  # audit-incomplete

    # str()/format() give the plain code (as 3.11's enum.StrEnum does; 3.10 has none): a message,
    # a table or a file writes "PC201", never "Code.PC201"
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


_SELECTOR = re.compile(r"^(ALL|PC\d{0,3})$")


def expand(selectors: Iterable[str]) -> set[str]:
    """Expand code prefixes (``PC2``, ``PC204``, ``ALL``) to the codes they name (every member has its
    rule: :func:`placecheck.findings.rules.registry.seal`).

    Raises ``ValueError`` naming a selector that matches no rule.
    """
    codes: set[str] = set()
    for raw in selectors:
        sel = raw.strip().upper()
        if not sel:
            continue
        if not _SELECTOR.match(sel):
            raise ValueError(f"invalid code selector {raw!r}: use a code prefix such as PC2, PC204 or ALL")
        matched = set(Code) if sel == "ALL" else {c for c in Code if c.startswith(sel)}
        if not matched:
            raise ValueError(f"code selector {raw!r} matches no rule (see `placecheck rules`)")
        codes |= matched
    return codes
