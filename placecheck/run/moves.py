"""The script's module moves: every ``Module.to()``/``.cuda()`` to CUDA walked at that moment.

The walk (:mod:`placecheck.checks.walk`, the same one ``audit`` runs) compares the module before and after
the move and reports what ``.to()`` left behind (PC101-PC105) at the line of the move. Parameters
keep their identity across the move (``torch.__future__``'s swap flag), as on a real GPU, so an
optimizer built before the move stays valid; unless the script asked for new ones.

The engine keeps that swap flag on for the whole run, but the flag changes more than moves: torch's
``load_state_dict(assign=True)`` swaps the loaded tensors into the module's Parameter objects under it,
and without it (torch's default) puts new Parameter objects in the module (``setattr``), which an
optimizer built before the load does not hold. So a load with ``assign=True`` runs under the script's
own flag, as on a GPU (PC308 then sees the optimizer's stale parameters).
"""

from __future__ import annotations

import dataclasses
import typing
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.codes import Code
from placecheck.checks.provenance import stray_package
from placecheck.checks.walk import Snapshot, walk
from placecheck.engines.calls import device_of, read_module_move
from placecheck.engines.cudaapi import current_index
from placecheck.engines.sources import here
from placecheck.findings import rules
from placecheck.findings.finding import Finding

_SET_SWAP = torch.__future__.set_swap_module_params_on_conversion
"""torch's own setter of the swap flag (the run patches the public one to remember the script's wish)."""

if typing.TYPE_CHECKING:
    from placecheck.run.session import Recording


