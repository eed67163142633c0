"""Where the audit runs: a real device, or CUDA simulated with fake tensors or with real values.

The simulated engine enters ``FakeTensorMode(allow_non_fake_inputs=True)``:
``model.to("cuda")`` turns registered parameters and buffers into fake CUDA
tensors (no memory for their data), everything ``.to()`` did not move stays a
real CPU tensor, and an op mixing the two raises PyTorch's own "Expected all
tensors to be on the same device". Model code that asks
``torch.cuda.is_available()`` or ``device_count()`` sees the simulated GPUs,
and the rest of the common ``torch.cuda`` runtime API (streams, events, RNG,
device properties, memory statistics, autocast) answers harmlessly (see
:func:`_cuda_query_patches`); cuDNN is off, so recurrent layers take
PyTorch's native kernels. All sessions of one engine share one fake mode: a
model whose ``__init__`` creates CUDA tensors is built in it, then moved in it.
:func:`fake_limit` says when an error was the fake engine's limit,
:func:`is_simulation_limit` when it was code needing a real CUDA driver.

The real-valued engine (:mod:`placecheck.tagged`) keeps real CPU data in
tensors that report the simulated device: slower and needing the weights in
memory, but it runs what fake tensors cannot (``.item()``, boolean masks,
data-dependent control flow, backward without a GPU). ``auto`` falls back to it
when the fake engine cannot run a model's forward (see :func:`fallback_engine`).

Not reentrant: one simulated session at a time per process.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import re
import sys
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from placecheck.devices import device_index
from placecheck.errors import UsageError


class EngineChoice(str, enum.Enum):
    """The ``--engine`` choices."""

    AUTO = "auto"
    REAL = "real"
    FAKE = "fake"
    TAGGED = "tagged"
    """CUDA simulated with real CPU values tagged as CUDA (placecheck.tagged)."""

    def __str__(self) -> str:
        return self.value


SIMULATED_CUDA = "simulated cuda"
SIMULATED_CUDA_VALUES = "simulated cuda (real values)"


@dataclass(frozen=True)
class Engine:
    """A chosen engine: its report name, target device and simulated GPU count."""

    name: str
    device: str
    simulated: bool
    gpus: int = 0
    reason: str = ""
    """Why this engine was chosen, for the report's notes."""
    real_values: bool = False
    """A simulation with real CPU values (placecheck.tagged), not fake tensors."""

    @property
    def fake(self) -> bool:
        """CUDA simulated with fake tensors."""
        return self.simulated and not self.real_values

    @functools.cached_property
    def fake_mode(self) -> Any:
        """The one fake mode of this engine's sessions (fake tensors of two modes cannot meet)."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        return FakeTensorMode(allow_non_fake_inputs=True)

    def session(self) -> contextlib.AbstractContextManager[Any]:
        """The context every step of the audit (build, move, forward) runs in.

        Every session of one fake engine shares its fake mode, so a model
        built in one (its ``__init__`` made CUDA tensors) is moved in the next.
        """
        if self.real_values:
            from placecheck.tagged import tagged_cuda

            return tagged_cuda(self.gpus)
        if self.simulated:
            return simulated_cuda(self.gpus, self.fake_mode)
        return contextlib.nullcontext()


def _real_available(device: str) -> tuple[bool, str]:
    kind = device.split(":")[0]
    if kind in ("cpu", "meta"):
        return True, ""
    if kind == "cuda":
        if not torch.cuda.is_available():
            return False, "no CUDA GPU is present"
        count = torch.cuda.device_count()
        if device_index(device) >= count:
            return False, f"this machine has {count} GPU{'s' if count != 1 else ''}"
        return True, ""
    if kind == "mps":
        ok = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
        return ok, "" if ok else "MPS is not available on this machine"
    return False, f"unknown device {device}"


def choose_engine(device: str, choice: EngineChoice = EngineChoice.AUTO, gpus: int | None = None,
                  train: bool = False) -> Engine:
    """Pick the engine for ``device`` (normalised) and ``--engine``.

    ``auto``: the real device when present; simulated CUDA when the target is
    CUDA and no (or too few) GPUs are present: with fake tensors, or with real
    values when ``train`` (a backward needs them without a GPU). ``gpus`` is the
    number of simulated GPUs (default: enough for the target index).
    """
    kind = device.split(":")[0]
    if gpus is not None and kind == "cuda" and device_index(device) >= gpus:
        need = device_index(device) + 1
        raise UsageError(f"--device {device} needs at least {need} GPUs; --gpus {gpus} was given: "
                         f"use --gpus {need} or a lower device index")
    available, why_not = _real_available(device)
    sim_gpus = max(gpus or 1, device_index(device) + 1)
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
                      real_values=True, reason=f"{why}; CUDA simulated with real CPU values "
                                               f"({sim_gpus} GPU{plural})")
    reason = "requested with --engine fake" if choice is EngineChoice.FAKE else why_not
    return Engine(name=SIMULATED_CUDA, device=device, simulated=True, gpus=sim_gpus,
                  reason=f"{reason}; CUDA simulated with fake tensors ({sim_gpus} GPU"
                         f"{'s' if sim_gpus != 1 else ''})")


def fallback_engine(engine: Engine, why: str) -> Engine:
    """The real-valued engine that ``auto`` falls back to when fake tensors cannot run the forward."""
    plural = "s" if engine.gpus != 1 else ""
    return Engine(name=SIMULATED_CUDA_VALUES, device=engine.device, simulated=True, gpus=engine.gpus,
                  real_values=True,
                  reason=f"fell back from fake tensors, which cannot run this model's forward ({why}); "
                         f"CUDA simulated with real CPU values ({engine.gpus} GPU{plural})")


class SimulatedStream:
    """A CUDA stream of the simulation: every operation is a no-op (fake tensors run nothing)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("cuda", device_index(str(device)) if device is not None else 0)
        self.priority = priority
        self.cuda_stream = 0

    def wait_event(self, event: Any) -> None:
        """No-op."""

    def wait_stream(self, stream: Any) -> None:
        """No-op."""

    def record_event(self, event: Any = None) -> SimulatedEvent:
        """The event, recorded (no-op)."""
        return event if isinstance(event, SimulatedEvent) else SimulatedEvent()

    def query(self) -> bool:
        """Always done."""
        return True

    def synchronize(self) -> None:
        """No-op."""

    def __enter__(self) -> SimulatedStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __repr__(self) -> str:
        return f"<placecheck simulated CUDA stream on {self.device}>"


