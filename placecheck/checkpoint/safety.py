"""Which globals a checkpoint's pickle asks for would run code when loaded.

A pickle can name any importable callable (``os.system``, ``builtins.exec``)
and call it while loading. ``torch.load(weights_only=True)`` refuses every
global outside torch's allowlist; ``weights_only=False`` runs them all.
placecheck learns the globals a file names while reading its metadata: its
inert unpickler's ``find_class`` sees every one (GLOBAL, STACK_GLOBAL at any
protocol, INST/OBJ/EXT) and imports none. This module compares them with the
allowlist, the same check as
``torch.serialization.get_unsafe_globals_in_checkpoint`` but for every pickle
placecheck reads (zip, legacy, any protocol, and every member of a ``.pt2``
archive that ``torch.export.load`` would unpickle).
"""

from __future__ import annotations


def normalize_module(module: str) -> str:
    """Python 2 module names in protocol-2 pickles, as ``pickle`` maps them (``__builtin__``)."""
    return {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)


def allowed_globals() -> frozenset[str]:
    """The globals ``torch.load(weights_only=True)`` accepts here: torch's and the user's."""
    from placecheck.engines.compat import weights_only_allowed_globals

    return weights_only_allowed_globals()


def unsafe_globals(names: list[str]) -> list[str]:
    """The names of ``names`` that ``weights_only=True`` would refuse (code it would have to run)."""
    allowed = allowed_globals()
    return [n for n in names if n not in allowed]