def _cuda_destination(func: Callable[..., Any], module: nn.Module, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> torch.device | None:
    """The CUDA device a ``Module.to(...)``/``.cuda(...)`` call moves to, or None (read by
    :func:`placecheck.engines.calls.read_module_move`: the parser ``Module.to`` itself uses)."""
    placement = read_module_move(func, (module, *args), kwargs, current_index())
    return placement.device if placement is not None and placement.to_cuda else None


def raised_by_swap(exc: BaseException) -> bool:
    """``exc`` (or its cause) was raised inside ``torch.utils.swap_tensors``: ``Module._apply`` could not
    swap a parameter for its moved copy. Decided from where it was raised, not from its text."""
    swap = getattr(torch.utils.swap_tensors, "__wrapped__", torch.utils.swap_tensors)
    codes = {getattr(swap, "__code__", None)}
    seen: BaseException | None = exc
    while seen is not None:
        tb = seen.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in codes or tb.tb_frame.f_code.co_name == "swap_tensors":
                return True
            tb = tb.tb_next
        seen = seen.__cause__
    return False


class Moves:
    """The modules the script moved, and the walks of those moves."""

    def __init__(self, recorder: Recording) -> None:
        self.recorder = recorder
        self.moved_modules: list[weakref.ref[nn.Module]] = []
        self._walked: set[tuple[int, str]] = set()
        self._moving = 0
        self.user_overwrite = False
        """The script asked for new Parameter objects on ``.to()`` (``torch.__future__``)."""
        self.user_swap = False
        """The script set ``torch.__future__``'s swap flag (torch's default: off)."""
        self.strays: dict[int, tuple[str, str, str]] = {}
        """``id()`` of each stray tensor (PC101) a move left behind -> its finding's key; a torch call of
        the script that receives one marks that finding used (:meth:`touched`)."""
        self.used: set[tuple[str, str, str]] = set()
        self._owners: dict[tuple[str, str, str], str] = {}
        """Each stray's finding key -> the installed package defining the class of the module holding the
        stray ("" for the user's own)."""
        self._derived: dict[int, tuple[weakref.ref[torch.Tensor], tuple[str, str, str]]] = {}
        """``id()`` of each tensor a torch call computed from a stray -> (the tensor, the stray's key)."""
        self._fed: set[tuple[str, str, str]] = set()
        """Strays that (themselves or through a result) fed a device mismatch or a CPU index copied to
        the device: the evidence that keeps their finding as it is."""
        self._moved: set[tuple[str, str, str]] = set()
        """Strays whose results the script copied to the device (``.to(x.device)``)."""
        self._not_scalar: set[tuple[str, str, str]] = set()
        """Strays used at least once as something other than a 0-dim scalar."""

    def module_to(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``nn.Module.to``: the move, then its walk."""
        def to(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return self._move_module(original, nn.Module.to, module, args, kwargs)
        return to

    def module_cuda(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``nn.Module.cuda``: the move, then its walk."""
        def cuda(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return self._move_module(original, nn.Module.cuda, module, args, kwargs)
        return cuda

    def _move_module(self, original: Callable[..., Any], func: Callable[..., Any], module: nn.Module,
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``module.to(...)`` as the script asked, then the walk of what the move left behind."""
        if self._moving or self.recorder.quieted:
            return original(module, *args, **kwargs)
        dest = _cuda_destination(func, module, args, kwargs)
        if dest is not None and (dest.index or 0) >= self.recorder.gpus:
            raise self.recorder.no_such_gpu(dest)
        line, _ = here()
        snapshot = Snapshot.take(module) if dest is not None else None
        self._moving += 1
        # the engine needs new tensors from .to(); a GPU keeps each Parameter object unless the script
        # asked for new ones (set_overwrite_module_params_on_conversion(True))
        _SET_SWAP(not self.user_overwrite)
        try:
            with self.recorder.quiet():  # the move's own copies are not the script's transfers
                moved = original(module, *args, **kwargs)
        finally:
            _SET_SWAP(True)
            self._moving -= 1
        if dest is None:
            return moved
        if self.recorder.ranks is not None:  # one rank of a torchrun launch: its own GPU?
            placed = next(iter([*module.parameters(), *module.buffers()]), None)
            if placed is not None:
                name = type(module).__name__
                self.recorder.ranks.placed_at(placed.device, f"{name}.to put the model", line, name)
        self.moved_modules.append(weakref.ref(module))
        key = (id(module), str(dest))
        if key in self._walked:
            return moved
        self._walked.add(key)
        with self.recorder.quiet():
            result = walk(module, device_of(dest), snapshot)
        for f in result.findings:
            found = dataclasses.replace(f, source=f.source or line, details=(
                *f.details, ("moved at", line), ("model", type(module).__name__)))
            self.recorder.add(found)
            if f.code == Code.PC101:
                stray = (found.code, found.source, found.where)
                self._owners[stray] = stray_package(f, module)
                self.strays.update({tid: stray for tid, path in result.origins.items() if path == f.where})
        for note in result.notes:
            self.recorder.notes[note] = None
        return moved

    def touched(self, tensors: Iterable[torch.Tensor]) -> None:
        """A torch call of the script received ``tensors``: the strays among them are used."""
        for t in tensors:
            key = self.strays.get(id(t))
            if key is not None:
                self.used.add(key)
                if t.dim() != 0:
                    self._not_scalar.add(key)

    def _stray_of(self, t: torch.Tensor) -> tuple[str, str, str] | None:
        """The key of the stray ``t`` is, or was computed from (None: neither)."""
        key = self.strays.get(id(t))
        if key is not None:
            return key
        derived = self._derived.get(id(t))
        return derived[1] if derived is not None and derived[0]() is t else None

    def derived(self, out: torch.Tensor, inputs: Iterable[torch.Tensor], moved: bool) -> None:
        """A torch call computed ``out`` from ``inputs``: a result of a stray is followed as the stray
        (``moved``: the call was a ``.to()``/``.cuda()``, and ``out`` is on a device)."""
        for t in inputs:
            key = self._stray_of(t)
            if key is None:
                continue
            if moved and out.device.type != "cpu":
                self._moved.add(key)
            elif out.device.type == "cpu" and id(out) not in self.strays:
                self._derived[id(out)] = (weakref.ref(out), key)
            return

    def prune(self) -> None:
        """Forget the results of strays that no longer exist (their ids may be reused)."""
        self._derived = {k: v for k, v in self._derived.items() if v[0]() is not None}

    def fed(self, t: torch.Tensor) -> None:
        """``t`` fed a device mismatch, or was a CPU index copied to a device: if it is (or came from) a
        stray, that stray's finding stands."""
        key = self._stray_of(t)
        if key is not None:
            self._fed.add(key)

    def verdict(self, key: tuple[str, str, str], finding: Finding) -> Finding:
        """A stray's finding (PC101) as the whole run shows it, decided as ``audit`` decides it from its
        forward (:func:`placecheck.findings.rules.stray_verdict`): one the script used but never let
        meet a device tensor (it used it only on the host or as a 0-dim scalar, or copied the results
        to the device) is ``info`` saying how; one it never used, held by a module an installed package
        defines, is ``info`` naming the package."""
        if key not in self._owners or key in self._fed:
            return finding
        if key in self.used:
            how = ("moved-copies" if key in self._moved else
                   "scalar" if key not in self._not_scalar else "cpu-only")
            return rules.stray_verdict(finding, how, finding.expected, self._owners[key])
        return rules.stray_verdict(finding, "unused-run", finding.expected, self._owners[key])

    def unswappable(self, line: str) -> None:
        """The fake engine could not swap a parameter for its moved copy: a limit of the simulation."""
        self.recorder.limit = (
            f"run: stopped at {line or 'a module move'}: the fake engine could not move the module there "
            "(its parameters are still held by the graph of a backward it simulated, which a real backward "
            "would have freed); a limit of the simulation, not a bug of the code: run with --engine tagged "
            "to check the rest")

    def overwrite_flag(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``torch.__future__.set_overwrite_module_params_on_conversion``: the script's wish, remembered."""
        def set_overwrite_module_params_on_conversion(value: bool) -> None:
            self.user_overwrite = bool(value)  # the engine's own setting (True) stays in force
        return set_overwrite_module_params_on_conversion

    def swap_flag(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``torch.__future__.set_swap_module_params_on_conversion``: the script's wish, remembered (it
        decides what ``load_state_dict(assign=True)`` does: :meth:`load_state_dict`)."""
        def set_swap_module_params_on_conversion(value: bool) -> None:
            self.user_swap = bool(value)  # the engine's own setting (True) stays in force for moves
        return set_swap_module_params_on_conversion

    def load_state_dict(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``nn.Module.load_state_dict`` under the script's swap flag (off unless the script set it), not
        the session's: the loaded values are copied into the existing parameters (``param.copy_``), as on
        a GPU, or with ``assign=True`` the module gets new Parameter objects (``setattr`` of the loaded
        tensors). Under the session's flag every load swapped, which a parameter with a weak reference
        refuses (an LSTM's flat weights hold one to each)."""
        def load_state_dict(module: nn.Module, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
            if self.user_swap:
                return original(module, state_dict, *args, **kwargs)
            _SET_SWAP(False)
            try:
                return original(module, state_dict, *args, **kwargs)
            finally:
                _SET_SWAP(True)
        return load_state_dict
