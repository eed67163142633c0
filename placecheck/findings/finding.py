"""The one record every check produces: a frozen :class:`Finding`.

This module must not import torch: the CLI's ``--help``, ``rules`` and
``explain`` paths use it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from placecheck.basics.codes import Code
from placecheck.basics.values import Site


class Severity(str, enum.Enum):
    """How bad a finding is. Ordered: ``ERROR > WARNING > INFO``."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Higher is worse; used for ``--fail-on`` and for sorting."""
        return {"error": 3, "warning": 2, "info": 1}[self.value]

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Evidence:
    """A finding that another problem caused, kept inside that problem (:attr:`Finding.evidence`).

    A forward-pass mismatch fed by a stray tensor or by a tensor created off the
    device says where the bug *bites*; the stray tensor or the creating line is
    the problem to fix.
    """

    code: str
    """The code of the linked finding, e.g. ``PC201``."""
    kind: str
    severity: Severity
    where: str
    """Path of the module whose forward ran the line (``""`` for the root)."""
    source: str
    """``file:line`` of the line that ran."""
    message: str
    op: str = ""
    """The op that ran there (``Tensor.mul``), when the finding names one."""
    origin: str = ""

    @staticmethod
    def of(finding: Finding) -> Evidence:
        """The evidence record of ``finding`` (its instances and evidence are not kept)."""
        return Evidence(code=finding.code, kind=finding.kind, severity=finding.severity,
                        where=finding.where, source=finding.source, message=finding.message,
                        op=dict(finding.details).get("op", ""), origin=finding.origin)

    def summary(self, same_file: str = "") -> str:
        """What happens where: ``crashes on a GPU at net.py:33 in blocks.0: Tensor.mul mixed ...``.

        ``same_file``: the file the reader already sees (the problem's own); a source in it is
        written ``line 33``.
        """
        effect = _EFFECT.get(self.code, self.kind)
        site = Site.parse(self.source)
        shown = f"line {site.line}" if same_file and site.path == same_file and site.line is not None \
            else self.source
        place = f" at {shown}" if self.source else ""
        headline = self.message.partition(": ")[0] if ": " in self.message else self.message
        return f"{effect}{place} in {self.where or '<root>'}: {headline}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity.value
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Evidence:
        """The inverse of :meth:`to_dict`."""
        names = {f.name for f in fields(Evidence)}
        values = {k: v for k, v in data.items() if k in names}
        values["severity"] = Severity(values["severity"])
        return Evidence(**values)


_EFFECT: dict[str, str] = {Code.PC201: "crashes on a GPU", Code.PC204: "waits for the GPU",
                           Code.PC205: "copies to the GPU on every call",
                           Code.PC206: "returned off the device", Code.PC208: "copies between devices"}
"""What a linked finding does, said from the user's side (others use the rule's kind)."""


@dataclass(frozen=True)
class Finding:
    """One placement problem.

    The first nine fields are the public JSON contract (docs/contract.md);
    the rest add detail that formats may show. A report groups findings that
    share a root cause into one problem (:mod:`placecheck.findings.problems`): the
    problem is a ``Finding`` whose ``where``/``source`` are its first
    instance's, with every instance's ``where`` in ``instances`` and the
    findings it caused in ``evidence``. Ungrouped (``--no-group``), both are empty.
    """

    code: str
    """Stable rule code, e.g. ``PC101``."""
    kind: str
    """Stable slug of the rule, e.g. ``stray-tensor``."""
    severity: Severity
    """``error``, ``warning`` or ``info``."""
    where: str
    """Dotted path from the root model (``blocks.2.attn.cache['k']``). For a
    forward-pass finding, the path of the module whose ``forward`` ran the
    offending line (``""`` for the root)."""
    message: str
    """What is wrong, in one sentence."""
    hint: str
    """How to fix it, stating the true rule."""
    source: str = ""
    """``file:line`` in the user's code, when known (never a torch frame)."""
    device: str = ""
    """The device the tensor was found on."""
    expected: str = ""
    """The device it should be on (the audit's target)."""
    dtype: str = ""
    """dtype of the tensor, when the finding is about one tensor."""
    shape: tuple[int, ...] | None = None
    """Shape of the tensor, when the finding is about one tensor."""
    nbytes: int = 0
    """Bytes of tensor data the finding covers (all tensors under a module
    for ``unregistered-module``)."""
    count: int = 0
    """Number of tensors the finding covers (0 when not about tensors)."""
    origin: str = ""
    """Where the offending tensor came from, when known: an attribute path
    or a ``file:line`` that created it."""
    module: str = ""
    """Dotted path of the module that owns the offending state."""
    details: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    """Extra key/value facts (op name, dtype pairs, ...), in a fixed order."""
    instances: tuple[str, ...] = ()
    """Every ``where`` this problem covers, the first first (``blocks.0.mask`` ... ``blocks.23.mask``);
    empty for an ungrouped finding. ``nbytes`` and ``count`` then total all instances."""
    evidence: tuple[Evidence, ...] = ()
    """The findings this problem caused (a mismatch fed by the stray tensor), in report order."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, keys in declaration order."""
        data = asdict(self)
        data["severity"] = self.severity.value
        data["shape"] = list(self.shape) if self.shape is not None else None
        data["details"] = dict(self.details)
        data["instances"] = list(self.instances)
        data["evidence"] = [e.to_dict() for e in self.evidence]
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Finding:
        """The inverse of :meth:`to_dict` (unknown keys, such as a run's ``target``, are ignored)."""
        names = {f.name for f in fields(Finding)}
        values = {k: v for k, v in data.items() if k in names}
        values["severity"] = Severity(values["severity"])
        if values.get("shape") is not None:
            values["shape"] = tuple(values["shape"])
        values["details"] = tuple((str(k), str(v)) for k, v in (values.get("details") or {}).items())
        values["instances"] = tuple(str(w) for w in values.get("instances") or ())
        values["evidence"] = tuple(Evidence.from_dict(e) for e in values.get("evidence") or ())
        return Finding(**values)

    @property
    def instance_count(self) -> int:
        """How many per-instance findings this covers (what ``--no-group`` would list)."""
        return max(1, len(self.instances)) + len(self.evidence)

    @property
    def sort_key(self) -> tuple[int, str, tuple[str | int, ...], tuple[str | int, ...], str]:
        """Deterministic order: worst first, then code, location, source.

        Locations and sources sort naturally: ``blocks.2`` before ``blocks.10``,
        ``net.py:9`` before ``net.py:10``.
        """
        return (-self.severity.rank, self.code, natural_key(self.where), natural_key(self.source),
                self.message)


def natural_key(text: str) -> tuple[str | int, ...]:
    """``"blocks.10.attn"`` -> ``("blocks.", 10, ".attn")``: digit runs compare as numbers.

    Text and numbers alternate from a text part (``re.split`` with a group), so
    two keys never compare a string with an int.
    """
    parts = re.split(r"(\d+)", text)
    return tuple(int(part) if i % 2 else part for i, part in enumerate(parts))
