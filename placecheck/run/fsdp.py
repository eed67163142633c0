"""FSDP under ``placecheck run --nproc-per-node N``: what each rank's ``fully_shard`` places, and where.

FSDP's own sharding cannot run on the real-valued engine: its sharded parameters are
``DTensor``s, whose device is the real one of their storage (the CPU: a ``DTensor`` is a
wrapper that the engine's :class:`~placecheck.tagged.SimulatedTensor` tag cannot reach), and
each op inside them runs below the engine's ``__torch_function__`` (the tag of every local shard
is lost at the first one: ``nn.Parameter(dtensor)`` detaches it). Run as is, a correct FSDP2
script got a PC201 inside FSDP's ``all_gather_copy_in`` (a shard that lost its tag, met with the
all-gather buffer on ``cuda:k``) and a PC207 (``fully_shard`` asked ``torch._C._get_accelerator()``,
which answers ``cpu`` on a machine without a GPU, and then found the model on ``cuda:k``).
FSDP1's flat parameters lose the tag the same way.

So each rank runs FSDP as its placement: what ``fully_shard`` (or FSDP1's
``FullyShardedDataParallel``) does to where tensors are, and nothing of its sharding:

- the module's registered parameters and buffers move to FSDP's device, the rank's current GPU
  (``torch.cuda.current_device()``: ``cuda:0`` on every rank without ``set_device``; FSDP1's
  ``device_id`` when given), with the script's own ``Module.to`` (so the walk after a move and the
  rank's own-GPU check see it, at the ``fully_shard`` line); tensors on ``meta`` stay there (for
  ``to_empty``); what ``.to()`` does not see (a plain tensor attribute) stays where it was;
- the outermost sharded module's forward moves its inputs to that device first, as FSDP2's root
  and FSDP1 do (``_to_kwargs``, "same as DDP"): a batch on the CPU reaches it as it would DDP;
- its all-gather is recorded, with its GPU, at the line of that forward: two ranks on one GPU are
  NCCL's "Duplicate GPU detected" there (:func:`placecheck.run.ranks._shared_gpus`).

Each rank keeps whole parameters (plain tensors on its GPU, not ``DTensor`` shards): a script's
loss, ``.item()`` and branches read real, finite values, and its optimizer steps as on one GPU.
What needs FSDP's own state is not simulated: ``FSDPModule``'s methods (``reshard``,
``set_requires_gradient_sync``...), sharded state dicts and ``DTensor`` parameters.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

_FSDP2_HOMES = ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard",
                "torch.distributed.fsdp._fully_shard._fully_shard", "torch.distributed._composable.fsdp",
                "torch.distributed._composable.fsdp.fully_shard")
"""The modules a script imports ``fully_shard`` from: the public path and the private ones (torch 2.4-2.5
had it only at ``torch.distributed._composable.fsdp``; libraries still import it from there)."""

ALL_GATHER = "FSDP's all-gather"
"""The collective a sharded module's forward runs first (recorded for two ranks on one GPU)."""


def fully_shard_homes() -> list[tuple[object, str]]:
    """Every ``(module, "fully_shard")`` that holds FSDP2's ``fully_shard`` in this build: whichever of
    them the script imports from, it calls the patched one."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        return []
    homes: list[tuple[object, str]] = []
    for name in _FSDP2_HOMES:
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


class ShardedPlacement:
    """A rank's FSDP: ``placed(module, device, line)`` moves a module as FSDP would, ``forward(device)``
    is told each outermost sharded forward (its line, its GPU)."""

    def __init__(self, forward: Callable[[torch.device], None]) -> None:
        self.on_forward = forward
        self._depth = 0
        self.sharded: set[int] = set()

    def place(self, module: nn.Module, device: torch.device) -> None:
        """``module``'s parameters and buffers moved to ``device`` as FSDP moves them, and its forward
        made a sharded one."""
        tensors = [*module.parameters(), *module.buffers()]
        if any(t.device.type == "meta" for t in tensors):
            # deferred initialisation: what is on meta stays there (the script's to_empty places it)
            module._apply(lambda t: t if t.device.type == "meta" else t.to(device))
        elif any(t.device != device for t in tensors):
            module.to(device)  # the script's own Module.to: recorded and walked at the fully_shard line
        if id(module) not in self.sharded:
            self.sharded.add(id(module))
            module.register_forward_pre_hook(self._pre_forward(device), with_kwargs=True, prepend=True)
            module.register_forward_hook(self._post_forward, always_call=True)

    def _pre_forward(self, device: torch.device) -> Callable[..., Any]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                 ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            self._depth += 1
            if self._depth > 1:  # inside the root's forward: its inputs are placed already
                return args, kwargs
            self.on_forward(device)
            from torch.distributed.utils import _to_kwargs

            moved_args, moved_kwargs = _to_kwargs(args, kwargs, device, False)  # as FSDP2's root, DDP
            return moved_args[0], moved_kwargs[0]
        return hook

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)


def fsdp_device(mesh: Any, device_id: Any = None) -> torch.device:
    """The device FSDP puts a rank's shards on: FSDP1's ``device_id``; a CPU mesh's CPU; else the rank's
    current GPU (what ``torch.cuda.current_device()`` answers the script)."""
    if device_id is not None:
        if isinstance(device_id, torch.device):
            return device_id if device_id.index is not None or device_id.type != "cuda" else \
                torch.device("cuda", torch.cuda.current_device())
        return torch.device("cuda", int(device_id))
    if mesh is not None and getattr(mesh, "device_type", "cuda") == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def sharding_placed(place: Callable[[nn.Module, Any], None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """FSDP2's ``fully_shard``: ``place(module, mesh)`` for the module (or each of a list), which is
    returned as ``fully_shard`` returns it; its sharding is not run (see the module's docstring)."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def fully_shard(module: Any, *args: Any, mesh: Any = None, **kwargs: Any) -> Any:
            for each in module if isinstance(module, list | tuple) else [module]:
                place(each, mesh)
            return module
        fully_shard.__name__ = getattr(original, "__name__", "fully_shard")
        fully_shard.__doc__ = getattr(original, "__doc__", None)
        fully_shard.__wrapped__ = original  # type: ignore[attr-defined]
        return fully_shard
    return make
