"""The machinery every rule family shares: the :class:`Rule` record, the table of rules, the
severity policy, and the lookups and code selectors built on them.

A family module (``walk``, ``forward``, ...) calls :func:`declare` once per
code it owns; the package's ``__init__`` imports every family, then
:func:`seal` sorts :data:`RULES` and refuses a :class:`Code` without a rule.
This module must not import torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from placecheck.basics.codes import Code, expand
from placecheck.findings.finding import Finding, Severity


@dataclass(frozen=True)
class Rule:
    """The declaration of one finding code."""

    code: Code
    kind: str
    severity: Severity
    title: str
    explanation: str
    wrong: str
    right: str
    phase: str
    """``walk``, ``forward``, ``checkpoint``, or ``run`` (the audit itself did not finish)."""


RULES: dict[str, Rule] = {}
"""Every rule, by code, in code order (once :func:`seal` ran: importing the package does)."""


def declare(
    code: Code, kind: str, severity: Severity, phase: str, title: str, explanation: str,
    wrong: str, right: str,
) -> None:
    """Add the rule of ``code`` to :data:`RULES`; ``ValueError`` for a code or kind already declared, or
    a code :class:`Code` does not list."""
    if code in RULES:
        raise ValueError(f"duplicate rule code {code}")
    if any(r.kind == kind for r in RULES.values()):
        raise ValueError(f"duplicate rule kind {kind}")
    known = Code(code)  # a plain string that names no member raises here
    RULES[known] = Rule(known, kind, severity, title, explanation.strip(), wrong.strip(), right.strip(),
                        phase)


def seal() -> None:
    """Sort :data:`RULES` by code, once every family declared its rules; ``RuntimeError`` naming a
    :class:`Code` no family declared."""
    missing = [code for code in Code if code not in RULES]
    if missing:
        raise RuntimeError(f"no rule declared for {', '.join(missing)} (placecheck.findings.rules)")
    ordered = sorted(RULES.items())
    RULES.clear()
    RULES.update(ordered)


# short names keep each family's table of declarations readable; the families import them
E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO  # noqa: E741


# -- the severity policy: each rule's default (in its family's module), and every change a report may make
#
# A finding takes its rule's severity unless one of the changes below applies; the checks ask
# severity(code, change) for it, so a change not declared here cannot be made (tests/test_rules.py
# also scans the package for a severity written anywhere else). `placecheck rules`, `placecheck
# explain` and docs/audit.md ("Severity") print these declarations.


@dataclass(frozen=True)
class SeverityChange:
    """One declared exception to a rule's default severity."""

    name: str
    """What the checks pass to :func:`severity` (``scalar``, ``library``)."""
    severity: Severity
    when: str
    """The condition, as ``placecheck rules`` and ``explain`` print it after "when"."""


RAISED_BY_EVIDENCE = ("a problem takes the worst severity of its instances and of the findings it "
                      "caused (its evidence): a cause whose tensor crashed an op (PC201) is an error")
"""The one change every rule shares (:func:`placecheck.findings.problems.group` makes it)."""

_LIBRARY = SeverityChange("library", I, "raised entirely inside an installed package (named; "
                                        "--library-findings keeps the default)")
_API = SeverityChange("api", I, "a torch or installed function the line called made it by itself, from none "
                                "of its arguments (named: pack_padded_sequence's lengths)")

SEVERITY_CHANGES: dict[str, tuple[SeverityChange, ...]] = {
    Code.PC101: (
        SeverityChange("scalar", W, "it is a 0-dim CPU tensor (used as a scalar beside device tensors, it "
                                    "does not raise)"),
        SeverityChange("handled", I, "the forward never lets it meet a device tensor (it replaces it with "
                                     "a moved copy, or uses it only on the CPU or as a scalar)"),
        SeverityChange("library-unused", I, "it is never used and a class an installed package defines "
                                            "holds it (named)"),
    ),
    Code.PC202: (
        _LIBRARY, _API,
        SeverityChange("cache", I, "a cache: the forward keeps the device copy in a module attribute, or "
                                   "placecheck run saw it made in fewer forwards than its module ran"),
        SeverityChange("scalar", I, "it is a 0-dim tensor copied to the device (a label or a constant: one "
                                    "scalar copy per call, as PyTorch's own code makes)"),
    ),
    Code.PC203: (SeverityChange("on-target", W, "created on the target device (it cannot crash; only an "
                                             "optimizer built before misses it)"),),
    Code.PC204: (
        _LIBRARY, _API,
        SeverityChange("loop", I, "placecheck run finds it in the script's own code outside any forward "
                                  "(a loss read for logging), with its rate per optimizer step"),
    ),
    Code.PC205: (
        _LIBRARY, _API,
        SeverityChange("scalar", I, "it is a 0-dim CPU tensor stored on the model and used as a scalar "
                                    "(read on the host, no copy)"),
    ),
}
"""Every exception to a rule's default severity, by code (:func:`severity` hands them out)."""


def rule(code: str) -> Rule:
    """The rule for ``code`` (case-insensitive); ``KeyError`` if unknown."""
    return RULES[code.upper()]


def severity(code: str, change: str | None = None) -> Severity:
    """The severity of a ``code`` finding: its rule's default, or that of the declared ``change``.

    Raises ``KeyError`` for a change :data:`SEVERITY_CHANGES` does not declare for ``code``: a check
    cannot give a finding a severity the rule table does not show.
    """
    if change is None:
        return rule(code).severity
    for declared in SEVERITY_CHANGES.get(code.upper(), ()):
        if declared.name == change:
            return declared.severity
    raise KeyError(f"{code} declares no severity change {change!r} (rules.SEVERITY_CHANGES)")


def severity_changes(code: str) -> tuple[SeverityChange, ...]:
    """The declared exceptions to ``code``'s default severity (none for most rules)."""
    return SEVERITY_CHANGES.get(code.upper(), ())


def make_finding(code: str, /, *, severity: Severity | None = None, **fields: Any) -> Finding:
    """A finding of rule ``code``: its code and kind from the rule table, its severity the rule's unless
    ``severity`` (a declared change, :func:`severity`) is given, the rest (``where``, ``message``...) as
    given. Every finding placecheck reports is built here (``tests/test_codes.py`` scans for others)."""
    r = rule(code)
    return Finding(code=r.code, kind=r.kind, severity=severity or r.severity, **fields)


def selected(select: Iterable[str] | None, ignore: Iterable[str] | None) -> frozenset[str]:
    """The codes left after ``--select`` (default ``ALL``) minus ``--ignore``."""
    chosen = expand(select) if select else set(RULES)
    return frozenset(chosen - expand(ignore or ()))
