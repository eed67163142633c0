"""What a whole script does with devices: the recorder behind ``placecheck run``.

In the style of ``torch/utils/flop_counter.py``: the public :class:`RunRecorder`
owns the state; a private ``TorchFunctionMode`` only hands each torch call to
it; a few patches (module moves, optimizers, data loaders, ``torch.load`` /
``torch.save``) tell it what the script is doing. :meth:`RunRecorder.findings`
turns what it saw into findings afterwards.

It runs on the real-valued engine (:func:`placecheck.tagged.tagged_cuda`):
values are real (a script prints losses, calls ``.item()``, branches on
data) and backward runs, while every tensor reports its simulated device.
What the recorder adds on top of the engine:

- an op mixing devices is recorded with the user's line, which tensor was
  off (a batch element and the loader line it came from, a module's buffer
  named by the script's variable, a tensor created at a line), then the
  offending argument is moved and the call runs again, so the script goes on
  and every mismatch is found;
- host syncs: in a module's forward they are PC204; in the loop itself one
  info finding per line, counting calls per optimizer step;
- in forward: a tensor made on the CPU then copied to the device (PC202), a
  layer built there (PC203), CPU index tensors indexing device tensors (PC205);
- copies of the same host tensor to the device at every step (PC209), and
  ``non_blocking`` copies of unpinned batches (a note);
- every ``Module.to()``/``.cuda()`` to CUDA is walked at that moment (PC101-PC105);
- before each optimizer step: state left on another device after a resume
  (PC307), and parameters the forward no longer uses (PC308);
- ``torch.load`` without ``map_location`` of storages the simulated machine
  lacks (PC301, before the load fails as it would there).

Parameters keep their identity across ``.to()`` (``torch.__future__``'s swap
flag) as on a real GPU, so an optimizer built before the move stays valid.

Not reentrant: one recorder at a time per process (the hooks are global).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any
from unittest import mock

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from placecheck.compat import DisableTorchFunctionSubclass, parse_to
from placecheck.devices import human_bytes
from placecheck.errors import PlacecheckError, one_line
from placecheck.finding import Finding, Severity
from placecheck.rules import rule
from placecheck.run.sites import called_from_user, here, library_caller, names_of, raised_at
from placecheck.tagged import SimulatedDeviceMismatchError, SimulatedTensor
from placecheck.walk import Snapshot, walk

_HOST_SYNC = frozenset({torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.__bool__,
                        torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__,
                        torch.Tensor.__format__, torch.Tensor.__repr__})
_SYNC_NAMES = {"__bool__": "bool()", "__int__": "int()", "__float__": "float()", "__index__": "an index",
               "__format__": "formatting", "__repr__": "printing"}
_MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda})
_FACTORIES = frozenset(getattr(torch, name) for name in (
    "zeros", "ones", "empty", "full", "tensor", "as_tensor", "arange", "linspace", "rand", "randn",
    "randint", "randperm", "eye", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like",
    "randn_like"))
# Ops whose index arguments may be CPU tensors on a GPU (an implicit copy, not an error).
_INDEX_OPS = frozenset({torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put_,
                        torch.Tensor.index_put, torch.index_put})
_MAX_RETRIES = 4
_MAX_TRACKED = 50_000
_PIN_WARNING = "'pin_memory' argument is set as true but no accelerator is found"


class StopRun(BaseException):
    """Raised into the script to end the run early (``--steps`` reached, ``--timeout``).

    A ``BaseException``, so the script's own ``except Exception`` does not swallow it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Origin:
    """Where a plain (CPU) tensor the script uses came from."""

    kind: str
    """``batch`` (an element of a DataLoader batch) or ``created`` (a factory call in the user's code)."""
    path: str
    """``batch[1]`` for a batch element, the factory's name for a creation."""
    line: str
    """The loop line that produced the batch, or the line that created the tensor."""
    pinned: bool = False
    """The batch came from a DataLoader with ``pin_memory=True``."""
    module: str = ""
    """For a creation: the class of the module whose forward made it ("" outside any forward)."""


@dataclass
class _Tracked:
    ref: weakref.ref[torch.Tensor]
    origin: _Origin


@dataclass
class _Copies:
    """Host-to-device copies of one host tensor at one line, by optimizer step."""

    ref: weakref.ref[torch.Tensor]
    nbytes: int
    device: str
    steps: set[int] = field(default_factory=set)


class _ScriptMode(TorchFunctionMode):
    """Hands every torch call to the recorder; holds no state of its own."""

    def __init__(self, recorder: RunRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return self.recorder.on_call(func, args, kwargs or {})


def _tensor_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[int, torch.Tensor]]:
    out = []
    for pos, a in enumerate((*args, *kwargs.values())):
        if isinstance(a, torch.Tensor):
            out.append((pos, a))
        elif isinstance(a, list | tuple):
            out.extend((pos, x) for x in a if isinstance(x, torch.Tensor))
    return out


