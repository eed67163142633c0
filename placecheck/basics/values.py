"""The small values placecheck reads from the user and from torch, each parsed once at the edge.

Torch-free, so the CLI, the config and the report use them without importing torch:

- :class:`Size`: a number of bytes, with its one grammar (``--gpu-memory``, ``--cpu-memory``,
  ``PLACECHECK_RUN_MEMORY``, ``run(memory=...)``);
- :class:`Device`: a device as tensors name it (``cuda:0``, ``cpu``), with an index for every
  device that has one;
- :class:`Site`: a place in a file, ``path:line`` (a finding's ``source``, a move's line).

Each compares, hashes and prints; ``str()`` gives the form the reports and the JSON contract use,
and ``parse`` reads it back. :class:`Size` is a frozen dataclass; :class:`Device` (the normalised form
tensors report) and :class:`Site` are ``str`` subclasses, so the JSON contract and users' comparisons
with text read them unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from placecheck.basics.errors import UsageError

# ---- sizes ---------------------------------------------------------------------------------------

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?)(B?)$")
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}

SIZE_HELP = ("a size such as 80GiB, 24GB or 512M (the unit is required: K, M, G, T are powers of 1000, "
             "Ki, Mi, Gi, Ti powers of 1024, a trailing B is optional, B alone is bytes)")
"""The grammar of :meth:`Size.parse`, as the errors and ``--help`` state it."""


@dataclass(frozen=True, order=True)
class Size:
    """A number of bytes.

    The one grammar (:meth:`parse`): a number and a unit: ``K``/``M``/``G``/``T`` (``KB``..., the
    prefix in either case) are powers of 1000, ``Ki``/``Mi``/``Gi``/``Ti`` (``KiB``...) powers of 1024,
    as IEC 80000-13 and Kubernetes read them; ``B`` alone is bytes. The unit is required, a bare
    ``80`` is refused, so a forgotten unit never becomes a budget a billion times off; a lower-case
    ``b`` (``24Gb``, gigabits) is refused too.
    """

    bytes: int

    @staticmethod
    def parse(text: str, what: str = "size") -> Size:
        """``"80GiB"`` -> ``Size(85899345920)``; ``"24GB"``/``"24g"`` -> ``Size(24000000000)``; a
        UsageError naming ``what`` (the option or variable) for anything else."""
        m = _SIZE.match(text.strip()) if isinstance(text, str) else None
        if m is None or not (m.group(2) or m.group(4)) or (m.group(3) and not m.group(2)):
            raise UsageError(f"{what} {text!r}: expected {SIZE_HELP}")
        base = 1024 if m.group(3) else 1000
        size = int(float(m.group(1)) * base ** _POWERS[m.group(2).lower()])
        if size <= 0:
            raise UsageError(f"{what} {text!r}: expected a size above zero, e.g. 24GiB")
        return Size(size)

    def __str__(self) -> str:
        """``1536`` -> ``1.5 KiB``: binary units, one decimal (bytes alone below 1 KiB)."""
        size = float(self.bytes)
        for unit in ("B", "KiB", "MiB", "GiB"):
            if size < 1024:
                return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
            size /= 1024
        return f"{size:.1f} TiB"


# ---- devices -------------------------------------------------------------------------------------

_DEVICE = re.compile(r"^(cuda|cpu|mps|meta)(?::(\d+))?$")
_NO_INDEX = ("cpu", "meta", "disk")
"""Device types that never carry an index (``disk``: where a device map offloads weights)."""

DEVICE_HELP = "cuda, cuda:N, cpu, mps or meta"


class Device(str):
    """A device as a tensor reports it: ``cuda:0`` (never bare ``cuda``), ``mps:0``, ``cpu``, ``meta``.

    Made only by :meth:`parse` (what a user typed), :meth:`of` (what torch or a report wrote) or
    ``Device(type, index)``, so a value typed ``Device`` is always in that normal form: compared,
    hashed and sorted as its text, read by :attr:`type` and :attr:`ordinal` without parsing it again.

    It is a ``str``: the report's JSON and SARIF, ``Finding.device == "cuda:0"`` in a user's code and
    ``torch.device(d)`` read it as the text they always read (the public contract does not change),
    while every signature that takes a ``Device`` refuses a plain string that was never normalised
    (mypy). Its ``repr`` is the text's, so a message that quotes it (``.to('cuda:0')``) reads as before.
    """

    __slots__ = ()

    def __new__(cls, type: str, index: int | None = None) -> Device:
        if ":" in type or not type:
            raise ValueError(f"Device({type!r}): give the type alone (cuda) and the index apart, "
                             "or read a text with Device.of")
        if type in _NO_INDEX:
            index = None
        elif index is None:
            index = 0
        return super().__new__(cls, type if index is None else f"{type}:{index}")

    def __getnewargs__(self) -> tuple[str, int | None]:  # type: ignore[override]  # pickle
        return self.type, self.ordinal if ":" in self else None

    def __copy__(self) -> Device:
        return self  # immutable, as str is

    def __deepcopy__(self, memo: object) -> Device:
        return self

    @staticmethod
    def parse(text: str) -> Device:
        """``"cuda"`` -> ``cuda:0``; ``"CPU"`` -> ``cpu``; ``"cuda:1"`` -> ``cuda:1``; a UsageError for
        anything else."""
        m = _DEVICE.match(text.strip().lower()) if isinstance(text, str) else None
        if not m:
            raise UsageError(f"unknown device {text!r}: use {DEVICE_HELP}")
        kind, index = m.group(1), m.group(2)
        if kind in _NO_INDEX and index not in (None, "0"):
            raise UsageError(f"unknown device {text!r}: {kind} takes no index; use {DEVICE_HELP}")
        return Device(kind, None if index is None else int(index))

    @staticmethod
    def of(text: str) -> Device:
        """A device torch or a report wrote (``cuda:1``, ``cuda``, ``cpu``, a checkpoint's ``cuda:3``,
        ``str(tensor.device)``), read leniently: any type, the index if there is one (``cuda`` ->
        ``cuda:0``)."""
        if type(text) is Device:
            return text
        kind, _, index = str(text).strip().partition(":")
        return Device(kind, int(index) if index.isdigit() else None)

    @property
    def type(self) -> str:
        """``cuda``, ``cpu``, ``mps``, ``meta``... (``torch.device.type``)."""
        return str.__str__(self).partition(":")[0]

    @property
    def ordinal(self) -> int:
        """The index (``cuda:1`` -> 1), 0 for the types without one (``cpu``). (``str.index`` stays the
        string's method: torch's ``device.index`` is this ordinal or None.)"""
        _, sep, index = self.partition(":")
        return int(index) if sep else 0


def device_order(text: str) -> tuple[int, str, int]:
    """A sort key for devices as reports name them: ``cuda:0 < cuda:1 < cuda:10 < cpu < disk < meta``,
    indexed devices by index, then the rest by name."""
    kind, _, index = text.partition(":")
    return (0 if index.isdigit() else 1, kind, int(index) if index.isdigit() else 0)


# ---- sites ---------------------------------------------------------------------------------------

class Site(str):
    """A place in a file: ``path:line``, or a path alone when no line is known; ``""``: nowhere known.

    A ``str`` as :class:`Device` is (a finding's ``source`` in the JSON contract is this text), read by
    :attr:`path` and :attr:`line` without splitting it again. A Windows drive's colon is part of the
    path: only digits after the last colon, with a path before them, make a line.
    """

    __slots__ = ()

    def __new__(cls, path: str = "", line: int | None = None) -> Site:
        return super().__new__(cls, path if line is None else f"{path}:{line}")

    @staticmethod
    def parse(text: str) -> Site:
        """``"pkg/net.py:42"`` -> ``Site("pkg/net.py", 42)``; no line -> ``Site(text)``."""
        return text if type(text) is Site else Site(str(text))

    def __copy__(self) -> Site:
        return self  # immutable, as str is

    def __deepcopy__(self, memo: object) -> Site:
        return self

    def _split(self) -> tuple[str, int | None]:
        path, sep, line = str.__str__(self).rpartition(":")
        if sep and path and line.isdigit():
            return path, int(line)
        return str.__str__(self), None

    @property
    def path(self) -> str:
        """``pkg/net.py`` of ``pkg/net.py:42``; the whole text when it holds no line."""
        return self._split()[0]

    @property
    def line(self) -> int | None:
        """``42`` of ``pkg/net.py:42``; None when no line is known."""
        return self._split()[1]
