"""A model trained with DataParallel or DistributedDataParallel, written wrongly and rightly.

``placecheck audit placecheck/examples/replicas.py:BuggyReplicated --wrap ddp`` audits it as each rank
sees it (rank k on ``cuda:k``): right on the first GPU, it crashes on the others.
``FixedReplicated`` is the same model written correctly: clean on every rank.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class BuggyReplicated(nn.Module):
    def __init__(self, dim: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.encoder = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)
        # BUG: created on the first GPU and kept as a plain attribute: .to(rank) leaves it on cuda:0.
        self.class_weights = torch.ones(classes, device="cuda:0")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BUG: a hard-coded device: right on cuda:0 only.
        noise = torch.randn(x.shape, device="cuda:0")
        h = torch.relu(self.encoder(x + noise))
        out: torch.Tensor = self.head(h) * self.class_weights
        return out


class FixedReplicated(nn.Module):
    def __init__(self, dim: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.encoder = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)
        # a buffer follows .to() onto each rank's GPU
        self.register_buffer("class_weights", torch.ones(classes), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn_like(x)  # on the input's device, whichever GPU that is
        h = torch.relu(self.encoder(x + noise))
        out: torch.Tensor = self.head(h) * self.class_weights
        return out
