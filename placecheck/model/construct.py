"""``--init``: build the model on the CPU, or on the meta device when it is too big for host memory.

``cpu`` builds the model as the user's script would: every tensor gets host
memory. ``meta`` builds it under ``torch.device("meta")``: tensors have shapes
and dtypes but no data, so a 70B-parameter model costs almost nothing. The
move then materialises the registered state on the target (under simulated
CUDA, ``.to()`` turns meta tensors into fake CUDA tensors with no memory; on a
real device ``to_empty()`` allocates them uninitialised).

What ``.to()`` did not move is still on ``meta`` afterwards, but in the user's
script it would be on the default device (CPU): :func:`leftovers_to_default_device`
turns each such tensor into one on the default device, so the walk and the
forward pass see exactly what they would see after a CPU build, except the
values (zeros). ``auto`` builds on meta first, which is cheap, counts the bytes
of parameters and buffers, and builds on the CPU instead when they fit
comfortably in available memory; the report's notes say which it chose.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from placecheck.basics.devices import human_bytes
from placecheck.basics.errors import LoadError, UsageError, one_line
from placecheck.basics.options import InitChoice
from placecheck.basics.values import Device
from placecheck.checks.assignments import Assignments, build_recorded
from placecheck.checks.state import replace_tensors
from placecheck.engines.compat import TorchDispatchMode
from placecheck.engines.engine import Engine, move_model

COMFORTABLE_FRACTION = 0.5
"""``auto`` builds on the CPU when parameters and buffers take at most this
fraction of the memory available now: the forward pass, the interpreter and
other processes need the rest."""

REAL_LEFTOVER_BUDGET = 256 * 2**20
"""Bytes of unmoved tensors given real (zeroed) host memory under simulated
CUDA, as a CPU build would have them; beyond it they become fake CPU tensors
(no memory), so a model whose big blocks sit in a plain list still fits."""

_UNINITIALIZED = (UninitializedParameter, UninitializedBuffer)  # nn.Lazy* state: no shape to copy


@dataclass
class Construction:
    """The model the audit works on and how it was built."""

    model: nn.Module
    on_meta: bool
    note: str = ""
    """For the report's notes: what ``--init`` chose and why; empty when nothing was chosen."""
    assignments: Assignments = field(default_factory=Assignments)
    """Where the user's code assigned each module attribute while the model was built (empty for a
    model built before the audit): the ``source`` of walk findings."""


