"""Where the audit runs: a real device, or CUDA simulated with fake tensors or with real values.

The simulated engine enters ``FakeTensorMode(allow_non_fake_inputs=True)``:
``model.to("cuda")`` turns registered parameters and buffers into fake CUDA
tensors (no memory for their data), everything ``.to()`` did not move stays a
real CPU tensor, and an op mixing the two raises PyTorch's own "Expected all
tensors to be on the same device". Model code that asks
``torch.cuda.is_available()`` or ``device_count()`` sees the simulated GPUs,
and the rest of the common ``torch.cuda`` runtime API (streams, events, RNG,
device properties, memory statistics, autocast) answers harmlessly (see
:mod:`placecheck.engines.cudaapi`); cuDNN is off, so recurrent layers take
PyTorch's native kernels. All sessions of one engine share one fake mode: a
model whose ``__init__`` creates CUDA tensors is built in it, then moved in it.
:mod:`placecheck.engines.classify` says when an error was the fake engine's limit or
code needing a real CUDA driver.

The real-valued engine (:mod:`placecheck.engines.tagged`) keeps real CPU data in
tensors that report the simulated device: slower and needing the weights in
memory, but it runs what fake tensors cannot (``.item()``, boolean masks,
data-dependent control flow, backward without a GPU). ``auto`` falls back to it
when the fake engine cannot run a model's forward (see :func:`fallback_engine`).

Not reentrant: one simulated session at a time per process.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from placecheck.basics.errors import UsageError
from placecheck.basics.options import EngineChoice
from placecheck.basics.patching import patch
from placecheck.basics.values import Device
from placecheck.engines.calls import Kind, as_device, read_placement
from placecheck.engines.classify import DeviceMismatchError, generator_refusal, index_ops, tensor_arguments
from placecheck.engines.cudaapi import (
    CPU_ONLY_BUILD,
    SIMULATED_GPU_NAME,
    SimulatedEvent,
    SimulatedStream,
    cuda_queries_simulated,
    current_index,
)
from placecheck.engines.shortcuts import fake_tensor
from placecheck.engines.tagged import tagged_cuda

__all__ = ["SIMULATED_CUDA", "SIMULATED_CUDA_VALUES", "SIMULATED_GPU_NAME", "Engine", "EngineChoice",
           "SimulatedEvent", "SimulatedStream", "choose_engine", "cuda_queries_simulated", "fallback_engine",
           "move_model", "simulated_cuda"]


SIMULATED_CUDA = "simulated cuda"
SIMULATED_CUDA_VALUES = "simulated cuda (real values)"


@dataclass(frozen=True)
class Engine:
    """A chosen engine: its report name, target device and simulated GPU count."""

    name: str
    device: Device
    simulated: bool
    gpus: int = 0
    reason: str = ""
    """Why this engine was chosen, for the report's notes."""
    real_values: bool = False
    """A simulation with real CPU values (placecheck.engines.tagged), not fake tensors."""
    gpus_given: bool = False
    """``gpus`` is the machine's count (``--gpus``): a higher device index raises, as CUDA does; else it
    is only enough GPUs for the target, and a model may name others."""

    @property
    def fake(self) -> bool:
        """CUDA simulated with fake tensors."""
        return self.simulated and not self.real_values

    @functools.cached_property
    def fake_mode(self) -> Any:
        """The one fake mode of this engine's sessions (fake tensors of two modes cannot meet)."""
        from placecheck.engines.compat import FakeTensorMode

        return FakeTensorMode(allow_non_fake_inputs=True)

    def session(self) -> contextlib.AbstractContextManager[Any]:
        """The context every step of the audit (build, move, forward) runs in.

        Every session of one fake engine shares its fake mode, so a model
        built in one (its ``__init__`` made CUDA tensors) is moved in the next.
        """
        if self.real_values:
            return tagged_cuda(self.gpus, self.gpus_given)
        if self.simulated:
            return simulated_cuda(self.gpus, self.fake_mode, self.gpus_given)
        return contextlib.nullcontext()


