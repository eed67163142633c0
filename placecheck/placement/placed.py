"""The placement a model's own code made: the devices it uses, and where its inputs go."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.values import Device, device_order
from placecheck.checks.expected import Placement
from placecheck.checks.state import reachable_tensors
from placecheck.engines.calls import device_of
from placecheck.engines.dispatch import Call, subscribed


def devices_used(model: nn.Module) -> list[Device]:
    """Every device a tensor the model holds is on (registered or not), GPUs by index first."""
    return sorted({device_of(t) for t in reachable_tensors(model)}, key=device_order)


def highest_gpu(devices: Iterable[str]) -> int:
    """The highest CUDA index among ``devices`` (-1 when none is a GPU)."""
    return max((Device.of(d).ordinal for d in devices if d.startswith("cuda")), default=-1)


class _Met(Exception):
    """The trial forward's input data met a tensor on a device: the trial stops there."""

    def __init__(self, device: Device) -> None:
        super().__init__(device)
        self.device = device


class _Registered(Exception):
    """The trial forward would register a module or parameter: it stops, changing nothing."""


class _FirstMeeting:
    """Follows the input data through a trial forward until it meets a tensor on an accelerator (a
    handler of the dispatcher)."""

    def __init__(self, inputs: Iterable[torch.Tensor]) -> None:
        self.derived: dict[int, torch.Tensor] = {id(t): t for t in inputs}

    def __call__(self, call: Call) -> Any:
        tensors = [t for _, t in call.tensors]
        derived = any(id(t) in self.derived for t in tensors)
        if derived:
            for t in tensors:
                if id(t) not in self.derived and t.device.type not in ("cpu", "meta"):
                    raise _Met(device_of(t))
        out = call.run()
        if derived:
            outs = [out] if isinstance(out, torch.Tensor) else \
                [o for o in out if isinstance(o, torch.Tensor)] if isinstance(out, tuple | list) else []
            for o in outs:
                if o.device.type not in ("cpu", "meta"):
                    raise _Met(device_of(o))  # the input data itself went to a device (x.to("cuda:1"))
                self.derived[id(o)] = o
        return out


def input_device(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 placement: Placement) -> tuple[Device, str]:
    """The device the forward's inputs go to, and how it was found (for the report's notes).

    A trial forward runs with the inputs on the CPU and stops at the first
    op where their data meets a tensor on an accelerator (the first layer's
    weight, a tensor the forward created there), or is copied to one: that
    device. It stops too before the forward registers a module or parameter,
    so it changes nothing. When it finds none (the forward failed first, or
    computed on the CPU only), the inputs go to the model's first device.
    """
    from torch.nn.modules import module as module_mod

    from placecheck.engines.compat import tree_leaves

    def refuse(*_: Any) -> None:
        raise _Registered

    first = placement.expected("").primary or Device("cpu")
    leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if not leaves:
        return first, "no tensor inputs"
    handles = [module_mod.register_module_module_registration_hook(refuse),
               module_mod.register_module_parameter_registration_hook(refuse)]
    was_training = model.training
    try:
        with torch.no_grad(), subscribed(_FirstMeeting(leaves)):
            model.eval()(*args, **kwargs)
    except _Met as met:
        return met.device, "the device of the first model tensor the input meets"
    except Exception:
        pass  # the traced forward reports what the model raises
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return first, "the model's first device (the input met no device tensor before the forward stopped)"
