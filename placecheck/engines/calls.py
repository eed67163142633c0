"""The one reading of a placement call: where a torch call puts its result, read with PyTorch's own parsing.

Every engine (fake tensors in :mod:`placecheck.engines.engine`, real values in
:mod:`placecheck.engines.tagged`) and run's module moves (:mod:`placecheck.run.moves`) ask
:func:`read_placement` what a call does to devices, instead of matching argument positions by hand.
Each entry of the table says where in PyTorch its reading comes from:

================================  ==========================================================================
call                              read with
================================  ==========================================================================
``Tensor.to``, ``Module.to``      ``torch._C._nn._parse_to`` (``compat.parse_to``): the parser
                                  ``nn.Module.to`` itself calls (torch/csrc/autograd/python_nn_functions
                                  ``THPVariable__parse_to``), whose three signatures are ``Tensor.to``'s
                                  (torch/csrc/autograd/python_variable_methods.cpp); only ``copy=``, which
                                  ``_parse_to`` refuses, is taken out first (the second positional ``bool``
                                  of every signature, or the keyword). A tensor argument gives its dtype and
                                  its *visible* device (a simulated tensor reports the simulated one).
``Tensor.cuda``, ``Module.cuda``  ``device=None|int|str|torch.device``, as ``torch.cuda._utils.``
                                  ``_get_device_index`` reads it (None: the current device)
``Tensor.cpu``, ``Module.cpu``    the CPU
``Tensor.type(t)``, ``type_as``   the legacy type classes ``torch._tensor_classes`` (each has ``is_cuda`` and
                                  ``dtype``), by object or by ``module.name`` string; ``type_as(o)`` is
                                  ``type(o.type())`` (torch/_tensor_docs.py)
factories, ``*_like``, ``new_*``  a ``Device? device`` argument in the op's schema
                                  (``torch.ops.aten.<name>.<overload>._schema``), plus the few factories bound
                                  in Python only (:data:`_PYTHON_FACTORIES`); an op with no such argument
                                  (``_parse_to``, ``linear``) is never a factory
default device                    ``torch.set_default_device`` / ``with torch.device(...)``: the factories of
                                  torch's own table (``torch.utils._device._device_constructors``) given no
                                  device go to the default one (``compat.default_device``)
``copy_``, ``resize_``, ``set_``  in place: the holder keeps its device
================================  ==========================================================================

``torch.load(map_location=...)`` is read where loads are simulated (:mod:`placecheck.run.checkpoints`),
its devices with :func:`as_device`.

A device naming ``cuda`` without an index is the current device (``torch.cuda.set_device``,
``torch.cuda.device(i)``): the caller passes the simulated current index. An ``int`` device is a CUDA
index, as on a CUDA build of torch.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.values import Device
from placecheck.engines.compat import (
    DisableTorchFunction,
    default_device,
    device_constructors,
    legacy_tensor_types,
    op_arguments,
    parse_to,
)


class Kind(enum.Enum):
    """What a placement call does."""

    MOVE = "move"
    """A tensor moved or cast (``Tensor.to/cuda/cpu/type/type_as``): a new tensor when anything changes."""
    MODULE_MOVE = "module move"
    """``Module.to/cuda/cpu``: every registered parameter and buffer moved, in place."""
    PARSE = "parse"
    """``torch._C._nn._parse_to`` itself (what ``Module.to`` calls)."""
    FACTORY = "factory"
    """A new tensor made on ``device`` (a ``device=`` argument, or the default device)."""
    INTO = "into"
    """Written in place into a holder (``copy_``, ``resize_``, ``set_``): the holder keeps its device."""


@dataclass(frozen=True)
class Destination:
    """Where one call places its result."""

    kind: Kind
    device: torch.device | None
    """Where the result lands (an index always given for CUDA); None: where it was (a dtype-only cast)."""
    dtype: torch.dtype | None = None
    """The dtype asked for, or None."""
    non_blocking: bool = False
    copy: bool = False
    """``Tensor.to(copy=True)``: a new tensor even when nothing changes."""
    memory_format: torch.memory_format | None = None
    source: Any = None
    """The tensor or module placed (a factory's: None)."""

    @property
    def to_cuda(self) -> bool:
        """The result lands on a CUDA device."""
        return self.device is not None and self.device.type == "cuda"

    def to_options(self) -> dict[str, Any]:
        """The keywords of a ``Tensor.to`` call making this placement but for its device."""
        options: dict[str, Any] = {}
        if self.dtype is not None:
            options["dtype"] = self.dtype
        if self.memory_format is not None:
            options["memory_format"] = self.memory_format
        if self.copy:
            options["copy"] = True
        return options


_DEVICES: dict[torch.device, Device] = {}


def device_of(where: torch.Tensor | torch.device) -> Device:
    """The device of a tensor (or torch's device) as placecheck's value: ``cuda:0``, ``cpu``; read once
    per device, then looked up (the tracer asks for it on every call)."""
    device = where.device if isinstance(where, torch.Tensor) else where
    found = _DEVICES.get(device)
    if found is None:
        found = _DEVICES[device] = Device.of(str(device))
    return found


def resolved(device: torch.device | None, current: int) -> torch.device | None:
    """``device`` with the current CUDA index filled in (``cuda`` -> ``cuda:current``)."""
    if device is not None and device.type == "cuda" and device.index is None:
        return torch.device("cuda", current)
    return device


def as_device(value: Any, current: int = 0) -> torch.device | None:
    """A device argument (``int``, ``str``, ``torch.device``) as a device, or None (not a device)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return torch.device("cuda", value) if value >= 0 else None
    if isinstance(value, str | torch.device):
        try:
            return resolved(torch.device(value), current)
        except RuntimeError:
            return None
    return None


def _device_argument(value: Any) -> Any:
    """An ``int`` device as the CUDA device it names on a CUDA build (a CPU-only build reads it otherwise)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.device("cuda", value)
    return value


def _read_to(args: tuple[Any, ...], kwargs: dict[str, Any], current: int) -> tuple[Any, ...] | None:
    """``(device, dtype, non_blocking, memory_format, copy)`` of ``.to(*args, **kwargs)`` (args without
    the tensor or module), or None when torch's parser refuses them (the call raises torch's error)."""
    kwargs = dict(kwargs)
    copy = bool(kwargs.pop("copy", False))
    rest = list(args)
    flags = [i for i, a in enumerate(rest) if isinstance(a, bool)]
    if len(flags) > 1:  # every signature's positional bools: non_blocking, then copy
        copy = copy or rest.pop(flags[1])
    if rest:
        rest[0] = _device_argument(rest[0])
    if "device" in kwargs:
        kwargs["device"] = _device_argument(kwargs["device"])
    try:
        with DisableTorchFunction():  # a simulated tensor argument must not run its own __torch_function__
            device, dtype, non_blocking, memory_format = parse_to(*rest, **kwargs)
    except (TypeError, RuntimeError):
        return None
    other = next((a for a in (*rest, kwargs.get("tensor")) if isinstance(a, torch.Tensor)), None)
    if other is not None:
        device = other.device  # the visible device: a simulated tensor's is not its data's
    return resolved(device, current), dtype, bool(non_blocking), memory_format, copy


_LEGACY_CLASSES = legacy_tensor_types()
_LEGACY_TYPES: dict[str, Any] = {f"{c.__module__}.{c.__name__}": c for c in _LEGACY_CLASSES}
"""PyTorch's legacy tensor types (``torch.FloatTensor``, ``torch.cuda.HalfTensor`` ...) by their names."""


def legacy_type(value: Any) -> tuple[bool, torch.dtype] | None:
    """(is CUDA, dtype) of a legacy tensor type: the class, or its name (``"torch.cuda.FloatTensor"``)."""
    if isinstance(value, str):
        value = _LEGACY_TYPES.get(value)
    if value is None or not isinstance(value, type):
        return None
    if value not in _LEGACY_CLASSES and not getattr(value, "simulates_legacy_type", False):
        return None  # (a session's stand-in for torch.cuda.FloatTensor says so)
    legacy: Any = value
    return bool(legacy.is_cuda), legacy.dtype


def legacy_type_name(t: torch.Tensor) -> str:
    """What ``t.type()`` says on a GPU: ``torch.cuda.FloatTensor`` for a (simulated) CUDA float tensor."""
    name = next((n for n, c in _LEGACY_TYPES.items() if c.dtype == t.dtype and not c.is_cuda
                 and n.count(".") == 1), None)
    if name is None:
        with DisableTorchFunction():
            return str(torch.Tensor.type(t))
    return name.replace("torch.", "torch.cuda.", 1) if t.device.type == "cuda" else name


_PYTHON_FACTORIES = frozenset({"asarray", "new_tensor", "new"})
"""Factories with a ``device=`` argument that are bound in Python only, with no aten op of their name:
``torch.asarray`` (torch/csrc/autograd/python_torch_functions_manual.cpp), ``Tensor.new_tensor`` and the
legacy ``Tensor.new`` (torch/csrc/autograd/python_variable_methods.cpp)."""
_NOT_FACTORIES = frozenset({"to", "_to_copy"})
"""Ops whose schema has a ``device`` but that move their input (read as :attr:`Kind.MOVE`)."""

_takes_device: dict[Any, bool] = {}


def takes_device(func: Callable[..., Any]) -> bool:
    """``func`` makes a new tensor on the device its ``device=`` argument names: its aten schema has a
    ``Device? device`` argument (or it is one of :data:`_PYTHON_FACTORIES`)."""
    try:
        known = _takes_device.get(func)
    except TypeError:  # unhashable
        return False
    if known is not None:
        return known
    name = getattr(func, "__name__", "")
    found = name in _PYTHON_FACTORIES
    if not found and name not in _NOT_FACTORIES and not name.startswith("__"):
        found = any(arg == "device" and "Device" in kind for arg, kind in op_arguments(name))
    _takes_device[func] = found
    return found


_TENSOR_MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.type,
                           torch.Tensor.type_as})
