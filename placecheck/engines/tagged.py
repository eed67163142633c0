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

A backward runs inside the dispatch of ``loss.backward()``, where autograd
hands the script's code plain CPU gradients with no mode active. A gradient
hook registered on a tagged tensor (:func:`_gradient_hook`) and a custom
``autograd.Function``'s backward (:func:`_custom_functions`: its ``apply`` and
``BackwardCFunction.apply`` wrapped for the session, torch's own Functions
left as they are) get their gradients tagged with the device a GPU would
give them and run under the session's modes (:mod:`placecheck.engines.callbacks`);
a gradient a custom backward returns on another device than its input's
raises autograd's own error.

Not reentrant: one session at a time per process.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from placecheck.basics.patching import patch
from placecheck.engines.autocast import on_gpu, simulated_autocast
from placecheck.engines.callbacks import called_back, in_callbacks
from placecheck.engines.calls import Destination, Kind, as_device, legacy_type_name, parsed, read_placement
from placecheck.engines.classify import (
    DeviceMismatchError,
    copies_between_devices,
    generator_refusal,
    host_arguments_on_device,
    host_outputs,
    legal_cpu_argument,
    mixes_devices,
    refused_on_device,
    tensor_arguments,
)
from placecheck.engines.compat import DisableTorchFunctionSubclass, make_subclass, tree_map_only
from placecheck.engines.cudaapi import (
    cuda_initialised,
    cuda_queries_simulated,
    current_index,
    forked_cuda_error,
)


class SimulatedDeviceMismatchError(DeviceMismatchError):
    """An op mixed devices under the real-valued engine (PyTorch's own text)."""


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
            if t.layout == torch.strided:
                tagged = t.as_subclass(SimulatedTensor)
            elif t.grad_fn is not None and torch.is_grad_enabled():
                return _SparseTag.apply(t, device)  # type: ignore[no-any-return]  # its graph kept
            else:
                # a sparse (COO, CSR...) tensor has no storage for as_subclass to share: an alias of it
                # (its indices and values shared), a leaf as the adjacency matrices of GCNs are
                tagged = make_subclass(SimulatedTensor, t, t.requires_grad)
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
        if func is torch.Tensor.register_hook and len(args) == 2 and isinstance(args[0], SimulatedTensor) \
                and not torchs_own(args[1]):
            args = (args[0], _gradient_hook(args[1], args[0]._pc_device))
        if func is torch.Tensor.get_device:
            return args[0]._pc_device.index if isinstance(args[0], SimulatedTensor) else -1
        if func is torch.Tensor.module_load and len(args) > 1:
            # load_state_dict's per-tensor step, as torch/_tensor.py writes it: the loaded tensor itself
            # (assign=True, on its own device) or a copy into the parameter (on the parameter's)
            assign = args[2] if len(args) > 2 else kwargs.get("assign", False)
            return args[1].detach() if assign else args[0].copy_(args[1]).detach()
        if func is torch.Tensor.__deepcopy__ and args and isinstance(args[0], SimulatedTensor):
            return _deepcopy(args[0], args[1] if len(args) > 1 else kwargs["memo"])
        if (func is _TENSOR_TYPE or func is torch.Tensor.type) and (len(args) == 1 or args[1] is None) \
                and kwargs.get("dtype") is None and isinstance(args[0], SimulatedTensor):
            return legacy_type_name(args[0])  # x.type(): "torch.cuda.FloatTensor", as on a GPU
        if func is torch.Tensor.__repr__ and isinstance(args[0], SimulatedTensor):
            # through __torch_function__ (no __repr__ override), so that a mode sees printing
            with DisableTorchFunctionSubclass():
                text = repr(untagged(args[0]))
            return f"{text[:-1]}, device='{args[0]._pc_device}')" if text.endswith(")") else text
        refused = refused_on_device(func, args)
        if refused is not None:
            raise refused
        device = _result_device(func, args, kwargs)
        if device is not None and device.type == "cuda" and torch.is_autocast_enabled("cpu") \
                and func not in _BACKWARDS:
            with on_gpu(), DisableTorchFunctionSubclass():  # simulated CUDA autocast casts this op's tensors
                out = func(*args, **kwargs)
        else:
            with DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
        if device is None:
            return out
        on_host = host_outputs(func)
        if on_host and isinstance(out, tuple):
            return tuple(o if i in on_host else _tag_all(o, device) for i, o in enumerate(out))
        return _tag_all(out, device)


