"""Which globals a checkpoint's pickle asks for, and which would run code.

A pickle can name any importable callable (``os.system``, ``builtins.exec``)
and call it while loading. ``torch.load(weights_only=True)`` refuses every
global outside torch's allowlist; ``weights_only=False`` runs them all. This
module reads the pickle's opcodes with :mod:`pickletools` (nothing is
imported or called) and compares the globals it names with that allowlist,
the same check as ``torch.serialization.get_unsafe_globals_in_checkpoint``
but for every pickle placecheck reads (zip, legacy and any protocol).
"""

from __future__ import annotations

import pickletools
from typing import IO

# Opcodes that push a string a later STACK_GLOBAL may take as module or name.
_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE",
                         "SHORT_BINSTRING", "BINSTRING", "STRING"})
_MEMO_PUT_OPS = frozenset({"BINPUT", "LONG_BINPUT", "PUT"})
_MEMO_GET_OPS = frozenset({"BINGET", "LONG_BINGET", "GET"})
# Opcodes weights_only refuses outright, whatever they name: they build
# objects from classes in ways the restricted unpickler does not support.
_REFUSED_OPS = frozenset({"INST", "OBJ", "EXT1", "EXT2", "EXT4"})

DYNAMIC_GLOBAL = "<global computed at load time>"


def normalize_module(module: str) -> str:
    """Python 2 module names in protocol-2 pickles, as ``pickle`` maps them (``__builtin__``)."""
    return {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)


def globals_in_pickle(stream: IO[bytes]) -> list[str]:
    """Every ``module.name`` the pickle at ``stream``'s position names, in order, once each.

    Reads one pickle (up to its STOP opcode) and leaves ``stream`` after it.
    A STACK_GLOBAL whose operands are not plain strings is reported as
    :data:`DYNAMIC_GLOBAL`; INST/OBJ/EXT opcodes as ``<opcode NAME>``.
    """
    found: dict[str, None] = {}
    recent: list[str | None] = []  # values pushed lately, strings or None
    memo: dict[int, str | None] = {}
    memo_next = 0
    for op, arg, _pos in pickletools.genops(stream):
        name = op.name
        if name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            found.setdefault(f"{normalize_module(module)}.{attr}", None)
            recent.append(None)
        elif name == "STACK_GLOBAL":
            if len(recent) >= 2 and recent[-1] is not None and recent[-2] is not None:
                found.setdefault(f"{normalize_module(recent[-2])}.{recent[-1]}", None)
            else:
                found.setdefault(DYNAMIC_GLOBAL, None)
            recent.append(None)
        elif name in _REFUSED_OPS:
            found.setdefault(f"<opcode {name}>", None)
        elif name in _STRING_OPS:
            recent.append(arg.decode("latin-1") if isinstance(arg, bytes) else str(arg))
        elif name in _MEMO_PUT_OPS:
            memo[_int(arg)] = recent[-1] if recent else None
        elif name == "MEMOIZE":
            memo[memo_next] = recent[-1] if recent else None
            memo_next += 1
        elif name in _MEMO_GET_OPS:
            recent.append(memo.get(_int(arg)))
        else:
            recent.append(None)
        if name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo_next = max(memo_next, _int(arg) + 1)
        del recent[:-2]
    return list(found)


def _int(arg: object) -> int:
    return int(arg) if isinstance(arg, (int, str)) else 0


def allowed_globals() -> frozenset[str]:
    """The globals ``torch.load(weights_only=True)`` accepts here: torch's and the user's."""
    from torch import _weights_only_unpickler as wou

    allowed = set(wou._get_allowed_globals())
    user = getattr(wou, "_get_user_allowed_globals", None)
    if user is not None:
        allowed |= set(user())
    return frozenset(allowed)


def unsafe_globals(names: list[str]) -> list[str]:
    """The names of ``names`` that ``weights_only=True`` would refuse (code it would have to run)."""
    allowed = allowed_globals()
    return [n for n in names if n not in allowed]