def available_memory() -> int:
    """Bytes of memory available to new allocations now (``MemAvailable`` on Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0  # unknown: auto then builds on meta, which is always safe for memory


def state_nbytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each shared tensor counted once."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) in seen or isinstance(t, _UNINITIALIZED):
            continue
        seen.add(id(t))
        total += t.nelement() * t.element_size()
    return total


def parse_init(init: str | InitChoice) -> InitChoice:
    """``"meta"`` -> ``InitChoice.META``; a UsageError naming the choices otherwise."""
    try:
        return InitChoice(init)
    except ValueError:
        raise UsageError(f"unknown --init {init!r}: use one of "
                         f"{', '.join(c.value for c in InitChoice)}") from None


def construct(
    model: nn.Module | Callable[[], nn.Module],
    init: InitChoice,
    device: Device | None,
    build: Callable[[Any], nn.Module],
    values_needed: bool = True,
) -> Construction:
    """Build the audit's model as ``init`` says.

    ``build`` is the audit's own builder (it copies instances and answers
    ``torch.cuda`` queries for the simulated GPUs); here it is called with
    ``model`` for a CPU build, or with a factory that builds under the meta
    device (``device``: the target; None: ``--device keep``). ``values_needed``
    False (the fake engine, whose move keeps no values) lets a CPU build zero
    its large tensors instead of drawing random values into them
    (:class:`_ZeroLargeRandomFills`).
    """
    if isinstance(model, nn.Module):
        if init is InitChoice.META:
            raise UsageError("--init meta needs a model class or factory, not a model that is "
                             "already built: pass the class or a function returning the model")
        return Construction(build(model), on_meta=False)
    if device == "meta" and init is InitChoice.META:
        raise UsageError("--init meta cannot tell moved tensors from unmoved ones when the "
                         "target is meta itself: use --device cuda, or --init cpu")
    if init is InitChoice.CPU or device == "meta":
        return _built(build, model, note="init: cpu (as requested)" if init is InitChoice.CPU else "",
                      values_needed=values_needed)

    def on_meta() -> nn.Module:
        with torch.device("meta"), _NoValueFillsOnMeta():  # type: ignore[no-untyped-call]
            return model()

    try:
        meta_model, meta_assignments = build_recorded(lambda: build(on_meta))
    except Exception as exc:
        if init is InitChoice.META:
            raise LoadError(f"building the model on the meta device raised {one_line(exc)}: "
                            "use --init cpu (--debug shows the traceback)") from exc
        return _built(build, model, note=f"init: cpu (auto: building on the meta device raised "
                                         f"{one_line(exc)}; built on the CPU instead)",
                      values_needed=values_needed)
    if init is InitChoice.META:
        return Construction(meta_model, on_meta=True, note=f"init: meta (as requested): {_META_NOTE}",
                            assignments=meta_assignments)
    need, have = state_nbytes(meta_model), available_memory()
    sizes = f"{human_bytes(need)} of parameters and buffers, {human_bytes(have)} of memory available"
    if need <= COMFORTABLE_FRACTION * have:
        del meta_model, meta_assignments
        return _built(build, model, note=f"init: cpu (auto: {sizes})", values_needed=values_needed)
    return Construction(meta_model, on_meta=True,
                        note=f"init: meta (auto: {sizes}, too much to build on the CPU): {_META_NOTE}",
                        assignments=meta_assignments)


_aten = torch.ops.aten
# In-place ops whose only effect is on values (random and constant fills), which meta tensors do not
# have; the random ones (and clamp_, erfinv_) only on floating tensors, where the fill cannot raise.
_VALUE_FILLS = frozenset({_aten.zero_.default, _aten.fill_.Scalar})
_FLOATING_VALUE_FILLS = frozenset({
    _aten.normal_.default, _aten.uniform_.default, _aten.random_.default, getattr(_aten.random_, "from"),
    _aten.random_.to, _aten.exponential_.default, _aten.bernoulli_.float, _aten.log_normal_.default,
    _aten.cauchy_.default, _aten.geometric_.default, _aten.erfinv_.default, _aten.clamp_.default,
})
_RANDOM_FILLS = frozenset(op for op in _FLOATING_VALUE_FILLS if torch.Tag.nondeterministic_seeded in op.tags)


class _NoValueFillsOnMeta(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's mode is untyped
    """A meta build skips the weight initialisers' fills: they only write values, which meta tensors lack.

    ``nn.Linear``'s ``kaiming_uniform_`` and a ``post_init`` that draws every
    weight with ``normal_`` otherwise run a Python meta kernel per tensor,
    most of the build of a model with thousands of experts. The tensor comes
    back unchanged, as the fill would leave it (shape, dtype, device). This
    runs below autograd, so an in-place fill of a leaf that requires grad
    outside ``no_grad`` still raises, as it would on the CPU.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if (func in _VALUE_FILLS or func in _FLOATING_VALUE_FILLS) and args:
            t = args[0]
            if (isinstance(t, torch.Tensor) and t.device.type == "meta"
                    and (func in _VALUE_FILLS or t.is_floating_point())):
                return t
        return func(*args, **(kwargs or {}))