def _real_available(device: Device) -> tuple[bool, str]:
    kind = device.type
    if kind in ("cpu", "meta"):
        return True, ""
    if kind == "cuda":
        if not torch.cuda.is_available():
            return False, "no CUDA GPU is present"
        count = torch.cuda.device_count()
        if device.ordinal >= count:
            return False, f"this machine has {count} GPU{'s' if count != 1 else ''}"
        return True, ""
    if kind == "mps":
        ok = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
        return ok, "" if ok else "MPS is not available on this machine"
    return False, f"unknown device {device}"


def choose_engine(device: Device, choice: EngineChoice = EngineChoice.AUTO, gpus: int | None = None,
                  train: bool = False) -> Engine:
    """Pick the engine for ``device`` (normalised) and ``--engine``.

    ``auto``: the real device when present; simulated CUDA when the target is
    CUDA and no (or too few) GPUs are present: with fake tensors, or with real
    values when ``train`` (a backward needs them without a GPU). ``gpus`` is the
    number of simulated GPUs (default: enough for the target index).
    """
    kind = device.type
    if gpus is not None and kind == "cuda" and device.ordinal >= gpus:
        need = device.ordinal + 1
        raise UsageError(f"--device {device} needs at least {need} GPUs; --gpus {gpus} was given: "
                         f"use --gpus {need} or a lower device index")
    available, why_not = _real_available(device)
    sim_gpus = max(gpus or 1, device.ordinal + 1)
    if choice is EngineChoice.REAL or (choice is EngineChoice.AUTO and available):
        if not available:
            raise UsageError(f"--engine real cannot run on {device}: {why_not}; "
                             "use --engine auto to simulate CUDA")
        return Engine(name=kind, device=device, simulated=False, reason=f"real {kind} device")
    if kind != "cuda":
        if choice in (EngineChoice.FAKE, EngineChoice.TAGGED):
            raise UsageError(f"--engine {choice.value} simulates CUDA only, not {device}: use --device cuda")
        raise UsageError(f"{device} is not available here ({why_not}): placecheck simulates "
                         "CUDA only; use --device cuda or --device cpu")
    plural = "s" if sim_gpus != 1 else ""
    if choice is EngineChoice.FAKE and train:
        raise UsageError("--train needs a backward pass, which the fake engine cannot run without a GPU: "
                         "use --engine tagged (or auto)")
    if choice is EngineChoice.TAGGED or train:
        why = ("requested with --engine tagged" if choice is EngineChoice.TAGGED else
               f"{why_not}; --train needs a backward, which fake tensors cannot run without a GPU")
        return Engine(name=SIMULATED_CUDA_VALUES, device=device, simulated=True, gpus=sim_gpus,
                      gpus_given=gpus is not None, real_values=True,
                      reason=f"{why}; CUDA simulated with real CPU values ({sim_gpus} GPU{plural})")
    reason = "requested with --engine fake" if choice is EngineChoice.FAKE else why_not
    return Engine(name=SIMULATED_CUDA, device=device, simulated=True, gpus=sim_gpus,
                  gpus_given=gpus is not None,
                  reason=f"{reason}; CUDA simulated with fake tensors ({sim_gpus} GPU{plural})")


def fallback_engine(engine: Engine, why: str) -> Engine:
    """The real-valued engine that ``auto`` falls back to when fake tensors cannot run the forward."""
    plural = "s" if engine.gpus != 1 else ""
    return Engine(name=SIMULATED_CUDA_VALUES, device=engine.device, simulated=True, gpus=engine.gpus,
                  gpus_given=engine.gpus_given, real_values=True,
                  reason=f"fell back from fake tensors, which cannot run this model's forward ({why}); "
                         f"CUDA simulated with real CPU values ({engine.gpus} GPU{plural})")


