"""DTensors over a simulated CUDA mesh on the real-valued engine: FSDP2's sharded parameters as on a GPU.

On a GPU, ``fully_shard`` over ``DeviceMesh("cuda", ...)`` turns each parameter into a ``DTensor`` whose
local shard is on the rank's GPU: ``param.device``, ``param.to_local().device`` and
``param.full_tensor().device`` are ``cuda:k``. Under the real-valued engine
(:mod:`placecheck.engines.tagged`) the data is on the CPU and a tensor's simulated device is its
:class:`~placecheck.engines.tagged.SimulatedTensor` tag, which a DTensor loses three ways, each mended here
for a rank's session (:func:`patches`):

- DTensor computes in its own C++ dispatch, below ``__torch_function__``: the local shard of every result
  is a plain CPU tensor. DTensor's ``__torch_function__`` (a no-op in torch) tags each result's new local
  shard with the device of the op's inputs (the rank's GPU, or the CPU for a DTensor moved there); a
  local shard read from Python (``DTensor._local_tensor``, what ``to_local()``, FSDP2 and DTensor's own
  Python code read) that no op tagged, on a CUDA mesh, is tagged with the rank's current GPU. Tagging
  changes the tensor object's class in place: its data, version counter and autograd identity are
  unchanged. ``DTensor.device`` answers its local shard's device, as torch's does.
- The engine's tagging of results (``as_subclass``) cannot re-type a wrapper subclass (a DTensor, an
  ``AsyncCollectiveTensor``): those are left as they are, a DTensor's local shard tagged instead; a
  ``.to()`` of a DTensor is DTensor's own ``_to_copy``; and an op that mixes a DTensor with a tagged tensor
  is DTensor's to decide (a 0-dim tensor is replicated, anything else raises DTensor's own error), not
  the engine's device check.
- FSDP2's backward runs in autograd's engine, where no mode is active: its pre-backward hook, its
  post-backward and its final callback allocate with ``device="cuda"``; they run under the session's
  modes (:func:`placecheck.engines.callbacks.called_back`), as the script's gradient hooks do.

And what asks for a driver: ``torch._C._get_accelerator()`` (FSDP2's default mesh) answers ``cuda``, as on
the GPU machine simulated; DTensor's random ops (``reset_parameters()`` on sharded parameters) run on the
CPU generator, not under DTensor's CUDA RNG tracker (which reads the CUDA generator's state): where the
values go is the same. The collectives run on PyTorch's fake process group, their outputs given the rank's
own values where ``torch.distributed``'s Python API is called (:func:`placecheck.run.patches.own_values`).

FSDP2 builds each shard (a parameter's, a gradient's) with ``FSDPParam.to_sharded_dtensor``: it is placed on
FSDP2's device, or on the CPU with ``offload_policy=CPUOffloadPolicy()`` (the optimizer then steps there),
and a shard FSDP2 puts in place of another (after ``to_empty``) is where the old one was. Its all-gathers,
reduce-scatters and offload copies are FSDP2's own work, not the script's calls (not recorded).

An op of the script that mixes a plain tensor with a DTensor raises on the ranks: :class:`ScriptDTensorMixes`
reports it (PC201) and runs it on the DTensor's full value.

Not simulated: the values other ranks would send (a gathered tensor holds this rank's shard in every
slot); the check that an NCCL collective gets no CPU tensor (PC402) sees ``torch.distributed``'s Python
API, not the functional collectives DTensor calls (``full_tensor()`` of a CPU-offloaded parameter).

Not reentrant: the patches are on DTensor's and the engine's classes, for the process (each rank is a
process of its own).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch

from placecheck.basics.patching import Patch

DTENSOR_MODULE = "torch.distributed.tensor"
"""DTensor's package (FSDP2 imports it): the patches are installed once the script imports it."""

VIEW_WARNING = r"FSDP2-wrapped module \(.*\) returned a view tensor"
"""What FSDP2 warns when a sharded module's output is a view: the engine's every result is one (a tagged
view of its CPU data), the script's module need not be; silenced in a rank's session."""

_HOST = "_pc_host"
"""Marks a DTensor's local shard that is on the CPU (moved there): never tagged as on the GPU."""


def _rank_gpu() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _on_cuda_mesh(dtensor: Any) -> bool:
    return getattr(dtensor._spec.mesh, "device_type", "") == "cuda"


def _place_local(local: Any, device: torch.device | None) -> None:
    """A DTensor's plain CPU local shard, now on ``device`` (a simulated GPU: tagged in place; the CPU or
    None: marked as a host tensor)."""
    from placecheck.engines.tagged import SimulatedTensor

    if type(local) is not torch.Tensor or local.device.type != "cpu":
        return
    if device is not None and device.type == "cuda":
        local.__class__ = SimulatedTensor  # the same object, data and autograd identity: only its class
        local._pc_device = device  # type: ignore[attr-defined]
    else:
        setattr(local, _HOST, True)


