"""What one traced forward of a model placed across devices does between them (``--device keep``).

The tracer (:mod:`placecheck.checks.trace`) hands every call to :class:`Flows`, which

- keeps the stack of running modules (global forward hooks), so that the
  target of a call is the device of the module whose forward runs it
  (:meth:`Flows.target`; a module spanning several devices, the root of a
  pipeline, accepts any of them);
- follows each tensor's *flow*: the stage (top-level module) whose forward
  produced it, and the devices its data went through by explicit copies;
- records every copy between devices as a :class:`~placecheck.findings.events.Copy`
  (bytes, user line, from-stage, and the stage that first computes on it),
  marking the waste PC208 reports: a registered parameter or buffer copied in
  forward, or data that left a top-level module (a child of the root) on one
  device, went to another, and came back to be computed on by the same
  top-level module on the same device (``cuda:1 -> cuda:0 -> cuda:1`` across
  one boundary: a stage that sends its activations to a layer left elsewhere
  and takes them back).

Not a ping-pong: a pipeline whose third stage sits on the first stage's device
(the data comes back to that device, but to another top-level module), and a
copy that brings the forward's result back to the input's device at the end
(``return h.to("cuda:0")``: nothing computes on it again).

Not reentrant: one traced forward at a time (the hooks are global).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from placecheck.basics.values import Device
from placecheck.checks.expected import INPUT, Placement
from placecheck.engines.calls import device_of
from placecheck.findings.events import Copy, EventSite

_MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.type_as})


@dataclass(frozen=True)
class _Flow:
    """Where one tensor's data came from."""

    stage: str
    """The stage whose forward produced it ("" for the root or the forward's inputs)."""
    route: tuple[Device, ...] = ()
    """The devices explicit copies took its data through, the current one last (empty: never copied)."""
    copy: Copy | None = None
    """The copy that made it (or what it derives from), until a stage computes on it."""
    arrived: Copy | None = None
    """The last copy its data went through (the one that brought it to its device)."""
    left: tuple[tuple[Device, str], ...] = ()
    """(device, top-level module) pairs its data left by a copy: that module computing on it again on
    that device is a ping-pong."""
    weights: str = ""
    """The registered parameter or buffer it is (or a view/cast of), by path."""


def _nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.nelement() * t.element_size())
    except (RuntimeError, ValueError):
        return 0


def _top(path: str) -> str:
    """The top-level module of a path (``s2.norm`` -> ``s2``)."""
    return path.split(".", 1)[0]


def _tensors_of(out: Any) -> Iterable[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, tuple | list):
        yield from (o for o in out if isinstance(o, torch.Tensor))