@contextlib.contextmanager
def simulated_cuda(gpus: int = 1, fake_mode: Any = None, strict: bool = False,
                   script: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], tuple[bool, Any]]
                   | None = None) -> Iterator[Any]:
    """Fake-tensor mode plus simulated ``torch.cuda`` queries; yields the fake mode.

    ``script``: ``placecheck run``'s calls that the fake mode alone cannot run (:class:`FakeCuda`).

    ``fake_mode`` (default: a new one) lets several sessions share one mode:
    the model built in one (``torch.zeros(..., device="cuda")`` in
    ``__init__``) is moved and run in the next, and fake tensors of two modes
    cannot meet.
    """
    from placecheck.engines.compat import FakeTensorMode

    mode = fake_mode if fake_mode is not None else FakeTensorMode(allow_non_fake_inputs=True)
    # A CPU-only build refuses .to("cuda") even on fake tensors; there the moves are made by hand.
    moves = FakeCuda(mode, moves=CPU_ONLY_BUILD, script=script) if CPU_ONLY_BUILD or script is not None \
        else contextlib.nullcontext()
    from placecheck.engines.datadep import (
        DataDependentMode,  # runs nonzero, .item()... with stated assumptions
    )

    datadep = DataDependentMode(mode)
    with cuda_queries_simulated(gpus, strict), _fake_parameters_swappable(datadep), mode, moves, datadep:
        yield mode


def _alike_fakes(t1: torch.Tensor, t2: torch.Tensor) -> bool:
    """Two fake tensors with the same device, dtype, shape, strides and ``requires_grad``: the same tensor
    as far as anything but their identity can tell (they hold no data)."""
    from placecheck.engines.compat import FakeTensor

    return (isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor) and t1.device == t2.device
            and t1.dtype == t2.dtype and t1.shape == t2.shape and t1.stride() == t2.stride()
            and t1.requires_grad == t2.requires_grad)


def _check_generator(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A GPU op given a ``torch.Generator`` of another device type raises (fake kernels never look at the
    generator); so does this engine, as the tagged one does. The call runs where its ``device=`` says,
    else on its first tensor's device."""
    device = as_device(kwargs["device"]) if kwargs.get("device") is not None else \
        next((t.device for _, t in tensor_arguments(args, kwargs)), None)
    refusal = generator_refusal(args, kwargs, device if isinstance(device, torch.device) else None)
    if refusal:
        raise DeviceMismatchError(refusal)


def _check_indices(args: tuple[Any, ...]) -> None:
    """Indexing a CPU tensor with a GPU index tensor (``cpu_table[cuda_ids]``) raises on a GPU machine;
    fake tensors let it through and give a CPU result. So does this engine raise, with torch's words (a
    GPU tensor indexed with CPU indices is legal: the indices are copied over)."""
    if len(args) < 2 or not isinstance(args[0], torch.Tensor) or args[0].device.type != "cpu":
        return
    todo = [args[1]]
    while todo:
        index = todo.pop()
        if isinstance(index, list | tuple):
            todo.extend(index)
        elif isinstance(index, torch.Tensor) and index.device.type not in ("cpu", "meta"):
            raise DeviceMismatchError("indices should be either on cpu or on the same device as the indexed "
                                      "tensor (cpu)")


def _swapped_in_place(t1: torch.Tensor, t2: torch.Tensor) -> bool:
    """``t1`` made what ``t2`` is (device, dtype, shape), keeping its object, where ``swap_tensors`` refuses
    a fake parameter that the graph of a simulated backward still holds: ``t1.data = t2``, as ``.to()``
    moves a parameter on a GPU (``Module._apply``'s ``param.data = ...``), and the fake tensor's own
    attributes (its fake device) taken from ``t2``. Whether it could (two fake tensors whose types allow
    the shallow copy)."""
    from placecheck.engines.compat import FakeTensor, has_compatible_shallow_copy_type

    if not (isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor)
            and has_compatible_shallow_copy_type()(t1, t2)):
        return False
    own = {key: value for key, value in vars(t1).items() if key == "_is_param"}
    with torch.no_grad():
        t1.data = t2
    vars(t1).clear()
    vars(t1).update({**vars(t2), **own})
    return True


