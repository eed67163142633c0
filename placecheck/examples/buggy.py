"""A small transformer-ish model with every placement bug ``.to()`` cannot fix.

``placecheck audit placecheck/examples/buggy.py:BuggyNet`` reports each one;
``clean.py`` beside this file is the same model written correctly.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class RopeCache:
    """A plain helper object holding tensors: invisible to ``.to()``."""

    def __init__(self, dim: int, length: int) -> None:
        freqs = torch.arange(length)[:, None] / (10000 ** (torch.arange(0, dim, 2) / dim))
        self.cos = freqs.cos()
        self.sin = freqs.sin()


class Block(nn.Module):
    def __init__(self, dim: int, length: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        # BUG PC101: a plain tensor attribute, not a buffer.
        self.mask = torch.tril(torch.ones(length, length))
        # BUG PC101: tensors in a plain dict.
        self.cache = {"k": torch.zeros(length, dim), "v": torch.zeros(length, dim)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-2]
        scores = (x @ x.transpose(-1, -2)) * self.mask[:n, :n]
        out: torch.Tensor = self.proj(scores.softmax(-1) @ x)
        return out


class BuggyNet(nn.Module):
    def __init__(self, dim: int = 32, length: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.blocks = nn.ModuleList([Block(dim, length) for _ in range(2)])
        # BUG PC101: a helper object with tensor fields.
        self.rope = RopeCache(dim, length)
        # BUG PC102: modules in a plain list (not nn.ModuleList).
        self.heads = [nn.Linear(dim, classes) for _ in range(2)]
        # BUG PC103: parameters in a plain list (not nn.ParameterList).
        self.scales = [nn.Parameter(torch.ones(classes)) for _ in range(2)]
        self.gate: nn.Linear | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        # BUG PC202: created on the default device (the CPU), not on x's device.
        x = x + 0.01 * torch.randn(x.shape)
        for block in self.blocks:
            x = block(x)
        pooled = x.mean(-2)
        if self.gate is None:
            # BUG PC203: a layer built in forward lands on the CPU; .to() never saw it.
            self.gate = nn.Linear(pooled.shape[-1], pooled.shape[-1])
        pooled = self.gate(pooled)
        out: torch.Tensor = sum(head(pooled) * s for head, s in zip(self.heads, self.scales, strict=True))
        return out
