"""Where a plain (CPU) tensor a script uses came from: a DataLoader batch, or a factory at a line.

The recorder tags tensors as they appear (a batch's elements when the loader yields them, a
factory's result in the user's code) and passes the tag on to views and casts of them, so that a
mismatch names its cause ("`labels` (batch[1], from the DataLoader at train.py:40)"). Tensors are
held by weak reference, by ``id``: a tensor that no longer exists is forgotten, so a reused id never
inherits an origin.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

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


@dataclass
class _Tracked:
    ref: weakref.ref[torch.Tensor]
    origin: Origin


class Origins:
    """The origin of each tagged tensor still alive."""

    def __init__(self) -> None:
        self._tracked: dict[int, _Tracked] = {}

    def __bool__(self) -> bool:
        return bool(self._tracked)

    def track(self, t: torch.Tensor, origin: Origin) -> None:
        self._tracked[id(t)] = _Tracked(weakref.ref(t), origin)
        if len(self._tracked) > MAX_TRACKED:
            self.prune()

    def of(self, t: torch.Tensor) -> Origin | None:
        tracked = self._tracked.get(id(t))
        if tracked is None or tracked.ref() is not t:
            return None
        return tracked.origin

    def prune(self) -> None:
        """Forget tensors that no longer exist (their ids may be reused)."""
        self._tracked = {k: v for k, v in self._tracked.items() if v.ref() is not None}
