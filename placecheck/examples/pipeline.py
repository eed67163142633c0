"""A model split across two GPUs by its own code (model parallelism), buggy and fixed.

``placecheck audit placecheck/examples/pipeline.py:BuggyPipeline --device keep``
builds it on two simulated GPUs as written, without moving it, and finds what
the GPUs would raise: the activation of stage ``s1`` (``cuda:0``) reaches
stage ``s2`` (``cuda:1``) unmoved, and ``s2`` keeps a mask on ``cuda:0``.
``FixedPipeline`` is the same model written correctly: clean, with its one
copy between the stages listed in the device map.

``--device cuda`` would move the whole model to one GPU first and find nothing.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class Stage(nn.Module):
    """Two linear layers and a mask that zeroes every fourth feature."""

    def __init__(self, dim: int, mask_on: str | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, dim)
        mask = (torch.arange(dim) % 4 != 0).float()
        if mask_on is None:
            self.register_buffer("mask", mask, persistent=False)  # moves with its stage
        else:
            self.mask = mask.to(mask_on)  # BUG PC101 when mask_on is not the stage's device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        out: torch.Tensor = self.fc2(h * self.mask)
        return out


class BuggyPipeline(nn.Module):
    """Stage ``s1`` on cuda:0, stage ``s2`` on cuda:1."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.s1 = Stage(dim).to("cuda:0")
        self.s2 = Stage(dim, mask_on="cuda:0").to("cuda:1")  # its mask stays on cuda:0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.s1(x)
        out: torch.Tensor = self.s2(h)  # BUG PC201: h is still on cuda:0
        return out


class FixedPipeline(nn.Module):
    """The same split, each stage's tensors on its own device, the activation moved between them."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.s1 = Stage(dim).to("cuda:0")
        self.s2 = Stage(dim).to("cuda:1")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.s1(x)
        out: torch.Tensor = self.s2(h.to("cuda:1"))
        return out
