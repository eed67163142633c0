"""Parsing and normalising ``--device`` without importing torch."""

from __future__ import annotations

import re

from placecheck.errors import UsageError

_DEVICE = re.compile(r"^(cuda|cpu|mps|meta)(?::(\d+))?$")

DEVICE_HELP = "cuda, cuda:N, cpu, mps or meta"

KEEP = "keep"
"""``--device keep``: no ``.to()``; the model is audited as its own code places it (many GPUs included)."""
AUDIT_DEVICE_HELP = "cuda, cuda:N, cpu, mps, meta or keep"
"""The devices an audit takes (``keep``: its own placement); checkpoint and fix take :data:`DEVICE_HELP`."""


def normalize_device(spec: str, keep: bool = False) -> str:
    """``"cuda"`` -> ``"cuda:0"``; ``"CPU"`` -> ``"cpu"``; raise ``UsageError`` on junk.

    CUDA and MPS devices get an explicit index because that is how tensors
    report them (``tensor.device`` is ``cuda:0``, never ``cuda``). ``keep``:
    also accept ``"keep"`` (an audit's ``--device keep``), returned as it is.
    """
    if keep and spec.strip().lower() == KEEP:
        return KEEP
    m = _DEVICE.match(spec.strip().lower())
    if not m:
        raise UsageError(f"unknown device {spec!r}: use {AUDIT_DEVICE_HELP if keep else DEVICE_HELP}")
    kind, index = m.group(1), m.group(2)
    if kind in ("cpu", "meta"):
        if index not in (None, "0"):
            raise UsageError(f"unknown device {spec!r}: {kind} takes no index; use {DEVICE_HELP}")
        return kind
    return f"{kind}:{int(index or 0)}"


def device_index(device: str) -> int:
    """The index of a normalised device (0 for cpu/meta/keep)."""
    _, _, idx = device.partition(":")
    return int(idx) if idx else 0
