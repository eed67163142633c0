"""The real-valued engine: CUDA simulated with real CPU data tagged as CUDA.

The fake-tensor engine has no data, so it cannot run what depends on values:
``.item()``, ``nonzero``, boolean-mask indexing, Python ``if`` on a tensor,
nor (without a GPU) autograd. This engine runs those on the CPU:

- :class:`SimulatedTensor` is a ``torch.Tensor`` subclass sharing an ordinary
  CPU tensor's data, whose Python-visible ``device`` is the simulated one
  (``cuda:0``). Its ``__torch_function__`` applies PyTorch's device rules
  (raising PyTorch's own "Expected all tensors to be on the same device" text
  when an op mixes devices, with the same legal exceptions: 0-dim CPU scalars,
  CPU index tensors, cross-device copies) and tags every result.
- :class:`_TaggingMode` turns the calls that name a CUDA device
  (``torch.zeros(..., device="cuda")``, ``x.to("cuda:1")``, ``x.cuda()``,
  ``x.to(other)``) into CPU calls whose results are tagged.
- ``Module._apply`` would write a moved tensor back into the old plain
  ``nn.Parameter`` (``param.data = moved``), dropping the tag; the session sets
  ``torch.__future__.set_overwrite_module_params_on_conversion(True)`` so that
  ``.to()`` makes new parameters from the tagged tensors instead, as the fake
  engine does.

A plain CPU tensor (one ``.to()`` never moved, or one created in forward
without ``device=``) stays an ordinary tensor, so it is on ``cpu`` and the
first op mixing it with a tagged one raises, as on a GPU.

Not reentrant: one session at a time per process.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map_only

from placecheck.classify import (
    DeviceMismatchError,
    copies_between_devices,
    generator_off_device,
    host_arguments_on_device,
    host_outputs,
    legal_cpu_argument,
    mixes_devices,
    refused_on_device,
    tensor_arguments,
)
from placecheck.cudaapi import cuda_initialised, cuda_queries_simulated, current_index, forked_cuda_error

_CPU = torch.device("cpu")

class SimulatedDeviceMismatchError(DeviceMismatchError):
    """An op mixed devices under the real-valued engine (PyTorch's own text)."""


def _cuda(device: Any) -> torch.device | None:
    """``device`` as a ``cuda:N`` device, or None when it names no CUDA device."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    if not isinstance(device, str | torch.device):
        return None
    try:
        dev = torch.device(device)
    except RuntimeError:
        return None
    if dev.type != "cuda":
        return None
    return dev if dev.index is not None else torch.device("cuda", current_index())


def visible_device(t: torch.Tensor) -> torch.device:
    """The device a tensor reports: the tag of a simulated tensor, the real one otherwise."""
    return t.device


class SimulatedTensor(torch.Tensor):
    """Real CPU data, reported on a simulated CUDA device."""

    _pc_device: torch.device

    @staticmethod
    def tag(t: torch.Tensor, device: torch.device) -> SimulatedTensor:
        """``t``'s data, now reporting ``device`` (``t`` itself when already tagged)."""
        if isinstance(t, SimulatedTensor):
            t._pc_device = device
            return t
        with DisableTorchFunctionSubclass():
            tagged = t.as_subclass(SimulatedTensor)
        tagged._pc_device = device
        return tagged

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self._pc_device

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return self._pc_device.type == "cuda"

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return self._pc_device.type == "cpu"

    @classmethod
    def __torch_function__(cls, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.get_device:
            return args[0]._pc_device.index if isinstance(args[0], SimulatedTensor) else -1
        if func is torch.Tensor.__repr__ and isinstance(args[0], SimulatedTensor):
            # through __torch_function__ (no __repr__ override), so that a mode sees printing
            with DisableTorchFunctionSubclass():
                text = repr(args[0].as_subclass(torch.Tensor))
            return f"{text[:-1]}, device='{args[0]._pc_device}')" if text.endswith(")") else text
        refused = refused_on_device(func, args)
        if refused is not None:
            raise refused
        device = _result_device(func, args, kwargs)
        with DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if device is None:
            return out
        on_host = host_outputs(func)
        if on_host and isinstance(out, tuple):
            return tuple(o if i in on_host else _tag_all(o, device) for i, o in enumerate(out))
        return _tag_all(out, device)


def _result_device(func: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> torch.device | None:
    """The simulated device of ``func``'s result; raises on an illegal mix of devices. None: a plain
    tensor (``device="cpu"`` given, as in ``torch.empty_like(t, device="cpu")``, is the CPU whatever
    ``t`` is on)."""
    device = kwargs.get("device")
    if device is not None and _cuda(device) is None:
        return None
    simulated: torch.device | None = None
    plain: list[tuple[int, torch.Tensor]] = []
    mixed = False
    tensors = list(tensor_arguments(args, kwargs))
    for pos, t in tensors:
        if isinstance(t, SimulatedTensor):
            if simulated is None:
                simulated = t._pc_device
            elif t._pc_device != simulated:
                mixed = True
        else:
            plain.append((pos, t))
    if simulated is None:
        return None
    if copies_between_devices(func):
        first = args[0] if args else None
        return first._pc_device if isinstance(first, SimulatedTensor) else None
    _check_generator(args, kwargs, simulated)
    host = host_arguments_on_device(func, tensors)
    if host:
        raise SimulatedDeviceMismatchError(
            f"{getattr(func, '__name__', func)} needs its argument {host[0][0]} on the CPU, but got a tensor "
            f"on {host[0][1].device}")
    if getattr(func, "__name__", "").startswith("_foreach_"):
        if mixes_devices(func, tensors, args):
            raise SimulatedDeviceMismatchError(
                "Expected all tensors to be on the same device, but found at least two devices at one index "
                f"of the lists of {getattr(func, '__name__', func)}")
        return simulated
    offending = [t for pos, t in plain if not legal_cpu_argument(func, pos, t)]
    if offending or mixed:
        other = offending[0].device if offending else next(
            t._pc_device for _, t in tensors
            if isinstance(t, SimulatedTensor) and t._pc_device != simulated)
        name = getattr(func, "__name__", str(func))
        raise SimulatedDeviceMismatchError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"{simulated} and {other}! (when checking argument for {name})")
    return simulated


def _check_generator(args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device) -> None:
    """A GPU op given a ``torch.Generator`` of another device type raises; so does this engine."""
    generator = generator_off_device(args, kwargs, device)
    if generator is not None:
        raise SimulatedDeviceMismatchError(f"Expected a '{device.type}' device type for generator but found "
                                           f"'{generator.device.type}'")


def _tag_all(out: Any, device: torch.device) -> Any:
    """Every tensor in an op's output (nested lists, tuples, namedtuples, return types) tagged ``device``."""
    return tree_map_only(torch.Tensor, lambda t: SimulatedTensor.tag(t, device), out)


def move_destination(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Where a ``.to()``/``.cuda()``/``.cpu()`` call sends its tensor: a torch.device, or None."""
    if func is torch.Tensor.cpu:
        return _CPU
    if func is torch.Tensor.cuda:
        dev = args[1] if len(args) > 1 else kwargs.get("device")
        return _cuda(dev if dev is not None else current_index())
    if len(args) > 1 and isinstance(args[1], int) and not isinstance(args[1], bool):
        return _cuda(args[1])  # x.to(1) is x.to("cuda:1"), as accelerate's hooks write it
    for a in (*args[1:], kwargs.get("device"), kwargs.get("other")):
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, str | torch.device):
            return torch.device(a) if _cuda(a) is None else _cuda(a)
    return None


def to_options(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword form of a ``Tensor.to`` call, less its device: ``dtype``, ``non_blocking``, ..."""
    rest = list(args[1:])
    options = {k: v for k, v in kwargs.items() if k not in ("device", "other")}
    if rest and isinstance(rest[0], torch.Tensor):
        options["dtype"] = rest.pop(0).dtype
    elif rest and ((isinstance(rest[0], str | torch.device | int) and not isinstance(rest[0], bool))
                   or rest[0] is None):
        rest.pop(0)
    if isinstance(kwargs.get("other"), torch.Tensor):
        options["dtype"] = kwargs["other"].dtype
    for name, value in zip(("dtype", "non_blocking", "copy"), rest, strict=False):
        options[name] = value
    if options.get("dtype") is None:
        options.pop("dtype", None)
    return options


def _move(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
          dest: torch.device) -> torch.Tensor:
    """``.to(dest)``/``.cuda()``/``.cpu()`` with a real device's semantics: a copy when the
    device changes, the tensor itself when nothing does."""
    source = args[0]
    simulated = isinstance(source, SimulatedTensor)
    with DisableTorchFunctionSubclass():
        data = source.as_subclass(torch.Tensor) if simulated else source
        out = torch.Tensor.to(data, **to_options(args, kwargs)) if func is torch.Tensor.to else data
        if dest.type != "cuda":
            if simulated and out.data_ptr() == data.data_ptr():
                out = out.clone()  # a device-to-host copy never aliases the device tensor
            return out
        if simulated and source._pc_device == dest and out is data:
            return source  # type: ignore[no-any-return]  # already there: .to() returns itself
        _cuda_used()
        if out.data_ptr() == data.data_ptr():
            out = out.clone()  # a host-to-device copy never aliases the host tensor
    return SimulatedTensor.tag(out, dest)


def _cuda_used() -> None:
    """A new CUDA tensor: CUDA is initialised (or, in a process forked after that, raises as CUDA does)."""
    error = forked_cuda_error()
    if error is not None:
        raise error
    cuda_initialised()


class _TaggingMode(TorchFunctionMode):
    """Runs every call on the CPU; calls aimed at a simulated CUDA device return tagged tensors."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            dest = move_destination(func, args, kwargs)
            if dest is not None:
                return _move(func, args, kwargs, dest)
        if func is torch.Tensor.type_as and len(args) == 2 and isinstance(args[1], torch.Tensor):
            # x.type_as(other) is x.to(other.dtype) on other's device
            return _move(torch.Tensor.to, (args[0], args[1].dtype), {}, args[1].device)
        if kwargs.get("pin_memory"):
            # page-locked host memory needs a driver; it is CPU memory all the same
            kwargs = {**kwargs, "pin_memory": False}
        device = kwargs.get("device")
        dest = _cuda(device) if device is not None else None
        if dest is not None:
            _cuda_used()
            _check_generator(args, kwargs, dest)
            with DisableTorchFunctionSubclass():
                out = func(*args, **{**kwargs, "device": "cpu"})
            return _tag_all(out, dest)
        return func(*args, **kwargs)


@contextlib.contextmanager
def tagged_cuda(gpus: int = 1, strict: bool = False) -> Iterator[None]:
    """The real-valued session: tagging mode, simulated ``torch.cuda`` queries, new params on ``.to()``."""
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        with cuda_queries_simulated(gpus, strict), _TaggingMode(), warnings.catch_warnings():
            # the data is on the CPU, where an LSTM with proj_size warns that oneDNN cannot run it;
            # on the GPU being simulated it would not
            warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")
            yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
