"""The script's optimizers: where each was built and resumed, and what they hold at each step.

Before each ``optimizer.step()`` (the global step pre-hook): state left on another device than its
parameter after a resume (PC307; the state is moved so the step runs on, as after the fix), and an
optimizer holding Parameter objects that no live module registers any more (PC308).

PC308 is decided from identity only: when the optimizer is built, the modules that register each
parameter it holds are remembered; at a step, a held parameter that neither those modules nor any
other live module registers now was replaced (the model re-created or reloaded after the optimizer
was built, ``load_state_dict(assign=True)``, or a ``.to()`` with
``set_overwrite_module_params_on_conversion(True)``). Never from what the last forward used: two
models stepped by two optimizers (a GAN), an EMA copy nobody optimizes, frozen parts and a step
whose gradients came from an earlier forward are all correct code.
"""

from __future__ import annotations

import gc
import itertools
import typing
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from placecheck.engines.sources import here
from placecheck.findings import rules

if typing.TYPE_CHECKING:
    from placecheck.run.session import Recording


class Optimizers:
    """Every optimizer the script builds, and the checks run before each of its steps."""

    def __init__(self, recorder: Recording) -> None:
        self.recorder = recorder
        self.built: weakref.WeakKeyDictionary[torch.optim.Optimizer, str] = weakref.WeakKeyDictionary()
        """Each optimizer -> the line that built it."""
        self.resumed: weakref.WeakKeyDictionary[torch.optim.Optimizer, str] = weakref.WeakKeyDictionary()
        """Each optimizer resumed with load_state_dict -> that line."""
        self.reported: set[tuple[int, str]] = set()
        self.owners: weakref.WeakKeyDictionary[torch.optim.Optimizer, dict[int, _Held]] = \
            weakref.WeakKeyDictionary()
        """Each optimizer -> ``id()`` of each held Parameter some module registered when the optimizer was
        built -> that parameter and the modules registering it (the modules weakly)."""

    def __len__(self) -> int:
        """How many optimizers the script built (and still holds)."""
        return len(self.built)

    def optimizer_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Optimizer.__init__``: the line each optimizer is built at."""
        def __init__(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original(opt, *args, **kwargs)
            if opt not in self.built:
                self.built[opt] = here()[0]
                with self.recorder.quiet():
                    self.owners[opt] = _registered(opt)
        return __init__

    def optimizer_load(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Optimizer.load_state_dict``: the line a resume loads its state at."""
        def load_state_dict(opt: torch.optim.Optimizer, state_dict: Any) -> Any:
            self.resumed[opt] = here()[0]
            return original(opt, state_dict)
        return load_state_dict

    def before_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The global step pre-hook: PC307 and PC308 before the step runs."""
        with self.recorder.quiet():
            self._check_state(opt)
            self._check_params(opt)

    def after_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The global step post-hook: one more step done (the run may stop here)."""
        self.recorder.step_done()

    def _check_state(self, opt: torch.optim.Optimizer) -> None:
        """PC307: optimizer state on another device than its parameter (a resume loaded before the move)."""
        for index, group in enumerate(opt.param_groups):
            off_bytes, off_count, devices, param_devices = 0, 0, set(), set()
            for p in group["params"]:
                state = opt.state.get(p)
                if not state:
                    continue
                for key, value in list(state.items()):
                    if not isinstance(value, torch.Tensor) or value.device == p.device:
                        continue
                    if value.dim() == 0 and value.device.type == "cpu":
                        continue  # `step` counters stay on the CPU unless capturable/fused
                    off_bytes += value.numel() * value.element_size()
                    off_count += 1
                    devices.add(str(value.device))
                    param_devices.add(str(p.device))
                    state[key] = value.to(p.device)  # so the step runs on, as after the fix
            if not off_count:
                continue
            report_key = (id(opt), f"group{index}")
            if report_key in self.reported:
                continue
            self.reported.add(report_key)
            line = self.resumed.get(opt) or self.built.get(opt, "")
            state_on, params_on = ", ".join(sorted(devices)), ", ".join(sorted(param_devices))
            self.recorder.add(rules.optimizer_state_off_device(
                type(opt).__name__, index, off_count, off_bytes, state_on, params_on, line=line))

    def _check_params(self, opt: torch.optim.Optimizer) -> None:
        """PC308: the optimizer holds Parameter objects no live module registers any more (replaced)."""
        if id(opt) in {k[0] for k in self.reported if k[1] == "stale"}:
            return
        held = self.owners.get(opt) or {}
        current = {id(p) for group in opt.param_groups for p in group["params"]}  # as the step sees them
        suspects = {pid: h for pid, h in held.items() if pid in current and not h.registered()}
        if not suspects:
            return
        gc.collect()  # a re-created model's old modules may linger in reference cycles
        registering = _registering_modules(set(suspects))
        stale = []
        for pid, h in suspects.items():
            owner = registering.get(pid)
            if owner is not None:
                h.modules.add(owner)  # registered elsewhere now (moved into a wrapper): still trained
            else:
                stale.append(h)
        if not stale:
            return
        self.reported.add((id(opt), "stale"))
        stepped = {id(p) for o in list(self.built) for g in o.param_groups for p in g["params"]}
        roots = list(self.recorder.roots.values())
        unstepped = {id(p): (type(m).__name__, name) for m in roots for name, p in m.named_parameters()
                     if p.requires_grad and id(p) not in stepped}
        names = [name for _, name in unstepped.values()] or [h.name for h in stale]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        model = ", ".join(sorted({cls for cls, _ in unstepped.values()}))
        line = self.built.get(opt, "")
        self.recorder.add(rules.stale_optimizer(type(opt).__name__, line, len(stale), model, len(unstepped),
                                                shown))


