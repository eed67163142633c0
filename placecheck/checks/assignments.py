"""Where the user's code assigned each attribute of a model's modules: the ``source`` of a walk finding.

A walk finding names a path (``blocks.3.mask``); the user fixes a line
(``self.mask = torch.tril(...)`` in ``Block.__init__``). That line is
recorded while the model is built: :func:`build_recorded` runs the model's
factory with ``nn.Module.__setattr__`` and the ``register_*`` methods
wrapped, and records, per module object and attribute name, the innermost
frame of the user's code that made the assignment (outside torch, placecheck
and installed packages; with none, the innermost outside torch and
placecheck, as for forward findings, see :mod:`placecheck.engines.sources`). A
container is recorded where it was assigned (``self.heads = [...]``), so a
tensor appended to it later points at that line too.

A model built before the audit (an ``nn.Module`` handed to the Python API)
has no records: :meth:`Assignments.source` then reads the class's source
(``self.<attr> = ...`` in ``__init__``, or in another method; a class-level
``attr = ...`` for a class attribute).

Every instance of a class built by the same line of code gets the same
``source`` (``blocks.0.mask`` ... ``blocks.23.mask``: ``model.py:14``), which
is what grouping findings into problems keys on.

Not reentrant: one recording at a time per process (the wrapped methods are global).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import sys
import textwrap
import weakref
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any, TypeVar

import torch.nn as nn

from placecheck.basics.patching import patch
from placecheck.engines.sources import (
    display_path,
    frames,
    internal_file,
    library_of_file,
)

BuiltT = TypeVar("BuiltT")

# The methods through which a module's attribute is assigned; each takes the name first (after self).
_ASSIGNING = ("__setattr__", "register_buffer", "register_parameter", "register_module", "add_module")


class Assignments:
    """``file:line`` of each recorded assignment, by module object and attribute name.

    Keyed by ``id(module)`` with a weak reference beside it: a record never
    keeps a module alive, and a record of a dead module is never read for a
    new one that reuses its id.
    """

    def __init__(self) -> None:
        self._by_module: dict[int, tuple[weakref.ref[nn.Module], dict[str, str]]] = {}

    def record(self, module: nn.Module, name: str, source: str) -> None:
        """The attribute ``name`` of ``module`` was (last) assigned at ``source``."""
        entry = self._by_module.get(id(module))
        if entry is None or entry[0]() is not module:
            entry = (weakref.ref(module), {})
            self._by_module[id(module)] = entry
        entry[1][name] = source

    def recorded(self, module: nn.Module, name: str) -> str:
        """The recorded ``file:line`` of ``module.<name>``'s assignment, or ""."""
        entry = self._by_module.get(id(module))
        if entry is None or entry[0]() is not module:
            return ""
        return entry[1].get(name, "")

    def source(self, module: nn.Module, name: str) -> str:
        """Where ``module.<name>`` was assigned: as recorded, else as the class's source says, else ""."""
        return self.recorded(module, name) or static_source(type(module), name)

    def __len__(self) -> int:
        return sum(len(names) for _, names in self._by_module.values())


def build_recorded(build: Callable[[], BuiltT]) -> tuple[BuiltT, Assignments]:
    """``build()``, and where the user's code assigned each module attribute while it ran.

    The search for the user's line of an assignment looks outwards from the
    assignment no further than this call: frames beyond it are the audit's
    caller, not the model's construction.
    """
    assignments = Assignments()
    with contextlib.ExitStack() as stack:
        for name in _ASSIGNING:
            stack.enter_context(patch(nn.Module, name, _recording(getattr(nn.Module, name), assignments),
                                      "an attribute assigned to a module is no torch call: its line is "
                                      "the source a walk finding names"))
        return build(), assignments


def _recording(method: Callable[..., Any], assignments: Assignments) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        name = args[0] if args else kwargs.get("name")
        if isinstance(name, str) and not isinstance(_assigned(args, kwargs), _PLAIN):
            source = _assigning_line(sys._getframe(1))
            if source:
                assignments.record(self, name, source)
        return result

    return wrapper


