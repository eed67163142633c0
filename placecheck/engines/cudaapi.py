"""The simulated ``torch.cuda`` runtime API: what model code may ask a GPU that is not there.

Model code that asks ``torch.cuda.is_available()`` or ``device_count()`` must
see the simulated GPUs during a simulated audit, or it takes its CPU path;
the rest of the common runtime API (streams, events, RNG, device properties,
memory statistics, autocast's availability check) answers harmlessly (see
:func:`_cuda_query_patches`), and so does the device-generic ``torch.accelerator``
API of torch 2.6+ (:func:`_accelerator_patches`, feature-detected). torch's own
internals keep the real answers.

Both simulating engines (fake tensors in :mod:`placecheck.engines.engine`, real values
in :mod:`placecheck.engines.tagged`) enter :func:`cuda_queries_simulated`. Every replacement goes through
:func:`placecheck.basics.patching.patch`, with its reason.

Legacy CUDA types (``torch.cuda.FloatTensor(2, 3)``, ``x.type(torch.cuda.HalfTensor)``,
``x.type("torch.cuda.FloatTensor")``) need a driver whatever the engine; under simulation they are the
moves they stand for (:func:`_legacy_cuda_types`, :func:`_tensor_type`), which each engine simulates.
A default device the script sets (``torch.set_default_device("cuda")``) is the simulated one during the
session and is undone when it ends (:func:`_default_device_kept`).

Not reentrant: one simulated session at a time per process.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from placecheck.basics.patching import patch
from placecheck.engines.calls import as_device, legacy_type
from placecheck.engines.classify import FORKED_CUDA, ForkedCudaError, InvalidDeviceError, RefusedOnDeviceError
from placecheck.engines.compat import cudnn_disabled, default_device, legacy_tensor_types

_WHY_QUERIES = ("model code asks torch.cuda / torch.accelerator how many GPUs there are and which is "
                "current; without a driver the real functions say none, and the code would take its CPU path")
_WHY_DRIVER = ("page-locked memory and the allocator's stream hint need a driver; neither changes where a "
               "tensor is")
_WHY_LEGACY = ("the legacy CUDA types (torch.cuda.FloatTensor, x.type('torch.cuda.FloatTensor')) need a "
               "driver whatever the engine; they are the moves they stand for")


class SimulatedStream:
    """A CUDA stream of the simulation: every operation is a no-op (fake tensors run nothing)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        named = as_device(device) if device is not None else None
        self.device = torch.device("cuda", named.index or 0 if named is not None else 0)
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


_current = [0]
"""The simulated current CUDA device's index (``torch.cuda.current_device()``): one cell, set by
``torch.cuda.set_device`` / ``torch.cuda.device(i)`` in model code and by :func:`current_device`."""


_gpus: list[int | None] = [None, None]
"""How many GPUs the simulated session has: [0] when ``--gpus`` bounds them (a higher index does not
exist), else None; [1] in any session, None outside one."""


def missing_gpu(device: torch.device) -> InvalidDeviceError | None:
    """What CUDA raises for ``device`` when the simulated machine lacks it (``cuda:3`` of 2 GPUs); None
    when it has it, or outside a simulated session (a real GPU raises by itself)."""
    gpus = _gpus[0]
    if gpus is None or device.type != "cuda" or (device.index or 0) < gpus:
        return None
    return InvalidDeviceError(str(device), gpus)


_initialised = [False]
"""A simulated CUDA tensor was made in this session: CUDA is initialised, as on a GPU."""
_bad_fork = [False]
"""This process was forked from one whose simulated CUDA was initialised (torch's ``_is_in_bad_fork``)."""


def cuda_initialised() -> None:
    """A simulated CUDA tensor was made: a process forked from here may not use CUDA again."""
    _initialised[0] = True


def forked_cuda_error() -> ForkedCudaError | None:
    """What CUDA raises on first use in a process forked after its parent initialised CUDA (a
    ``DataLoader`` worker under the fork start method whose dataset makes CUDA tensors); None here."""
    return ForkedCudaError(FORKED_CUDA) if _bad_fork[0] else None


def _after_fork_in_child() -> None:
    _bad_fork[0] = _bad_fork[0] or (_gpus[1] is not None and _initialised[0])


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_index() -> int:
    """The simulated current CUDA device's index: where ``device="cuda"`` and ``.cuda()`` go."""
    return _current[0]