_MODULE_MOVES = frozenset({nn.Module.to, nn.Module.cuda, nn.Module.cpu})
_INTO = frozenset({torch.Tensor.copy_, torch.Tensor.resize_, torch.Tensor.set_, torch.Tensor.resize_as_})
_TENSOR_TYPE = torch.Tensor.type
"""``Tensor.type`` as torch defines it (a session may patch the attribute)."""


def _cuda_index(value: Any, current: int) -> torch.device | None:
    """``.cuda(device)``'s device: None is the current one; an int, a str or a device names one."""
    if value is None:
        return torch.device("cuda", current)
    device = as_device(value, current)
    return device if device is not None and device.type == "cuda" else None


def _tensor_move(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 current: int) -> Destination | None:
    source = args[0] if args else None
    if func is torch.Tensor.cpu:
        return Destination(Kind.MOVE, torch.device("cpu"), source=source)
    if func is torch.Tensor.cuda:
        device = _cuda_index(args[1] if len(args) > 1 else kwargs.get("device"), current)
        non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        fmt = kwargs.get("memory_format")
        return None if device is None else Destination(Kind.MOVE, device, non_blocking=non_blocking,
                                                      memory_format=fmt, source=source)
    if func is torch.Tensor.type_as:
        other = args[1] if len(args) > 1 else kwargs.get("other")
        if not isinstance(other, torch.Tensor):
            return None
        return Destination(Kind.MOVE, other.device, other.dtype, source=source)
    if func is _TENSOR_TYPE or func is torch.Tensor.type:
        wanted = legacy_type(args[1] if len(args) > 1 else kwargs.get("dtype"))
        if wanted is None:  # no argument (the name asked), or a torch.dtype: the device stays
            return None
        is_cuda, dtype = wanted
        here = source.device if isinstance(source, torch.Tensor) else None
        if is_cuda:
            device = here if here is not None and here.type == "cuda" else torch.device("cuda", current)
        else:
            device = torch.device("cpu")
        return Destination(Kind.MOVE, device, dtype, source=source)
    read = _read_to(args[1:], kwargs, current)
    if read is None:
        return None
    device, dtype, non_blocking, memory_format, copy = read
    return Destination(Kind.MOVE, device, dtype, non_blocking, copy, memory_format, source)


