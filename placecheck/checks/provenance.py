"""Provenance: where an off-target tensor seen in forward came from.

An off-target tensor is either one of the model's attributes (a stray the
walk found, or the state of a layer built during forward), or made by the
forward itself (a factory without ``device=``, a ``.cpu()``), or derived from
those. :class:`Provenances` keeps that answer per tensor for one traced
forward, and what happened to the strays (used, moved, fed a mismatch), from
which the forward's verdict on each stray is read (:meth:`Provenances.stray_verdicts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.codes import Code
from placecheck.basics.values import Device
from placecheck.checks.walk import WalkResult, storage_key
from placecheck.engines.sources import library_of_class
from placecheck.findings.events import EventSite, Provenance
from placecheck.findings.finding import Finding
from placecheck.findings.rules import cached_in_run


@dataclass(frozen=True)
class StrayVerdict:
    """What the forward did with one stray tensor (PC101) that it never let meet a device tensor."""

    path: str
    how: str
    """``replaced`` (forward swapped in a tensor on the target before use), ``removed``,
    ``moved-copies`` (only used in CPU work whose results it copies to the target),
    ``cpu-only`` (only used in work that never met a device tensor), or ``scalar`` (only used
    as a 0-dim scalar, which PyTorch reads on the host), or ``unused`` (never used by a forward that
    ran to its end)."""


class Provenances:
    """Provenance of every off-target tensor of one traced forward, and what happened to the strays."""

    def __init__(self, walk: WalkResult | None) -> None:
        self.origins: dict[int, str] = dict(walk.origins) if walk else {}
        """``id(tensor)`` -> attribute path, for unregistered state and layers built in forward."""
        self.storages: dict[int, str] = dict(walk.storages) if walk else {}
        self.walk_findings = dict(walk.finding_by_origin) if walk else {}
        self.lazy_origins: set[str] = set()
        self.strays = {path for path, f in self.walk_findings.items() if f.code == Code.PC101}
        """The walk's stray tensors (PC101), whose use in forward is followed."""
        self._stray_ids = {tid: path for tid, path in self.origins.items() if path in self.strays}
        self.stray_touched: set[str] = set()
        self.stray_fed: set[str] = set()
        """Strays that took part (themselves or through a result) in a mismatch or an implicit transfer."""
        self.stray_moved: set[str] = set()
        self.scalar_only: dict[str, bool] = {}
        """Stray path -> True while every use of it in forward was as a 0-dim scalar."""
        self._known: dict[int, tuple[torch.Tensor, Provenance]] = {}
        self._keep: list[Any] = []

    def of(self, t: torch.Tensor) -> Provenance:
        """Where ``t`` came from: created in forward, derived from, or itself an attribute."""
        path = self.origins.get(id(t))
        if path is None:
            known = self._known.get(id(t))
            if known is not None and known[0] is t:
                return known[1]
            key = storage_key(t)
            path = self.storages.get(key) if key is not None else None
        if path is None:
            return Provenance()
        return Provenance(path=path, linked=self.walk_findings.get(path), lazy=path in self.lazy_origins)

    def knows(self, t: torch.Tensor) -> bool:
        """True when ``t`` already has a provenance of its own (recorded, or an attribute)."""
        return id(t) in self._known or id(t) in self.origins

    def remember(self, t: torch.Tensor, prov: Provenance) -> None:
        """``t`` came from ``prov`` (kept alive, so that its id is not reused during the forward)."""
        self._known[id(t)] = (t, prov)

    def add_lazy(self, t: torch.Tensor, path: str) -> None:
        """``t`` is state of a module or parameter registered during forward, at ``path``."""
        self.origins.setdefault(id(t), path)
        self.lazy_origins.add(path)
        self._keep.append(t)

    def touched(self, off: list[tuple[int, torch.Tensor]], scalar_use: bool = True) -> None:
        """Off-target tensors an op received: note the strays among them, and whether as scalars."""
        if not self._stray_ids:
            return
        for _, t in off:
            stray = self._stray_ids.get(id(t))
            if stray is not None:
                self.stray_touched.add(stray)
                as_scalar = scalar_use and t.dim() == 0
                self.scalar_only[stray] = self.scalar_only.get(stray, True) and as_scalar

    def mark(self, prov: Provenance, what: str, creations: bool = True, seen: set[int] | None = None,
             at: EventSite | None = None, to: Device | None = None) -> None:
        """``what`` (``moved``, ``fed_mismatch`` or ``met_device``) happened to a tensor of provenance
        ``prov``: note it on its creations (PC202) and, but ``met_device``, on its stray attributes
        (PC101), combined origins included."""
        seen = seen if seen is not None else set()
        if id(prov) in seen:
            return
        seen.add(id(prov))
        if creations and prov.creation is not None:
            prov.creation.mark(what, at=at, to=to)
        if prov.path in self.strays and what != "met_device":
            (self.stray_moved if what == "moved" else self.stray_fed).add(prov.path)
        for other in prov.also:
            self.mark(other, what, creations, seen, at, to)

    def stray_verdicts(self, after: WalkResult, completed: bool) -> list[StrayVerdict]:
        """The strays (PC101) the forward shows it handles, and how.

        ``after`` is the walk repeated after the forward. A stray is handled
        when the forward replaced it with a tensor on the target, or used it
        only in computations that never met a device tensor (no mismatch, no
        implicit transfer traced to it). One never used is ``unused``; one that
        fed a mismatch is not handled; nothing is when the forward stopped early.
        """
        if not completed:
            return []
        still_off = {f.where for f in after.findings if f.code == Code.PC101}
        present = set(after.origins.values())
        verdicts = []
        for path in sorted(self.strays - self.stray_fed):
            if path in still_off and path not in self.stray_touched:
                verdicts.append(StrayVerdict(path, "unused"))
            elif path not in still_off:
                verdicts.append(StrayVerdict(path, "replaced" if path in present else "removed"))
            elif path in self.stray_touched:
                if self.scalar_only.get(path):
                    how = "scalar"
                else:
                    how = "moved-copies" if path in self.stray_moved else "cpu-only"
                verdicts.append(StrayVerdict(path, how))
        return verdicts


