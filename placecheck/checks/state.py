"""The state a model holds, walked one way for every reader.

``.to()`` moves what a module registers (``_parameters``, ``_buffers``,
``_modules``). Everything else a module holds is in its plain attributes:
tensors, modules and parameters there, inside containers (list, tuple, dict,
set, deque, namedtuple, mapping proxy) and inside helper objects (instances
of the user's classes, dataclasses, ``__slots__`` classes), nested. This
module decides once what that state is, for the walk (what ``.to()`` left
behind), for copying a model, and for materialising a meta-built one:

- :data:`MODULE_INTERNALS`: the attributes every ``nn.Module`` keeps for
  hooks and bookkeeping, never user state;
- :func:`contents`: one level of a container or helper object, or ``None``
  for a leaf (:data:`ATOMS`, functions, classes, modules of code);
- :func:`holds_module`: a framework's object attached to a module (a trainer and its loops and data)
  is the module's owner, not its state;
- :func:`held`: every tensor and module reachable from one attribute, with its
  path, its outermost and its immediate holder, not descending into either,
  cycles cut, at most :data:`MAX_DEPTH` holders deep;
- :func:`reachable_tensors` and :func:`replace_tensors`: every tensor of a
  model, registered or not, read or replaced in place.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from placecheck.engines.sources import library_of_file

MODULE_INTERNALS = frozenset(vars(nn.Module())) | {"_flat_weight_refs"}
"""Attributes every nn.Module has (hooks, registries, flags), and the RNN
modules' weak references to their own parameters: never user state."""

ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), torch.device,
         torch.dtype, torch.Size, range, slice, memoryview, type)
"""Leaf values never descended into (``type``: classes are code, not state)."""

CLASS_STATE = (torch.Tensor, nn.Module, list, tuple, dict, set, frozenset, collections.deque)
"""Class-level values that are state, not methods, properties or constants."""

MAX_DEPTH = 64
"""How many containers/helper objects deep the traversal descends. Cycle
detection already bounds it; this only stops pathological chains (a linked
list of thousands of nodes), and the walk's report note names the path where
it stopped."""

MAX_ITEMS = 100_000
"""Members of one container read by :func:`held`; the rest are not checked."""

# Classes whose class-level attributes are library state, never the user's.
_LIBRARY_PACKAGES = frozenset({"torch", "builtins", "typing", "abc", "collections", "enum"})

_CONTAINERS = (dict, list, tuple, set, frozenset, collections.deque, types.MappingProxyType)


@dataclass(frozen=True)
class Registry:
    """A model's registered state read in one traversal: what ``named_modules()``, ``named_parameters()``
    and ``named_buffers()`` give (each de-duplicated by identity, in their order), without walking the
    module tree once for each (a walk asks for all three, and a 671B model has 75,000 modules)."""

    modules: list[tuple[str, nn.Module]]
    parameters: list[tuple[str, torch.Tensor]]
    buffers: list[tuple[str, torch.Tensor]]

    @staticmethod
    def of(model: nn.Module) -> Registry:
        modules = list(model.named_modules())
        parameters: list[tuple[str, torch.Tensor]] = []
        buffers: list[tuple[str, torch.Tensor]] = []
        for store, found in (("_parameters", parameters), ("_buffers", buffers)):
            seen: set[int] = set()
            for prefix, module in modules:
                for name, tensor in getattr(module, store).items():
                    if tensor is None or id(tensor) in seen:
                        continue
                    seen.add(id(tensor))
                    found.append((f"{prefix}.{name}" if prefix else name, tensor))
        return Registry(modules, parameters, buffers)

    def ids(self) -> set[int]:
        """The ids of every registered parameter and buffer."""
        return {id(t) for _, t in self.parameters} | {id(t) for _, t in self.buffers}


@dataclass(frozen=True)
class Holder:
    """What holds a value: a plain container or a helper object."""

    kind: str
    """``dict`` (mapping proxies and dict subclasses too), ``list``, ``tuple``,
    ``set``, ``frozenset``, ``deque``, ``namedtuple``, ``sequence`` (a subclass
    of a sequence or set type) or ``object`` (a helper object)."""
    class_name: str
    """The holder's class, ``RopeCache`` for a helper object."""

    @property
    def is_object(self) -> bool:
        return self.kind == "object"

    @property
    def name(self) -> str:
        """How a message names it: the container kind, or the helper's class."""
        return self.class_name if self.is_object else self.kind


def holder(value: Any) -> Holder:
    """The :class:`Holder` describing ``value`` (a container or helper object)."""
    name = type(value).__name__
    if isinstance(value, dict | types.MappingProxyType):
        return Holder("dict", name)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return Holder("namedtuple", name)
    if isinstance(value, list | tuple | set | frozenset | collections.deque):
        exact = type(value) in (list, tuple, set, frozenset, collections.deque)
        return Holder(name if exact else "sequence", name)
    return Holder("object", name)


