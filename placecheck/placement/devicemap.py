"""The report's device map of a model placed across devices: per stage its devices and bytes, and the
copies between devices of one forward."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn

from placecheck.basics.values import device_order
from placecheck.checks.expected import Placement
from placecheck.findings.events import Copy
from placecheck.findings.report import DeviceMap, StageRow, Transfer


def transfers(copies: Iterable[Copy]) -> tuple[Transfer, ...]:
    """The copies of one forward as report rows; identical ones (devices, bytes, line, boundary) are one
    row with their count."""
    rows: dict[tuple[str, str, int, str, str, str], int] = {}
    for c in copies:
        key = (c.src, c.dst, c.nbytes, c.site.source, c.from_stage, c.to_stage)
        rows[key] = rows.get(key, 0) + 1
    return tuple(Transfer(src, dst, nbytes, source, from_stage, to_stage, count)
                 for (src, dst, nbytes, source, from_stage, to_stage), count in rows.items())


def device_map(model: nn.Module, placement: Placement, copies: Iterable[Copy] = ()) -> DeviceMap:
    """Per stage (each child of the root, or for a child spanning several devices its outermost
    descendants on one: :meth:`~placecheck.checks.expected.Placement.stage_of`; and the root's own
    state), its devices and the bytes of its parameters and buffers; with the copies between devices of
    one forward."""
    seen: set[int] = set()
    stages: dict[str, dict[str, int]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False),
                    *model.named_buffers(remove_duplicate=False)]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        owner = name.rpartition(".")[0]
        stage = placement.stage_of(owner)
        per_device = stages.setdefault(stage, {})
        device = str(t.device)
        per_device[device] = per_device.get(device, 0) + _nbytes(t)
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    rows = []
    for stage in sorted(stages, key=lambda s: order.get(s, -1)):
        per_device = dict(sorted(stages[stage].items(), key=lambda kv: device_order(kv[0])))
        rows.append(StageRow(stage, tuple(per_device), sum(per_device.values()),
                             tuple(per_device.items()) if len(per_device) > 1 else ()))
    return DeviceMap(tuple(rows), transfers(copies))


def _nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.nelement() * t.element_size())
    except (RuntimeError, ValueError):
        return 0
