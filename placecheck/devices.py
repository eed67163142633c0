"""Parsing and normalising ``--device`` without importing torch."""

from __future__ import annotations

import re

from placecheck.errors import UsageError

_DEVICE = re.compile(r"^(cuda|cpu|mps|meta)(?::(\d+))?$")

DEVICE_HELP = "cuda, cuda:N, cpu, mps or meta"


def normalize_device(spec: str) -> str:
    """``"cuda"`` -> ``"cuda:0"``; ``"CPU"`` -> ``"cpu"``; raise ``UsageError`` on junk.

    CUDA and MPS devices get an explicit index because that is how tensors
    report them (``tensor.device`` is ``cuda:0``, never ``cuda``).
    """
    m = _DEVICE.match(spec.strip().lower())
    if not m:
        raise UsageError(f"unknown device {spec!r}: use {DEVICE_HELP}")
    kind, index = m.group(1), m.group(2)
    if kind in ("cpu", "meta"):
        if index not in (None, "0"):
            raise UsageError(f"unknown device {spec!r}: {kind} takes no index; use {DEVICE_HELP}")
        return kind
    return f"{kind}:{int(index or 0)}"


def device_index(device: str) -> int:
    """The index of a normalised device (0 for cpu/meta)."""
    _, _, idx = device.partition(":")
    return int(idx) if idx else 0