def _local_shard(slot: Any) -> Any:
    """``DTensor._local_tensor`` (a slot): read, a plain CPU shard over a CUDA mesh that no op tagged is
    tagged with the rank's GPU."""
    from placecheck.engines.tagged import SimulatedTensor

    def get(self: Any) -> Any:
        local = slot.__get__(self, type(self))
        if type(local) is torch.Tensor and not getattr(local, _HOST, False) and _on_cuda_mesh(self):
            _place_local(local, _rank_gpu())
        return local

    def set_(self: Any, value: Any) -> None:
        # a new shard put in place of the old one (FSDP2 after to_empty) is where the old one was
        try:
            before = slot.__get__(self, type(self))
        except AttributeError:  # DTensor's constructor: no shard yet
            before = None
        if isinstance(before, SimulatedTensor):
            _place_local(value, before.device)
        elif type(before) is torch.Tensor and getattr(before, _HOST, False):
            _place_local(value, None)
        slot.__set__(self, value)

    return property(get, set_)


def _device(original: Any) -> Any:
    """``DTensor.device``: its local shard's (simulated) device."""
    def get(self: Any) -> torch.device:
        local = self._local_tensor
        device = local.device
        if device.type == "cpu" and type(local) is not torch.Tensor and not getattr(local, _HOST, False) \
                and _on_cuda_mesh(self) and _is_wrapper(local):
            return _rank_gpu()  # an AsyncCollectiveTensor's: on the GPU of the collective
        return device  # type: ignore[no-any-return]
    return property(get)


def _is_wrapper(t: Any) -> bool:
    from placecheck.engines.compat import is_traceable_wrapper_subclass

    return bool(is_traceable_wrapper_subclass(t))


def _dtensors(value: Any) -> Iterator[Any]:
    from torch.distributed.tensor import DTensor

    from placecheck.engines.compat import tree_leaves

    for leaf in tree_leaves(value):
        if isinstance(leaf, DTensor):
            yield leaf


def _input_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    """Where an op on DTensors computes: a ``device=`` it is given, else its first DTensor argument's (a
    plain tensor beside it is a 0-dim scalar, which may be on the CPU), else None."""
    from placecheck.engines.calls import as_device
    from placecheck.engines.classify import tensor_arguments

    if kwargs.get("device") is not None:
        return as_device(kwargs["device"])  # type: ignore[no-any-return]
    return next((t.device for t in _dtensors([t for _, t in tensor_arguments(args, kwargs)])), None)