def _forget_fake_memo(t: Any) -> None:
    """Drop the fake mode's weak references to ``t`` (its converter memo), so that it can be swapped."""
    from placecheck.engines.compat import FakeTensor

    if not isinstance(t, FakeTensor):
        return
    memo = t.fake_mode.fake_tensor_converter.tensor_memo
    keys = [ref.key for ref in weakref.getweakrefs(t) if isinstance(ref, weakref.KeyedRef)]
    for key in keys:
        if memo.get(key) is t:
            del memo[key]


@contextlib.contextmanager
def _fake_parameters_swappable(known: Any = None) -> Iterator[None]:
    """Let ``Module._apply`` move parameters that are already fake tensors.

    A model built inside the fake mode (because its ``__init__`` creates CUDA
    tensors) holds fake parameters; ``.to()``/``.cuda()`` on it then swaps each
    one for its moved version with ``torch.utils.swap_tensors``, which refuses
    a tensor with a weak reference, and the fake mode's memo holds one ("Couldn't
    swap Linear.weight"). The memo only saves re-converting the same tensor, so
    the entry is dropped before the swap. The swap keeps each Parameter object,
    as ``.to()`` does on a real GPU.

    ``known`` (the data-dependent mode, which keeps the values of some fake
    tensors) holds weak references too, to a weight
    initialised to known values (a zeroed bias: a model that places its own
    stages with ``.to("cuda:1")`` in ``__init__``, such as transformers' GPT-2
    split by hand); its entries are taken out for the swap and put back on the
    swapped objects (:meth:`~placecheck.engines.datadep.DataDependentMode.take` and
    ``give``), so the values stay known.
    """
    real_swap: Callable[[torch.Tensor, torch.Tensor], None] = torch.utils.swap_tensors

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        _forget_fake_memo(t1)
        _forget_fake_memo(t2)
        values = [known.take(t) if known is not None else None for t in (t1, t2)]
        holders = (t2, t1)  # after the swap, each object holds the other's contents
        try:
            real_swap(t1, t2)
        except RuntimeError:
            # still referenced (the graph of a simulated backward holds a trained parameter)
            if _alike_fakes(t1, t2):
                pass  # two fake tensors of the same metadata hold no data: nothing to swap but known values
            elif _swapped_in_place(t1, t2):
                holders = (t1, t1)  # t1 holds t2's contents now; t2 keeps them too
            else:
                holders = (t1, t2)
                raise
        finally:
            for t, value in zip(holders, values, strict=True):
                if value is not None:
                    known.give(t, value)

    with patch(torch.utils, "swap_tensors", swap,
               "a swap of fake tensors must carry the values the fake engine knows for them; swap_tensors "
               "is no torch function a mode sees"):
        yield


def _fake_on(fake_mode: Any, t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A fake tensor of ``fake_mode`` shaped like ``t``, on ``device``, with no data."""
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    if isinstance(t, UninitializedParameter | UninitializedBuffer):  # nn.Lazy* state: no shape yet
        return fake_tensor(fake_mode, (0,), (1,), dtype, device)
    return fake_tensor(fake_mode, t.shape, t.stride(), dtype, device)


def fake_tensor_like(fake_mode: Any, t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake tensor of ``fake_mode`` with ``t``'s shape, strides and dtype, on ``device``, with no data
    (a meta-built weight materialised where a device map puts it)."""
    return _fake_on(fake_mode, t, device, t.dtype)


_META = torch.device("meta")
_TENSOR_MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.type, torch.Tensor.type_as})
"""The tensor moves this engine's mode makes itself (a CPU-only build refuses them to CUDA)."""
_APPLY_CODE = nn.Module._apply.__code__
"""``Module._apply``: the one caller whose ``Parameter(t)`` of a fresh move is made in place."""


