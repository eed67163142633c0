"""The one record every check produces: a frozen :class:`Finding`.

This module must not import torch: the CLI's ``--help``, ``rules`` and
``explain`` paths use it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, field
from typing import Any


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
class Finding:
    """One placement problem.

    The first nine fields are the public JSON contract (see PLACEMENT.md);
    the rest add detail that formats may show.
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, keys in declaration order."""
        data = asdict(self)
        data["severity"] = self.severity.value
        data["shape"] = list(self.shape) if self.shape is not None else None
        data["details"] = dict(self.details)
        return data

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
