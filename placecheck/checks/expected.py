"""Where each module of a model placed by its own code is expected to compute: decided from evidence.

With ``--device keep`` nothing moves the model to one target; every module is
judged against the device of the state it holds:

1. its own registered parameters and buffers: the device holding most of their
   bytes (a registered tensor elsewhere in the same module is PC104/PC105);
2. else the registered state of its descendants: their device, or every device
   they span (the root of a two-stage pipeline spans ``cuda:0`` and ``cuda:1``);
3. else its nearest ancestor's expectation (an ``nn.ReLU`` in a stage);
4. else (a model with no state at all) nothing: any device is accepted.

A module spanning several devices (case 2) accepts tensors on any of them; its
``primary`` device is the one its first registered tensor is on (the first
stage). Never decided from class or attribute names.

A *stage* is the outermost module on one device: a child of the root that
holds state on one device, or, for a child spanning several (an
``nn.ModuleList`` whose first layers are on ``cuda:0`` and the rest on
``cuda:1``), its outermost descendants that are each on one (``layers.3``,
``layers.4``): :meth:`Placement.stage_of`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn

from placecheck.basics.values import Device, device_order
from placecheck.engines.calls import device_of


@dataclass(frozen=True)
class Expected:
    """The device(s) a module's tensors are expected on, and which rule decided it."""

    devices: tuple[Device, ...]
    """One device, or every device a module spanning several stages uses (first-used first)."""
    how: str
    """``own``, ``descendants``, ``ancestor`` or ``none`` (the numbered rules of this module)."""

    @property
    def primary(self) -> Device | None:
        """The device a tensor of this module goes to when one must be chosen (None when none is known)."""
        return self.devices[0] if self.devices else None

    def allows(self, device: Device) -> bool:
        """True when a tensor on ``device`` is where this module expects it."""
        return not self.devices or device in self.devices

    @property
    def label(self) -> str:
        """``cuda:1``, or ``cuda:0 or cuda:1`` for a module spanning both (a finding's ``expected``)."""
        return " or ".join(self.devices) if self.devices else "any device"


_ANY = Expected((), "none")


def _own_device(module: nn.Module) -> Device | None:
    """The device holding most bytes of ``module``'s own registered parameters and buffers (ties: the
    first registered); None when it registers none."""
    by_device: dict[Device, int] = {}
    for t in [*module._parameters.values(), *module._buffers.values()]:
        if t is None:
            continue
        device = device_of(t)
        by_device[device] = by_device.get(device, 0) + _nbytes(t)
    if not by_device:
        return None
    return max(by_device, key=lambda d: (by_device[d], -list(by_device).index(d)))


def _nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.nelement() * t.element_size())
    except (RuntimeError, ValueError):
        return 0  # an uninitialised lazy parameter


def _ordered(devices: Iterable[Device]) -> tuple[Device, ...]:
    seen: dict[Device, None] = {}
    for d in devices:
        seen.setdefault(d, None)
    return tuple(seen)


class Placement:
    """The expectations of every module of one model, by dotted path (``""`` is the root)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._by_path: dict[str, Expected] = {}
        paths = {id(m): p for p, m in model.named_modules(remove_duplicate=False)}
        modules = dict(model.named_modules(remove_duplicate=False))
        for path, module in modules.items():
            if path in self._by_path:
                continue
            own = _own_device(module)
            if own is not None:
                self._by_path[path] = Expected((own,), "own")
                continue
            below = _ordered(device_of(t) for t in [*module.parameters(), *module.buffers()])
            if below:
                self._by_path[path] = Expected(below, "descendants")
        for path in modules:  # rule 3: the nearest ancestor's
            if path not in self._by_path:
                self._by_path[path] = self._inherited(path)
        self._paths = paths
        self._stages: dict[str, str] = {}

    def _inherited(self, path: str) -> Expected:
        while path:
            path = path.rpartition(".")[0]
            found = self._by_path.get(path)
            if found is not None and found.how != "ancestor":
                return Expected(found.devices, "ancestor")
        return _ANY

    def expected(self, path: str) -> Expected:
        """The expectation of the module at ``path``; for a path the model does not register (a module
        in a plain list: ``heads[0]``), the one of the nearest registered module holding it."""
        found = self._by_path.get(path)
        while found is None and path:
            cut = max(path.rfind("."), path.rfind("["), path.rfind("{"))
            path = path[:cut] if cut > 0 else ""
            found = self._by_path.get(path)
        return found or _ANY

    def stage_of(self, path: str) -> str:
        """The stage of the module at ``path``: the outermost module on its path (itself included)
        whose state is on one device; ``""`` for the root; the path itself when none is."""
        found = self._stages.get(path)
        if found is not None:
            return found
        stage = path
        if path:
            parts = path.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                expected = self.expected(prefix)  # a subclass's expectations (a device map) decide too
                if expected.how not in ("ancestor", "none") and len(expected.devices) == 1:
                    stage = prefix
                    break
        self._stages[path] = stage
        return stage

    def of_module(self, module: nn.Module) -> Expected:
        """The expectation of a module object of the model (any device when it is not the model's)."""
        path = self._paths.get(id(module))
        return self.expected(path) if path is not None else _ANY

    def held_weights(self) -> dict[int, str]:
        """``id -> parameter path`` of tensors that hold a registered weight's data outside its module
        (a dispatcher's copy of an offloaded weight, :mod:`placecheck.placement.dispatch`): copying one
        in forward copies those weights. None here: the model's own placement holds no such copies."""
        return {}

    def devices(self) -> tuple[Device, ...]:
        """Every device the model's registered state is on, GPUs by index first."""
        return tuple(sorted({device_of(t) for t in [*self.model.parameters(), *self.model.buffers()]},
                            key=device_order))


INPUT = "(input)"
"""The stage of the forward's inputs, in flows and messages (never a module path)."""
