"""``buggy.py``'s model written correctly: placecheck finds nothing here."""

from __future__ import annotations

import torch
import torch.nn as nn


class RopeCache(nn.Module):
    """Rotary tables as non-persistent buffers: ``.to()`` moves them."""

    def __init__(self, dim: int, length: int) -> None:
        super().__init__()
        freqs = torch.arange(length)[:, None] / (10000 ** (torch.arange(0, dim, 2) / dim))
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)


class Block(nn.Module):
    mask: torch.Tensor

    def __init__(self, dim: int, length: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(length, length)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-2]
        scores = (x @ x.transpose(-1, -2)) * self.mask[:n, :n]
        out: torch.Tensor = self.proj(scores.softmax(-1) @ x)
        return out


class CleanNet(nn.Module):
    def __init__(self, dim: int = 32, length: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.blocks = nn.ModuleList([Block(dim, length) for _ in range(2)])
        self.rope = RopeCache(dim, length)
        self.heads = nn.ModuleList([nn.Linear(dim, classes) for _ in range(2)])
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(classes)) for _ in range(2)])
        self.gate = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        x = x + 0.01 * torch.randn_like(x)
        for block in self.blocks:
            x = block(x)
        pooled = self.gate(x.mean(-2))
        out: torch.Tensor = sum(head(pooled) * s for head, s in zip(self.heads, self.scales, strict=True))
        return out