@contextlib.contextmanager
def current_device(index: int) -> Iterator[None]:
    """``cuda:index`` is the simulated current device inside the block (``torch.cuda.device(index)``
    on a GPU: what DataParallel's replica threads and a rank after ``set_device(rank)`` run under)."""
    before = _current[0]
    _current[0] = index
    try:
        yield
    finally:
        _current[0] = before


def _index_of(device: Any) -> int | None:
    """The CUDA index ``torch.cuda.device(...)``/``set_device(...)`` select; None: keep the current one
    (a negative index, ``"cuda"`` without one, a CPU device)."""
    dev = as_device(device, _current[0])
    return dev.index if dev is not None and dev.type == "cuda" else None


class _SimulatedDeviceContext:
    """``torch.cuda.device(i)`` / ``device_of(t)``: ``cuda:i`` is the current device inside the block."""

    def __init__(self, device: Any = None) -> None:
        index = _index_of(device)
        self.idx = -1 if index is None else index
        self._before = _current[0]

    def __enter__(self) -> None:
        self._before = _current[0]
        if self.idx >= 0:
            _current[0] = self.idx

    def __exit__(self, *exc: Any) -> None:
        _current[0] = self._before


def _device_of(obj: Any) -> _SimulatedDeviceContext:
    device = getattr(obj, "device", None)
    return _SimulatedDeviceContext(device if isinstance(device, torch.device) and device.type == "cuda"
                                   else None)


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

    def _set_device(device: Any) -> None:
        index = _index_of(device)
        if index is None:
            return
        if index >= gpus:
            raise InvalidDeviceError(f"cuda:{index}", gpus)
        _current[0] = index

    return {
        "is_available": lambda: True,
        "device_count": lambda: gpus,
        "current_device": current_index,
        "is_initialized": lambda: True,
        "init": _none,
        "get_device_name": lambda device=None: SIMULATED_GPU_NAME,
        "get_device_capability": lambda device=None: (9, 0),
        "get_device_properties": _props,
        "get_arch_list": lambda: ["sm_90"],
        "is_bf16_supported": lambda *a, **k: True,
        "is_tf32_supported": lambda *a, **k: True,
        "can_device_access_peer": lambda device, peer: True,
        "set_device": _set_device,
        "device": _SimulatedDeviceContext,
        "device_of": _device_of,
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


class _SimulatedDeviceIndex:
    """``torch.accelerator.device_index(i)``: ``cuda:i`` is the current device inside the block (``None``:
    no switch)."""

    def __init__(self, device: int | None, /) -> None:
        self.idx = device
        self._before = _current[0]

    def __enter__(self) -> None:
        self._before = _current[0]
        if self.idx is not None and self.idx >= 0:
            _current[0] = self.idx

    def __exit__(self, *exc: Any) -> None:
        _current[0] = self._before


def _accelerator_patches(gpus: int) -> dict[str, Callable[..., Any]]:
    """``torch.accelerator`` (torch 2.6+), the device-generic runtime API, answered as ``torch.cuda`` is
    (:func:`_cuda_query_patches`): CUDA is the accelerator, ``gpus`` of them, the simulated current device;
    what it cannot simulate either (graphs, ``torch.Stream`` objects) is left as torch has it."""
    cuda = _cuda_query_patches(gpus)

    def _current_accelerator(check_available: bool = False) -> torch.device:
        return torch.device("cuda")  # the compile-time accelerator of a CUDA build, and available

    def _capability(device: Any = None, /) -> dict[str, Any]:
        return {"supported_dtypes": {t for t in vars(torch).values() if isinstance(t, torch.dtype)}}

    return {
        "is_available": cuda["is_available"],
        "current_accelerator": _current_accelerator,
        "device_count": cuda["device_count"],
        "current_device_index": current_index,
        "current_device_idx": current_index,
        "set_device_index": cuda["set_device"],
        "set_device_idx": cuda["set_device"],
        "device_index": _SimulatedDeviceIndex,
        "get_device_capability": _capability,
        "synchronize": cuda["synchronize"],
        "current_stream": cuda["current_stream"],
        "set_stream": cuda["set_stream"],
        "empty_cache": cuda["empty_cache"],
        "empty_host_cache": cuda["empty_cache"],
        "get_memory_info": cuda["mem_get_info"],
        **{name: cuda[name] for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                                         "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
                                         "reset_accumulated_memory_stats")},
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
# torch.distributed asks on the user's behalf too: FSDP2's fully_shard places the parameters on
# torch.cuda.current_device() (the rank's GPU after set_device), DeviceMesh asks for the
# GPUs; under simulation they must see the simulated ones (placecheck.placement.replicas).
_DISTRIBUTED = "torch.distributed."
# The DataLoader asks torch.accelerator whether to pin its batches (and, with workers, which device its
# pinning thread serves): under simulation it must pin as on a GPU machine, so that pinning a batch
# already on the device raises there as it does on one (Tensor.pin_memory is simulated below).
_DATA_LOADING = ("torch.utils.data.dataloader", "torch.utils.data._utils.pin_memory")
CPU_ONLY_BUILD = torch.version.cuda is None and torch.version.hip is None
_AUTOCAST_DISABLED_WARNING = "CUDA is not available or torch_xla is imported. Disabling autocast"


def _called_from_torch(depth: int = 2) -> bool:
    """True when the caller of the patched function is torch itself."""
    name = sys._getframe(depth).f_globals.get("__name__", "")
    for_user = (name in _ASKING_FOR_USER_CODE and not CPU_ONLY_BUILD) or name.startswith(_DISTRIBUTED) \
        or name in _DATA_LOADING
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
def cuda_queries_simulated(gpus: int, strict: bool = False) -> Iterator[None]:
    """Make ``torch.cuda.is_available()`` and friends, and ``torch.accelerator``'s (torch 2.6+), report
    ``gpus`` GPUs to model code.

    ``strict`` (``--gpus`` given): the machine has no more GPUs; a tensor on a higher index raises
    CUDA's "invalid device ordinal" (:func:`missing_gpu`). Otherwise ``gpus`` is only enough for the
    target, and a model naming another GPU is audited as one that has it.

    cuDNN is switched off for the session: with it, ``nn.LSTM``/``GRU``/``RNN``
    take cuDNN's path on (simulated) CUDA tensors, whose ``flatten_parameters``
    and ``_cudnn_rnn`` need a driver ("Found no NVIDIA driver", "CUDA driver
    version is insufficient"). Without it they run PyTorch's native kernels,
    which follow the same device rules; placement does not depend on the backend.
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(current_device(_current[0]))  # what model code selects stays in the session
        stack.enter_context(_gpu_count(gpus, strict))
        for name, fn in _cuda_query_patches(gpus).items():
            real = getattr(torch.cuda, name, None)
            if real is None:
                continue
            # classes stay classes (isinstance(s, torch.cuda.Stream) must work); the real ones need a
            # driver whoever calls them
            patched = fn if isinstance(fn, type) else _for_user_code(fn, real)
            stack.enter_context(patch(torch.cuda, name, patched, _WHY_QUERIES))
        accelerator = getattr(torch, "accelerator", None)  # torch 2.6+
        for name, fn in _accelerator_patches(gpus).items() if accelerator is not None else ():
            real = getattr(accelerator, name, None)
            if real is not None:
                patched = fn if isinstance(fn, type) else _for_user_code(fn, real)
                stack.enter_context(patch(accelerator, name, patched, _WHY_QUERIES))
        # page-locked host memory and the allocator's stream hint need a driver; neither changes
        # where a tensor is: pin_memory() is a CPU copy, record_stream() nothing
        stack.enter_context(patch(torch.Tensor, "pin_memory", _pinned_copy, _WHY_DRIVER))
        stack.enter_context(patch(torch.Tensor, "record_stream", _record_stream, _WHY_DRIVER))
        stack.enter_context(cudnn_disabled())
        stack.enter_context(patch(torch.Tensor, "type", _tensor_type(torch.Tensor.type), _WHY_LEGACY))
        for name, legacy in _legacy_cuda_types().items():
            stack.enter_context(patch(torch.cuda, name, legacy, _WHY_LEGACY))
        stack.enter_context(_default_device_kept())
        stack.enter_context(patch(torch, "Generator", _simulated_generator_type(), _WHY_GENERATOR))
        if CPU_ONLY_BUILD:
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=re.escape(_AUTOCAST_DISABLED_WARNING))
        yield


_WHY_GENERATOR = ("torch.Generator(device='cuda') needs a driver; the simulated CUDA ops draw from a CPU "
                  "generator that says it is on the GPU, and a class has no hook for what it constructs")


def _simulated_generator_type() -> type:
    """What ``torch.Generator`` is in the session: ``torch.Generator(device="cuda:1")`` (or ``"cuda"``: the
    current device, as CUDA's default) is a CPU generator whose ``device`` is ``cuda:1`` (the simulated
    ops run on the CPU, whose kernels draw from it, and a GPU's generator check reads that device); any
    other device is torch's own. ``isinstance(g, torch.Generator)`` and ``issubclass`` answer for torch's
    class, which every generator of the session is."""
    real = torch.Generator

    class SimulatedCudaGenerator(real):  # type: ignore[misc,valid-type]  # torch's class is untyped
        def __new__(cls, device: torch.device) -> SimulatedCudaGenerator:
            made = real.__new__(cls, "cpu")  # type: ignore[call-arg]  # torch.Generator(device)
            made.__dict__["_simulated_device"] = device
            return made  # type: ignore[no-any-return]

        def __init__(self, device: torch.device) -> None:  # made in __new__
            pass

        @property
        def device(self) -> torch.device:
            return self.__dict__["_simulated_device"]  # type: ignore[no-any-return]

        def __repr__(self) -> str:
            return f"<torch.Generator object on {self.device} (simulated)>"

    class GeneratorType(type):
        def __call__(cls, device: Any = "cpu") -> Any:
            where = torch.device(device) if isinstance(device, str | int) else device
            if isinstance(where, torch.device) and where.type == "cuda":
                index = where.index if where.index is not None else _current[0]
                return SimulatedCudaGenerator(torch.device("cuda", index))
            return real(device)

        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, real)

    class Generator(metaclass=GeneratorType):
        """torch.Generator, under placecheck's simulated CUDA."""

    return Generator


@contextlib.contextmanager
def _gpu_count(gpus: int, strict: bool) -> Iterator[None]:
    before = list(_gpus), _initialised[0]
    _gpus[:] = [gpus if strict else None, gpus]
    try:
        yield
    finally:
        _gpus[:] = before[0]
        _initialised[0] = before[1]


class _LegacyCudaType(type):
    """A legacy CUDA tensor type under simulation: ``torch.cuda.FloatTensor(2, 3)`` is its CPU type's
    tensor moved to the current CUDA device; ``isinstance(t, torch.cuda.FloatTensor)`` asks the visible
    device and the dtype."""

    dtype: torch.dtype
    host: Any
    is_cuda = True
    simulates_legacy_type = True

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor) and obj.device.type == "cuda" and obj.dtype == cls.dtype

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.pop("device", None)
        target = torch.device("cuda", current_index()) if device is None else torch.device(device)
        return cls.host(*args, **kwargs).to(target)


def _legacy_cuda_types() -> dict[str, type]:
    """``torch.cuda.<X>Tensor`` for each legacy CUDA type PyTorch has, as :class:`_LegacyCudaType`s."""
    hosts = {(c.dtype, c.__module__): c for c in legacy_tensor_types() if not c.is_cuda}
    found: dict[str, type] = {}
    for c in legacy_tensor_types():
        host = hosts.get((c.dtype, "torch"))
        if c.is_cuda and c.__module__ == "torch.cuda" and host is not None:
            found[c.__name__] = _LegacyCudaType(c.__name__, (), {"dtype": c.dtype, "host": host,
                                                                  "__module__": "torch.cuda"})
    return found


def _tensor_type(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.type(t)``: to a legacy CUDA type (a class or its name), the move it stands for (each engine
    simulates ``.to``); anything else as torch does it."""
    def type(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is None:
            return original(self, **kwargs)  # the name asked
        wanted = legacy_type(dtype)
        if wanted is None or not wanted[0]:
            return original(self, dtype, non_blocking, **kwargs)
        here = self.device
        device = here if here.type == "cuda" else torch.device("cuda", current_index())
        if here == device and self.dtype == wanted[1]:
            return self  # already of that type: the tensor itself, as torch returns it
        return self.to(device=device, dtype=wanted[1], non_blocking=non_blocking)
    type.__doc__ = original.__doc__
    return type


@contextlib.contextmanager
def _default_device_kept() -> Iterator[None]:
    """A default device the script sets (``torch.set_default_device``) ends with the session."""
    before = default_device()
    try:
        yield
    finally:
        if default_device() != before:
            torch.set_default_device(before)


def _pinned_copy(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    """``Tensor.pin_memory()`` under simulation: a copy on the CPU, as pinned memory is."""
    if self.device.type != "cpu":
        raise RefusedOnDeviceError(f"cannot pin '{self.device}' memory: only dense CPU tensors can be pinned")
    return self.clone()


def _record_stream(self: torch.Tensor, stream: Any) -> None:
    """``Tensor.record_stream(s)`` under simulation: nothing to tell an allocator that does not exist."""


