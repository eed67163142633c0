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

Call arguments are traversed with torch's pytree (:mod:`placecheck.engines.compat`), as PyTorch's flop
counter and fake tensors do. This module imports nothing of placecheck above
:mod:`placecheck.engines.sources`, and that and torch only inside its functions (the
CLI's parent process, which calls :func:`out_of_memory`, never imports torch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from placecheck.basics.errors import one_line

if TYPE_CHECKING:
    import torch


def tensor_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[tuple[int, torch.Tensor]]:
    """``(argument position, tensor)`` for every tensor in a call's arguments, nested containers too.

    The position is that of the top-level argument holding the tensor (keyword
    arguments follow the positional ones), which decides whether a CPU tensor
    is a legal index (:func:`legal_cpu_argument`).
    """
    import torch

    from placecheck.engines.compat import tree_leaves

    for pos, a in enumerate((*args, *kwargs.values())):
        if isinstance(a, torch.Tensor):
            yield pos, a
        elif isinstance(a, list | tuple | dict):
            for leaf in tree_leaves(a):
                if isinstance(leaf, torch.Tensor):
                    yield pos, leaf


def replace_tensors(obj: Any, moved: dict[int, torch.Tensor]) -> Any:
    """``obj`` (call arguments) with the tensors in ``moved`` (by id) replaced, containers rebuilt."""
    import torch

    from placecheck.engines.compat import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: moved.get(id(t), t), obj)


def tensors_with_paths(obj: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a nested value (a forward's output, a DataLoader's batch), with its path
    (``output[0]['logits']``): nested lists, tuples, dicts, namedtuples (what ``torch.utils._pytree``
    flattens), and the fields of dataclasses it leaves whole.

    A container type registered with pytree without key paths (transformers' ``ModelOutput``, an
    ordered dict) is opened as the mapping or sequence it is.
    """
    import dataclasses

    import torch

    from placecheck.engines.compat import keystr, tree_flatten_with_path

    try:
        leaves, _ = tree_flatten_with_path(obj)
    except ValueError:  # a registered node without a flatten_with_keys_fn
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from tensors_with_paths(v, f"{path}[{k!r}]")
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                yield from tensors_with_paths(v, f"{path}[{i}]")
        return
    for key_path, leaf in leaves:
        here = path + keystr(key_path)
        if isinstance(leaf, torch.Tensor):
            yield here, leaf
        elif dataclasses.is_dataclass(leaf) and not isinstance(leaf, type) and here.count(".") < 8:
            for f in dataclasses.fields(leaf):
                yield from tensors_with_paths(getattr(leaf, f.name, None), f"{here}.{f.name}")


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


_CROSS_DEVICE_NAMES = frozenset({"copy_", "_foreach_copy_", "to", "type_as", "__setitem__", "set_",
                                 "_has_compatible_shallow_copy_type", "new_tensor", "__deepcopy__",
                                 "__reduce_ex__"})
"""Ops that legally take tensors on two devices: they copy between them."""

_SHAPE_ONLY_NAMES = frozenset({"expand_as", "view_as", "reshape_as", "result_type",
                               "is_same_size", "can_cast", "promote_types", "is_set_to", "_is_all_true"})
"""Ops that read only the other tensor's shape or dtype: any device will do."""

_NO_CPU_SCALARS = frozenset({
    "clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_",
    "logaddexp", "logaddexp2", "nextafter", "nextafter_", "igamma", "igammac",
    "cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack",
})
"""Ops that refuse a 0-dim CPU tensor beside CUDA ones, where ``add`` and most binary ops take it as a
scalar. From PyTorch's ``native_functions.yaml``: their CUDA kernels lack ``device_check: NoCheck``, so
every tensor argument's device is checked (a GPU raises for ``clamp(x, min=t)``, ``logaddexp(x, t)``
and ``stack`` of 0-dim tensors: tests/data/mix-table.json); ``stack`` and friends reach ``cat``.
Not ``float_power``: it is composite (``pow`` of both converted to float64), and ``pow`` takes the
scalar (the H200's rows ``grown float_power 0-dim other/self``)."""

_NO_CPU_SCALAR_AT: dict[str, frozenset[int]] = {
    "lerp": frozenset({1}), "lerp_": frozenset({1}),
    "addcmul": frozenset({0, 1}), "addcmul_": frozenset({1}),
    "addcdiv": frozenset({0, 1, 2}), "addcdiv_": frozenset({1, 2}),
}
"""Ops whose argument at these positions may not be a 0-dim CPU tensor beside CUDA ones, where the
others may: ``lerp``'s ``end`` (its CUDA kernel asserts a CUDA tensor there, while a CPU ``weight`` is
read as a scalar); ``addcmul``'s ``self`` and ``tensor1`` (ATen's ``PointwiseOpsKernel.cu`` refuses
them; only ``tensor2`` has a CPU-scalar path); every tensor of ``addcdiv`` (no such path). The H200's
rows ``grown in-place lerp_ 0-dim other``, ``lerp weight 0-dim``, ``grown scalar addcdiv`` and
``grown scalar addcmul value tensor``."""

_ANY_DEVICE_AT: dict[str, frozenset[int]] = {
    "ctc_loss": frozenset({0, 1, 2, 3}),
    "fill_": frozenset({0, 1}), "fill": frozenset({0, 1}),
}
"""Ops that take tensors on any devices at these positions: ``ctc_loss`` copies its targets and lengths to
the device of ``log_probs`` (a CPU ``log_probs`` with CUDA targets and lengths runs on the CPU), and
``fill_(value)`` reads a 0-dim ``value`` on another device with ``value.item()`` (ATen's ``Fill.cpp``;
its only tensors are ``self`` and that 0-dim value). A CPU tensor there is legal (PC205 when it is copied)."""

_IN_PLACE_DUNDERS = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                               "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                               "__irshift__",
                               "__imatmul__"})

