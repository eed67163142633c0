"""The one way placecheck replaces an attribute of torch's or a framework's code: :func:`patch`.

PyTorch's own instruments observe through modes and hooks, and so does placecheck wherever torch
offers one. What no mode or hook shows (a ``torch.cuda`` query without a driver, a module's move,
an optimizer built, a DataLoader's batch, a collective of a fake process group) is patched, always
through this module:

- :func:`patch` replaces ``owner.name`` for a ``with`` block and puts back exactly what was there (an
  attribute the owner only inherited is removed again, one it lacked is deleted), in reverse order,
  however the block ends;
- each patch says why (``why=``): no mode or hook can see what it sees. The reasons are listed by
  :func:`installed` while the patches are in force (``placecheck ... --debug`` and the tests read
  them), so "what has placecheck changed in torch right now" has one answer;
- :func:`patched` installs a list of ``(owner, name, make)`` as one block, ``make(original)`` giving
  each replacement (the wrappers of :mod:`placecheck.run.patches`);
- :func:`patched_once_imported` does the same for code of a module the program may never import (FSDP
  costs half a second to import): at once when it is imported already, else right after the program
  imports it, and undone with the block either way.

Torch-free: the owners are passed in. Not reentrant for the same ``owner.name`` from two threads;
nested patches of the same attribute are undone innermost first, as a stack.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class Installed:
    """One patch in force: what was replaced and why."""

    owner: str
    """The patched object's name (``torch.cuda``, ``Module``)."""
    name: str
    why: str


_IN_FORCE: list[Installed] = []


def _owner_name(owner: object) -> str:
    name = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None)
    return str(name or type(owner).__name__)


@contextlib.contextmanager
def patch(owner: object, name: str, value: Any, why: str, create: bool = False) -> Iterator[None]:
    """``owner.name`` is ``value`` for the block, then exactly what it was before.

    ``create``: the attribute may be missing (it is deleted again afterwards); otherwise a missing
    attribute is placecheck's own error (``AttributeError``), as a renamed torch attribute should be.
    """
    if not create and not hasattr(owner, name):
        raise AttributeError(f"placecheck would patch {_owner_name(owner)}.{name}, which does not exist")
    own = vars(owner).get(name, _MISSING) if hasattr(owner, "__dict__") else getattr(owner, name, _MISSING)
    record = Installed(_owner_name(owner), name, why)
    setattr(owner, name, value)
    _IN_FORCE.append(record)
    try:
        yield
    finally:
        _IN_FORCE.remove(record)
        if own is _MISSING:
            with contextlib.suppress(AttributeError):
                delattr(owner, name)
        else:
            setattr(owner, name, own)


Patch = tuple[object, str, Callable[[Callable[..., Any]], Callable[..., Any]]]
"""``(owner, attribute name, make)``: the attribute becomes ``make(original)``."""


@contextlib.contextmanager
def patched(patches: Sequence[Patch], why: str) -> Iterator[None]:
    """Each ``owner.name`` replaced by ``make(original)`` for the block (:func:`patch` each, undone in
    reverse order, even when the block raises)."""
    with contextlib.ExitStack() as stack:
        for owner, name, make in patches:
            stack.enter_context(patch(owner, name, make(getattr(owner, name)), why))
        yield


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``module`` with the finders after it and calls ``then()`` once its code has run."""

    def __init__(self, module: str, then: Callable[[], None]) -> None:
        self.module = module
        self.then = then
        self._searching = False

    def find_spec(self, fullname: str, path: Any,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        # two rooms waiting for the same module (the scratch area's and the fake engine's safetensors
        # patches) each ask the finders after them, the other among them: the one already searching
        # answers None, the other finds the module, and each wraps the loader with its `then`
        if fullname != self.module or self._searching:
            return None
        self._searching = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
                if spec is not None:
                    if isinstance(spec.loader, importlib.abc.Loader) and hasattr(spec.loader, "exec_module"):
                        spec.loader = _ThenLoader(spec.loader, self.then)
                    return spec
            return None
        finally:
            self._searching = False


class _ThenLoader(importlib.abc.Loader):
    """``loader``, and ``then()`` after the module's code ran."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[], None]) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.then()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package...
        return getattr(self.loader, name)


@contextlib.contextmanager
def patched_once_imported(module: str, patches: Callable[[], Sequence[Patch]], why: str) -> Iterator[None]:
    """:func:`patched` for ``patches()`` (read when ``module`` is imported: they name its code), from now
    when ``module`` is imported already, else from the moment the block imports it; undone with the
    block. Nothing is imported for it: a program that never imports ``module`` never pays for it."""
    with contextlib.ExitStack() as stack:
        def install() -> None:
            stack.enter_context(patched(patches(), why))

        if module in sys.modules:
            install()
            yield
            return
        finder = _AfterImport(module, install)
        sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(finder)


def installed() -> list[Installed]:
    """The patches in force now, oldest first."""
    return list(_IN_FORCE)
