"""Models placed by a device map: what accelerate's hooks repair, and what they do not.

accelerate's ``dispatch_model`` moves each module's registered parameters and
buffers to the device its map entry names, and its hooks move every module's
inputs there before its forward. Two things stay where the code put them: a
plain tensor attribute (not registered, so no hook or ``.to()`` sees it), and a
tensor the forward creates on a hard-coded device::

    placecheck audit placecheck/examples/mapped.py:BuggyMapped --device-map configs/device_map.json
    placecheck audit placecheck/examples/mapped.py:FixedMapped --device-map configs/device_map_offload.json

``configs/device_map.json`` puts ``embed`` and ``head`` on ``cuda:0`` and the
two blocks on ``cuda:1``; ``configs/device_map_offload.json`` offloads
``decoder`` to the CPU and ``head`` to disk.
"""

from __future__ import annotations

import torch
import torch.nn as nn

VOCAB = 1000
WIDTH = 64


class ScaledBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.scale = torch.ones(WIDTH)  # BUG: a plain attribute; the map's hooks never move it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(x) * self.scale
        return out


class BiasedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = torch.zeros(WIDTH, device="cuda:0")  # BUG: cuda:0 whatever GPU this block is mapped to
        out: torch.Tensor = self.proj(x) + bias
        return out


class BuggyMapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.encoder = ScaledBlock()
        self.decoder = BiasedBlock()
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.decoder(self.encoder(self.embed(ids))))
        return out


class FixedScaledBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("scale", torch.ones(WIDTH), persistent=False)  # placed with its module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(x) * self.scale
        return out


class FixedBiasedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(x) + torch.zeros(WIDTH, device=x.device)  # on the input's device
        return out


class FixedMapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.encoder = FixedScaledBlock()
        self.decoder = FixedBiasedBlock()
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.decoder(self.encoder(self.embed(ids))))
        return out
