"""Where a plain (CPU) tensor a script uses came from: a DataLoader batch, or a factory at a line.

The recorder tags tensors as they appear (a batch's elements when the loader yields them, a
factory's result in the user's code) and passes the tag on to views and casts of them, so that a
mismatch names its cause ("`labels` (batch[1], from the DataLoader at train.py:40)"). Tensors are
held by weak reference, by ``id``: a tensor that no longer exists is forgotten, so a reused id never
inherits an origin.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType, FrameType

import torch
import torch.nn as nn

from placecheck.checks.walk import storage_key

MAX_TRACKED = 50_000
"""Tags kept before the dead ones are dropped (a long stretch without optimizer steps)."""


@dataclass
class Origin:
    """Where a plain (CPU) tensor the script uses came from."""

    kind: str
    """``batch`` (an element of a DataLoader batch) or ``created`` (a factory call in the user's code)."""
    path: str
    """``batch[1]`` for a batch element, the factory's name for a creation."""
    line: str
    """The loop line that produced the batch, or the line that created the tensor."""
    pinned: bool = False
    """The batch came from a DataLoader with ``pin_memory=True``."""
    module: str = ""
    """For a creation: the class of the module whose forward made it ("" outside any forward)."""
    init: bool = False
    """For a creation: made while a module's ``__init__`` ran (its state: the walk after a move reports
    what ``.to()`` leaves behind, PC101, at the attribute's line)."""
    scope: CodeType | None = None
    """For a creation: the code of the user's function (or module) that made it."""
    elsewhere: bool = False
    """For a creation outside any forward: the tensor was computed from the created one in another function
    than the one that made it (a corpus tokenized into one tensor by a data class, sliced into batches by
    the script)."""


def in_module_init(frame: FrameType | None) -> bool:
    """``frame`` runs an ``nn.Module``'s ``__init__`` (``self`` is a module)."""
    return frame is not None and frame.f_code.co_name == "__init__" \
        and isinstance(frame.f_locals.get("self"), nn.Module)


@dataclass
class _Tracked:
    ref: weakref.ref[torch.Tensor]
    origin: Origin


class Origins:
    """The origin of each tagged tensor still alive."""

    def __init__(self) -> None:
        self._tracked: dict[int, _Tracked] = {}
        self._created: dict[int, tuple[weakref.ref[torch.UntypedStorage], str, tuple[int, ...], Origin]] = {}
        """A created tensor's storage (its data pointer) -> the storage, its dtype, shape and origin: a tensor
        made on the same data by no torch function call (``nn.Parameter(torch.full(...))``, which outlives
        the factory's own tensor; ``Variable(t)``) came from the same line. The storage is held weakly
        and compared, so memory freed and reused by another tensor is not taken for it."""

    def __bool__(self) -> bool:
        return bool(self._tracked)

    def track(self, t: torch.Tensor, origin: Origin) -> None:
        self._tracked[id(t)] = _Tracked(weakref.ref(t), origin)
        if origin.kind == "created":
            key = storage_key(t)
            if key is not None:
                with contextlib.suppress(TypeError):  # (a storage that takes no weak reference: not kept)
                    storage = weakref.ref(t.untyped_storage())
                    self._created[key] = (storage, str(t.dtype), tuple(t.shape), origin)  # the newest there
        if len(self._tracked) > MAX_TRACKED:
            self.prune()

    def derive(self, out: torch.Tensor, origin: Origin, scope: Callable[[], CodeType | None]) -> None:
        """``out`` was computed from a tensor whose origin is ``origin``, in the user's function
        ``scope()`` (asked only of a creation not yet seen elsewhere): ``out`` has that origin too."""
        if origin.kind == "created" and not origin.module and not origin.elsewhere \
                and origin.scope is not None and scope() is not origin.scope:
            origin = dataclasses.replace(origin, elsewhere=True)
        self.track(out, origin)

    def of(self, t: torch.Tensor) -> Origin | None:
        tracked = self._tracked.get(id(t))
        if tracked is not None and tracked.ref() is t:
            return tracked.origin
        if self._created:
            # nn.Parameter(data), Variable(data): a new tensor object on data's storage, made by no torch
            # function call
            key = storage_key(t)
            made = self._created.get(key) if key is not None else None
            if made is not None and made[1:3] == (str(t.dtype), tuple(t.shape)) \
                    and made[0]() is t.untyped_storage():
                return made[3]
        return None

    def prune(self) -> None:
        """Forget tensors that no longer exist (their ids may be reused)."""
        self._tracked = {k: v for k, v in self._tracked.items() if v.ref() is not None}
        self._created = {k: v for k, v in self._created.items() if v[0]() is not None}