class Flows:
    """The module stack, each tensor's flow, and the copies between devices of one traced forward."""

    def __init__(self, placement: Placement, model: nn.Module) -> None:
        self.placement = placement
        self._stack: list[str] = []
        self._flows: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._devices: dict[str, torch.device] = {}
        self.copies: list[Copy] = []
        self._weights: dict[int, str] = {}
        for name, t in [*model.named_parameters(remove_duplicate=False),
                        *model.named_buffers(remove_duplicate=False)]:
            self._weights.setdefault(id(t), name)
        for key, name in placement.held_weights().items():
            self._weights.setdefault(key, name)

    # -- the module stack -----------------------------------------------------------------------------
    def hooks(self, module_paths: dict[int, str]) -> list[RemovableHandle]:
        """Global forward hooks keeping the stack of running modules (remove them after the forward)."""
        from torch.nn.modules import module as module_mod

        def enter(module: nn.Module, args: Any) -> None:
            path = module_paths.get(id(module))
            self._stack.append(path if path is not None else self.current)

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            if self._stack:
                self._stack.pop()

        return [module_mod.register_module_forward_pre_hook(enter),
                module_mod.register_module_forward_hook(leave, always_call=True)]

    @property
    def current(self) -> str:
        """The path of the module whose forward runs now ("" for the root)."""
        return self._stack[-1] if self._stack else ""

    def _flow(self, t: torch.Tensor) -> _Flow | None:
        found: _Flow | None = self._flows.get(t)  # type: ignore[no-untyped-call]
        return found

    def _device(self, name: str) -> torch.device:
        found = self._devices.get(name)
        if found is None:
            found = self._devices[name] = torch.device(name)
        return found

    def target(self, tensors: list[tuple[int, torch.Tensor]], fallback: torch.device) -> torch.device:
        """The device this call should run on: its module's; for a module spanning several devices, the
        first of them an argument is on (else its first device)."""
        devices = self.placement.expected(self.current).devices
        if not devices:
            return fallback
        if len(devices) > 1:
            for _, t in tensors:
                if device_of(t) in devices:
                    return t.device
        return self._device(devices[0])

    def stages(self, t: torch.Tensor) -> tuple[str, str]:
        """(the stage that produced ``t``, the stage of the module running now): the two sides of a
        mismatch. The first is :data:`~placecheck.checks.expected.INPUT` for the forward's inputs, the
        stage holding it for a registered parameter or buffer, ``""`` for the root's own work."""
        here = self.placement.stage_of(self.current)
        flow = self._flow(t)
        if flow is not None:
            return flow.stage, here
        weights = self._weights.get(id(t), "")
        return (self.placement.stage_of(weights.rpartition(".")[0]) if weights else ""), here

    def mark_inputs(self, inputs: Any) -> None:
        """The forward's input tensors (nested), so that a message can name them as such."""
        from placecheck.engines.compat import tree_leaves

        for t in tree_leaves(inputs):
            if isinstance(t, torch.Tensor):
                self._flows[t] = _Flow(INPUT)

    # -- flows and copies -----------------------------------------------------------------------------
    def between_devices(self, func: Callable[..., Any], args: tuple[Any, ...], out: torch.Tensor) -> bool:
        """True for a copy from one accelerator to another (``h.to("cuda:1")``): traffic, not a creation."""
        source = args[0] if args else None
        return (func in _MOVES and isinstance(source, torch.Tensor)
                and source.device.type not in ("cpu", "meta") and out.device.type not in ("cpu", "meta")
                and source.device != out.device)

    def after_call(self, func: Callable[..., Any], args: tuple[Any, ...],
                   tensors: list[tuple[int, torch.Tensor]], out: Any,
                   site: Callable[[Any], EventSite]) -> Copy | None:
        """Give ``out`` its flow; return the copy ``func`` made between devices, if it made one."""
        import sys

        here = self.placement.stage_of(self.current)
        moving = func in _MOVES
        inherited: _Flow | None = None
        for _, t in tensors:
            flow = self._flow(t)
            if flow is None:
                continue
            inherited = inherited or flow
            if here and not moving:  # a stage computes on it
                if flow.copy is not None and not flow.copy.to_stage:
                    flow.copy.to_stage = here
                if flow.arrived is not None and (device_of(t), _top(here)) in flow.left:
                    flow.arrived.ping_pong = True  # back on the device and in the module it left
        copy: Copy | None = None
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        # a move to or from meta copies no data (accelerate's hooks free offloaded weights that way)
        if moving and source is not None and isinstance(out, torch.Tensor) and out.device != source.device \
                and "meta" not in (source.device.type, out.device.type):
            flow = self._flow(source)
            weights = self._weights.get(id(source), "") or (flow.weights if flow is not None else "")
            route = (flow.route if flow is not None and flow.route else (device_of(source),))
            dst = device_of(out)
            from_stage = (flow.stage if flow is not None else
                          self.placement.stage_of(weights.rpartition(".")[0]))
            copy = Copy(device_of(source), dst, _nbytes(out), site(sys._getframe(1)), from_stage,
                        route=(*route, dst), weights=weights)
            self.copies.append(copy)
            left = (*(flow.left if flow is not None else ()), (device_of(source), _top(here or from_stage)))
            self._flows[out] = _Flow(from_stage, (*route, dst), copy, copy, left, weights)
            return copy
        if inherited is None and not here:
            return None
        weights = ""
        if len(tensors) == 1:  # a view or cast of a registered tensor is still its weights
            only = tensors[0][1]
            weights = self._weights.get(id(only), "") or (inherited.weights if inherited is not None else "")
        stage = here or (inherited.stage if inherited is not None else "")
        flow_out = _Flow(stage, inherited.route if inherited else (),
                         inherited.copy if inherited is not None and not here else None,
                         inherited.arrived if inherited is not None else None,
                         inherited.left if inherited is not None else (), weights)
        for t in _tensors_of(out):
            self._flows[t] = flow_out
        return None
