"""A synthetic model with about 10,000 modules, for the walk's scale benchmark.

Each block is four modules (the block, a LayerNorm, a Linear, a GELU); a
stray plain tensor attribute can be planted in every ``stray_every``-th block
so that a test can check the walk finds each one, at their exact paths.

    placecheck audit placecheck.examples.many_modules:many_modules
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

MODULES_PER_BLOCK = 4
WIDTH = 16


class Block(nn.Module):
    """norm -> linear -> gelu, plus a residual."""

    def __init__(self, stray: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.act = nn.GELU()
        if stray:
            self.scale = torch.ones(WIDTH)  # deliberately unregistered: .to() leaves it behind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.proj(self.norm(x)))
        if hasattr(self, "scale"):
            out = out * self.scale
        result: torch.Tensor = x + out
        return result


class ManyModules(nn.Module):
    """``blocks`` blocks in an ``nn.Sequential``: 2 + 4 * blocks modules in all."""

    def __init__(self, blocks: int, stray_every: int = 0) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(stray=bool(stray_every) and i % stray_every == 0)
                                      for i in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.blocks(x)
        return result


def blocks_for(modules: int) -> int:
    """The number of blocks that gives at least ``modules`` modules."""
    return max(1, math.ceil((modules - 2) / MODULES_PER_BLOCK))


def many_modules(modules: int = 10_000, stray_every: int = 0) -> ManyModules:
    """A clean model with at least ``modules`` modules (10,000 by default); input ``float32[B,16]``."""
    return ManyModules(blocks_for(modules), stray_every)