_HOST_ARGUMENT_NAMES: dict[str, dict[int, str]] = {
    "_pack_padded_sequence": {1: "lengths"},
    "_pad_packed_sequence": {1: "batch_sizes"},
    "tensor_split": {1: "tensor_indices_or_sections"},
}
"""The names of :data:`_HOST_ARGUMENTS`, for a finding's message."""

_HOST_ARGUMENTS: dict[str, frozenset[int]] = {op: frozenset(names)
                                              for op, names in _HOST_ARGUMENT_NAMES.items()}
"""Ops whose argument at these positions must be a CPU tensor whatever the device of the rest
(``pack_padded_sequence``'s ``lengths``): on CUDA a GPU raises; on the CPU it is correct."""

_HOST_OUTPUTS: dict[str, frozenset[int]] = {"_pack_padded_sequence": frozenset({1}),
                                             "_pad_packed_sequence": frozenset({1})}
"""Ops that return a CPU tensor at these positions of their output whatever their input's device
(``batch_sizes`` of a packed sequence; the ``lengths`` ``pad_packed_sequence`` returns, made with
``batch_sizes``' options in ATen's ``_pad_packed_sequence``)."""

_CPU_ACCEPTED: dict[str, frozenset[int]] = {**_HOST_ARGUMENTS, **_ANY_DEVICE_AT}
"""Ops that accept a CPU tensor of any shape at these positions beside CUDA ones."""

_PACKED_RNNS = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})
"""Recurrent ops whose packed form takes ``batch_sizes`` (int64, on the CPU) second."""


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", "")


def in_place(func: Callable[..., Any]) -> bool:
    """``x.add_(y)``, ``x += y``: the op writes its first argument."""
    name = _name(func)
    return (name.endswith("_") and not name.endswith("__")) or name in _IN_PLACE_DUNDERS


def copies_between_devices(func: Callable[..., Any]) -> bool:
    """True for the ops that legally take tensors on two devices: they copy between them (``copy_``,
    ``to``, ``x[i] = v``) or read only the other's shape (``expand_as``)."""
    return _name(func) in _CROSS_DEVICE_NAMES or _name(func) in _SHAPE_ONLY_NAMES