def _torch_function(original: Any) -> Any:
    """``DTensor.__torch_function__``: torch's (run the op in DTensor's dispatch), then each result's new
    local shard placed where the op's inputs are."""
    from placecheck.engines.compat import DisableTorchFunctionSubclass

    def torch_function(cls: type, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        with DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        slot = _SLOT[0]
        for result in _dtensors(out):
            local = slot.__get__(result, type(result))
            if type(local) is torch.Tensor and not getattr(local, _HOST, False):
                device = _input_device(args, kwargs)
                if device is None:
                    break  # no DTensor came in: the mesh decides when the shard is read
                _place_local(local, device)
        return out
    return classmethod(torch_function)


_SLOT: list[Any] = []
"""DTensor's own ``_local_tensor`` slot, while :func:`patches` replace it."""


def _tag(original: Callable[..., Any]) -> Any:
    """``SimulatedTensor.tag``: a wrapper subclass is left as it is (a DTensor's local shard tagged)."""
    def tag(t: torch.Tensor, device: torch.device) -> Any:
        if _is_wrapper(t):
            for dtensor in _dtensors(t):
                _place_local(_SLOT[0].__get__(dtensor, type(dtensor)), device)
            return t
        return original(t, device)
    return staticmethod(tag)


def _move(original: Callable[..., Any]) -> Callable[..., Any]:
    """The engine's ``.to()``: a DTensor's is DTensor's own ``_to_copy``, its result's shard placed at the
    destination."""
    def move(placement: Any, dest: torch.device) -> Any:
        from torch.distributed.tensor import DTensor

        from placecheck.engines.compat import DisableTorchFunctionSubclass

        source = placement.source
        if not isinstance(source, DTensor):
            return original(placement, dest)
        options = placement.to_options()
        here = source.device
        with DisableTorchFunctionSubclass():
            if dest.type == here.type and dest.index in (None, here.index):
                out = torch.Tensor.to(source, **options) if options else source
            else:  # between the CPU and a GPU: a copy, though the data stays on the CPU
                out = torch.Tensor.to(source, torch.device("cpu") if dest.type == "cuda" else dest,
                                      **{**options, "copy": True})
        if out is not source:
            _place_local(_SLOT[0].__get__(out, type(out)), dest)
        return out
    return move


def _defers_to_dtensor(original: Any) -> Any:
    """``SimulatedTensor.__torch_function__``: an op with a DTensor among its arguments is DTensor's to run
    (``NotImplemented`` hands it on)."""
    function = original.__func__ if isinstance(original, classmethod) else original

    def torch_function(cls: type, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None) -> Any:
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        return function(cls, func, types, args, kwargs)
    return classmethod(torch_function)


def _fsdps_own(quiet: Callable[[], AbstractContextManager[Any]], back: bool
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """FSDP2's own work (its all-gathers, reduce-scatters and the copies of CPU offload), not recorded as the
    script's (``quiet``); during a backward (``back``), under the session's modes."""
    from placecheck.engines.callbacks import called_back

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def method(*args: Any, **kwargs: Any) -> Any:
            with called_back() if back else contextlib.nullcontext(), quiet():
                return original(*args, **kwargs)
        return method
    return make


def _answers_cuda(check_available: bool = False) -> torch.device:
    """``torch._C._get_accelerator()`` on the GPU machine simulated."""
    return torch.device("cuda")


def _no_rng_tracker(mesh: Any) -> bool:
    """``is_rng_supported_mesh(mesh)``: no, DTensor's random ops run on the CPU generator."""
    return False


def patches() -> list[Patch]:
    """The session's patches (see the module's docstring), once ``torch.distributed.tensor`` is imported."""
    from torch.distributed.tensor import DTensor

    from placecheck.engines import tagged
    from placecheck.engines.compat import accelerator_query, dtensor_rng_askers

    _SLOT[:] = [vars(DTensor)["_local_tensor"]]
    accelerator, query = accelerator_query()
    out: list[Patch] = [
        (DTensor, "_local_tensor", _local_shard),
        (DTensor, "device", _device),
        (DTensor, "__torch_function__", _torch_function),
        (tagged.SimulatedTensor, "tag", _tag),
        (tagged.SimulatedTensor, "__torch_function__",
         lambda original: _defers_to_dtensor(vars(tagged.SimulatedTensor)["__torch_function__"])),
        (tagged, "_move", _move),
        (accelerator, query, lambda original: _answers_cuda),
    ]
    out += [(owner, "is_rng_supported_mesh", lambda original: _no_rng_tracker)
            for owner in dtensor_rng_askers()]
    return out


def _sharded_on_fsdp_device(original: Callable[..., Any]) -> Callable[..., Any]:
    """``FSDPParam.to_sharded_dtensor``: the shard (a parameter's, a gradient's) on FSDP2's device, or on the
    CPU where FSDP2 offloads it (``offload_policy=CPUOffloadPolicy()``)."""
    @functools.wraps(original)
    def to_sharded_dtensor(self: Any, tensor: torch.Tensor) -> Any:
        out = original(self, tensor)
        offloaded = getattr(self, "offload_to_cpu", False)
        device = torch.device("cpu") if offloaded else getattr(self, "device", None)
        _place_local(_SLOT[0].__get__(out, type(out)), device)
        return out
    return to_sharded_dtensor


def fsdp_patches(quiet: Callable[[], AbstractContextManager[Any]]) -> list[Patch]:
    """FSDP2's backward entries under the session's modes, its own work not recorded as the script's
    (``quiet``: the recorder's), and its shards where FSDP2 keeps them, once ``torch.distributed.fsdp`` is
    imported."""
    from placecheck.engines.compat import fsdp2_backward_entries, fsdp2_param_class, fsdp2_unshard

    unshard, name = fsdp2_unshard()
    return [*((owner, name, _fsdps_own(quiet, True)) for owner, name in fsdp2_backward_entries()),
            (unshard, name, _fsdps_own(quiet, False)),
            (fsdp2_param_class(), "to_sharded_dtensor", _sharded_on_fsdp_device)]


class ScriptDTensorMixes:
    """An op of the script that mixes a plain tensor (not a 0-dim scalar) with a DTensor: on the ranks it
    raises ("got mixed torch.Tensor and DTensor", a sharded parameter read outside its own module's
    forward); PC201 at its line, as ``audit --wrap fsdp`` reports it
    (:class:`placecheck.placement.replicas.DTensorMixes`), and the op run on the DTensors' full values
    (detached: no gradient reaches the DTensor through it), so that the run goes on and reports every
    such op. Decided from the arguments' types, never from
    DTensor's message. A handler of the dispatcher, subscribed before the recorder (which sees the call
    first); placecheck's and FSDP2's own calls (``quieted()``) are left alone."""

    def __init__(self, add: Callable[[Any], None], quiet: Callable[[], AbstractContextManager[Any]],
                 quieted: Callable[[], bool]) -> None:
        self.add = add
        self.quiet = quiet
        self.quieted = quieted

    def __call__(self, call: Any) -> Any:
        from placecheck.placement.replicas import DTensorMix

        mix = None if self.quieted() else DTensorMix.of(call)
        if mix is None:
            return call.run()
        self.add(self._finding(mix))
        with self.quiet():  # detached: its backward would run DTensor's collectives outside the simulation
            full = mix.full_values(detach=True)
        return mix.run_on(call, full)

    @staticmethod
    def _finding(mix: Any) -> Any:
        from placecheck.engines.calls import device_of
        from placecheck.engines.sources import here
        from placecheck.findings.rules import dtensor_mixed

        plain, dtensor = mix.described
        return dtensor_mixed(mix.op, plain, dtensor, mix.placements, where="", source=here()[0],
                             device=device_of(mix.plain), expected=device_of(mix.dtensor))