def contents(value: Any, limit: int | None = MAX_ITEMS) -> list[tuple[Any, str, Any]] | None:
    """``(key, path suffix, child)`` for each member of a container or helper object; None for a leaf.

    The key is what :func:`replace_tensors` writes back through: a dict key,
    a position, or an attribute name. Set members come sorted by what they
    are (dtype, shape, device), not by where they live, so the order is the
    same in every run. ``limit`` caps the members read from one container.
    """
    if isinstance(value, dict | types.MappingProxyType):
        return [(k, f"[{k!r}]", v) for k, v in itertools.islice(list(value.items()), limit)]
    fields = getattr(type(value), "_fields", None)
    if isinstance(value, tuple) and isinstance(fields, tuple):
        return [(i, f".{name}", v) for i, (name, v) in enumerate(zip(fields, value, strict=False))]
    if isinstance(value, list | tuple | collections.deque):
        return [(i, f"[{i}]", v) for i, v in enumerate(itertools.islice(value, limit))]
    if isinstance(value, set | frozenset):
        members = sorted(itertools.islice(value, limit), key=set_member_key)
        return [(i, f"{{{i}}}", v) for i, v in enumerate(members)]
    if isinstance(value, ATOMS):
        return None
    if type(value).__module__ in ("builtins", "types"):
        return None  # functions, methods, modules, code objects, ...
    instance_dict = _instance_dict(value)
    if callable(value) and instance_dict is None:
        return None
    attrs: dict[str, Any] = dict(instance_dict or {})
    if dataclasses.is_dataclass(value):
        # declared fields first, in declaration order
        names = [f.name for f in dataclasses.fields(value)]
        attrs = {n: attrs[n] for n in names if n in attrs} | attrs
    for slot, slot_value in _slot_values(value).items():
        attrs.setdefault(slot, slot_value)
    if not attrs:
        return None
    return [(k, f".{k}", v) for k, v in attrs.items()]


def _instance_dict(value: Any) -> dict[str, Any] | None:
    """``value.__dict__`` read without running the object's ``__getattr__``/``__getattribute__``.

    Helper objects may define hooks that raise, or that invent attributes on
    demand (proxies); the traversal must neither crash on them nor follow them.
    """
    try:
        found = object.__getattribute__(value, "__dict__")
    except Exception:
        return None
    return found if isinstance(found, dict) else None


def _slot_values(value: Any) -> dict[str, Any]:
    """The ``__slots__`` a helper object has set, read through the slot descriptors."""
    found: dict[str, Any] = {}
    for cls in type(value).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            descriptor: Any = cls.__dict__.get(slot)
            if slot in found or not hasattr(descriptor, "__get__"):
                continue
            try:
                found[slot] = descriptor.__get__(value, cls)
            except Exception:  # unset slot (AttributeError) or a raising descriptor
                continue
    return found


def set_member_key(value: Any) -> tuple[Any, ...]:
    """A content-free sort key for a set member: tensors by dtype, shape, device and size.

    Members that compare equal under this key look the same in every report
    (same dtype, shape, device, bytes), so their relative order does not show.
    """
    if isinstance(value, torch.Tensor):
        try:
            shape: tuple[int, ...] = tuple(int(s) for s in value.shape)
            nbytes = int(value.nelement() * value.element_size())
        except (RuntimeError, ValueError, TypeError):  # an uninitialised lazy parameter
            shape, nbytes = (), 0
        return (0, type(value).__name__, str(value.dtype), shape, str(value.device), nbytes, "")
    shown = repr(value) if isinstance(value, ATOMS) else ""
    return (1, type(value).__name__, "", (), "", 0, shown)


def attributes(module: nn.Module) -> list[tuple[str, Any]]:
    """``(name, value)`` of the module's own instance attributes, its internals left out.

    Registered state lives in the internals (``_parameters``, ``_buffers``,
    ``_modules``); what is here is what ``.to()`` does not look at. torch.distributed's composable
    APIs (FSDP2's ``fully_shard``, ``replicate``) keep their bookkeeping here too, under keys of their
    own (:func:`_composable_state_keys`): the device mesh, the sharded-parameter groups; the
    parameters they manage are registered, so that state is left out as well.
    """
    internal = _internal_names()
    return [(name, value) for name, value in list(vars(module).items()) if name not in internal]


def _internal_names() -> frozenset[str]:
    """:data:`MODULE_INTERNALS` and the :func:`_composable_state_keys` (one set, made once per set of
    keys: :func:`attributes` asks for every module of the model)."""
    keys = _composable_state_keys()
    return _with_internals(keys) if keys else MODULE_INTERNALS


@functools.lru_cache(maxsize=8)
def _with_internals(keys: frozenset[str]) -> frozenset[str]:
    return MODULE_INTERNALS | keys


