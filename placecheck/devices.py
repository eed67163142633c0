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


# ---- --device-map and memory sizes -----------------------------------------------------------------

DEVICE_MAP_CHOICES = ("auto", "balanced", "balanced_low_0", "sequential")
"""The maps ``--device-map`` computes, as ``from_pretrained(device_map=...)`` names them; anything
else is a JSON file holding the map."""

DEVICE_MAP_HELP = f"{'|'.join(DEVICE_MAP_CHOICES)} or FILE.json"

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``; binary units, one decimal."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([A-Za-z]+)$")
SIZE_HELP = "a size such as 80GiB, 24GB or 512MiB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"


def parse_size(text: str, option: str = "--gpu-memory") -> int:
    """``"80GiB"`` -> ``85899345920``; ``"24GB"`` -> ``24000000000``; a UsageError for anything else.

    Strict on purpose: the unit is required and spelled as above (``GB`` is 10**9 bytes, ``GiB``
    2**30), so a typo never becomes a budget a thousand times off.
    """
    m = _SIZE.match(text.strip()) if isinstance(text, str) else None
    unit = _UNITS.get(m.group(2)) if m else None
    if m is None or unit is None:
        raise UsageError(f"{option} {text!r}: expected {SIZE_HELP}")
    size = int(float(m.group(1)) * unit)
    if size <= 0:
        raise UsageError(f"{option} {text!r}: expected a size above zero, e.g. 24GiB")
    return size


def check_device_map_spec(spec: str) -> None:
    """A UsageError unless ``spec`` is one of :data:`DEVICE_MAP_CHOICES` or names a ``.json`` file."""
    if spec in DEVICE_MAP_CHOICES or spec.lower().endswith(".json"):
        return
    raise UsageError(f"--device-map {spec!r}: use {', '.join(DEVICE_MAP_CHOICES)} or a FILE.json "
                     "mapping module names to devices")