def legal_cpu_argument(func: Callable[..., Any], pos: int, t: torch.Tensor) -> bool:
    """A CPU tensor a GPU op accepts: a 0-dim scalar it reads (not the tensor an in-place op writes, nor
    an argument of an op in :data:`_NO_CPU_SCALARS`), an index tensor (not the indexed one, nor the
    values ``index_put_`` writes), or an argument the op takes on the CPU (``_CPU_ACCEPTED``)."""
    import torch

    if t.device.type != "cpu":
        return False
    name = _name(func)
    if pos in _CPU_ACCEPTED.get(name, ()):
        return True
    if pos == 1 and name in _PACKED_RNNS and t.dim() == 1 and t.dtype == torch.int64:
        return True  # a packed sequence's batch_sizes, on the CPU by design
    if t.dim() == 0:
        return name not in _NO_CPU_SCALARS and pos not in _NO_CPU_SCALAR_AT.get(name, ()) \
            and not (pos == 0 and in_place(func))
    return func in index_ops() and pos > 0 and not (pos == 2 and name in ("index_put_", "index_put"))


def host_arguments_on_device(func: Callable[..., Any],
                             tensors: list[tuple[int, torch.Tensor]]) -> list[tuple[int, torch.Tensor]]:
    """The tensors an op needs on the CPU (:data:`_HOST_ARGUMENTS`) that are on a device."""
    positions = _HOST_ARGUMENTS.get(_name(func))
    if not positions:
        return []
    return [(pos, t) for pos, t in tensors if pos in positions and t.device.type not in ("cpu", "meta")]


def host_argument_name(func: Callable[..., Any], pos: int) -> str:
    """The name of the argument at ``pos`` that ``func`` needs on the CPU (``lengths``), or ""."""
    return _HOST_ARGUMENT_NAMES.get(_name(func), {}).get(pos, "")


def host_outputs(func: Callable[..., Any]) -> frozenset[int]:
    """The positions of ``func``'s output that stay on the CPU (:data:`_HOST_OUTPUTS`)."""
    return _HOST_OUTPUTS.get(_name(func), frozenset())


def refused_on_device(func: Callable[..., Any], args: tuple[Any, ...]) -> BaseException | None:
    """The error a GPU raises for a call that no device tensor may make: ``.numpy()`` of a device
    tensor (TypeError), ``pin_memory()`` of one (only CPU tensors can be pinned); None otherwise."""
    import torch

    subject = args[0] if args else None
    if not isinstance(subject, torch.Tensor) or subject.device.type in ("cpu", "meta"):
        return None
    name = _name(func)
    if name == "numpy":
        return RefusedOnDeviceTypeError(f"can't convert {subject.device} device type tensor to numpy. Use "
                                        "Tensor.cpu() to copy the tensor to host memory first.")
    if name == "pin_memory":
        return RefusedOnDeviceError(f"cannot pin a tensor on {subject.device}: only dense CPU tensors can be "
                                    "pinned")
    return None


def offending_arguments(func: Callable[..., Any], tensors: list[tuple[int, torch.Tensor]],
                        device: torch.device) -> list[tuple[int, torch.Tensor]]:
    """The tensors of a call on ``device`` that a GPU op could not take: off ``device`` and not a
    legal CPU scalar or index."""
    return [(pos, t) for pos, t in tensors if t.device != device
            and (not legal_cpu_argument(func, pos, t) or _written_value(func, pos, t))]


def _written_value(func: Callable[..., Any], pos: int, t: torch.Tensor) -> bool:
    """The value ``x[index] = value`` writes through tensor indices, when it is not a 0-dim scalar: it must
    be on ``x``'s device (what ``index_put_`` checks), unlike an index."""
    return pos == 2 and _name(func) == "__setitem__" and t.dim() > 0


def _index_write_mixed(args: tuple[Any, ...]) -> bool:
    """``x[index] = value`` mixes devices when ``index`` holds a tensor (advanced indexing: ATen's
    ``index_put_``) and ``value`` is a tensor of more than 0 dimensions on another device than ``x``.
    Indices may be on any device (a device mask writing into a CPU tensor is copied to the host, a CPU
    index into a device tensor to the device), and so may a 0-dim value (read as a scalar). Without a
    tensor index it is a copy (``copy_``), legal between devices. The H200's rows ``grown index setitem
    *`` and ``setitem cpu value``."""
    import torch

    if len(args) < 3 or not isinstance(args[0], torch.Tensor):
        return False
    self, index, value = args[0], args[1], args[2]
    items = index if isinstance(index, tuple) else (index,)
    if not any(isinstance(i, torch.Tensor) for i in items):
        return False
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != self.device