class _SparseTag(torch.autograd.Function):
    """A sparse result of autograd's graph (``weight.to_sparse()``) tagged: an alias made without its
    history (:meth:`SimulatedTensor.tag`), joined back to it here, the gradient passed through."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, device: torch.device) -> torch.Tensor:  # type: ignore[override]
        with DisableTorchFunctionSubclass():
            tagged = make_subclass(SimulatedTensor, t.detach(), False)
        tagged._pc_device = device
        return tagged

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def untagged(t: torch.Tensor) -> torch.Tensor:
    """A simulated tensor's data as a plain CPU tensor (call with torch functions disabled): a view
    sharing its memory, or for a sparse tensor, which has no storage to share, a detached alias."""
    if t.layout == torch.strided:
        return t.as_subclass(torch.Tensor)
    return make_subclass(torch.Tensor, t, t.requires_grad)


_TENSOR_TYPE = torch.Tensor.type
"""``Tensor.type`` as torch defines it (what ``__torch_function__`` receives)."""
_BACKWARDS = frozenset({torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad})
"""Autograd runs a GPU's backward outside the forward's autocast (its device threads have their own)."""


def _deepcopy(t: SimulatedTensor, memo: dict[int, Any]) -> SimulatedTensor:
    """``copy.deepcopy`` of a simulated tensor: a copy of its data on the same simulated device, with its
    ``requires_grad``, its gradient and its attributes (a parameter's mark among them), as a GPU's
    ``Tensor.__deepcopy__`` gives (torch's own needs ``new_empty`` to keep the subclass, which the data's
    plain CPU tensor does not)."""
    if id(t) in memo:
        return memo[id(t)]  # type: ignore[no-any-return]
    if not t.is_leaf:
        raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                           "protocol at the moment.")
    with torch.no_grad(), DisableTorchFunctionSubclass():
        data = untagged(t).clone(memory_format=torch.preserve_format)
    copied = SimulatedTensor.tag(data, t._pc_device)
    memo[id(t)] = copied
    with DisableTorchFunctionSubclass():
        copied.requires_grad_(t.requires_grad)
    if t.grad is not None:
        copied.grad = copy.deepcopy(t.grad, memo)
    for name, value in t.__dict__.items():
        if name != "_pc_device":
            setattr(copied, name, copy.deepcopy(value, memo))
    return copied


def _result_device(func: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> torch.device | None:
    """The simulated device of ``func``'s result; raises on an illegal mix of devices. None: a plain
    tensor (``device="cpu"`` given, as in ``torch.empty_like(t, device="cpu")``, is the CPU whatever
    ``t`` is on)."""
    device = kwargs.get("device")
    if device is not None and getattr(as_device(device), "type", None) != "cuda":
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
    refusal = generator_refusal(args, kwargs, device)
    if refusal:
        raise SimulatedDeviceMismatchError(refusal)


def _tag_all(out: Any, device: torch.device) -> Any:
    """Every tensor in an op's output (nested lists, tuples, namedtuples, return types) tagged ``device``."""
    return tree_map_only(torch.Tensor, lambda t: SimulatedTensor.tag(t, device), out)


def _move(placement: Destination, dest: torch.device) -> torch.Tensor:
    """A tensor move (``.to(dest)``/``.cuda()``/``.cpu()``/``.type(...)``) with a real device's
    semantics: a copy when the device changes, the tensor itself when nothing does."""
    source = placement.source
    simulated = isinstance(source, SimulatedTensor)
    options = placement.to_options()
    with DisableTorchFunctionSubclass():
        data = untagged(source) if simulated else source
        if dest.type != "cuda":  # the CPU (or meta): a real move of the data
            out = torch.Tensor.to(data, dest, **options)
            if simulated and _aliases(out, data):
                out = out.clone()  # a device-to-host copy never aliases the device tensor
            return out
        out = torch.Tensor.to(data, **options) if options else data
        if simulated and source._pc_device == dest and out is data:
            return source  # type: ignore[no-any-return]  # already there: .to() returns itself
        _cuda_used()
        if _aliases(out, data):
            out = out.clone()  # a host-to-device copy never aliases the host tensor
    return SimulatedTensor.tag(out, dest)


def _aliases(out: torch.Tensor, data: torch.Tensor) -> bool:
    """``out`` shares ``data``'s memory (``.to()`` returned it, or a view of it)."""
    if out is data:
        return True
    if out.layout != torch.strided or data.layout != torch.strided:
        return False  # a sparse tensor has no one data pointer; .to() that changed nothing returned itself
    return bool(out.data_ptr() == data.data_ptr())


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
        placement = read_placement(func, args, kwargs, current_index())
        if placement is not None:
            if placement.kind is Kind.MOVE and placement.device is not None \
                    and isinstance(placement.source, torch.Tensor):
                return _move(placement, placement.device)
            if placement.kind is Kind.PARSE:
                # Module.to's own parser: a tensor argument's device is its simulated one
                return parsed(placement)
        if kwargs.get("pin_memory"):
            # page-locked host memory needs a driver; it is CPU memory all the same
            kwargs = {**kwargs, "pin_memory": False}
        if placement is not None and placement.kind is Kind.FACTORY and placement.to_cuda:
            dest = placement.device
            assert dest is not None
            _cuda_used()
            _check_generator(args, kwargs, dest)
            with DisableTorchFunctionSubclass():
                # device="cpu" given: the default device (torch's DeviceContext, below this mode) adds none
                out = func(*args, **{**kwargs, "device": "cpu"})
            return _tag_all(out, dest)
        if func is torch.tensor and args and isinstance(args[0], SimulatedTensor) \
                and kwargs.get("device") is None:
            # a copy of a tensor is made on that tensor's device (the default device is for Python data)
            return SimulatedTensor.tag(func(*args, **kwargs), args[0]._pc_device)
        return func(*args, **kwargs)


def torchs_own(fn: Any) -> bool:
    """``fn`` is torch's (or placecheck's) own code, by where it is defined: torch's hooks and Functions
    run as torch wrote them for the engine; the script's and its libraries' are simulated."""
    from placecheck.engines.sources import is_internal

    fn = getattr(fn, "func", fn)  # functools.partial
    code = getattr(fn, "__code__", None) or getattr(type(fn).__call__, "__code__", None)
    return code is not None and is_internal(code)


def as_on(t: Any, device: torch.device | None) -> Any:
    """``t`` as a GPU would hand it over: a plain tensor (autograd's, DDP's reducer's: their data on the
    CPU) tagged with ``device`` when that is a CUDA device; anything else as it is."""
    if isinstance(t, torch.Tensor) and not isinstance(t, SimulatedTensor) and device is not None \
            and device.type == "cuda":
        return SimulatedTensor.tag(t, device)
    return t


def _gradient_hook(hook: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """``hook`` registered on a simulated tensor (``param.register_hook(lambda g: g * mask)``): it gets the
    gradient on the tensor's device, as on a GPU (autograd hands it over as a plain CPU tensor), and runs
    as the script's code (:func:`called_back`): a CPU ``mask`` there mixes devices as it would."""
    @functools.wraps(hook)
    def on_device(grad: Any) -> Any:
        with called_back():
            return hook(as_on(grad, device))
    return on_device


class _NodeDevices:
    """What a custom ``autograd.Function`` of the script ran on, kept on its backward node: the
    simulated devices of its forward's outputs (its gradients arrive on those) and of its tensor inputs
    (the gradients its backward returns must be there: autograd's own check on a GPU)."""

    __slots__ = ("inputs", "outputs")

    def __init__(self, inputs: list[torch.device | None], outputs: list[torch.device | None]) -> None:
        self.inputs, self.outputs = inputs, outputs


def _devices_of(values: Any) -> list[torch.device | None]:
    items = values if isinstance(values, tuple | list) else (values,)
    return [v.device if isinstance(v, torch.Tensor) else None for v in items]


def _function_apply(original: Any) -> Any:
    """``autograd.Function.apply``: a Function the script (or a library) defines runs as on a GPU; its
    backward node remembers its devices (:class:`_NodeDevices`). torch's own Functions are left as they
    are (decided by where the class is defined)."""
    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        out = original.__get__(None, cls)(*args, **kwargs)  # a classmethod, in Python or C
        if torchs_own(getattr(cls, "forward", None)):
            return out
        outputs = _devices_of(out)
        node = next((o.grad_fn for o in (out if isinstance(out, tuple | list) else (out,))
                     if isinstance(o, torch.Tensor) and o.grad_fn is not None), None)
        if node is not None and any(d is not None and d.type == "cuda" for d in outputs):
            node._pc_devices = _NodeDevices(_devices_of(args), outputs)  # type: ignore[attr-defined]
        return out
    return classmethod(apply)


def _backward_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    """A custom Function's backward (``BackwardCFunction.apply``): it gets its gradients on the devices of
    the forward's outputs and runs as the script's code (:func:`called_back`); a gradient it returns on
    another device than its input's raises autograd's own error, as on a GPU."""
    @functools.wraps(original)
    def apply(node: Any, *grads: Any) -> Any:
        devices: _NodeDevices | None = getattr(node, "_pc_devices", None)
        if devices is None:
            return original(node, *grads)
        outputs = devices.outputs
        grads = tuple(as_on(g, outputs[i] if i < len(outputs) else None) for i, g in enumerate(grads))
        with called_back():
            result = original(node, *grads)
        returned = result if isinstance(result, tuple) else (result,)
        for index, (g, expected) in enumerate(zip(returned, devices.inputs, strict=False)):
            if isinstance(g, torch.Tensor) and expected is not None and g.device != expected:
                raise SimulatedDeviceMismatchError(
                    f"Function {type(node).__name__} returned an invalid gradient at index {index} - "
                    f"expected device {expected} but got {g.device}")
        return result
    return apply


@contextlib.contextmanager
def _custom_functions() -> Iterator[None]:
    """Custom ``autograd.Function``s simulated in their backward too (:func:`_function_apply`)."""
    from torch.autograd import function

    why = ("a custom autograd.Function's backward runs in autograd's engine, outside every mode: its node "
           "must remember the simulated devices of its inputs and outputs")
    apply, backward = function.Function.__dict__["apply"], function.BackwardCFunction.apply
    with patch(function.Function, "apply", _function_apply(apply), why), \
            patch(function.BackwardCFunction, "apply", _backward_apply(backward), why):
        yield


def _variable_new(original: Any) -> Any:
    """``torch.autograd.Variable(t)``: ``t.detach()`` with ``requires_grad`` set, made in C where no mode
    sees it and the result is a plain tensor; of a simulated tensor it is that detached alias, on its
    device, as on a GPU."""
    def new(cls: type, data: Any = None, requires_grad: bool = False, *args: Any, **kwargs: Any) -> Any:
        if isinstance(data, SimulatedTensor) and not args and set(kwargs) <= {"volatile"}:
            alias = data.detach()
            with DisableTorchFunctionSubclass():
                alias.requires_grad_(requires_grad)
            return alias
        return original(cls, data, requires_grad, *args, **kwargs)
    return staticmethod(new)


def _tensor_new(original: Any) -> Any:
    """``torch.Tensor(t)``: an alias of ``t`` made by the legacy constructor in C (no mode sees it); of a
    simulated tensor it keeps ``t``'s device, as ``torch.Tensor(cuda_tensor)`` does on a GPU."""
    def new(*args: Any, **kwargs: Any) -> Any:  # any signature: torch._dynamo's polyfill checks it
        if len(args) == 2 and args[0] is torch.Tensor and not kwargs and isinstance(args[1], SimulatedTensor):
            return args[1].detach()
        return original(*args, **kwargs)
    return staticmethod(new)


@contextlib.contextmanager
def _aliasing_constructors() -> Iterator[None]:
    """The legacy constructors that alias their input keep its simulated device (:func:`_variable_new`,
    :func:`_tensor_new`); the rest (``as_tensor``, ``Parameter``, ``detach``, views) go through the
    modes already."""
    from torch.autograd.variable import Variable

    why = "a legacy constructor aliases its tensor in C, where the simulated device is lost"
    with patch(Variable, "__new__", _variable_new(Variable.__new__), why), \
            patch(torch.Tensor, "__new__", _tensor_new(torch.Tensor.__new__), why):
        yield


@contextlib.contextmanager
def tagged_cuda(gpus: int = 1, strict: bool = False) -> Iterator[None]:
    """The real-valued session: tagging mode, simulated ``torch.cuda`` queries, new params on ``.to()``."""
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        mode = _TaggingMode()
        with cuda_queries_simulated(gpus, strict), mode, in_callbacks(mode), _custom_functions(), \
                _aliasing_constructors(), simulated_autocast(), \
                warnings.catch_warnings():
            # the data is on the CPU, where an LSTM with proj_size warns that oneDNN cannot run it;
            # on the GPU being simulated it would not
            warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")
            yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