class SimulatedEvent:
    """A CUDA event of the simulation: recorded and complete at once; no time elapses."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 **kwargs: Any) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        """No-op."""

    def wait(self, stream: Any = None) -> None:
        """No-op."""

    def query(self) -> bool:
        """Always complete."""
        return True

    def synchronize(self) -> None:
        """No-op."""

    def elapsed_time(self, end_event: Any) -> float:
        """0.0 ms: the simulation measures no time."""
        return 0.0


class _SimulatedDeviceContext:
    """``torch.cuda.device(i)`` / ``device_of(t)``: selects nothing (the simulation has no current device)."""

    def __init__(self, device: Any = None) -> None:
        self.idx = device if isinstance(device, int) else 0

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


SIMULATED_GPU_NAME = "placecheck simulated GPU"
_EMPTY_RNG_STATE = torch.zeros(0, dtype=torch.uint8)  # what the simulated torch.cuda.get_rng_state() returns


def _cuda_query_patches(gpus: int) -> dict[str, Callable[..., Any]]:
    """What model code may ask ``torch.cuda``, answered for ``gpus`` simulated GPUs.

    Simulated: availability and count, device name/capability/properties
    (an 80 GiB sm_90 part named ``placecheck simulated GPU``), streams and
    events (no-op objects), ``synchronize``, the CUDA RNG (seeding is a no-op;
    the state is an empty byte tensor), memory statistics (all 0, 80 GiB free),
    and ``torch.autocast("cuda")``'s availability check (see
    :data:`_ASKING_FOR_USER_CODE`); ``Tensor.pin_memory`` and ``record_stream`` are
    patched in :func:`cuda_queries_simulated`. Not simulated: CUDA graphs, NCCL,
    ``torch.cuda.nvtx``/profiler internals, custom kernels (they need a driver;
    see :func:`is_simulation_limit`).
    """

    def _props(device: Any = None) -> Any:
        return types.SimpleNamespace(name=SIMULATED_GPU_NAME, total_memory=80 * 2**30, major=9, minor=0,
                                     multi_processor_count=132, is_integrated=False, is_multi_gpu_board=False,
                                     L2_cache_size=50 * 2**20, warp_size=32, gcnArchName="NVIDIA",
                                     uuid="00000000-0000-0000-0000-000000000000")

    def _stream(device: Any = None) -> SimulatedStream:
        return SimulatedStream(device)

    def _stream_context(stream: Any = None) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext(stream)

    def _rng_state(device: Any = "cuda") -> torch.Tensor:
        return _EMPTY_RNG_STATE  # made once, outside any session: not a tensor the model created

    def _none(*args: Any, **kwargs: Any) -> None:
        return None

    def _zero(*args: Any, **kwargs: Any) -> int:
        return 0

    return {
        "is_available": lambda: True,
        "device_count": lambda: gpus,
        "current_device": lambda: 0,
        "is_initialized": lambda: True,
        "init": _none,
        "get_device_name": lambda device=None: SIMULATED_GPU_NAME,
        "get_device_capability": lambda device=None: (9, 0),
        "get_device_properties": _props,
        "get_arch_list": lambda: ["sm_90"],
        "is_bf16_supported": lambda *a, **k: True,
        "is_tf32_supported": lambda *a, **k: True,
        "can_device_access_peer": lambda device, peer: True,
        "set_device": _none,
        "device": _SimulatedDeviceContext,
        "device_of": lambda obj: _SimulatedDeviceContext(),
        "synchronize": _none,
        "ipc_collect": _none,
        "current_stream": _stream,
        "default_stream": _stream,
        "Stream": SimulatedStream,
        "stream": _stream_context,
        "set_stream": _none,
        "Event": SimulatedEvent,
        "manual_seed": _none,
        "manual_seed_all": _none,
        "seed": _none,
        "seed_all": _none,
        "initial_seed": _zero,
        "get_rng_state": _rng_state,
        "get_rng_state_all": lambda: [_rng_state() for _ in range(gpus)],
        "set_rng_state": _none,
        "set_rng_state_all": _none,
        "empty_cache": _none,
        "reset_peak_memory_stats": _none,
        "reset_max_memory_allocated": _none,
        "reset_accumulated_memory_stats": _none,
        "memory_allocated": _zero,
        "max_memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_reserved": _zero,
        "memory_stats": lambda device=None: {},
        "memory_summary": lambda device=None, abbreviated=False: f"{SIMULATED_GPU_NAME}: no memory used",
        "mem_get_info": lambda device=None: (80 * 2**30, 80 * 2**30),
    }


# torch modules that ask torch.cuda on the user's behalf: torch.autocast("cuda") checks
# availability (and bf16 support) before it enables itself; under simulation it must see the
# simulated GPU, or it prints "CUDA is not available ... Disabling autocast" and runs in fp32.
# With fake tensors autocast then really applies (fake CUDA tensors carry the autocast key);
# with the real-valued engine the data is on the CPU, so ops stay fp32 there.
# A CPU-only build of torch aborts the process when autocast("cuda") is enabled on fake CUDA
# tensors ("not linked with support for cuda devices", from C++): there autocast stays disabled,
# its warning silenced, and the forward runs in fp32.
_ASKING_FOR_USER_CODE = ("torch.cuda.amp.common", "torch.amp.autocast_mode")
_CPU_ONLY_BUILD = torch.version.cuda is None and torch.version.hip is None
_AUTOCAST_DISABLED_WARNING = "CUDA is not available or torch_xla is imported. Disabling autocast"


def _called_from_torch(depth: int = 2) -> bool:
    """True when the caller of the patched function is torch itself."""
    name = sys._getframe(depth).f_globals.get("__name__", "")
    for_user = name in _ASKING_FOR_USER_CODE and not _CPU_ONLY_BUILD
    return bool(name == "torch" or name.startswith("torch.")) and not for_user


def _for_user_code(simulated: Callable[..., Any], real: Callable[..., Any]) -> Callable[..., Any]:
    """Answer model code with the simulated value, torch's own internals with the real one.

    torch consults ``torch.cuda.is_available()`` itself (fake tensors use it
    to decide whether they may initialise a device); only the user's code
    must see the simulated GPUs.
    """

    def query(*args: Any, **kwargs: Any) -> Any:
        if _called_from_torch():
            return real(*args, **kwargs)
        return simulated(*args, **kwargs)

    query.__name__ = getattr(real, "__name__", "query")
    query.__doc__ = getattr(real, "__doc__", None)
    return query


@contextlib.contextmanager
def cuda_queries_simulated(gpus: int) -> Iterator[None]:
    """Make ``torch.cuda.is_available()`` and friends report ``gpus`` GPUs to model code.

    cuDNN is switched off for the session: with it, ``nn.LSTM``/``GRU``/``RNN``
    take cuDNN's path on (simulated) CUDA tensors, whose ``flatten_parameters``
    and ``_cudnn_rnn`` need a driver ("Found no NVIDIA driver", "CUDA driver
    version is insufficient"). Without it they run PyTorch's native kernels,
    which follow the same device rules; placement does not depend on the backend.
    """
    with contextlib.ExitStack() as stack:
        for name, fn in _cuda_query_patches(gpus).items():
            real = getattr(torch.cuda, name, None)
            if real is None:
                continue
            # classes stay classes (isinstance(s, torch.cuda.Stream) must work); the real ones need a
            # driver whoever calls them
            patched = fn if isinstance(fn, type) else _for_user_code(fn, real)
            stack.enter_context(mock.patch.object(torch.cuda, name, patched))
        # page-locked host memory and the allocator's stream hint need a driver; neither changes
        # where a tensor is: pin_memory() is a CPU copy, record_stream() nothing
        stack.enter_context(mock.patch.object(torch.Tensor, "pin_memory", _pinned_copy))
        stack.enter_context(mock.patch.object(torch.Tensor, "record_stream", _record_stream))
        stack.enter_context(_cudnn_disabled())
        if _CPU_ONLY_BUILD:
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=re.escape(_AUTOCAST_DISABLED_WARNING))
        yield


def _pinned_copy(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    """``Tensor.pin_memory()`` under simulation: a copy on the CPU, as pinned memory is."""
    if self.device.type != "cpu":
        raise RuntimeError(f"cannot pin '{self.device}' memory: only dense CPU tensors can be pinned")
    return self.clone()


def _record_stream(self: torch.Tensor, stream: Any) -> None:
    """``Tensor.record_stream(s)`` under simulation: nothing to tell an allocator that does not exist."""


@contextlib.contextmanager
def _cudnn_disabled() -> Iterator[None]:
    """``torch.backends.cudnn.enabled = False`` for the block, leaving the other cuDNN flags alone."""
    enabled = torch._C._get_cudnn_enabled()
    torch._C._set_cudnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_cudnn_enabled(enabled)


@contextlib.contextmanager
def simulated_cuda(gpus: int = 1, fake_mode: Any = None) -> Iterator[Any]:
    """Fake-tensor mode plus simulated ``torch.cuda`` queries; yields the fake mode.

    ``fake_mode`` (default: a new one) lets several sessions share one mode:
    the model built in one (``torch.zeros(..., device="cuda")`` in
    ``__init__``) is moved and run in the next, and fake tensors of two modes
    cannot meet.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = fake_mode if fake_mode is not None else FakeTensorMode(allow_non_fake_inputs=True)
    # A CPU-only build refuses .to("cuda") even on fake tensors; there the moves are made by hand.
    moves = _FakeCudaMoves(mode) if _CPU_ONLY_BUILD else contextlib.nullcontext()
    with cuda_queries_simulated(gpus), _fake_parameters_swappable(), mode, moves:
        yield mode


def _forget_fake_memo(t: Any) -> None:
    """Drop the fake mode's weak references to ``t`` (its converter memo), so that it can be swapped."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(t, FakeTensor):
        return
    memo = t.fake_mode.fake_tensor_converter.tensor_memo
    keys = [ref.key for ref in weakref.getweakrefs(t) if isinstance(ref, weakref.KeyedRef)]
    for key in keys:
        if memo.get(key) is t:
            del memo[key]


@contextlib.contextmanager
def _fake_parameters_swappable() -> Iterator[None]:
    """Let ``Module._apply`` move parameters that are already fake tensors.

    A model built inside the fake mode (because its ``__init__`` creates CUDA
    tensors) holds fake parameters; ``.to()``/``.cuda()`` on it then swaps each
    one for its moved version with ``torch.utils.swap_tensors``, which refuses
    a tensor with a weak reference, and the fake mode's memo holds one ("Couldn't
    swap Linear.weight"). The memo only saves re-converting the same tensor, so
    the entry is dropped before the swap. The swap keeps each Parameter object,
    as ``.to()`` does on a real GPU.
    """
    real_swap: Callable[[torch.Tensor, torch.Tensor], None] = torch.utils.swap_tensors

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        _forget_fake_memo(t1)
        _forget_fake_memo(t2)
        real_swap(t1, t2)

    with mock.patch.object(torch.utils, "swap_tensors", swap):
        yield


def _fake_on(fake_mode: Any, t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A fake tensor of ``fake_mode`` shaped like ``t``, on ``device``, with no data."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    with unset_fake_temporarily():
        if isinstance(t, UninitializedParameter | UninitializedBuffer):  # nn.Lazy* state: no shape yet
            meta = torch.empty(0, dtype=dtype, device="meta")
        else:
            meta = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="meta")
    fake: torch.Tensor = fake_mode.fake_tensor_converter.from_meta_and_device(fake_mode, meta, device)
    return fake


_META = torch.device("meta")


class _FakeCudaMoves(TorchFunctionMode):
    """``x.to("cuda")`` / ``x.cuda()`` as fake CUDA tensors, for a CPU-only build of torch.

    That build refuses any move to CUDA ("not linked with support for cuda
    devices"), fake tensors included, while fake CUDA factories work; so each
    move to CUDA becomes a new fake CUDA tensor of the same shape and dtype,
    whether it runs in ``__init__``, in ``model.to()`` or in forward.

    Indexing a fake CUDA tensor (``x[0]``, ``x[:, 0]``, ``x[idx]``) fails there
    too: Python's indexing sets a CUDA device guard before any dispatch. It is
    computed on fake ``meta`` stand-ins instead (shapes and errors are the
    same; fake tensors hold no values) and the result made a fake CUDA tensor.
    The tracer's mode, entered later, has checked the devices before this runs.
    """

    def __init__(self, fake_mode: Any) -> None:
        super().__init__()
        self.fake_mode = fake_mode

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
        from placecheck.tagged import _destination, _to_options

        kwargs = kwargs or {}
        if func in (torch.Tensor.to, torch.Tensor.cuda) and args and isinstance(args[0], torch.Tensor):
            dest = _destination(func, args, kwargs)
            if dest is not None and dest.type == "cuda":
                source: torch.Tensor = args[0]
                options = _to_options(args, kwargs) if func is torch.Tensor.to else {}
                dtype = options.get("dtype") or source.dtype
                if source.device == dest and dtype == source.dtype and not options.get("copy"):
                    return source  # already there: .to() returns the tensor itself
                moved = _fake_on(self.fake_mode, source, dest, dtype)
                if source.requires_grad and torch.is_grad_enabled():
                    moved.requires_grad_(True)
                return moved
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and args \
                and isinstance(args[0], torch.Tensor) and args[0].device.type == "cuda":
            return self._index(func, args)
        return func(*args, **kwargs)


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

    with mock.patch.object(nn.Module, "_apply", apply_once):
        yield


def move_model(model: nn.Module, engine: Engine) -> nn.Module:
    """``model.to(device)``, exactly as a user's script would, inside ``engine``.

    Under fake tensors the uninitialised buffers of ``nn.Lazy*`` modules
    (``LazyBatchNorm1d.running_mean``) are first made empty tensors, as
    ``.to()`` makes of uninitialised parameters: the fake mode cannot
    dispatch on their tensor subclass ("Multiple dispatch failed for
    aten._to_copy"). On a CPU-only build of torch the session itself turns
    moves to CUDA into fake CUDA tensors (:class:`_FakeCudaMoves`).
    """
    if not engine.fake:
        moved = model.to(engine.device)
        return moved if isinstance(moved, nn.Module) else model
    from torch.nn.parameter import UninitializedBuffer

    for module in model.modules():
        for name, buffer in module._buffers.items():
            if isinstance(buffer, UninitializedBuffer):
                module._buffers[name] = _fake_on_same_device(buffer)
    with _each_module_applied_once():
        moved = model.to(engine.device)
    return moved if isinstance(moved, nn.Module) else model


def _fake_on_same_device(t: torch.Tensor) -> torch.Tensor:
    """An empty fake tensor on ``t``'s device with its dtype, in the active fake mode."""
    from torch._guards import active_fake_mode

    fake_mode = active_fake_mode()
    if fake_mode is None:
        return torch.empty(0, dtype=t.dtype, device=t.device)
    return _fake_on(fake_mode, t, t.device, t.dtype)


# What fake tensors cannot run, by the message PyTorch raises when no exception type says it.
_FAKE_LIMIT_TEXTS: tuple[tuple[str, str], ...] = (
    ("not linked with support for cuda",
     "this torch build has no CUDA support, which some fake-tensor ops need"),
    ("hasprimarycontext", "autograd needs a real CUDA device under fake tensors"),
    ("cannot access data pointer of tensor", "it reads a tensor's memory (data_ptr)"),
    (".numpy() is not supported for tensor subclasses", "it reads tensor values (.numpy())"),
    ("not available for 'meta' device type", "it reads a tensor's storage"),
)


def fake_limit(exc: BaseException) -> str:
    """Why the fake engine could not run a forward, when ``exc`` (or its cause) says it was its limit.

    "" otherwise: an error of the model's own (a shape mismatch, a bad
    ``device=``) is the model's, even when its message mentions fake tensors.
    Recognised: fake tensors' own exceptions (data-dependent values and
    shapes, an operator without a fake implementation, a tensor they cannot
    convert, a guard on a data-dependent symbolic size), their "NYI: aten.*"
    assertions, and the messages in :data:`_FAKE_LIMIT_TEXTS`.
    """
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedFakeTensorException,
        UnsupportedOperatorException,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from placecheck.errors import one_line
    from placecheck.trace import user_line

    seen: BaseException | None = exc
    why = ""
    while seen is not None and not why:
        text = str(seen).lower()
        if isinstance(seen, DataDependentOutputException | GuardOnDataDependentSymNode):
            why = "it reads tensor values (.item(), .tolist(), bool() or if on a tensor)"
        elif isinstance(seen, DynamicOutputShapeException):
            why = "an op's output shape depends on values (nonzero, boolean-mask indexing, unique)"
        elif isinstance(seen, UnsupportedOperatorException):
            why = f"an operator has no fake-tensor implementation ({one_line(seen)})"
        elif isinstance(seen, UnsupportedFakeTensorException):
            why = f"fake tensors cannot represent a tensor it uses ({one_line(seen)})"
        elif isinstance(seen, AssertionError) and text.startswith("nyi: aten."):
            why = f"an operator is not implemented for fake tensors ({one_line(seen)})"
        else:
            why = next((reason for needle, reason in _FAKE_LIMIT_TEXTS if needle in text), "")
        seen = seen.__cause__ or seen.__context__
    if not why:
        return ""
    line = user_line(exc)
    return f"{why} at {line}" if line else why


# Errors from code that needs a real CUDA driver, which no simulation here can give.
_DRIVER_ERRORS = ("found no nvidia driver", "cuda driver version is insufficient",
                  "no cuda gpus are available", "not compiled with cuda", "cudagetdevicecount",
                  "hasprimarycontext", "cuda error: ",
                  "tried to instantiate dummy base class")  # CUDA classes on the CPU-only build


def is_simulation_limit(exc: BaseException) -> str:
    """A note when ``exc``, raised during a simulated forward, is the simulation's limit, not the model's.

    Returns "" when ``exc`` is not such an error. Code that is correct on a GPU
    can still call into the CUDA driver (a custom kernel, ``torch.cuda.graphs``,
    NCCL, an API :func:`_cuda_query_patches` does not simulate); its error
    says nothing about the model's placement, so it belongs in the report's
    notes, not in a PC207 that blames the user's code.
    """
    from placecheck.errors import one_line
    from placecheck.trace import user_line

    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen).lower()
        if any(needle in text for needle in _DRIVER_ERRORS):
            line = user_line(exc)
            where = f" at {line}" if line else ""
            return (f"forward: stopped{where}: the code there needs a real CUDA driver, which the simulation "
                    f"does not provide ({one_line(seen)}); run on a GPU to check the rest")
        seen = seen.__cause__ or seen.__context__
    return ""