def _foreach_mixed(args: tuple[Any, ...]) -> bool:
    """A ``torch._foreach_*`` call mixes devices when the tensors at one index of its lists are on two
    devices (each index may be on its own device: PyTorch groups them)."""
    import torch

    lists = [a for a in args if isinstance(a, list | tuple) and a and isinstance(a[0], torch.Tensor)]
    # a tensor scalar (``_foreach_mul_(xs, s)``) meets every index: a CPU one must be 0-dim, which every
    # device reads as a scalar; one on a device must share each index's device (the H200's rows
    # ``grown foreach mul_ scalar tensor``: "scalar tensor is expected to be on cpu")
    scalars = [a for a in args if isinstance(a, torch.Tensor)
               and not (a.device.type == "cpu" and a.dim() == 0)]
    for column in zip(*lists, strict=False):
        devices = {t.device for t in (*column, *scalars) if isinstance(t, torch.Tensor)}
        if len(devices) > 1:
            return True
    return False


def mixes_devices(func: Callable[..., Any], tensors: list[tuple[int, torch.Tensor]],
                  args: tuple[Any, ...] | None = None) -> bool:
    """True when an op's tensor arguments are on two devices in a way no GPU kernel accepts.

    Decided from the devices alone: the legal mixes (a 0-dim CPU scalar an op reads, a CPU index
    tensor, a copy between devices) do not count. ``args`` (the call's positional arguments) lets a
    ``torch._foreach_*`` call be judged index by index, as PyTorch groups its lists.
    """
    if args is not None and _name(func) == "__setitem__":
        return _index_write_mixed(args)
    if copies_between_devices(func):
        return False
    if args is not None and _name(func).startswith("_foreach_"):
        return _foreach_mixed(args)
    devices = {t.device for pos, t in tensors if not legal_cpu_argument(func, pos, t)}
    return len(devices) > 1


def generator_off_device(args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device | None) -> Any:
    """The ``torch.Generator`` of a call that runs on ``device`` (the device of its tensors, or of its
    ``device=``; None: a factory given neither, which runs on the default device) when the generator is on
    another device type: a GPU raises "Expected a 'cuda' device type for generator"; a CPU op given a
    CUDA generator raises "Expected a 'cpu' device type for generator" (the H200's row ``grown generator
    cpu op cuda generator device generator``); None when there is none."""
    import torch

    generators = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Generator)]
    if not generators:
        return None
    if device is None:
        device = torch.get_default_device()
    if device.type == "meta":
        return None
    return next((g for g in generators if g.device.type != device.type), None)


def generator_refusal(args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device | None) -> str:
    """What a GPU raises for a call on ``device`` given a ``torch.Generator`` of another device type
    (:func:`generator_off_device`), in torch's words; "" when it raises nothing."""
    import torch

    generator = generator_off_device(args, kwargs, device)
    if generator is None:
        return ""
    runs_on = device if device is not None else torch.get_default_device()
    return f"Expected a '{runs_on.type}' device type for generator but found '{generator.device.type}'"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def is_engine_mismatch(exc: BaseException) -> bool:
    """True when a simulating engine raised its own device-mismatch exception type for ``exc``.

    Not the text: fake tensors' device check raised it (its exception type where
    torch has one, :func:`placecheck.engines.compat.is_fake_device_mismatch`), or the
    real-valued engine raised :class:`~placecheck.engines.tagged.SimulatedDeviceMismatchError`
    (a subclass of :class:`DeviceMismatchError`, defined here so that this
    module does not import the engine).
    """
    from placecheck.engines.compat import is_fake_device_mismatch

    return any(isinstance(e, DeviceMismatchError) or is_fake_device_mismatch(e) for e in _chain(exc))