class _Held:
    """A Parameter an optimizer holds, with the modules that registered it when the optimizer was built."""

    def __init__(self, param: torch.Tensor, name: str) -> None:
        self.param = param
        """Held strongly, as the optimizer holds it: a weak reference would stop ``.to()`` swapping it."""
        self.name = name
        """Its name in the first module that registered it (``0.weight``)."""
        self.modules: weakref.WeakSet[nn.Module] = weakref.WeakSet()

    def registered(self) -> bool:
        """One of the modules known to register it still does (the same object: identity)."""
        p = self.param
        return any(any(q is p for q in m._parameters.values()) for m in list(self.modules))


def _registered(opt: torch.optim.Optimizer) -> dict[int, _Held]:
    """The Parameters ``opt`` holds that some live module registers now, each with those modules.

    A parameter no module registers (a plain tensor, or an ``nn.Parameter`` the script keeps itself)
    is not remembered: nothing can replace it."""
    params = {id(p): p for g in opt.param_groups for p in g["params"] if isinstance(p, torch.Tensor)}
    held: dict[int, _Held] = {}
    for module in _live_modules():
        for name, p in module._parameters.items():
            if p is not None and id(p) in params and params[id(p)] is p:
                h = held.get(id(p))
                if h is None:
                    h = held[id(p)] = _Held(p, name)
                h.modules.add(module)
    return held


def _registering_modules(ids: set[int]) -> dict[int, nn.Module]:
    """For each parameter ``id()`` in ``ids``: a live module that registers it now."""
    found: dict[int, nn.Module] = {}
    if not ids:
        return found
    for module in _live_modules():
        for p in module._parameters.values():
            if p is not None and id(p) in ids:
                found.setdefault(id(p), module)
    return found


def _live_modules() -> list[nn.Module]:
    """Every ``nn.Module`` alive in the process (the garbage collector tracks them all).

    The objects are filtered in C (``map``, ``compress``) against the set of ``nn.Module``'s subclasses:
    a Python test per object (hundreds of thousands in a process that imported torch) ran under the
    script's line tracer and cost most of a short run."""
    objects = gc.get_objects()
    kinds = _subclasses(nn.Module)
    return list(itertools.compress(objects, map(kinds.__contains__, map(type, objects))))


def _subclasses(cls: type) -> set[type]:
    """``cls`` and every class that derives from it, now."""
    found = {cls}
    pending = [cls]
    while pending:
        subs: list[type] = pending.pop().__subclasses__()
        for sub in subs:
            if sub not in found:
                found.add(sub)
                pending.append(sub)
    return found