def read_module_move(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     current: int = 0) -> Destination | None:
    """``Module.to/cuda/cpu(*args[1:], **kwargs)``: where the module's tensors go (None: the call is refused
    by torch, which will raise its own error)."""
    module = args[0] if args else None
    if func is nn.Module.cpu:
        return Destination(Kind.MODULE_MOVE, torch.device("cpu"), source=module)
    if func is nn.Module.cuda:
        device = _cuda_index(args[1] if len(args) > 1 else kwargs.get("device"), current)
        return None if device is None else Destination(Kind.MODULE_MOVE, device, source=module)
    read = _read_to(args[1:], kwargs, current)
    if read is None:
        return None
    device, dtype, non_blocking, memory_format, _ = read
    return Destination(Kind.MODULE_MOVE, device, dtype, non_blocking, False, memory_format, module)


@functools.cache
def _constructors() -> frozenset[Any]:
    return frozenset(device_constructors())


def read_placement(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   current: int = 0) -> Destination | None:
    """What ``func(*args, **kwargs)`` does to devices, or None when it places nothing.

    ``current``: the (simulated) current CUDA index, where ``"cuda"`` without an index goes.
    """
    try:
        hash(func)
    except TypeError:
        return None
    if func in _TENSOR_MOVES or func is torch.Tensor.type:  # (the attribute a session may patch)
        return _tensor_move(func, args, kwargs, current)
    if func in _MODULE_MOVES:
        return read_module_move(func, args, kwargs, current)
    if func is parse_to or getattr(func, "__name__", None) == "_parse_to":
        read = _read_to(args, kwargs, current)
        if read is None:
            return None
        device, dtype, non_blocking, memory_format, _ = read
        return Destination(Kind.PARSE, device, dtype, non_blocking, False, memory_format)
    if func in _INTO:
        holder = args[0] if args else None
        if isinstance(holder, torch.Tensor):
            return Destination(Kind.INTO, holder.device, source=holder)
        return None
    if "device" in kwargs and kwargs["device"] is not None:
        if takes_device(func):
            device = as_device(kwargs["device"], current)
            return None if device is None else Destination(Kind.FACTORY, device, kwargs.get("dtype"))
        return None
    if func in _constructors():
        default = default_device()
        if default is not None:
            return Destination(Kind.FACTORY, resolved(default, current), kwargs.get("dtype"))
    return None


def parsed(placement: Destination) -> tuple[Any, ...]:
    """What ``torch._C._nn._parse_to`` returns for ``placement`` (:attr:`Kind.PARSE`)."""
    return placement.device, placement.dtype, placement.non_blocking, placement.memory_format
