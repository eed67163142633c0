"""What an error raised while building or running a model means: the one place that decides.

Three answers, each from the best evidence there is:

- a **device mismatch** (PC201) is decided from the tensors the op received:
  :func:`mixes_devices` looks at their devices, never at PyTorch's message,
  which differs from op to op ("Expected all tensors to be on the same
  device", ``nn.LSTM``'s "Input and hidden tensors are not at the same
  device", ``index_add_``'s "expected to be in the same device", a
  convolution's "Input type ... and weight type ... should be the same");
- a **limit of the simulation** (:func:`fake_limit`, :func:`simulation_limit`,
  :func:`needs_cuda_driver`): fake tensors' own exception types where they
  exist; for code calling into a CUDA driver that is not there, the driver's
  message is the only evidence PyTorch gives, so those texts are kept here, once;
- otherwise the **user's bug** (PC207).

Call arguments are traversed with torch's pytree (:mod:`placecheck.compat`), as PyTorch's flop
counter and fake tensors do. This module imports nothing of placecheck above
:mod:`placecheck.sources`, and that and torch only inside its functions (the
CLI's parent process, which calls :func:`out_of_memory`, never imports torch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from placecheck.errors import one_line

if TYPE_CHECKING:
    import torch


def tensor_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[tuple[int, torch.Tensor]]:
    """``(argument position, tensor)`` for every tensor in a call's arguments, nested containers too.

    The position is that of the top-level argument holding the tensor (keyword
    arguments follow the positional ones), which decides whether a CPU tensor
    is a legal index (:func:`legal_cpu_argument`).
    """
    import torch

    from placecheck.compat import tree_leaves

    for pos, a in enumerate((*args, *kwargs.values())):
        if isinstance(a, torch.Tensor):
            yield pos, a
        elif isinstance(a, list | tuple | dict):
            for leaf in tree_leaves(a):
                if isinstance(leaf, torch.Tensor):
                    yield pos, leaf


def _index_ops() -> frozenset[Callable[..., Any]]:
    import torch

    return frozenset({torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put_,
                      torch.Tensor.index_put, torch.index_put})


_INDEX_OPS: frozenset[Callable[..., Any]] | None = None


def index_ops() -> frozenset[Callable[..., Any]]:
    """Ops whose index arguments (after the first) may be CPU tensors on a GPU: an implicit copy."""
    global _INDEX_OPS
    if _INDEX_OPS is None:
        _INDEX_OPS = _index_ops()
    return _INDEX_OPS


def legal_cpu_argument(func: Callable[..., Any], pos: int, t: torch.Tensor) -> bool:
    """A CPU tensor a GPU op accepts: a 0-dim scalar, or an index tensor (not the indexed one)."""
    return t.device.type == "cpu" and (t.dim() == 0 or (func in index_ops() and pos > 0))


def offending_arguments(func: Callable[..., Any], tensors: list[tuple[int, torch.Tensor]],
                        device: torch.device) -> list[tuple[int, torch.Tensor]]:
    """The tensors of a call on ``device`` that a GPU op could not take: off ``device`` and not a
    legal CPU scalar or index."""
    return [(pos, t) for pos, t in tensors if t.device != device and not legal_cpu_argument(func, pos, t)]


def mixes_devices(func: Callable[..., Any], tensors: list[tuple[int, torch.Tensor]]) -> bool:
    """True when an op's tensor arguments are on two devices in a way no GPU kernel accepts.

    Decided from the devices alone: the legal mixes (a 0-dim CPU scalar, a CPU
    index tensor) do not count.
    """
    devices = {t.device for pos, t in tensors if not legal_cpu_argument(func, pos, t)}
    return len(devices) > 1


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def is_engine_mismatch(exc: BaseException) -> bool:
    """True when a simulating engine raised its own device-mismatch exception type for ``exc``.

    Not the text: fake tensors' device check raised it (its exception type where
    torch has one, :func:`placecheck.compat.is_fake_device_mismatch`), or the
    real-valued engine raised :class:`~placecheck.tagged.SimulatedDeviceMismatchError`
    (a subclass of :class:`DeviceMismatchError`, defined here so that this
    module does not import the engine).
    """
    from placecheck.compat import is_fake_device_mismatch

    return any(isinstance(e, DeviceMismatchError) or is_fake_device_mismatch(e) for e in _chain(exc))


class DeviceMismatchError(RuntimeError):
    """An op mixed devices, decided from its tensor arguments (raised by placecheck's own engines)."""


# Fake tensors' limits that no exception type names, by the message PyTorch raises.
_FAKE_LIMIT_TEXTS: tuple[tuple[str, str], ...] = (
    ("not linked with support for cuda",
     "this torch build has no CUDA support, which some fake-tensor ops need"),
    ("hasprimarycontext", "autograd needs a real CUDA device under fake tensors"),
    ("cannot access data pointer of tensor", "it reads a tensor's memory (data_ptr)"),
    (".numpy() is not supported for tensor subclasses", "it reads tensor values (.numpy())"),
    ("not available for 'meta' device type", "it reads a tensor's storage"),
)

# Errors from code that needs a real CUDA driver, which no simulation here can give.
_DRIVER_TEXTS = ("found no nvidia driver", "cuda driver version is insufficient",
                 "no cuda gpus are available", "not compiled with cuda", "cudagetdevicecount",
                 "hasprimarycontext", "cuda error: ",
                 "tried to instantiate dummy base class")  # CUDA classes on the CPU-only build

# What building a model that wants a GPU raises without one (then it is built inside the simulation).
_BUILD_TEXTS = ("no nvidia driver", "not compiled with cuda", "cuda driver", "cuda error",
                "found no nvidia", "not linked with support for cuda", "cudagetdevicecount")

_OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory", "memoryerror")


def fake_limit(exc: BaseException, assumed: bool = False) -> str:
    """Why the fake engine could not run a forward, when ``exc`` (or its cause) says it was its limit.

    "" otherwise: an error of the model's own (a shape mismatch, a bad
    ``device=``) is the model's, even when its message mentions fake tensors.
    ``assumed``: ``exc`` (not a device mismatch) came after ops that ran on
    assumed values (:mod:`placecheck.datadep`), which real values may not have
    given (a size, a value read to the host): then any error is the limit.
    Recognised: fake tensors' own exceptions (data-dependent values and
    shapes, an operator without a fake implementation, a tensor they cannot
    convert, a guard on a data-dependent symbolic size), their "NYI: aten.*"
    assertions, and the messages in :data:`_FAKE_LIMIT_TEXTS`.
    """
    from placecheck.compat import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        GuardOnDataDependentSymNode,
        UnsupportedFakeTensorException,
        UnsupportedOperatorException,
    )

    why = ""
    for seen in _chain(exc):
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
        if why:
            break
    if not why and assumed:
        why = (f"the forward raised {one_line(exc)} after ops that ran on assumed values (see the notes), "
               "which real values may not give")
    if not why:
        return ""
    from placecheck.sources import user_line  # a lower layer, imported here: it imports torch

    line = user_line(exc)
    return f"{why} at {line}" if line else why