def _composable_state_keys() -> frozenset[str]:
    """The ``__dict__`` keys under which torch.distributed's composable APIs keep a module's state
    (none until one of them has been imported)."""
    from placecheck.engines.compat import composable_state_keys

    return composable_state_keys()


def class_attributes(module: nn.Module) -> dict[str, Any]:
    """Attributes defined on the user's classes of ``module`` (above nn.Module in its MRO).

    ``class M(nn.Module): table = torch.arange(10)`` creates one tensor shared
    by every instance, which ``.to()`` never moves. torch's own classes (and
    Python's) are skipped, as are dunder names and names the instance shadows.
    """
    found: dict[str, Any] = {}
    instance = vars(module)
    for cls in type(module).__mro__:
        if cls.__module__.partition(".")[0] in _LIBRARY_PACKAGES:
            continue
        for name, value in vars(cls).items():
            if name.startswith("__") or name in instance or name in found:
                continue
            found[name] = value
    return found


def class_state(module: nn.Module) -> dict[str, Any]:
    """The :func:`class_attributes` that hold state (:data:`CLASS_STATE`), not code or constants."""
    return {name: value for name, value in class_attributes(module).items() if isinstance(value, CLASS_STATE)}


OWNER_SEARCH = 4
"""How many objects deep :func:`holds_module` looks for the module (a Lightning Trainer holds its
LightningModule two deep: ``trainer.strategy._lightning_module``)."""

_NOT_OBJECTS = (*ATOMS, *_CONTAINERS, torch.Tensor, nn.Module)
_OWNER_ITEMS = 2_000
"""Members :func:`holds_module` reads at most, in all: an owner holds its module near the top."""


def holds_module(value: Any, modules: set[int]) -> str:
    """The installed package of ``value`` when it is that package's object and holds one of ``modules``
    (by id) within :data:`OWNER_SEARCH` objects; "" otherwise.

    A framework attaches its own objects to the module it drives (Lightning's ``Trainer`` as
    ``LightningModule._trainer``): those objects hold the module, with the loops, the data and the
    loggers that drive it; the module does not hold them as its state. Decided from evidence, never from
    a class's name: the object's class is defined in an installed package (not the user's code), and
    the object refers back to the module it is attached to. A helper object of the user's own, or an
    installed package's object that does not hold the module (a cache, a config), stays state.
    """
    if isinstance(value, _NOT_OBJECTS):
        return ""
    package = _package_of_module(type(value).__module__)
    if not package or package == "torch":
        return ""
    budget = [_OWNER_ITEMS]
    return package if _reaches(value, modules, OWNER_SEARCH, set(), budget) else ""


def _reaches(value: Any, modules: set[int], depth: int, seen: set[int], budget: list[int]) -> bool:
    if id(value) in seen or depth <= 0 or budget[0] <= 0:
        return False
    seen.add(id(value))
    members = contents(value, limit=budget[0])
    if members is None:
        return False
    budget[0] -= len(members)
    if any(id(child) in modules for _, _, child in members):
        return True
    return any(_reaches(child, modules, depth - 1, seen, budget) for _, _, child in members
               if not isinstance(child, (*ATOMS, torch.Tensor, nn.Module)))


def _package_of_module(name: str) -> str:
    """The installed package whose file is the Python module ``name`` ("lightning"), or "" (the user's,
    or unknown; :func:`~placecheck.engines.sources.library_of_file` caches per file)."""
    filename = getattr(sys.modules.get(name), "__file__", None)
    return library_of_file(filename) if isinstance(filename, str) else ""


@dataclass(frozen=True)
class Held:
    """A tensor or module found in a module's plain state."""

    value: Any
    path: str
    """Where it is, from the root model: ``blocks.0.cache['k']``."""
    owner: str
    """Path of the module whose attribute holds it (``blocks.0``; ``""`` for the root)."""
    attr: str
    """That attribute's name (``cache``)."""
    outer: Holder | None
    """The outermost plain holder under the attribute; None when the attribute is the value."""
    parent: Holder | None
    """The immediate holder; None when the attribute is the value."""


def held(value: Any, path: str, owner: str, attr: str, seen: set[int],
         too_deep: list[str] | None = None) -> Iterator[Held]:
    """Every tensor and module reachable from ``value``, the attribute ``attr`` of module ``owner``.

    Descends into containers and helper objects, not into tensors or modules
    (the caller decides what a module found in plain state means). ``seen``
    holds the ids of containers already walked (shared between calls, so a
    container reachable twice is walked once, and cycles end); a path where
    :data:`MAX_DEPTH` stopped the descent is appended to ``too_deep``.
    """
    yield from _held(value, path, owner, attr, seen, too_deep, None, None, 0)


