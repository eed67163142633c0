"""Parsing and normalising ``--device`` without importing torch."""

from __future__ import annotations

from placecheck.basics.errors import UsageError
from placecheck.basics.values import DEVICE_HELP, SIZE_HELP, Device, Size

__all__ = ["AUDIT_DEVICE_HELP", "DEVICE_HELP", "DEVICE_MAP_CHOICES", "DEVICE_MAP_HELP", "KEEP",
           "SIZE_HELP", "check_device_map_spec", "human_bytes", "parse_size",
           "parse_target"]

KEEP = "keep"
"""``--device keep``: no ``.to()``; the model is audited as its own code places it (many GPUs included)."""
AUDIT_DEVICE_HELP = "cuda, cuda:N, cpu, mps, meta or keep"
"""The devices an audit takes (``keep``: its own placement); checkpoint and fix take :data:`DEVICE_HELP`."""


def parse_target(spec: str) -> Device | None:
    """An audit's ``--device``: :meth:`Device.parse <placecheck.basics.values.Device.parse>`, or None
    for ``keep`` (no ``.to()``: the model is audited as its own code places it)."""
    if spec.strip().lower() == KEEP:
        return None
    try:
        return Device.parse(spec)
    except UsageError:
        raise UsageError(f"unknown device {spec!r}: use {AUDIT_DEVICE_HELP}") from None


# ---- --device-map and memory sizes -----------------------------------------------------------------

DEVICE_MAP_CHOICES = ("auto", "balanced", "balanced_low_0", "sequential")
"""The maps ``--device-map`` computes, as ``from_pretrained(device_map=...)`` names them; anything
else is a JSON file holding the map."""

DEVICE_MAP_HELP = f"{'|'.join(DEVICE_MAP_CHOICES)} or FILE.json"


def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``: :class:`~placecheck.basics.values.Size`'s form."""
    return str(Size(n))


def parse_size(text: str, option: str = "--gpu-memory") -> int:
    """``"80GiB"`` -> ``85899345920`` bytes: :meth:`Size.parse <placecheck.basics.values.Size.parse>`'s
    grammar."""
    return Size.parse(text, option).bytes


def check_device_map_spec(spec: str) -> None:
    """A UsageError unless ``spec`` is one of :data:`DEVICE_MAP_CHOICES` or names a ``.json`` file."""
    if spec in DEVICE_MAP_CHOICES or spec.lower().endswith(".json"):
        return
    raise UsageError(f"--device-map {spec!r}: use {', '.join(DEVICE_MAP_CHOICES)} or a FILE.json "
                     "mapping module names to devices")