def simulation_limit(exc: BaseException) -> str:
    """A note when ``exc``, raised during a simulated forward, is the simulation's limit, not the model's.

    Returns "" when ``exc`` is not such an error. Code that is correct on a GPU
    can still call into the CUDA driver (a custom kernel, ``torch.cuda.graphs``,
    NCCL, an API the engine does not simulate); its error says nothing about
    the model's placement, so it belongs in the report's notes, not in a PC207
    that blames the user's code.
    """
    for seen in _chain(exc):
        text = str(seen).lower()
        if any(needle in text for needle in _DRIVER_TEXTS):
            from placecheck.sources import user_line  # a lower layer, imported here: it imports torch

            line = user_line(exc)
            where = f" at {line}" if line else ""
            return (f"forward: stopped{where}: the code there needs a real CUDA driver, which the simulation "
                    f"does not provide ({one_line(seen)}); run on a GPU to check the rest")
    return ""


def needs_cuda_driver(exc: BaseException) -> bool:
    """True when building a model failed because it wanted a real GPU (``exc`` or its direct cause)."""
    text = f"{exc} {exc.__cause__ or ''}".lower()
    return any(s in text for s in _BUILD_TEXTS)


def out_of_memory(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is the machine running out of memory."""
    return any(isinstance(e, MemoryError) or any(t in str(e).lower() for t in _OOM_TEXTS)
               for e in _chain(exc))