def _held(value: Any, path: str, owner: str, attr: str, seen: set[int], too_deep: list[str] | None,
          outer: Holder | None, parent: Holder | None, depth: int) -> Iterator[Held]:
    if isinstance(value, torch.Tensor | nn.Module):
        yield Held(value, path, owner, attr, outer, parent)
        return
    if id(value) in seen:
        return
    members = contents(value)
    if members is None:
        return
    if depth >= MAX_DEPTH:
        if too_deep is not None:
            too_deep.append(path)
        return
    seen.add(id(value))
    here = holder(value)
    for _, suffix, child in members:
        yield from _held(child, path + suffix, owner, attr, seen, too_deep, outer or here, here, depth + 1)


def _module_values(module: nn.Module) -> list[Any]:
    """Everything a module holds: registered parameters, buffers, submodules, then plain attributes."""
    return [*module._parameters.values(), *module._buffers.values(), *module._modules.values(),
            *(value for _, value in attributes(module))]


def reachable_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """Every tensor reachable from ``model``'s modules, registered or not, once each.

    Through the same containers and helper objects the walk descends into,
    and through modules held in them; for code that must treat every tensor a
    model holds, such as copying it.
    """
    seen: set[int] = set()
    modules = [model]
    while modules:
        module = modules.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        for value in _module_values(module):
            if isinstance(value, torch.Tensor):  # most values: registered tensors, no descent
                if id(value) not in seen:
                    seen.add(id(value))
                    yield value
                continue
            if isinstance(value, nn.Module):
                modules.append(value)
                continue
            if isinstance(value, ATOMS):  # nothing held
                continue
            for found in held(value, "", "", "", seen):
                if isinstance(found.value, nn.Module):
                    modules.append(found.value)
                elif id(found.value) not in seen:
                    seen.add(id(found.value))
                    yield found.value


def replace_tensors(model: nn.Module, replace: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Put ``replace(t)`` in place of every tensor ``t`` reachable from ``model``'s modules.

    Registered parameters and buffers are replaced in their registries; plain
    state in place where it is mutable (dicts, lists, deques, helper objects,
    frozen dataclasses too), and by a rebuilt copy where it is not (tuples,
    namedtuples, sets, mapping proxies), stored back where the old one was.
    ``replace`` is called once per tensor occurrence: it must return the same
    new tensor for the same old one to keep shared references shared.
    Containers reached twice are rebuilt once; cycles end.
    """
    _Replacer(replace).module(model)


@dataclass
class _Replacer:
    replace: Callable[[torch.Tensor], torch.Tensor]
    done: dict[int, Any] = dataclasses.field(default_factory=dict)
    """id of each module and holder visited -> what replaces it (itself, or a rebuilt copy)."""

    def module(self, module: nn.Module) -> None:
        if id(module) in self.done:
            return
        self.done[id(module)] = module
        stores: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
        for store in stores:
            for name, t in list(store.items()):
                if t is not None:
                    store[name] = self.replace(t)
        for name, value in attributes(module):
            new = self.value(value, 0)
            if new is not value:
                module.__dict__[name] = new
        for child in module._modules.values():
            if child is not None:
                self.module(child)

    def value(self, value: Any, depth: int) -> Any:
        """``value`` with its tensors replaced: the same object, changed in place, where it can be."""
        if isinstance(value, torch.Tensor):
            return self.replace(value)
        if isinstance(value, nn.Module):
            self.module(value)
            return value
        if id(value) in self.done:
            return self.done[id(value)]
        members = contents(value, limit=None)
        if members is None or depth >= MAX_DEPTH:
            return value
        self.done[id(value)] = value  # cycles end here
        new_members = [(key, self.value(child, depth + 1)) for key, _, child in members]
        changed = [(key, new) for (key, new), (_, _, old) in zip(new_members, members, strict=True)
                   if new is not old]
        result = _with_members(value, new_members, changed) if changed else value
        self.done[id(value)] = result
        return result


def _with_members(value: Any, members: list[tuple[Any, Any]], changed: list[tuple[Any, Any]]) -> Any:
    """``value`` holding ``members`` (in order), ``changed`` the ones that differ: in place when mutable."""
    if isinstance(value, dict | list | collections.deque):
        for key, new in changed:
            value[key] = new
        return value
    if isinstance(value, types.MappingProxyType):  # read-only: a new proxy over a new dict
        return types.MappingProxyType(dict(members))
    if isinstance(value, tuple | set | frozenset):
        items = [new for _, new in members]
        try:
            if hasattr(value, "_fields"):  # a namedtuple
                return getattr(type(value), "_make")(items)  # noqa: B009
            return type(value)(items)
        except TypeError:
            return value  # a subclass that cannot be rebuilt from its items: leave it
    for name, new in changed:
        object.__setattr__(value, name, new)  # frozen dataclasses too
    return value