def _replace(obj: Any, moved: dict[int, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return moved.get(id(obj), obj)
    if isinstance(obj, dict):
        return {k: _replace(v, moved) for k, v in obj.items()}
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_replace(v, moved) for v in obj)
    if isinstance(obj, list):
        return [_replace(v, moved) for v in obj]
    return obj


def _op_name(func: Callable[..., Any]) -> str:
    name = getattr(func, "__name__", str(func))
    qual = getattr(func, "__qualname__", name)
    return f"Tensor.{name}" if qual.startswith("TensorBase.") or qual.startswith("Tensor.") else name


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _batch_leaves(batch: Any, path: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """``("batch[1]", tensor)`` for every tensor in a collated batch (tuples, lists, dicts)."""
    if isinstance(batch, torch.Tensor):
        yield path, batch
    elif depth < 4 and isinstance(batch, dict):
        for k, v in batch.items():
            yield from _batch_leaves(v, f"{path}[{k!r}]", depth + 1)
    elif depth < 4 and isinstance(batch, list | tuple):
        for i, v in enumerate(batch):
            yield from _batch_leaves(v, f"{path}[{i}]", depth + 1)


def _cuda_destination(args: tuple[Any, ...], kwargs: dict[str, Any], cuda_call: bool) -> torch.device | None:
    """The CUDA device a ``Module.to(...)``/``.cuda(...)`` call moves to, or None."""
    if cuda_call:
        dev = args[0] if args else kwargs.get("device")
        index = dev if isinstance(dev, int) else (torch.device(dev).index if dev is not None else None)
        return torch.device("cuda", index or 0)
    try:
        device = parse_to(*args, **kwargs)[0]
    except (TypeError, RuntimeError):
        return None
    if device is None or device.type != "cuda":
        return None
    return torch.device("cuda", device.index or 0)


def _non_blocking(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return any(isinstance(a, bool) and a for a in args[1:3])  # to(device, non_blocking) / cuda(device, nb)


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A tagged tensor's data as an ordinary CPU tensor (what a real GPU would copy back to save)."""
    if isinstance(t, SimulatedTensor):
        with DisableTorchFunctionSubclass():
            return t.as_subclass(torch.Tensor)
    return t


def _map_tree(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor], undo: _Undo | None = None,
              depth: int = 0) -> Any:
    """``obj`` with ``fn`` applied to every tensor in its dicts, lists and tuples (rebuilt, not mutated)
    and in the modules in it (replaced in place; ``undo`` collects the originals)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if depth > 32:
        return obj
    if isinstance(obj, dict):
        items = [(k, _map_tree(v, fn, undo, depth + 1)) for k, v in obj.items()]
        try:
            out = type(obj)()
        except TypeError:
            out = {}
        out.update(items)
        metadata = getattr(obj, "_metadata", None)
        if metadata is not None:  # a state_dict's per-module versions, which load_state_dict reads
            out._metadata = metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list):
        return [_map_tree(v, fn, undo, depth + 1) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_map_tree(v, fn, undo, depth + 1) for v in obj)
    if isinstance(obj, nn.Module):  # a pickled whole module: its tensors are replaced in place
        _replace_module_tensors(obj, fn, undo)
    return obj


_Undo = list[tuple[dict[str, Any], str, Any]]


def _replace_module_tensors(model: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor],
                            undo: _Undo | None) -> None:
    """Every parameter and buffer of ``model`` replaced by ``fn`` of it (parameters stay parameters);
    ``undo`` collects what was replaced, for :func:`_restore`."""
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                new = fn(param)
                if new is not param:
                    if undo is not None:
                        undo.append((module._parameters, name, param))
                    module._parameters[name] = nn.Parameter(new, requires_grad=param.requires_grad)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                new = fn(buffer)
                if new is not buffer:
                    if undo is not None:
                        undo.append((module._buffers, name, buffer))
                    module._buffers[name] = new


def _restore(undo: _Undo) -> None:
    for table, name, original in reversed(undo):
        table[name] = original


class RunRecorder:
    """Records a whole script's use of devices under simulated CUDA and turns it into findings.

    ``gpus`` is the simulated machine's GPU count; ``steps`` ends the run
    (:class:`StopRun`) after that many optimizer steps (0: never).
    """

    def __init__(self, gpus: int = 1, steps: int = 2) -> None:
        self.gpus = gpus
        self.max_steps = steps
        self.target = "cuda:0"
        self.steps = 0
        """Optimizer steps completed."""
        self.step_line = ""
        self.found: dict[tuple[str, str, str], Finding] = {}
        self.notes: dict[str, None] = {}
        self.syncs: dict[tuple[str, str], list[Any]] = {}
        """(source, call) -> [count, in-forward module name or "", device, optimizer steps it ran in]."""
        self.copies: dict[tuple[str, int], _Copies] = {}
        self.batch_copies: dict[tuple[str, str, bool], dict[str, None]] = {}
        """(copy line, loop line, pinned) -> batch paths copied with the other non_blocking than pinned."""
        self.moved_modules: list[weakref.ref[nn.Module]] = []
        self._walked: set[tuple[int, str]] = set()
        self.optimizers: weakref.WeakKeyDictionary[torch.optim.Optimizer, str] = weakref.WeakKeyDictionary()
        self._resumed: weakref.WeakKeyDictionary[torch.optim.Optimizer, str] = weakref.WeakKeyDictionary()
        self._opt_reported: set[tuple[int, str]] = set()
        self._tracked: dict[int, _Tracked] = {}
        self._loaders: dict[int, tuple[bool, str]] = {}
        self._forward_stack: list[nn.Module] = []
        self._roots: dict[int, nn.Module] = {}
        """Top-level modules called since the last optimizer step."""
        self._quiet = 0
        self._moving = 0
        self.user_overwrite = False
        """The script asked for new Parameter objects on ``.to()`` (``torch.__future__``)."""
        self.stopped_by_steps = False
        self._saved: dict[str, list[str]] = {}
        """Files this run saved with torch.save -> the device of each tensor, in order."""
        self.reported_errors: set[int] = set()
        """ids of exceptions raised to reproduce a failure already reported (a PC301 load)."""

    # -- the session ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def recording(self) -> Iterator[RunRecorder]:
        """Inside the real-valued engine's session: record every call, move, step and load."""
        from torch.nn.modules import module as module_mod
        from torch.optim import optimizer as optimizer_mod
        from torch.utils.data import dataloader

        swap = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        handles = [
            optimizer_mod.register_optimizer_step_pre_hook(self._before_step),
            optimizer_mod.register_optimizer_step_post_hook(self._after_step),
            module_mod.register_module_forward_pre_hook(self._forward_enter),
            module_mod.register_module_forward_hook(self._forward_exit, always_call=True),
            module_mod.register_module_module_registration_hook(self._module_registered),
        ]
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(warnings.catch_warnings())
                warnings.filterwarnings("ignore", message=_PIN_WARNING)  # the simulation has no pinned memory
                for owner, name, make in (
                    (nn.Module, "to", self._module_to), (nn.Module, "cuda", self._module_cuda),
                    (torch.optim.Optimizer, "__init__", self._optimizer_init),
                    (torch.optim.Optimizer, "load_state_dict", self._optimizer_load),
                    (dataloader.DataLoader, "__iter__", self._loader_iter),
                    (dataloader._BaseDataLoaderIter, "__next__", self._loader_next),
                    (torch, "load", self._torch_load), (torch, "save", self._torch_save),
                    (SimulatedTensor, "__repr__", self._simulated_repr),
                    (torch.__future__, "set_overwrite_module_params_on_conversion", self._overwrite_flag),
                ):
                    original = getattr(owner, name)
                    stack.enter_context(mock.patch.object(owner, name, make(original)))
                stack.enter_context(_ScriptMode(self))
                yield self
        finally:
            for handle in handles:
                handle.remove()
            torch.__future__.set_swap_module_params_on_conversion(swap)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """placecheck's own torch calls: not recorded."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def _add(self, finding: Finding, key_extra: str = "") -> None:
        key = (finding.code, finding.source, key_extra or finding.where)
        self.found.setdefault(key, finding)

    # -- per call -------------------------------------------------------------------------------------
    def on_call(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One torch call: run it, recording syncs, copies and mismatches."""
        if self._quiet:
            return func(*args, **kwargs)
        if func in _HOST_SYNC and args and isinstance(args[0], torch.Tensor) \
                and args[0].device.type == "cuda":
            self._record_sync(func.__name__, args[0])
            with self.quiet():
                if func is torch.Tensor.__format__ and args[0].dim() == 0 and len(args) > 1:
                    # f"{loss:.3f}": a GPU formats the value (Tensor.__format__ does so only for
                    # exact torch.Tensor, not for the engine's subclass)
                    return args[0].item().__format__(args[1])
                return func(*args, **kwargs)
        if func is torch.Tensor.module_load and len(args) > 1 and not kwargs.get("assign", False):
            # load_state_dict under the swap flag: a copy into the parameter, legal across devices
            # on a GPU as copy_ is (the tagged engine does not list module_load as a copy)
            return args[0].copy_(args[1]).detach()
        if func in _INDEX_OPS and args and isinstance(args[0], torch.Tensor) \
                and args[0].device.type == "cuda":
            self._implicit_index(func, args)
        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            out = self._repair(func, args, kwargs, exc)
        if isinstance(out, torch.Tensor) and out.device.type == "cuda" \
                and (out.device.index or 0) >= self.gpus:
            raise self._no_such_gpu(out.device)
        if func in _MOVES and isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
            self._record_move(func, args, kwargs, args[0], out)
        elif isinstance(out, torch.Tensor) and type(out) is torch.Tensor:
            if func in _FACTORIES:
                line = called_from_user()
                if line:
                    module = type(self._forward_stack[-1]).__name__ if self._forward_stack else ""
                    self._track(out, _Origin("created", f"torch.{_op_name(func)}", line, module=module))
            elif self._tracked:
                for _, t in _tensor_args(args, kwargs):
                    origin = self._origin(t)
                    if origin is not None:
                        self._track(out, origin)  # a view or a cast of a batch element keeps its origin
                        break
        return out

    def _no_such_gpu(self, device: torch.device) -> RuntimeError:
        """What CUDA raises for a device index the machine lacks (--gpus sets how many it has)."""
        return RuntimeError(f"CUDA error: invalid device ordinal ({device} on a machine with {self.gpus} "
                            f"GPU{'s' if self.gpus != 1 else ''}; placecheck run --gpus sets how many)")

    def _track(self, t: torch.Tensor, origin: _Origin) -> None:
        self._tracked[id(t)] = _Tracked(weakref.ref(t), origin)
        if len(self._tracked) > _MAX_TRACKED:  # a long stretch without optimizer steps
            self._prune()

    def _origin(self, t: torch.Tensor) -> _Origin | None:
        tracked = self._tracked.get(id(t))
        if tracked is None or tracked.ref() is not t:
            return None
        return tracked.origin

    def _prune(self) -> None:
        """Forget tensors that no longer exist (their ids may be reused)."""
        self._tracked = {k: v for k, v in self._tracked.items() if v.ref() is not None}
        self.copies = {k: v for k, v in self.copies.items() if v.ref() is not None or len(v.steps) > 1}

    def _repair(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                exc: Exception) -> Any:
        """Record a device mismatch, move the offending arguments to the majority device, run again.

        The mismatch is decided from the devices of the arguments (the engine's own decision, which
        it raises as SimulatedDeviceMismatchError), never from an error's text; any other error is the
        script's and propagates.
        """
        for _ in range(_MAX_RETRIES):
            if not isinstance(exc, SimulatedDeviceMismatchError):
                raise exc
            tensors = _tensor_args(args, kwargs)
            on_cuda = [t.device for _, t in tensors if t.device.type == "cuda"]
            if not on_cuda:
                raise exc
            reference = max(set(on_cuda), key=on_cuda.count)
            offending = [t for pos, t in tensors if t.device != reference
                         and not (t.device.type == "cpu" and t.dim() == 0)
                         and not (func in _INDEX_OPS and pos > 0)]
            if not offending:
                raise exc
            line, frame = here()
            moved: dict[int, torch.Tensor] = {}
            for t in offending:
                self._mismatch(func, t, reference, line, frame)
                with self.quiet():
                    moved[id(t)] = t.to(reference)
            args, kwargs = _replace(args, moved), _replace(kwargs, moved)
            try:
                return func(*args, **kwargs)
            except Exception as again:
                exc = again
        raise exc

    def _mismatch(self, func: Callable[..., Any], t: torch.Tensor, reference: torch.device, line: str,
                  frame: FrameType | None) -> None:
        """PC201 for one offending argument: what it is and where it came from."""
        r = rule("PC201")
        names = names_of(t, frame)
        named = f"`{names[0]}`" if names else f"a {t.device} tensor {tuple(t.shape)}"
        origin = self._origin(t)
        owner = self._module_owner(t, frame)
        in_module = self._forward_stack[-1] if self._forward_stack else None
        if origin is not None and origin.kind == "batch":
            what = f"{named} ({origin.path}, from the DataLoader at {origin.line})"
            where, origin_text = names[0] if names else origin.path, origin.line
            hint = (f"move every tensor of the batch to the device, not only the inputs: "
                    f"{names[0] if names else 'x'} = {names[0] if names else 'x'}.to(device)")
        elif owner:
            what, where, origin_text = f"`{owner}`", owner, owner
            holder = owner.rsplit(".", 1)[0]
            hint = (f"call {holder}.to(device) as for the model: .to() moves a module's registered "
                    "buffers, a loss's weight and pos_weight included")
        elif origin is not None:
            what = f"{named} (created by {origin.path} at {origin.line})"
            where, origin_text = names[0] if names else "", origin.line
            hint = (f"create it on the input's device in forward ({origin.path}(..., device=x.device))"
                    if in_module is not None else
                    f"create it on the device ({origin.path}(..., device=device)), or move it once before "
                    "the loop; a metric can also accumulate Python numbers")
        else:
            what, where, origin_text = named, names[0] if names else "", ""
            hint = f"move it to {reference} before this op (tensor.to(device))"
        if in_module is not None and not owner:
            where = where or type(in_module).__name__
        op = _op_name(func)
        details: tuple[tuple[str, str], ...] = (("op", op),)
        if origin is not None and origin.kind == "batch":  # placecheck fix moves it beside its siblings
            details += (("batch", origin.path),)
        message = (f"{op} mixed {reference} and {t.device}: {what} is on {t.device}; on a GPU this "
                   f"raises 'Expected all tensors to be on the same device'")
        self._add(Finding(
            code=r.code, kind=r.kind, severity=r.severity, where=where, message=message, hint=hint,
            source=line, device=str(t.device), expected=str(reference),
            dtype=str(t.dtype).removeprefix("torch."),
            shape=tuple(t.shape), nbytes=_nbytes(t), count=1, origin=origin_text,
            details=details), key_extra=f"{where}|{origin_text}")

    def _module_owner(self, t: torch.Tensor, frame: FrameType | None) -> str:
        """``criterion.weight`` when ``t`` is a parameter or buffer of a module the script names."""
        scopes: list[dict[str, Any]] = []
        scan = frame
        while scan is not None and len(scopes) < 6:
            scopes.append(scan.f_locals)
            scan = scan.f_back
        if frame is not None:
            scopes.append(frame.f_globals)
        for scope in scopes:
            for name, value in list(scope.items()):
                if isinstance(value, nn.Module) and not name.startswith("_"):
                    for tname, owned in [*value.named_buffers(), *value.named_parameters()]:
                        if owned is t:
                            return f"{name}.{tname}"
        return ""

    def _record_sync(self, name: str, t: torch.Tensor) -> None:
        line, _ = here()
        if not line:
            return
        module = type(self._forward_stack[-1]).__name__ if self._forward_stack else ""
        call = _SYNC_NAMES.get(name, f".{name}()")
        via = library_caller()
        if via:
            call = f"{call} in {via}"
        entry = self.syncs.setdefault((line, call),
                                      [0, module, str(t.device), set()])
        entry[0] += 1
        entry[3].add(self.steps)

    def _simulated_repr(self, original: Callable[..., str]) -> Callable[..., str]:
        recorder = self

        def __repr__(tensor: SimulatedTensor, *args: Any, **kwargs: Any) -> str:
            if not recorder._quiet and tensor.device.type == "cuda":
                recorder._record_sync("__repr__", tensor)
            with recorder.quiet():
                return original(tensor, *args, **kwargs)
        return __repr__

    def _record_move(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                     source: torch.Tensor, out: torch.Tensor) -> None:
        """A host-to-device copy: the same host tensor every step (PC209), pinned memory and non_blocking."""
        if out.device.type != "cuda" or source.device.type != "cpu" or out is source \
                or isinstance(source, nn.Parameter):  # a weak reference would stop .to() swapping it
            return
        line, _ = here()
        if not line:
            return
        origin = self._origin(source)
        if origin is not None and origin.kind == "batch":
            non_blocking = _non_blocking(func, args, kwargs)
            if non_blocking != origin.pinned:
                self.batch_copies.setdefault((line, origin.line, origin.pinned), {})[origin.path] = None
            return
        if origin is not None and origin.module:
            self._created_then_moved(origin, str(out.device), source)
            return
        key = (line, id(source))
        copies = self.copies.get(key)
        if copies is None or copies.ref() is not source:
            copies = self.copies[key] = _Copies(weakref.ref(source), _nbytes(source), str(out.device))
        copies.steps.add(self.steps)

    def _created_then_moved(self, origin: _Origin, device: str, t: torch.Tensor) -> None:
        """PC202: made on the host in forward, then copied to the device, on every call."""
        r = rule("PC202")
        self._add(Finding(
            code=r.code, kind=r.kind, severity=Severity.WARNING, where=origin.module, source=origin.line,
            device="cpu", expected=device, dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape),
            nbytes=_nbytes(t), count=1,
            message=(f"{origin.path} in {origin.module}.forward creates the tensor on the CPU and it is then "
                     f"copied to {device}: a host allocation and a blocking copy on every call"),
            hint=f"create it on the device directly: {origin.path}(..., device=x.device)"))

    def _implicit_index(self, func: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """PC205: a CPU index tensor indexing a device tensor (a host-to-device copy per call)."""
        index = args[1] if len(args) > 1 else None
        items = index if isinstance(index, tuple | list) else (index,)
        cpu = [t for t in items if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() > 0]
        if not cpu:
            return
        line, _ = here()
        if not line:
            return
        r = rule("PC205")
        self._add(Finding(
            code=r.code, kind=r.kind, severity=r.severity, source=line, device="cpu",
            where=type(self._forward_stack[-1]).__name__ if self._forward_stack else "",
            expected=str(args[0].device), dtype=str(cpu[0].dtype).removeprefix("torch."),
            shape=tuple(cpu[0].shape), nbytes=_nbytes(cpu[0]), count=1,
            message=(f"a CPU index tensor {tuple(cpu[0].shape)} indexes a {args[0].device} tensor: legal, "
                     "but PyTorch copies the index to the device (and waits) on every call"),
            hint="make the index on the device (torch.arange(n, device=x.device), idx.to(device) once)"))

    # -- module moves ----------------------------------------------------------------------------------
    def _module_to(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def to(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return self._move_module(original, module, args, kwargs, cuda_call=False)
        return to

    def _module_cuda(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def cuda(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return self._move_module(original, module, args, kwargs, cuda_call=True)
        return cuda

    def _move_module(self, original: Callable[..., Any], module: nn.Module, args: tuple[Any, ...],
                     kwargs: dict[str, Any], cuda_call: bool) -> Any:
        """``module.to(...)`` as the script asked, then the walk of what the move left behind."""
        if self._moving or self._quiet:
            return original(module, *args, **kwargs)
        dest = _cuda_destination(args, kwargs, cuda_call)
        if dest is not None and (dest.index or 0) >= self.gpus:
            raise self._no_such_gpu(dest)
        line, _ = here()
        snapshot = Snapshot.take(module) if dest is not None else None
        self._moving += 1
        # the engine needs new tensors from .to(); a GPU keeps each Parameter object unless the script
        # asked for new ones (set_overwrite_module_params_on_conversion(True))
        torch.__future__.set_swap_module_params_on_conversion(not self.user_overwrite)
        try:
            with self.quiet():  # the move's own copies are not the script's transfers
                moved = original(module, *args, **kwargs)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(True)
            self._moving -= 1
        if dest is None:
            return moved
        self.moved_modules.append(weakref.ref(module))
        key = (id(module), str(dest))
        if key in self._walked:
            return moved
        self._walked.add(key)
        with self.quiet():
            result = walk(module, str(dest), snapshot)
        for f in result.findings:
            self._add(dataclasses.replace(f, source=f.source or line,
                                          details=(*f.details, ("moved at", line),
                                                   ("model", type(module).__name__))))
        for note in result.notes:
            self.notes[note] = None
        return moved

    def _overwrite_flag(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def set_overwrite_module_params_on_conversion(value: bool) -> None:
            self.user_overwrite = bool(value)  # the engine's own setting (True) stays in force
        return set_overwrite_module_params_on_conversion

    # -- optimizers -------------------------------------------------------------------------------------
    def _optimizer_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original(opt, *args, **kwargs)
            if opt not in self.optimizers:
                self.optimizers[opt] = here()[0]
        return __init__

    def _optimizer_load(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def load_state_dict(opt: torch.optim.Optimizer, state_dict: Any) -> Any:
            self._resumed[opt] = here()[0]
            return original(opt, state_dict)
        return load_state_dict

    def _before_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with self.quiet():
            self._check_state(opt)
            self._check_params(opt)

    def _after_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.steps += 1
        self._roots.clear()
        self._prune()
        self.step_line = here()[0]
        if self.max_steps and self.steps >= self.max_steps:
            self.stopped_by_steps = True
            raise StopRun(f"after {self.steps} optimizer step{'s' if self.steps != 1 else ''} (--steps "
                          f"{self.max_steps})")

    def _check_state(self, opt: torch.optim.Optimizer) -> None:
        """PC307: optimizer state on another device than its parameter (a resume loaded before the move)."""
        r = rule("PC307")
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
                    off_bytes += _nbytes(value)
                    off_count += 1
                    devices.add(str(value.device))
                    param_devices.add(str(p.device))
                    state[key] = value.to(p.device)  # so the step runs on, as after the fix
            if not off_count:
                continue
            report_key = (id(opt), f"group{index}")
            if report_key in self._opt_reported:
                continue
            self._opt_reported.add(report_key)
            line = self._resumed.get(opt) or self.optimizers.get(opt, "")
            state_on, params_on = ", ".join(sorted(devices)), ", ".join(sorted(param_devices))
            self._add(Finding(
                code=r.code, kind=r.kind, severity=r.severity,
                where=f"{type(opt).__name__}.param_groups[{index}]",
                message=(f"{off_count} state tensor{'s' if off_count != 1 else ''} "
                         f"({human_bytes(off_bytes)}) "
                         f"of param group {index} {'are' if off_count != 1 else 'is'} on {state_on} while "
                         f"the parameters are on {params_on}: the first step mixes devices"),
                hint=("load_state_dict casts the state to where the parameters are at that moment: move "
                      "the model to the device before optimizer.load_state_dict (or build the optimizer "
                      "after the move)"),
                source=line, device=state_on, expected=params_on, nbytes=off_bytes, count=off_count,
                details=(("optimizer", type(opt).__name__),)))

    def _check_params(self, opt: torch.optim.Optimizer) -> None:
        """PC308: the forward since the last step used none of this optimizer's parameters."""
        roots = [m for m in self._roots.values() if any(p.requires_grad for p in m.parameters())]
        if not roots or id(opt) in {k[0] for k in self._opt_reported if k[1] == "stale"}:
            return
        held = {id(p) for group in opt.param_groups for p in group["params"]}
        used = {id(p): (type(m).__name__, name) for m in roots for name, p in m.named_parameters()}
        if held & set(used):
            return
        self._opt_reported.add((id(opt), "stale"))
        r = rule("PC308")
        names = [name for _, name in used.values()]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        model = ", ".join(sorted({cls for cls, _ in used.values()}))
        line = self.optimizers.get(opt, "")
        self._add(Finding(
            code=r.code, kind=r.kind, severity=r.severity, where=f"{type(opt).__name__}",
            message=(f"{type(opt).__name__} built at {line or 'an unknown line'} holds {len(held)} "
                     f"parameter{'s' if len(held) != 1 else ''} the forward no longer uses; the {model} "
                     f"the script runs has {len(names)} that no optimizer steps ({shown})"),
            hint=("build the optimizer from the model the script trains, after the model is re-created, "
                  "reloaded or moved: optimizer = Optim(model.parameters()) last"),
            source=line, count=len(names), module=model,
            details=(("optimizer", type(opt).__name__), ("parameters", shown))))

    def _module_registered(self, owner: nn.Module, name: str, submodule: nn.Module | None) -> None:
        """PC203: a layer with parameters built during a forward (an optimizer built before misses it)."""
        if not self._forward_stack or submodule is None \
                or isinstance(submodule, nn.modules.lazy.LazyModuleMixin):
            return  # nn.Lazy* follow .to() correctly
        devices = sorted({str(t.device) for t in [*submodule.parameters(), *submodule.buffers()]})
        if not devices:
            return  # nothing to place or to train (nn.ReLU built in forward)
        line, _ = here()
        target = next((str(t.device) for m in self._forward_stack for t in m.parameters()
                       if t.device.type == "cuda"), "")
        on_target = devices == [target]
        r = rule("PC203")
        self._add(Finding(
            code=r.code, kind=r.kind, severity=Severity.WARNING if on_target else r.severity,
            where=f"{type(owner).__name__}.{name}", source=line, device=", ".join(devices),
            expected=target,
            message=(f"{type(submodule).__name__} {name!r} is built during {type(owner).__name__}.forward "
                     f"on {', '.join(devices)}: " + (
                         "an optimizer built before the first forward does not hold its parameters"
                         if on_target else "the earlier .to() never saw it, and no optimizer holds it")),
            hint="build layers in __init__ (or use an nn.Lazy* module), then move the model and build the "
                 "optimizer"))

    def _forward_enter(self, module: nn.Module, args: Any) -> None:
        if not self._forward_stack:
            self._roots[id(module)] = module
        self._forward_stack.append(module)

    def _forward_exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._forward_stack and self._forward_stack[-1] is module:
            self._forward_stack.pop()

    # -- data loaders ------------------------------------------------------------------------------------
    def _loader_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __iter__(loader: Any) -> Any:
            iterator = original(loader)
            self._loaders[id(iterator)] = (bool(getattr(loader, "pin_memory", False)), here()[0])
            return iterator
        return __iter__

    def _loader_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __next__(iterator: Any) -> Any:
            batch = original(iterator)
            pinned, _ = self._loaders.get(id(iterator), (False, ""))
            line = here()[0]
            for path, t in _batch_leaves(batch, "batch"):
                if type(t) is torch.Tensor:
                    self._track(t, _Origin("batch", path, line, pinned))
            return batch
        return __next__

    # -- checkpoints ---------------------------------------------------------------------------------------
    def _torch_load(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
            with self.quiet():
                return self._load(original, f, map_location, args, kwargs)
        return load

    def _load(self, original: Callable[..., Any], f: Any, map_location: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        """``torch.load`` as on the simulated machine: storages restored where they were saved when it has
        that device (tagged), PC301 and the load's failure when it does not."""
        from placecheck.checkpoint import read_checkpoint
        from placecheck.checkpoint.preflight import device_findings

        line = here()[0]
        if map_location is None and (isinstance(f, str | bytes) or hasattr(f, "__fspath__")):
            try:
                meta = read_checkpoint(f)
            except (PlacecheckError, OSError):
                meta = None
            missing = device_findings(meta, self.target, self.gpus) if meta is not None else []
            missing = [m for m in missing if m.device != m.expected and "," not in m.device]
            if missing:
                for finding in missing:
                    self._add(dataclasses.replace(finding, source=line))
                have = f"torch.cuda.device_count() is {self.gpus}"
                error = RuntimeError(f"Attempting to deserialize object on CUDA device "
                                     f"{missing[0].device.partition(':')[2] or '0'} but {have}.")
                self.reported_errors.add(id(error))
                raise error
        locations: dict[int, str] = {}

        def remember(storage: Any, location: str) -> Any:
            locations[storage.data_ptr()] = location
            return storage

        loaded = original(f, remember, *args, **kwargs)
        saved_here = iter(self._saved.get(os.path.abspath(f), [])
                          if isinstance(f, str) or hasattr(f, "__fspath__") else [])

        def place(t: torch.Tensor) -> torch.Tensor:
            saved = next(saved_here, None) or locations.get(t.untyped_storage().data_ptr(), "cpu")
            dest = self._mapped(map_location, saved)
            if dest.type == "cuda":
                return SimulatedTensor.tag(_plain(t), dest)
            return t

        return _map_tree(loaded, place)

    def _mapped(self, map_location: Any, saved: str) -> torch.device:
        """Where ``torch.load(map_location=...)`` puts a storage saved on ``saved``."""
        if map_location is None:
            target = saved
        elif isinstance(map_location, dict):
            target = map_location.get(saved, saved)
        elif isinstance(map_location, str | torch.device):
            target = str(map_location)
        else:
            target = "cpu"  # a callable map_location: its storages are its business
        device = torch.device(target)
        return torch.device("cuda", device.index or 0) if device.type == "cuda" else device

    def _torch_save(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            devices: list[str] = []

            def host(t: torch.Tensor) -> torch.Tensor:
                devices.append(str(t.device))
                return _plain(t)

            undo: _Undo = []
            with self.quiet():
                try:
                    plain = _map_tree(obj, host, undo)
                    if isinstance(f, str) or hasattr(f, "__fspath__"):
                        # the file holds host tensors (no placecheck class in it); a later torch.load of
                        # it in this run puts each back on the device it was saved from, as on a GPU
                        self._saved[os.path.abspath(f)] = devices
                    return original(plain, f, *args, **kwargs)
                finally:
                    _restore(undo)  # a whole module saved: the script's module keeps its own tensors
        return save

    # -- results ---------------------------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        """Everything recorded, host syncs and repeated copies summarised per line."""
        out = list(self.found.values())
        for (line, call), (count, module, device, steps) in self.syncs.items():
            r = rule("PC204")
            inside = call.split(" in ", 1)[1] if " in " in call else ""
            if module and inside:
                # a performance finding made entirely inside installed code: info, naming it
                out.append(Finding(
                    code=r.code, kind=r.kind, severity=Severity.INFO, where=module, source=line,
                    device=device, expected=device, count=count,
                    message=(f"{call} of a {device} tensor in {module}.forward: a host sync inside "
                             "installed code, on every call"),
                    hint=f"{inside} syncs there by itself; nothing to change in this line",
                    details=(("call", call), ("calls", str(count)))))
                continue
            if module:
                out.append(Finding(
                    code=r.code, kind=r.kind, severity=r.severity, where=module, source=line, device=device,
                    expected=device, count=count,
                    message=f"{call} of a {device} tensor in {module}.forward waits for the GPU on every "
                            "call",
                    hint="keep the value on the device (torch.where, masks), or compute it outside forward",
                    details=(("call", call), ("calls", str(count)))))
                continue
            # per step in which the line ran: the run may stop mid-step, before a step's logging line
            # a line that ran once may be a per-step line the --steps stop cut short (logging after step())
            cut_short = self.stopped_by_steps and max(steps) >= self.steps - 1
            rate = ("once" if count == 1 and not cut_short else
                    f"{count / len(steps):g} per optimizer step" if self.steps else f"{count} times")
            out.append(Finding(
                code=r.code, kind=r.kind, severity=Severity.INFO, where="", source=line, device=device,
                expected=device, count=count,
                message=(f"{call} of a {device} tensor outside the model's forward: a host sync, {rate}; "
                         "each waits for the GPU to finish the queued work"),
                hint=(f"{inside} syncs by design; nothing to change here" if inside
                      else "fine once per step for logging; accumulate on the device (loss.detach()) and "
                           "read it every N steps when steps are short"),
                details=(("call", call), ("calls", str(count)))))
        r = rule("PC209")
        repeated: dict[str, _Copies] = {}
        for (line, _), copies in self.copies.items():
            if len(copies.steps) >= 2 and copies.nbytes > repeated.get(line, copies).nbytes - 1:
                repeated[line] = copies
        for line, copies in repeated.items():
            out.append(Finding(
                code=r.code, kind=r.kind, severity=r.severity, where="", source=line, device="cpu",
                expected=copies.device, nbytes=copies.nbytes, count=len(copies.steps),
                message=(f"the same {human_bytes(copies.nbytes)} host tensor is copied to {copies.device} at "
                         f"every step ({len(copies.steps)} steps seen): {human_bytes(copies.nbytes)} per "
                         "step "
                         "over the bus for data that does not change"),
                hint="move it to the device once, before the loop, and index the device copy",
                details=(("bytes per step", str(copies.nbytes)),)))
        return out

    def copy_notes(self) -> list[str]:
        """Batches copied with ``non_blocking`` that does not match the loader's ``pin_memory``."""
        notes = []
        for (line, loop, pinned), paths in self.batch_copies.items():
            what = ", ".join(paths)
            if pinned:
                notes.append(f"{line}: {what} from pinned memory (a DataLoader with pin_memory=True, "
                             "iterated "
                             f"at {loop}) copied with a blocking .to(): non_blocking=True lets the copy "
                             "overlap with compute")
            else:
                notes.append(f"{line}: .to(..., non_blocking=True) of {what} from a DataLoader without "
                             f"pin_memory=True (iterated at {loop}): from pageable memory the copy is "
                             "synchronous, the flag does nothing; pass pin_memory=True to the DataLoader")
        return notes

    def error_finding(self, exc: BaseException) -> Finding | None:
        """The script's own exception: PC201 when it mixed devices, PC207 otherwise; None when reported."""
        seen: BaseException | None = exc
        while seen is not None:
            if id(seen) in self.reported_errors:
                return None
            seen = seen.__cause__ or seen.__context__
        line = raised_at(exc)
        if isinstance(exc, SimulatedDeviceMismatchError):
            r = rule("PC201")
            return Finding(code=r.code, kind=r.kind, severity=r.severity, where="", source=line,
                           message=f"the script stopped on a device mismatch: {one_line(exc)}",
                           hint="move every tensor of this op to one device")
        r = rule("PC207")
        return Finding(code=r.code, kind=r.kind, severity=r.severity, where="", source=line,
                       message=f"the script raised {one_line(exc)}",
                       hint="fix the error at this line; the findings before it stand",
                       details=(("exception", type(exc).__name__),))