def stray_package(finding: Finding, model: nn.Module) -> str:
    """The installed package defining the class of the module of ``model`` that holds the stray of
    ``finding`` ("" for the user's own class, or when it is not found): the evidence of
    :func:`placecheck.findings.rules.stray_verdict`."""
    try:
        owner = type(model.get_submodule(finding.module) if finding.module else model)
    except AttributeError:
        return ""
    return library_of_class(owner)


class CallCounts:
    """``placecheck run``: how many forwards each module class ran, and how many times each line of a
    forward made a tensor on the host that it then copied to the device (PC202).

    "On every call" is decided by counting: a line that made its tensor in fewer forwards than its
    module ran is a cache (built once, or when the length changes), not a copy on every call."""

    def __init__(self) -> None:
        self.forwards: dict[str, int] = {}
        """Module class name -> forwards run (every module's, not only the outermost)."""
        self.made: dict[str, int] = {}
        """The creating line -> tensors made there and copied to the device."""
        self._first: dict[str, tuple[str, str, str, str]] = {}
        """The creating line -> (op, tensor, copied to, copied at) of its first creation."""

    def forward(self, module_class: str) -> None:
        self.forwards[module_class] = self.forwards.get(module_class, 0) + 1

    def created(self, line: str, op: str, tensor: str, copied_to: str, copied_at: str) -> None:
        """The forward's ``line`` made ``tensor`` with ``op``, copied to ``copied_to`` at ``copied_at``."""
        self.made[line] = self.made.get(line, 0) + 1
        self._first.setdefault(line, (op, tensor, copied_to, copied_at))

    def verdict(self, finding: Finding) -> Finding:
        """``finding`` (a PC202 of a forward's creation copied to the device) as the whole run shows it
        (:func:`placecheck.findings.rules.cached_in_run`: made in fewer forwards than its module ran, a
        cache)."""
        line = finding.origin or finding.source
        made, calls = self.made.get(line, 0), self.forwards.get(finding.where, 0)
        if line not in self._first:
            return finding
        op, tensor, copied_to, copied_at = self._first[line]
        return cached_in_run(finding, op, tensor, copied_to, copied_at, made=made, calls=calls)