class FakeCuda(TorchFunctionMode):
    """The fake engine's one mode: what fake tensors alone cannot do for a simulated GPU.

    Three duties, each switched on where it is needed (a mode costs every op a Python call, which a
    one-GPU audit on a CUDA build need not pay):

    ``moves`` (a CPU-only build of torch, or ``model_move``): ``x.to("cuda")`` / ``x.cuda()`` as fake
    CUDA tensors. That build refuses any move to CUDA ("not linked with support for cuda devices"),
    fake tensors included, while fake CUDA factories work; so each move to CUDA becomes a new fake CUDA
    tensor of the same shape and dtype, whether it runs in ``__init__``, in ``model.to()`` or in forward.
    Indexing a fake CUDA tensor (``x[0]``, ``x[:, 0]``, ``x[idx]``) fails there too: Python's indexing
    sets a CUDA device guard before any dispatch. It is computed on fake ``meta`` stand-ins instead
    (shapes and errors are the same; fake tensors hold no values) and the result made a fake CUDA tensor.
    The dispatcher's handlers, above this mode, have checked the devices before this runs.

    ``model_move`` (a build with CUDA support): only the moves of ``model.to()`` are made here, of meta
    tensors and of plain contiguous CPU tensors to CUDA; a fake CUDA tensor holds no data, so the one made
    from the source's shape and strides is what ``_to_copy`` would give, without converting the source into
    the fake mode and decomposing the copy per parameter. The values of a small CPU source are still
    handed to the data-dependent mode (:mod:`placecheck.engines.datadep`), as its ``_to_copy`` would have
    been. A ``memory_format`` and anything else are left to torch.

    ``follow_current`` (:func:`current_device_moves`): ``device="cuda"``, ``.to("cuda")`` and ``.cuda()``
    go to the simulated current device, as on a GPU (fake tensors would send them to ``cuda:0`` whatever
    the current device is); ``device=1`` is ``cuda:1``, as on a CUDA build.

    ``script`` (``placecheck run``'s fake engine, :mod:`placecheck.run.fake`): the calls of a whole
    script that the fake mode cannot run without a GPU (backward, printing, deep copies): a function that
    answers ``(True, result)`` for a call it handles, ``(False, None)`` for any other. The torch calls it
    makes itself still get this mode's moves.
    """

    def __init__(self, fake_mode: Any = None, model_move: bool = False, *, moves: bool = True,
                 follow_current: bool = False,
                 script: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], tuple[bool, Any]]
                 | None = None) -> None:
        super().__init__()
        self.fake_mode = fake_mode
        self.model_move = model_move
        self.moves = moves and fake_mode is not None
        self.follow_current = follow_current
        self.script = script
        self._moves_only = FakeCuda(fake_mode, model_move) if script is not None and self.moves else None
        self.fresh: dict[int, torch.Tensor] = {}
        """``model_move``: the fake tensors made here that nothing else holds yet (by id), which
        :meth:`parameters_made_in_place` turns into parameters without a ``detach``."""

    @contextlib.contextmanager
    def parameters_made_in_place(self) -> Iterator[None]:
        """``nn.Parameter(t)`` of a fake tensor this mode just made marks ``t`` itself as the parameter.

        ``Module._apply`` wraps each moved tensor so; for a tensor subclass (a fake tensor)
        ``Parameter`` returns ``t.detach()`` marked as a parameter, and that ``detach`` goes
        through the fake mode's dispatch: half the move of a model with thousands of experts. A
        tensor made here a moment ago has no other holder and no autograd history, so marking it
        is the same parameter without the alias. Any other tensor takes ``Parameter``'s own path.
        """
        original = nn.Parameter.__new__
        fresh = self.fresh

        def new(cls: type, data: Any = None, requires_grad: bool = True) -> Any:
            if (cls is nn.Parameter and isinstance(data, torch.Tensor)
                    and sys._getframe(1).f_code is _APPLY_CODE and fresh.pop(id(data), None) is data):
                data.requires_grad_(requires_grad)
                data._is_param = True
                return data
            return original(cls, data, requires_grad)

        try:
            with patch(nn.Parameter, "__new__", staticmethod(new),
                       "Module._apply re-wraps each moved tensor in a new Parameter; the fake engine's move "
                       "must stay the Parameter, as on a GPU"):
                yield
        finally:
            fresh.clear()

    def _shortcut(self, source: torch.Tensor, memory_format: Any) -> bool:
        """Whether this move of ``source`` is made here (always on a CPU-only build)."""
        if not self.model_move:
            return True
        if memory_format is not None:
            return False
        if source.device.type == "meta":
            return True
        return (source.device.type == "cpu" and type(source) in (torch.Tensor, nn.Parameter)
                and source.layout == torch.strided and not source.is_quantized and source.is_contiguous())

    def _on_meta(self, value: Any) -> Any:
        """``value`` with every fake CUDA tensor in it (one level of tuples/lists) a fake meta one."""
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            return _fake_on(self.fake_mode, value, _META, value.dtype)
        if isinstance(value, tuple | list):
            return type(value)(self._on_meta(v) for v in value)
        return value

    def _index(self, func: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        source: torch.Tensor = args[0]
        out = func(*(self._on_meta(a) for a in args))
        if func is torch.Tensor.__setitem__:
            return None  # fake tensors hold no values to write; the meta call checked the shapes
        return _fake_on(self.fake_mode, out, source.device, out.dtype)

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if kwargs.get("generator") is not None:
            _check_generator(args, kwargs)
        if func in index_ops():
            _check_indices(args)
        if self.script is not None:
            if self._moves_only is not None:
                with self._moves_only:  # the script's handling calls torch too: those moves are made here
                    handled, out = self.script(func, args, kwargs)
            else:
                handled, out = self.script(func, args, kwargs)
            if handled:
                return out
        if self.follow_current:
            return _to_current_device(func, args, kwargs)
        if not self.moves:
            return func(*args, **kwargs)
        placement = read_placement(func, args, kwargs, current_index()) \
            if (func in _TENSOR_MOVES and args and isinstance(args[0], torch.Tensor)) or "device" in kwargs \
            else None
        if placement is not None and placement.kind is Kind.FACTORY and placement.to_cuda:
            # device=0 is cuda:0 as on a CUDA build (a CPU-only build reads an int as an accelerator)
            return func(*args, **{**kwargs, "device": placement.device})
        if placement is not None and placement.kind is Kind.MOVE and placement.to_cuda \
                and self._shortcut(args[0], placement.memory_format):
            source: torch.Tensor = args[0]
            dest = placement.device
            assert dest is not None
            dtype = placement.dtype or source.dtype
            if source.device == dest and dtype == source.dtype and not placement.copy:
                return source  # already there: .to() returns the tensor itself
            moved = _fake_on(self.fake_mode, source, dest, dtype)
            if source.requires_grad and torch.is_grad_enabled():
                moved.requires_grad_(True)
            if self.model_move and source.device.type == "cpu":
                _known_values(moved, source, dtype)
            if self.model_move:
                self.fresh[id(moved)] = moved
            return moved
        if not self.model_move and func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and args \
                and isinstance(args[0], torch.Tensor) and args[0].device.type == "cuda":
            return self._index(func, args)
        return func(*args, **kwargs)

def _to_current_device(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` with its CUDA device (``"cuda"``, ``1``) resolved to the simulated current device's
    ``cuda:i``; each call is read by :func:`placecheck.engines.calls.read_placement`."""
    placement = read_placement(func, args, kwargs, current_index())  # (the device resolved: cuda:current)
    if placement is not None and placement.to_cuda:
        if placement.kind is Kind.FACTORY:
            kwargs = {**kwargs, "device": placement.device}
        elif placement.kind is Kind.MOVE and func in (torch.Tensor.to, torch.Tensor.cuda):
            return torch.Tensor.to(args[0], placement.device, non_blocking=placement.non_blocking,
                                   **placement.to_options())
    return func(*args, **kwargs)


def current_device_moves() -> FakeCuda:
    """The mode that sends ``"cuda"`` to the simulated current device (a replica's attempt, under
    either engine: the real-valued one resolves it itself, so there it changes nothing)."""
    return FakeCuda(follow_current=True)


def _known_values(moved: torch.Tensor, source: torch.Tensor, dtype: torch.dtype) -> None:
    """Tell the data-dependent mode the values of ``moved``, a fake copy of the real CPU tensor ``source``."""
    from placecheck.engines.datadep import KNOWN_BYTES_LIMIT, active, on_host

    mode = active()
    if mode is None or source.nelement() * source.element_size() > KNOWN_BYTES_LIMIT:
        return
    with on_host():
        values = source.detach().to(dtype=dtype, copy=True)
    mode.give(moved, (values, None))


@contextlib.contextmanager
def _each_module_applied_once() -> Iterator[None]:
    """Let ``Module._apply`` run once per module object during one ``.to()``.

    A module registered under two parents (T5's ``shared`` embedding is also
    ``encoder.embed_tokens``) is visited twice by ``.to()``. On a real device
    the second visit is a no-op; under fake tensors it tries to swap a
    parameter that is already fake and fails ("Couldn't swap
    Embedding.weight"). Overrides of ``_apply`` still run; only the base
    class's work is skipped the second time.
    """
    base_apply = nn.Module._apply
    applied: set[int] = set()

    def apply_once(self: nn.Module, fn: Callable[..., Any], recurse: bool = True) -> nn.Module:
        if id(self) in applied:
            return self
        applied.add(id(self))
        moved: nn.Module = base_apply(self, fn, recurse)  # type: ignore[no-untyped-call]
        return moved

    with patch(nn.Module, "_apply", apply_once,
               "a module shared by two parents is moved once, as on a GPU; there is no hook on "
               "Module._apply"):
        yield


def move_model(model: nn.Module, engine: Engine) -> nn.Module:
    """``model.to(device)``, exactly as a user's script would, inside ``engine``.

    Under fake tensors the uninitialised buffers of ``nn.Lazy*`` modules
    (``LazyBatchNorm1d.running_mean``) are first made empty tensors, as
    ``.to()`` makes of uninitialised parameters: the fake mode cannot
    dispatch on their tensor subclass ("Multiple dispatch failed for
    aten._to_copy"). On a CPU-only build of torch the session itself turns
    moves to CUDA into fake CUDA tensors (:class:`FakeCuda`).
    """
    if not engine.fake:
        moved = model.to(engine.device)
        return moved if isinstance(moved, nn.Module) else model
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    from placecheck.engines.compat import fake_moves_replace_parameters

    for module in model.modules():
        for name, buffer in module._buffers.items():
            if isinstance(buffer, UninitializedBuffer):
                module._buffers[name] = _fake_on_same_device(buffer)
        # and their parameters, which the fake mode of torch 2.11 cannot dispatch on either; newer
        # torch gives the same empty fake parameter
        for name, param in module._parameters.items():
            if isinstance(param, UninitializedParameter):
                module._parameters[name] = nn.Parameter(_fake_on_same_device(param),
                                                        requires_grad=param.requires_grad)
    # The parameters become fake CUDA tensors straight from their shapes (the session's own moves do
    # that on a CPU-only build): torch's _to_copy per parameter costs some 30 times more, most of the
    # audit of a model with thousands of experts, and half of a CPU-built convnet's.
    from placecheck.engines.compat import active_fake_mode

    fake_mode = active_fake_mode()
    if fake_mode is not None and not CPU_ONLY_BUILD:
        moves = FakeCuda(fake_mode, model_move=True)
        with (_each_module_applied_once(), fake_moves_replace_parameters(), moves,
              moves.parameters_made_in_place()):
            moved = model.to(engine.device)
        return moved if isinstance(moved, nn.Module) else model
    with _each_module_applied_once(), fake_moves_replace_parameters():
        moved = model.to(engine.device)
    return moved if isinstance(moved, nn.Module) else model


def _fake_on_same_device(t: torch.Tensor) -> torch.Tensor:
    """An empty fake tensor on ``t``'s device with its dtype, in the active fake mode."""
    from placecheck.engines.compat import active_fake_mode

    fake_mode = active_fake_mode()
    if fake_mode is None:
        return torch.empty(0, dtype=t.dtype, device=t.device)
    return _fake_on(fake_mode, t, t.device, t.dtype)
