"""torch's private names, in one place: every other module of placecheck uses only torch's public API.

placecheck simulates CUDA with fake tensors, dispatch modes and pytree
traversal, which torch ships under private names (``torch._subclasses``,
``torch._guards``, ``torch.utils._pytree``, ``torch._C`` ...). Each is named
here once: an import of this module's attribute imports torch's (lazily, at
that moment, as the import it replaces did: ``placecheck --help`` imports no
torch), and a name that a torch release lacks has a fallback or a refusal that
says which torch it needs (:func:`require_torch`). tests/test_compat.py fails
when another module imports a private torch name.

The oldest torch supported is **2.10** (pyproject's ``torch>=2.10``), the oldest
on which the tests marked ``compat`` (``pytest -m compat``: engines, the
device-error classifier, run mode, checkpoints, fix, CLI) pass. What was tried
(PyPI's CUDA builds on a machine without a GPU, 2026-11):

- 2.10.0: all pass (the fake engine's Conv2d-input mismatch is a known xfail
  before 2.12, as on 2.11: torch's fake convolution returns a CPU tensor
  instead of raising);
- 2.9.1: 12 fail. Under the fake mode a real CPU tensor's ``.cuda()`` (a model
  that calls ``.cuda()`` in ``__init__``, autocast, indexing) reaches the CUDA
  driver ("CUDA driver version is insufficient"); also the shared fake mode of
  an engine's sessions, a checkpoint read that must load no tensor data, and
  the fix of the buggy example;
- 2.8.0, 2.7.1, 2.6.0: the same and more (18 to 24 fail), the ``.pt2`` reader
  among them; up to 2.7, ``Module._apply`` put a fake tensor into the existing
  parameter with ``param.data = ...``, which left every moved parameter on
  ``meta`` (:func:`fake_moves_replace_parameters` replaces the parameter
  instead, as newer torch does);
- 2.5 and 2.4 lack FSDP2 (``torch.distributed.fsdp.fully_shard``, public from
  2.6) for ``--wrap fsdp``; 2.4 also DTensor.

Within the supported range: ``FakeTensorDeviceMismatchError`` first appears
after 2.11 (2.11 and 2.10 raise a plain ``RuntimeError`` from the fake tensors'
device check; :func:`is_fake_device_mismatch` recognises both), and 2.11's fake
mode cannot move ``nn.Lazy*`` modules' uninitialised parameters
(placecheck.engines.engine.move_model makes them empty fake tensors first, as newer torch does).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import tempfile
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from placecheck.basics.errors import UsageError

if TYPE_CHECKING:
    import torch
    from torch._C import DisableTorchFunction as DisableTorchFunction
    from torch._C import DisableTorchFunctionSubclass as DisableTorchFunctionSubclass
    from torch._C import _EnableTorchFunction as _EnableTorchFunction
    from torch._guards import active_fake_mode as active_fake_mode
    from torch._subclasses.fake_tensor import DataDependentOutputException as DataDependentOutputException
    from torch._subclasses.fake_tensor import DynamicOutputShapeException as DynamicOutputShapeException
    from torch._subclasses.fake_tensor import FakeTensor as FakeTensor
    from torch._subclasses.fake_tensor import FakeTensorMode as FakeTensorMode
    from torch._subclasses.fake_tensor import UnsupportedFakeTensorException as UnsupportedFakeTensorException
    from torch._subclasses.fake_tensor import UnsupportedOperatorException as UnsupportedOperatorException
    from torch._subclasses.fake_tensor import unset_fake_temporarily as unset_fake_temporarily
    from torch.fx.experimental.symbolic_shapes import (
        GuardOnDataDependentSymNode as GuardOnDataDependentSymNode,
    )
    from torch.overrides import _get_current_function_mode_stack as _get_current_function_mode_stack
    from torch.utils._python_dispatch import TorchDispatchMode as TorchDispatchMode
    from torch.utils._python_dispatch import _disable_current_modes as _disable_current_modes
    from torch.utils._python_dispatch import (
        _get_current_dispatch_mode_stack as _get_current_dispatch_mode_stack,
    )
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass as is_traceable_wrapper_subclass
    from torch.utils._pytree import keystr as keystr
    from torch.utils._pytree import tree_flatten as tree_flatten
    from torch.utils._pytree import tree_flatten_with_path as tree_flatten_with_path
    from torch.utils._pytree import tree_leaves as tree_leaves
    from torch.utils._pytree import tree_map as tree_map
    from torch.utils._pytree import tree_map_only as tree_map_only
    from torch.utils._pytree import tree_unflatten as tree_unflatten

_TensorT = TypeVar("_TensorT", bound="torch.Tensor")

FLOOR = "2.10"
"""The oldest torch placecheck supports (pyproject's ``torch>=``): see the module's docstring."""

_FAKE = "torch._subclasses.fake_tensor"
_PYTREE = "torch.utils._pytree"
_DISPATCH = "torch.utils._python_dispatch"

_LAZY: dict[str, str] = {
    **dict.fromkeys(("FakeTensor", "FakeTensorMode", "unset_fake_temporarily", "DataDependentOutputException",
                     "DynamicOutputShapeException", "UnsupportedFakeTensorException",
                     "UnsupportedOperatorException"), _FAKE),
    **dict.fromkeys(("keystr", "tree_flatten", "tree_flatten_with_path", "tree_leaves", "tree_map",
                     "tree_map_only", "tree_unflatten"), _PYTREE),
    **dict.fromkeys(("TorchDispatchMode", "_disable_current_modes", "_get_current_dispatch_mode_stack",
                     "is_traceable_wrapper_subclass"), _DISPATCH),
    "active_fake_mode": "torch._guards",
    "DisableTorchFunction": "torch._C",
    "DisableTorchFunctionSubclass": "torch._C",
    "_EnableTorchFunction": "torch._C",
    "_get_current_function_mode_stack": "torch.overrides",
    "GuardOnDataDependentSymNode": "torch.fx.experimental.symbolic_shapes",
}
"""Names importable from this module, each from the torch module that holds it (imported on first use)."""

FAKE_TENSOR_LOGGER = _FAKE
"""The logger fake tensors warn on (silenced around the forward)."""

WARM_MODULES = ("torch._subclasses.schema_check_mode",)
"""torch's private modules that every audit imports (a fork server imports them before forking)."""


def training_modules() -> tuple[str, ...]:
    """torch's private modules that training and the fake engine import on first use: the first call of an
    optimizer's ``__init__``/``step``/``zero_grad`` or of DDP's forward imports ``torch._dynamo``
    (``torch._disable_dynamo`` wraps them), and so does ``FakeTensorMode``; about 1.5 s idle, twice that
    under ``run``'s line tracer. A fork server imports them before forking, so that no rank, proof or audit
    it forks pays that import again. The import starts no thread and runs no parallel op: a forked child's
    OpenMP pool starts as it would have.

    The import makes torch's cache folder: in the temp folder, or where ``TORCHINDUCTOR_CACHE_DIR`` says
    (torch sets it to the folder it made, so a process that imported it passes it on). Nothing is imported
    first where that folder is outside the temp folder: it may be in the user's tree, which only the
    script's own first use (inside ``run``'s scratch area) may touch."""
    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if named:
        temp = os.path.realpath(tempfile.gettempdir())
        folder = os.path.realpath(named)
        if os.path.commonpath([temp, folder]) != temp:
            return ()
    return ("torch._dynamo",)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


# ---- versions ------------------------------------------------------------------------------------

def _release(version: str) -> tuple[int, ...]:
    """``"2.11.0+cu130"`` -> ``(2, 11, 0)``; ``"2.15.0a0+git1234"`` -> ``(2, 15, 0)``."""
    return tuple(int(re.match(r"\d*", part).group() or 0)  # type: ignore[union-attr]
                 for part in version.split("+")[0].split(".")[:3])


def torch_version() -> str:
    """The version of the torch in use (``torch.__version__``), imported here."""
    import torch

    return str(torch.__version__)


def torch_note() -> str:
    """The report note naming the torch in use."""
    return f"torch: {torch_version()}"


def torch_at_least(version: str) -> bool:
    """True when the torch in use is ``version`` or newer (its release numbers; a pre-release counts)."""
    return _release(torch_version()) >= _release(version)


def require_torch(version: str, what: str) -> None:
    """Refuse ``what`` (a flag, a feature) on a torch older than ``version``: a one-line usage error."""
    if not torch_at_least(version):
        raise UsageError(f"{what} needs torch>={version}; this is {torch_version()}")


# ---- fake tensors --------------------------------------------------------------------------------

def _device_check_codes() -> frozenset[types.CodeType]:
    """The code of fake tensors' device check (``FakeTensor._find_common_device``), nested functions too."""
    fake = importlib.import_module(_FAKE)
    check = getattr(fake.FakeTensor, "_find_common_device", None)
    code = getattr(check, "__code__", None)
    if code is None:
        return frozenset()
    found = {code}
    pending = [code]
    while pending:
        for const in pending.pop().co_consts:
            if isinstance(const, types.CodeType) and const not in found:
                found.add(const)
                pending.append(const)
    return frozenset(found)


_CHECK_CODES: frozenset[types.CodeType] | None = None


def is_fake_device_mismatch(exc: BaseException) -> bool:
    """True when fake tensors raised ``exc`` because an op's tensors were on two devices.

    Decided from the type where torch has one (``FakeTensorDeviceMismatchError``,
    after 2.11); before it, fake tensors raise a plain ``RuntimeError`` from
    their device check, so the evidence is where it was raised: the innermost
    frame of its traceback runs that check's code, never its message.
    """
    fake = sys.modules.get(_FAKE)
    if fake is None:  # no fake tensor was ever made in this process
        return False
    mismatch = getattr(fake, "FakeTensorDeviceMismatchError", None)
    if mismatch is not None:
        return isinstance(exc, mismatch)
    if type(exc) is not RuntimeError or exc.__traceback__ is None:
        return False
    global _CHECK_CODES
    if _CHECK_CODES is None:
        _CHECK_CODES = _device_check_codes()
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code in _CHECK_CODES


_SET_DATA_LEAVES_META: bool | None = None


def _set_data_leaves_meta() -> bool:
    """True when ``Module._apply`` assigns a fake result to ``param.data`` (torch 2.6 and older), which
    leaves the parameter on ``meta``: probed once on a one-weight module, no version compared."""
    global _SET_DATA_LEAVES_META
    if _SET_DATA_LEAVES_META is None:
        import torch
        from torch import nn
        from torch.utils._python_dispatch import _disable_current_modes

        fake = importlib.import_module(_FAKE)
        with _disable_current_modes(), torch._C.DisableTorchFunction():  # outside any session's modes
            mode = fake.FakeTensorMode(allow_non_fake_inputs=True)
            probe = nn.Module()
            probe.weight = nn.Parameter(torch.zeros(1))
            probe._apply(mode.from_tensor)  # type: ignore[no-untyped-call]
            _SET_DATA_LEAVES_META = probe.weight.device.type == "meta"
    return _SET_DATA_LEAVES_META


@contextlib.contextmanager
def fake_moves_replace_parameters() -> Iterator[None]:
    """Within the block ``Module._apply`` replaces each parameter whose move made a fake tensor, as torch
    2.7 and newer do, instead of assigning to ``param.data`` (which leaves it on ``meta``)."""
    if not _set_data_leaves_meta():
        yield
        return
    import torch

    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)