class RefusedOnDeviceTypeError(TypeError):
    """``.numpy()`` of a device tensor: the TypeError a GPU raises, raised by the simulation (so a
    ``except TypeError`` of the model's catches it). The model's bug, never the simulation's failure."""


class RefusedOnDeviceError(RuntimeError):
    """``pin_memory()`` of a device tensor: the RuntimeError a GPU raises, raised by the simulation. The
    model's bug, never the simulation's failure."""


class DeviceMismatchError(RuntimeError):
    """An op mixed devices, decided from its tensor arguments (raised by placecheck's own engines)."""


class ForkedCudaError(RuntimeError):
    """CUDA used in a process forked after the parent initialised it (a DataLoader worker whose dataset
    makes CUDA tensors, under the default fork start method): what CUDA raises there, raised by the
    simulation. The model's bug, never the simulation's limit."""


FORKED_CUDA = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must "
               "use the 'spawn' start method")
"""PyTorch's own words for :class:`ForkedCudaError` (torch/cuda/__init__.py)."""


def is_missing_device(exc: BaseException) -> bool:
    """True when ``exc`` is (or was caused by) an :class:`InvalidDeviceError`: a GPU the machine lacks."""
    return any(isinstance(e, InvalidDeviceError) for e in _chain(exc))


def is_device_error(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is an error a GPU raises for where a tensor is: a device
    mismatch (:func:`is_engine_mismatch`), a GPU the machine lacks, CUDA in a forked worker, a call no
    device tensor may make (``.numpy()``, ``pin_memory()``). Decided from the exception types the
    engines raise on purpose for those, never from a message: any other error a script raises is its
    own (a ``KeyError`` in its config), not a placement finding."""
    kinds = (DeviceMismatchError, InvalidDeviceError, ForkedCudaError, RefusedOnDeviceTypeError,
             RefusedOnDeviceError)
    return is_engine_mismatch(exc) or any(isinstance(e, kinds) for e in _chain(exc))


class InvalidDeviceError(RuntimeError):
    """A device index the simulated machine lacks (``x.to("cuda:3")`` with ``--gpus 2``): what CUDA
    raises there, raised by placecheck's engines. The model's bug, never the simulation's limit."""

    def __init__(self, device: str, gpus: int) -> None:
        super().__init__(f"CUDA error: invalid device ordinal ({device} on a machine with {gpus} GPU"
                         f"{'s' if gpus != 1 else ''}; --gpus sets how many)")


# Fake tensors' limits that no exception type names, by the message PyTorch raises.
_FAKE_LIMIT_TEXTS: tuple[tuple[str, str], ...] = (
    ("not linked with support for cuda",
     "this torch build has no CUDA support, which some fake-tensor ops need"),
    ("hasprimarycontext", "autograd needs a real CUDA device under fake tensors"),
    ("cannot access data pointer of tensor", "it reads a tensor's memory (data_ptr)"),
    (".numpy() is not supported for tensor subclasses", "it reads tensor values (.numpy())"),
    ("not available for 'meta' device type", "it reads a tensor's storage"),
    # the fake kernels of exponential_, geometric_, cauchy_, log_normal_ are torch._refs, which refuse a
    # generator argument (the H200 ran them with a CUDA generator)
    ("generator is not supported in refs", "a random op's fake kernel refuses its generator argument"),
    # an op that reads the values of a fake tensor in C++ (tensor_split's CPU indices made in the fake
    # mode); fake tensors have no data
    ("but its data is not allocated yet",
     "an op reads the values of a tensor, which fake tensors do not hold"),
    # fill_ of a CPU tensor from a 0-dim device tensor (ATen reads value.item(), the fake kernel refuses)
    ("faketensor is wrapped to wrong device", "fake tensors cannot write a value from another device here"),
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
    assumed values (:mod:`placecheck.engines.datadep`), which real values may not have
    given (a size, a value read to the host): then any error is the limit.
    Recognised: fake tensors' own exceptions (data-dependent values and
    shapes, an operator without a fake implementation, a tensor they cannot
    convert, a guard on a data-dependent symbolic size), their "NYI: aten.*"
    assertions, and the messages in :data:`_FAKE_LIMIT_TEXTS`.
    """
    from placecheck.engines.compat import (
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
    if not why and assumed and not is_device_error(exc):  # a GPU refuses that whatever the values
        why = (f"the forward raised {one_line(exc)} after ops that ran on assumed values (see the notes), "
               "which real values may not give")
    if not why:
        return ""
    from placecheck.engines.sources import user_line  # a lower layer, imported here: it imports torch

    line = user_line(exc)
    return f"{why} at {line}" if line else why


def simulation_limit(exc: BaseException, phase: str = "forward") -> str:
    """A note when ``exc``, raised during a simulated ``phase`` (a forward, a script ``placecheck run``
    runs), is the simulation's limit, not the model's.

    Returns "" when ``exc`` is not such an error. Code that is correct on a GPU
    can still call into the CUDA driver (a custom kernel, ``torch.cuda.graphs``,
    NCCL, an API the engine does not simulate); its error says nothing about
    the model's placement, so it belongs in the report's notes, not in a PC207
    that blames the user's code.
    """
    from placecheck.engines.sources import user_line  # a lower layer, imported here: it imports torch

    if is_missing_device(exc) or any(isinstance(e, ForkedCudaError) or FORKED_CUDA in str(e)
                                     for e in _chain(exc)):
        return ""  # what a GPU with that many devices raises too: the model's bug
    for seen in _chain(exc):
        text = str(seen).lower()
        if any(needle in text for needle in _DRIVER_TEXTS):
            line = user_line(exc)
            where = f" at {line}" if line else ""
            return (f"{phase}: stopped{where}: the code there needs a real CUDA driver, which the simulation "
                    f"does not provide ({one_line(seen)}); run on a GPU to check the rest")
    failed = simulation_failure(exc)
    if failed:
        line = user_line(exc)
        where = f" at {line}" if line else ""
        return (f"{phase}: stopped{where}: the simulation could not run the code there ({failed}); a limit "
                f"of placecheck's simulated GPU, not a bug of the code: run on a GPU to check the rest")
    return ""


# What a Python bug raises, never a torch operator given bad arguments (those raise RuntimeError,
# IndexError or ValueError from inside the op, or TypeError at the user's call, before any mode runs).
_BUG_TYPES = (AttributeError, KeyError, NameError, AssertionError, RecursionError, NotImplementedError,
              TypeError)


def simulation_failure(exc: BaseException) -> str:
    """What failed, when ``exc`` is the simulation's own failure rather than the code's error; "" otherwise.

    The evidence, in order: torch's compiler stack reporting its own internal failure (dynamo's
    ``InternalTorchDynamoError``, a backend compiler that failed: torch.compile tracing the simulated
    tensors); a Python bug raised inside placecheck's own code (its engines, its patches of
    ``torch.cuda``), which no code on a real GPU runs. A device mismatch the engines raise on purpose
    (:func:`is_engine_mismatch`) is never one.
    """

    from placecheck.engines.sources import placecheck_file

    if is_engine_mismatch(exc):
        return ""
    from placecheck.engines.compat import compiler_errors

    compiler = compiler_errors()
    for seen in _chain(exc):
        if compiler and isinstance(seen, compiler):
            return f"torch.compile on simulated CUDA tensors failed: {one_line(seen)}"
        tb = seen.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None and isinstance(seen, _BUG_TYPES) \
                and not isinstance(seen, RefusedOnDeviceTypeError) \
                and placecheck_file(tb.tb_frame.f_code.co_filename):
            return f"placecheck's simulation raised {one_line(seen)}"
    return ""


def needs_cuda_driver(exc: BaseException) -> bool:
    """True when building a model failed because it wanted a real GPU (``exc`` or its direct cause)."""
    text = f"{exc} {exc.__cause__ or ''}".lower()
    return any(s in text for s in _BUILD_TEXTS)


def out_of_memory(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is the machine running out of memory."""
    return any(isinstance(e, MemoryError) or any(t in str(e).lower() for t in _OOM_TEXTS)
               for e in _chain(exc))
