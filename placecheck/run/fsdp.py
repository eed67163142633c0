"""FSDP under ``placecheck run --nproc-per-node N``: what each rank's FSDP places, and where.

FSDP2's ``fully_shard`` runs as torch wrote it, over a mesh of the simulated GPUs: each rank's parameters
become ``DTensor`` shards on its GPU (``placements``, ``device_mesh``, ``to_local()``, ``full_tensor()``
as on a GPU), its forward all-gathers and its backward reduce-scatters on the fake process group. What the
real-valued engine needs for that is in :mod:`placecheck.run.dtensors` (until then a DTensor's shard lost
its simulated device at its first op, so ``fully_shard`` was replaced by a placement that kept whole
parameters, and a script asking a parameter for ``placements`` stopped there). Here, around it
(:class:`ShardedPlacement`):

- before FSDP2 shards a module, ``fully_shard(module)`` puts its registered parameters and buffers on
  FSDP's device, the rank's current GPU (``torch.cuda.current_device()``: ``cuda:0`` on every rank
  without ``set_device``; the CPU for a CPU mesh), with the script's own ``Module.to`` (recorded and
  walked as a move at the ``fully_shard`` line, where a GPU other than the rank's is PC401): FSDP2's own
  move (``param.data = ...``) would drop the engine's tag. What is on ``meta`` stays there (for
  ``to_empty``), and what ``.to()`` does not see (a plain tensor attribute) stays where it was, as with
  FSDP. Every module that holds ``fully_shard`` is patched (:func:`fully_shard_homes`): the public path
  and the private ``torch.distributed._composable.fsdp``, once the script imports FSDP
  (:data:`FSDP_MODULE`; a rank that never does is spared its import).
- FSDP1's ``FullyShardedDataParallel(module, device_id=...)`` builds a subclass of itself
  (:func:`whole_wrapper`) that holds the module whole as ``_fsdp_wrapped_module``, moves what is on
  the CPU to ``device_id`` (nothing without one, as FSDP1), and marks the module's parameters as
  FSDP-managed (``_fsdp_flattened``, which Lightning asks of the optimizer's): its flat parameters
  would lose the engine's tag as DTensors did, and are not simulated.
- The outermost sharded module's forward moves its inputs to FSDP's device first
  (as FSDP2's root, FSDP1 and DDP do), and its all-gather is
  reported, with its GPU, at that line: two ranks on one GPU are NCCL's "Duplicate GPU detected" there.

The fake process group moves no data: a gathered parameter holds the rank's own shard in every slot
(:func:`placecheck.run.patches.own_values`), so losses, ``.item()`` and branches read real, finite values,
not another rank's. Not simulated: FSDP1's ``auto_wrap_policy`` (the module is placed whole).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

ALL_GATHER = "FSDP's all-gather"
"""The collective a sharded module's forward runs first (the ``call`` of a shared-GPU PC401)."""

NOTE = ("fsdp: fully_shard shards each rank's module as FSDP2 does on a GPU: DTensor parameters on the "
        "rank's GPU, the forward's all-gathers and the backward's reduce-scatters on the fake process group "
        "(which moves no data: a gathered parameter holds the rank's own shard in every slot)")
"""Said once per run that shards a module with FSDP2."""

NOTE_FSDP1 = ("fsdp: each rank runs FullyShardedDataParallel as its placement (the module's parameters and "
              "buffers moved to its device_id and its inputs there, as FSDP does), with whole parameters: "
              "its flat-parameter sharding is not simulated")
"""Said once per run that wraps a module in FSDP1."""

Placed = Callable[[torch.device, str, str, str], None]
"""``placed_at(device, what, line, where)`` of :class:`placecheck.run.ranks.RankChecks`."""


FSDP_MODULE = "torch.distributed.fsdp"
"""The package every FSDP import goes through (``torch.distributed._composable.fsdp`` imports from it):
its patches are installed once the script imports it."""