# ---- torch._C ------------------------------------------------------------------------------------

def has_compatible_shallow_copy_type() -> Callable[..., Any]:
    """``torch._has_compatible_shallow_copy_type`` (called by ``Module._apply`` on two tensors)."""
    import torch

    return torch._has_compatible_shallow_copy_type  # type: ignore[no-any-return]


@contextlib.contextmanager
def cudnn_disabled() -> Iterator[None]:
    """``torch.backends.cudnn.enabled = False`` for the block, leaving the other cuDNN flags alone (and
    without the module's setter, which a simulation may have replaced)."""
    import torch

    enabled = torch._C._get_cudnn_enabled()
    torch._C._set_cudnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_cudnn_enabled(enabled)


def parse_to(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """``Tensor.to``'s own argument parser: ``(device, dtype, non_blocking, memory_format)``."""
    import torch

    return tuple(torch._C._nn._parse_to(*args, **kwargs))


def default_device() -> Any:
    """The default device ``torch.set_default_device`` or ``with torch.device(...):`` set (a
    ``torch.device``, maybe without an index), or None when none is set (the CPU)."""
    from torch.utils import _device

    return _device.CURRENT_DEVICE


def device_constructors() -> set[Any]:
    """torch's own table of the factories that the default device applies to when they are given no
    ``device`` (``torch.utils._device._device_constructors``, cached by torch)."""
    from torch.utils import _device

    return _device._device_constructors()  # type: ignore[no-any-return]


def op_arguments(name: str) -> list[tuple[str, str]]:
    """``(name, type)`` of every argument of every overload of the aten op ``name`` (its schema:
    ``torch.ops.aten.<name>.<overload>._schema``); [] when aten has no op of that name."""
    import torch

    try:
        packet = getattr(torch.ops.aten, name)
        return [(a.name, str(a.type)) for overload in packet.overloads()
                for a in getattr(packet, overload)._schema.arguments]
    except (AttributeError, RuntimeError):
        return []


def legacy_tensor_types() -> frozenset[Any]:
    """PyTorch's legacy tensor type classes (``torch.FloatTensor``, ``torch.cuda.HalfTensor`` ...:
    ``torch._tensor_classes``), each with ``is_cuda`` and ``dtype``."""
    import torch

    return frozenset(torch._tensor_classes)


# ---- checkpoints ---------------------------------------------------------------------------------

def weights_only_allowed_globals() -> frozenset[str]:
    """The globals ``torch.load(weights_only=True)`` accepts here: torch's and the user's."""
    from torch import _weights_only_unpickler as wou

    allowed = set(wou._get_allowed_globals())
    user = getattr(wou, "_get_user_allowed_globals", None)
    if user is not None:
        allowed |= set(user())
    return frozenset(allowed)


def export_scalar_type(code: int) -> str:
    """The name of ``torch.export``'s serialised dtype number ``code`` (ValueError when unknown)."""
    from torch._export.serde.schema import ScalarType

    return str(ScalarType(code).name)


# ---- torch.distributed ---------------------------------------------------------------------------

FSDP_FLOOR = "2.10"
"""FSDP2's ``fully_shard`` is public from torch 2.6 (and DTensor from 2.5)."""


def fake_store() -> Any:
    """A store for PyTorch's fake process group (``init_process_group("fake", store=...)``): collectives
    return at once without moving data."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def fsdp_init_module() -> Any:
    """FSDP2's initialisation module (its ``_move_states_to_device``), or None in a build without it."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_init
    except ImportError:
        return None
    return _fsdp_init


def fsdp2_backward_entries() -> list[tuple[Any, str]]:
    """FSDP2's methods that autograd calls during a backward (an output's gradient hook, its
    post-backward ``autograd.Function``, the engine's final callback), as ``(class, name)``."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    return [(FSDPState, "_pre_backward"), (FSDPState, "_root_post_backward_final_callback"),
            (FSDPParamGroup, "post_backward")]


def fsdp2_unshard() -> tuple[Any, str]:
    """FSDP2's all-gather of a parameter group (``FSDPParamGroup.unshard``), as ``(class, name)``."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    return FSDPParamGroup, "unshard"


def fsdp2_param_class() -> Any:
    """FSDP2's ``FSDPParam``, which builds each sharded parameter (and gradient) as a DTensor
    (``to_sharded_dtensor``)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    return FSDPParam


def dtensor_rng_askers() -> list[Any]:
    """DTensor's modules that ask ``is_rng_supported_mesh(mesh)`` before a random op on a DTensor (then
    run it under their CUDA RNG tracker)."""
    from torch.distributed.tensor import _dispatch, _random

    return [_random, _dispatch]


def accelerator_query() -> tuple[Any, str]:
    """Where torch asks which accelerator this build has (``torch._C._get_accelerator``: FSDP2's default
    mesh is of its type), as ``(module, name)``."""
    import torch

    return torch._C, "_get_accelerator"


def composable_state_keys() -> frozenset[str]:
    """The ``__dict__`` keys under which torch.distributed's composable APIs keep a module's state
    (none until one of them has been imported)."""
    contract = sys.modules.get("torch.distributed._composable.contract")
    if contract is None:
        return frozenset()
    keys = (getattr(contract, "STATE_KEY", None), getattr(contract, "REGISTRY_KEY", None))
    return frozenset(k for k in keys if isinstance(k, str))


def compiler_errors() -> tuple[type[BaseException], ...]:
    """TorchDynamo's own failures (``InternalTorchDynamoError``, ``BackendCompilerFailed``), when
    TorchDynamo is already imported (importing it costs seconds); else ``()``."""
    if "torch._dynamo" not in sys.modules:
        return ()
    from torch._dynamo.exc import BackendCompilerFailed, InternalTorchDynamoError

    return (InternalTorchDynamoError, BackendCompilerFailed)


def dynamo_disabled() -> contextlib.AbstractContextManager[None]:
    """TorchDynamo switched off (``torch._dynamo.config.patch(disable=True)``): ``torch.compile`` runs
    the eager code."""
    import torch._dynamo

    return torch._dynamo.config.patch(disable=True)  # type: ignore[no-any-return]


def storage_location_registry() -> list[Any]:
    """``torch.serialization``'s list of (priority, tagger, deserializer) entries that name a storage's
    saved location (``register_package`` appends to it; there is no public way to insert first)."""
    import torch.serialization

    return torch.serialization._package_registry  # type: ignore[no-any-return]


FULLY_SHARD_MODULES = ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard",
                       "torch.distributed.fsdp._fully_shard._fully_shard",
                       "torch.distributed._composable.fsdp", "torch.distributed._composable.fsdp.fully_shard")
"""The modules that hold FSDP2's ``fully_shard``: the public path and the private ones (the only one
before torch 2.6, which libraries still import it from)."""


def inputs_to_device(args: tuple[Any, ...], kwargs: dict[str, Any], device: Any
                     ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A forward's inputs moved to ``device`` as DDP and FSDP move them (``torch.distributed.utils.
    _to_kwargs``, on the current stream)."""
    from torch.distributed.utils import _to_kwargs

    moved_args, moved_kwargs = _to_kwargs(args, kwargs, device, False)
    return moved_args[0], moved_kwargs[0]