_STOP: CodeType = build_recorded.__code__
_PLAIN = (int, float, str, bool, bytes, type(None))
"""Values no finding can be about (no tensor, no module): their assignments are not recorded."""


def _assigned(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The value an assigning method was given (``__setattr__``'s ``value``, ``register_buffer``'s
    ``tensor``...); ``...`` when it cannot tell."""
    if len(args) > 1:
        return args[1]
    return next((kwargs[k] for k in ("value", "tensor", "param", "module") if k in kwargs), ...)


def _assigning_line(frame: FrameType | None) -> str:
    """``file:line`` of the innermost user frame from ``frame`` out to :func:`build_recorded` ("" if none)."""
    found = frames(frame, _STOP)
    shown = found.user or found.first_outside
    return _line(shown) if shown is not None else ""


def _line(frame: FrameType) -> str:
    return f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}"


# -- the class's source, for models built before the audit -------------------------------------

def static_source(cls: type, name: str) -> str:
    """Where the class ``cls`` (or a user class it derives from) assigns the attribute ``name``.

    ``self.<name> = ...`` (or ``self.register_buffer("<name>", ...)`` and the
    like) in ``__init__`` first, then in the other methods; a class-level
    ``<name> = ...``; "" when none of the user's classes says (torch's own
    classes and installed packages are not read).
    """
    for klass in cls.__mro__:
        found = _class_assignments(klass).get(name)
        if found:
            return found
    return ""


@functools.cache
def _class_assignments(cls: type) -> dict[str, str]:
    """``name -> file:line`` of the attribute assignments in the source of ``cls`` (cached per class).

    Per name: the last assignment in ``__init__`` (the value the instance
    keeps), else the first in another method, else the class body's.
    """
    try:
        filename = inspect.getsourcefile(cls) or ""
    except TypeError:  # a builtin class
        return {}
    if not filename or internal_file(filename) or library_of_file(filename):
        return {}
    try:
        lines, start = inspect.getsourcelines(cls)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return {}
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.ClassDef):
        return {}
    in_init: dict[str, int] = {}
    elsewhere: dict[str, int] = {}
    methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for method in methods:
        selves = method.args.posonlyargs + method.args.args
        if not selves:
            continue
        for name, lineno in sorted(_assigned_to(method, selves[0].arg), key=lambda found: found[1]):
            if method.name == "__init__":
                in_init[name] = lineno
            else:
                elsewhere.setdefault(name, lineno)
    in_body = {target.id: statement.lineno for statement in node.body for target in _targets(statement)
               if isinstance(target, ast.Name)}
    chosen = in_body | elsewhere | in_init
    shown = display_path(filename)
    return {name: f"{shown}:{start + lineno - 1}" for name, lineno in chosen.items()}


def _assigned_to(method: ast.AST, self_name: str) -> Iterator[tuple[str, int]]:
    """``(name, line)`` for ``self.<name> = ...``, ``self.register_buffer("<name>", ...)`` (and the
    other ``register_*``/``add_module``) and ``setattr(self, "<name>", ...)`` in ``method``."""
    for node in ast.walk(method):
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for target in _targets(node):
                for leaf in _unpacked(target):
                    if isinstance(leaf, ast.Attribute) and _is_name(leaf.value, self_name):
                        yield leaf.attr, node.lineno
        if not isinstance(node, ast.Call):
            continue
        func, args = node.func, node.args
        if (isinstance(func, ast.Attribute) and func.attr in _ASSIGNING and _is_name(func.value, self_name)
                and args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str)):
            yield args[0].value, node.lineno
        elif (_is_name(func, "setattr") and len(args) > 1 and _is_name(args[0], self_name)
              and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str)):
            yield args[1].value, node.lineno


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return [node.target]
    return []


def _unpacked(target: ast.expr) -> Iterator[ast.expr]:
    """The leaves of an assignment target: ``self.a, (self.b, c)`` -> ``self.a``, ``self.b``, ``c``."""
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _unpacked(element)
    elif isinstance(target, ast.Starred):
        yield from _unpacked(target.value)
    else:
        yield target