def fully_shard_homes() -> list[tuple[object, str]]:
    """Every ``(module, "fully_shard")`` that holds FSDP2's ``fully_shard`` in this build: whichever of
    them the script imports it from, it calls the patched one."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        return []
    homes: list[tuple[object, str]] = []
    from placecheck.engines.compat import FULLY_SHARD_MODULES

    for name in FULLY_SHARD_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "fully_shard", None) is fully_shard:
            homes.append((module, "fully_shard"))
    return homes


def fsdp1_wrapper() -> type[nn.Module] | None:
    """FSDP1's ``FullyShardedDataParallel``, or None in a build without it."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return None
    return FullyShardedDataParallel  # type: ignore[no-any-return]


def _states(module: nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


class ShardedPlacement:
    """A rank's FSDP (see the module's docstring). ``placed_at`` is told what FSDP put on a GPU,
    ``on_forward(device)`` each outermost sharded forward, ``note(text)`` what to say once; FSDP2's own
    work runs under ``quiet()`` (the recorder's: not the script's calls)."""

    def __init__(self, placed_at: Placed, on_forward: Callable[[torch.device], None],
                 note: Callable[[str], None],
                 quiet: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
                 ) -> None:
        self.placed_at = placed_at
        self.quiet = quiet
        self.on_forward = on_forward
        self.note = note
        self._depth = 0
        self._sharded: set[int] = set()

    def patches(self) -> list[tuple[object, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
        """The session's patches: every ``fully_shard``, FSDP2's backward
        (:func:`placecheck.run.dtensors.fsdp_patches`) and FSDP1's ``__new__``."""
        from placecheck.run.dtensors import fsdp_patches

        out: list[tuple[object, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
            (owner, name, self._fully_shard) for owner, name in fully_shard_homes()]
        out += fsdp_patches(self.quiet)
        wrapper = fsdp1_wrapper()
        if wrapper is not None:
            standin = whole_wrapper(wrapper, self.fsdp1)
            out.append((wrapper, "__new__", lambda original: _builds(wrapper, standin, original)))
        return out

    def _fully_shard(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def fully_shard(module: Any, *args: Any, mesh: Any = None, ignored_params: Any = None,
                        **kwargs: Any) -> Any:
            modules = [m for m in (module if isinstance(module, list | tuple) else [module])
                       if isinstance(m, nn.Module)]
            ignored = {id(p) for p in ignored_params or ()}
            devices = [self.fsdp2(each, mesh, ignored) for each in modules]
            out = original(module, *args, mesh=mesh, ignored_params=ignored_params, **kwargs)
            for each, device in zip(modules, devices, strict=True):
                self.note(NOTE)
                self._sharded_forward(each, device)
            return out
        return fully_shard

    def fsdp2(self, module: nn.Module, mesh: Any, ignored: set[int] | None = None) -> torch.device:
        """What ``fully_shard(module, mesh=mesh, ignored_params=...)`` (``ignored``: their ids) places, before
        FSDP2 shards it: its other states moved to FSDP2's device (returned)."""
        from placecheck.engines.sources import here

        device = fsdp_device(mesh)
        ignored = ignored or set()
        states = [t for t in _states(module) if id(t) not in ignored]
        if any(t.device != device and t.device.type != "meta" for t in states):
            name = type(module).__name__
            self.placed_at(device, f"fully_shard put {name}'s parameters", here()[0], f"fully_shard({name})")
            if ignored or any(t.device.type == "meta" for t in states):  # meta stays for to_empty
                def place(t: torch.Tensor) -> torch.Tensor:
                    return t if t.device.type == "meta" or id(t) in ignored else t.to(device)
                nn.Module._apply(module, place)  # type: ignore[no-untyped-call]
            else:
                module.to(device)  # the script's own Module.to: recorded and walked at this line
        return device

    def fsdp1(self, wrapper: nn.Module, device_id: Any) -> None:
        """``FullyShardedDataParallel(module, device_id=device_id)`` (``wrapper``, holding the module):
        what is on the CPU moved to ``device_id`` (left there without one), a sharded forward."""
        from placecheck.engines.sources import here

        module = wrapper._fsdp_wrapped_module
        assert isinstance(module, nn.Module)
        target = fsdp1_device(device_id)
        if target is not None and any(t.device.type == "cpu" for t in _states(module)):
            name = type(module).__name__
            self.placed_at(target, f"FullyShardedDataParallel put {name}'s parameters", here()[0],
                           f"FullyShardedDataParallel({name})")
            module.to(target)
        param = next(iter(module.parameters()), None)  # FSDP1's compute device: the module's GPU, or
        on_gpu = param is not None and param.device.type == "cuda"  # else the current one
        self.note(NOTE_FSDP1)
        self._sharded_forward(wrapper, param.device if on_gpu and param is not None else
                              torch.device("cuda", torch.cuda.current_device()))

    def _sharded_forward(self, module: nn.Module, device: torch.device) -> None:
        if id(module) in self._sharded:
            return
        self._sharded.add(id(module))
        module.register_forward_pre_hook(self._pre_forward(device), with_kwargs=True, prepend=True)
        module.register_forward_hook(self._post_forward, always_call=True)

    def _pre_forward(self, device: torch.device) -> Callable[..., Any]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                 ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            self._depth += 1
            if self._depth > 1:  # inside the root's forward: placed already
                return args, kwargs
            self.on_forward(device)
            from placecheck.engines.compat import inputs_to_device

            return inputs_to_device(args, kwargs, device)  # as FSDP2's root, FSDP1 and DDP do
        return hook

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)


def fsdp_device(mesh: Any) -> torch.device:
    """FSDP2's device: a CPU mesh's CPU, else the rank's current GPU (what the script's
    ``torch.cuda.current_device()`` answers)."""
    if mesh is not None and getattr(mesh, "device_type", "cuda") == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def fsdp1_device(device_id: Any) -> torch.device | None:
    """FSDP1's ``device_id`` as a device (``cuda`` without an index: the current GPU); None without one."""
    if device_id is None:
        return None
    device = device_id if isinstance(device_id, torch.device) else torch.device(device_id)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def whole_wrapper(wrapper: type[nn.Module], place: Callable[[nn.Module, Any], None]) -> type[nn.Module]:
    """A subclass of FSDP1's ``FullyShardedDataParallel`` built instead of it (``isinstance`` holds): it
    holds the module whole as ``_fsdp_wrapped_module`` (where FSDP1 keeps it), ``place(self, device_id)``
    places it, its forward is the module's, and its FSDP methods are ``nn.Module``'s (there are no flat
    parameters to summon or gradients to hold back: ``no_sync`` and ``summon_full_params`` do nothing)."""

    @contextlib.contextmanager
    def nothing(*args: Any, **kwargs: Any) -> Iterator[None]:
        yield

    class FullyShardedDataParallel(wrapper):  # type: ignore[misc,valid-type]
        def __init__(self, module: nn.Module, *args: Any, device_id: Any = None, **kwargs: Any) -> None:
            nn.Module.__init__(self)
            self._fsdp_wrapped_module = module
            place(self, device_id)
            for param in module.parameters():  # managed by FSDP (Lightning asks the optimizer's)
                param._fsdp_flattened = True  # type: ignore[attr-defined]

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self._fsdp_wrapped_module(*args, **kwargs)

        def check_is_root(self) -> bool:
            return True

        def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
            return nn.utils.clip_grad_norm_(self.parameters(), max_norm, norm_type)

        no_sync = nothing
        summon_full_params = staticmethod(nothing)
        _apply = nn.Module._apply
        apply = nn.Module.apply
        named_parameters = nn.Module.named_parameters
        named_buffers = nn.Module.named_buffers

    FullyShardedDataParallel.__module__ = wrapper.__module__
    FullyShardedDataParallel.__qualname__ = wrapper.__qualname__
    return FullyShardedDataParallel


def _builds(wrapper: type, standin: type, original: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper.__new__``: ``wrapper(...)`` builds a ``standin`` (whose ``__init__`` Python then runs)."""
    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if cls is wrapper:
            return nn.Module.__new__(standin)
        return original(cls) if original is object.__new__ else original(cls, *args, **kwargs)
    return __new__