def pad_packed_sequence_op() -> Any:
    """The op behind ``nn.utils.rnn.pad_packed_sequence`` (``torch._VF._pad_packed_sequence``): its ATen
    kernel is composite and reads ``batch_sizes`` and writes ``lengths`` through data pointers."""
    import torch

    return torch._C._VariableFunctions._pad_packed_sequence


def scripted_python_function(value: Any) -> Callable[..., Any] | None:
    """The Python function a ``torch.jit.ScriptFunction`` was compiled from (``torch.jit.script`` keeps
    it as ``_torchdynamo_inline`` for TorchDynamo, which inlines it); None for anything else."""
    import inspect

    import torch

    if not isinstance(value, torch.jit.ScriptFunction):
        return None
    original = getattr(value, "_torchdynamo_inline", None)
    return original if inspect.isfunction(original) else None


def make_subclass(cls: type[_TensorT], t: Any, requires_grad: bool) -> _TensorT:
    """``torch.Tensor._make_subclass``: ``t``'s storage as a tensor of class ``cls`` (the tagged engine's
    tags, and a simulated parameter rebuilt in a child process)."""
    import torch

    made: _TensorT = torch.Tensor._make_subclass(cls, t, requires_grad)
    return made


def foreach_copy() -> Any:
    """``torch._foreach_copy_``, the optimizers' list copy (a host sync between host and device)."""
    import torch

    return torch._foreach_copy_


def autocast_cpu_key() -> Any:
    """The dispatcher's ``AutocastCPU`` key, whose kernels CUDA autocast's simulation replaces."""
    import torch

    return torch._C.DispatchKey.AutocastCPU


@contextlib.contextmanager
def dispatch_key_excluded(key: Any) -> Iterator[None]:
    """Below ``key`` in the dispatcher, with no ``__torch_function__`` mode: a kernel calling the op it
    replaces (``torch._C._ExcludeDispatchKeyGuard``, ``DisableTorchFunction``)."""
    import torch

    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)), torch._C.DisableTorchFunction():
        yield


def dispatch_key_registrations(key: str) -> list[str]:
    """The ops with a kernel registered for the dispatcher's ``key`` (``aten::name`` strings)."""
    import torch

    return list(torch._C._dispatch_get_registrations_for_dispatch_key(key))