class _ZeroLargeRandomFills(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's mode is untyped
    """A CPU build for the fake engine zeroes its large floating tensors instead of drawing random values.

    Drawing the initial weights (``kaiming_uniform_``, ``normal_``...) is most
    of a CPU build: about three quarters of building regnet_y_128gf. The fake
    engine's ``.to()`` keeps no values, and its data-dependent handling
    (:mod:`placecheck.engines.datadep`) keeps the values of tensors up to
    ``KNOWN_BYTES_LIMIT`` only; so the tensors above it are zeroed (a
    memset), as a meta build's unmoved tensors are, and the small ones keep
    their random values. Shapes, dtypes, devices and autograd are the fill's.
    """

    def __init__(self, limit: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.limit = limit

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if func in _RANDOM_FILLS and args:
            t = args[0]
            if (isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.is_floating_point()
                    and t.nelement() * t.element_size() > self.limit):
                return t.zero_()
        return func(*args, **(kwargs or {}))


def _built(build: Callable[[Any], nn.Module], factory: Callable[[], nn.Module], note: str,
           values_needed: bool = True) -> Construction:
    """A CPU build by ``factory``, recording where the user's code assigned each module attribute."""
    from placecheck.engines.datadep import KNOWN_BYTES_LIMIT

    def built() -> nn.Module:
        if values_needed:
            return build(factory)
        with _ZeroLargeRandomFills(KNOWN_BYTES_LIMIT):
            return build(factory)

    model, assignments = build_recorded(built)
    return Construction(model, on_meta=False, note=note, assignments=assignments)


_META_NOTE = ("built on the meta device, no memory for weights; tensors .to() did not move are "
              "reported on the default device, with zeros for values")


def move_from_meta(model: nn.Module, engine: Engine) -> nn.Module:
    """Materialise a meta-built model on the target, as ``.to(device)`` would place it.

    Under simulated CUDA the user's own ``.to()`` runs (inside the fake mode
    it turns meta tensors into fake CUDA tensors, overrides of ``to`` and
    ``_apply`` included). A real device cannot copy out of a meta tensor, so
    there ``to_empty()`` allocates the registered state uninitialised
    (``_apply`` overrides run; an override of ``to`` itself does not).
    """
    if engine.simulated:
        return move_model(model, engine)
    moved = model.to_empty(device=engine.device)
    return moved if isinstance(moved, nn.Module) else model


@dataclass
class _Materialiser:
    """Gives each meta tensor a replacement on ``device``, the same one each time it is met."""

    device: torch.device
    fake: bool
    """True inside a fake mode: tensors beyond the budget may be fake there."""
    budget: int
    replaced: dict[int, torch.Tensor] = field(default_factory=dict)
    originals: list[torch.Tensor] = field(default_factory=list)
    """Keeps each replaced tensor alive, so that no id in ``replaced`` is reused."""

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta" or isinstance(t, _UNINITIALIZED):
            return t
        if id(t) in self.replaced:
            return self.replaced[id(t)]
        nbytes = t.nelement() * t.element_size()
        if self.fake and nbytes > self.budget:
            new = torch.empty_like(t, device=self.device)  # a fake tensor: no memory
        else:
            self.budget -= nbytes
            with _real_tensors() if self.fake else contextlib.nullcontext():
                new = torch.zeros(t.shape, dtype=t.dtype, device=self.device)
        if isinstance(t, nn.Parameter):
            new = nn.Parameter(new, requires_grad=t.requires_grad)
        self.replaced[id(t)] = new
        self.originals.append(t)
        return new


def _real_tensors() -> contextlib.AbstractContextManager[Any]:
    from placecheck.engines.compat import unset_fake_temporarily

    return unset_fake_temporarily()


def leftovers_to_default_device(model: nn.Module, snapshot: Any = None,
                                 device: str | torch.device = "cpu") -> int:
    """Put every tensor still on ``meta`` after the move on ``device``; return how many.

    They are what ``.to()`` did not move: attributes, tensors in containers
    and helper objects, modules in plain lists, registered tensors an override
    kept back. After a CPU build they would be CPU tensors, so that is what
    the walk must report and what the forward pass must meet (a 0-dim CPU
    tensor is a legal scalar beside CUDA tensors; a 0-dim meta one is not).
    References shared before stay shared. ``snapshot`` (the walk's
    :class:`~placecheck.checks.walk.Snapshot`) learns the new identities, so a plain
    reference to a registered tensor is still recognised as one.
    """
    from placecheck.engines.compat import active_fake_mode

    materialiser = _Materialiser(torch.device(device), fake=active_fake_mode() is not None,
                                 budget=REAL_LEFTOVER_BUDGET)
    replace_tensors(model, materialiser.tensor)
    if snapshot is not None:
        for old_id, new in materialiser.replaced.items():
            for table in (snapshot.params, snapshot.buffers):
                if old_id in table:
                    table[id(new)] = table[old_id]
            snapshot.keep.append(new)
    return len(materialiser.replaced)


def materialise_lazy(model: nn.Module, inputs: tuple[tuple[Any, ...], dict[str, Any], str],
                      device: Device) -> bool:
    """Give uninitialised ``nn.Lazy*`` parameters their shapes with one forward on ``device`` (where
    the model was built: cpu, or meta); True if it ran.

    Neither simulated engine can move an uninitialised parameter and keep it
    uninitialised (``.to()`` makes a plain 0-element tensor of it), and a
    lazy module materialises on whatever device its parameters report; the
    placement after ``.to()`` is the same either way: lazy parameters follow it.
    """
    lazy = (UninitializedParameter, UninitializedBuffer)
    if not any(isinstance(t, lazy) for t in [*model.parameters(), *model.buffers()]):
        return False
    from placecheck.model.inputs import move_inputs

    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(*move_inputs(inputs[0], device), **move_inputs(inputs[1], device))
    except Exception:
        return False  # the traced forward will report what is wrong
    finally:
        model.train(was_training)
    return True
