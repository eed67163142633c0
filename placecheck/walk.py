"""The walk: after ``.to()``, find every tensor the move left behind.

``.to()`` moves what is registered (``_parameters``, ``_buffers``,
``_modules``). The walk reports registered tensors still off the target
(PC104/PC105) and everything reachable from module attributes that is not
registered: tensors (PC101), modules (PC102) and parameters (PC103) in plain
attributes, containers and helper objects, nested, de-duplicated by identity.

It also records where every stray tensor lives (:attr:`WalkResult.origins`),
so the forward pass can say which attribute an offending tensor came from.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from placecheck.finding import Finding, Severity
from placecheck.report import human_bytes
from placecheck.rules import rule

# Attributes every nn.Module has; hooks and bookkeeping, never user state.
_MODULE_INTERNALS = frozenset(vars(nn.Module())) | {"_flat_weight_refs"}

# Leaf values the walk never descends into.
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), torch.device,
          torch.dtype, torch.Size, range, slice, memoryview, type)
_HELPER = "helper:"  # prefix of a ``parent`` kind naming a plain helper object's class
# Class-level values the walk looks into: state, not methods, properties or constants.
_CLASS_STATE = (torch.Tensor, nn.Module, list, tuple, dict, set, frozenset, collections.deque)
MAX_DEPTH = 64
"""How many containers/helper objects deep the walk descends. Cycle detection
already bounds the walk; this only stops pathological chains (a linked list of
thousands of nodes), and a report note names the path where it stopped."""
_MAX_ITEMS = 100_000

# Classes whose class-level attributes are library state, never the user's.
_LIBRARY_PACKAGES = frozenset({"torch", "builtins", "typing", "abc", "collections", "enum"})


@dataclass
class Snapshot:
    """Identities of registered state taken before ``.to()``.

    On a real GPU ``.to()`` keeps each Parameter object (it swaps ``.data``),
    so a plain reference to a registered parameter still sees the moved
    tensor: not a bug. Under fake tensors ``.to()`` creates new Parameter
    objects instead; the snapshot lets the walk treat both the same.
    Buffers are replaced by new tensors on every engine, so a plain reference
    to a buffer is stale after ``.to()``: that one *is* a bug.
    """

    params: dict[int, str] = field(default_factory=dict)
    buffers: dict[int, str] = field(default_factory=dict)
    modules: set[int] = field(default_factory=set)
    keep: list[Any] = field(default_factory=list)
    """Strong references, so that ids stay unique while the audit runs."""

    @staticmethod
    def take(model: nn.Module) -> Snapshot:
        snap = Snapshot()
        for name, p in model.named_parameters(remove_duplicate=False):
            snap.params.setdefault(id(p), name)
            snap.keep.append(p)
        for name, b in model.named_buffers(remove_duplicate=False):
            snap.buffers.setdefault(id(b), name)
            snap.keep.append(b)
        for m in model.modules():
            snap.modules.add(id(m))
        return snap


@dataclass
class WalkResult:
    """Findings of the walk plus what the forward pass needs from it."""

    findings: list[Finding]
    origins: dict[int, str]
    """``id(tensor)`` -> path, for every unregistered tensor found (moved or not)."""
    storages: dict[int, str]
    """Storage data pointer -> path, for real (non-fake) unregistered tensors:
    finds the origin of a view such as ``self.mask[:n]``."""
    stats: dict[str, int]
    finding_by_origin: dict[str, Finding] = field(default_factory=dict)
    """path -> the walk finding about the tensor at that path."""
    notes: list[str] = field(default_factory=list)
    """Remarks for the report's notes: where the walk stopped short (depth limit)."""


def tensor_device(t: torch.Tensor) -> str:
    """``str(t.device)``; uninitialised lazy parameters included."""
    return str(t.device)


def tensor_nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.nelement() * t.element_size())
    except (RuntimeError, ValueError):
        return 0  # UninitializedParameter has no shape yet


def _shape(t: torch.Tensor) -> tuple[int, ...] | None:
    try:
        return tuple(int(s) for s in t.shape)
    except (RuntimeError, ValueError, TypeError):
        return None


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def storage_key(t: torch.Tensor) -> int | None:
    """The data pointer of a real tensor's storage; ``None`` for fake/meta tensors."""
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(t, FakeTensor) or t.device.type == "meta" or t.is_sparse:
        return None
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return ptr or None


def join(base: str, attr: str) -> str:
    """``join("enc.0", "mask") == "enc.0.mask"``; ``join("", "mask") == "mask"``."""
    return f"{base}.{attr}" if base else attr


def _hook_derived(module: nn.Module) -> set[str]:
    """Attributes recomputed by a forward pre-hook before every call.

    ``weight_norm``, ``spectral_norm`` and ``torch.nn.utils.prune`` keep the
    real parameters under other names and set ``module.weight`` as a plain
    tensor attribute from a pre-hook: not a stray tensor.
    """
    names = set()
    for hook in module._forward_pre_hooks.values():
        for attr in ("name", "_tensor_name"):
            value = getattr(hook, attr, None)
            if isinstance(value, str):
                names.add(value)
    return names


def _library_managed(module: nn.Module) -> set[str]:
    """Plain tensor attributes that their library moves to the input's device before use.

    transformers' rotary embeddings keep ``original_inv_freq``, a plain
    reference to the ``inv_freq`` buffer, and ``dynamic_rope_update`` calls
    ``self.original_inv_freq.to(x.device)`` before reading it ("needed if the
    model has been moved to a device after being initialized"): not a bug.
    """
    if "inv_freq" in module._buffers and hasattr(module, "rope_type"):
        return {"original_inv_freq"}
    return set()


def _instance_dict(value: Any) -> dict[str, Any] | None:
    """``value.__dict__`` read without running the object's ``__getattr__``/``__getattribute__``.

    Helper objects may define hooks that raise, or that invent attributes on
    demand (proxies); the walk must neither crash on them nor follow them.
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


def _items(value: Any) -> Iterator[tuple[str, Any]] | None:
    """``(path suffix, child)`` pairs for a container or helper object; None for a leaf."""
    if isinstance(value, dict | types.MappingProxyType):
        return ((f"[{k!r}]", v) for k, v in list(value.items())[:_MAX_ITEMS])
    fields = getattr(type(value), "_fields", None)
    if isinstance(value, tuple) and isinstance(fields, tuple):
        return ((f".{name}", v) for name, v in zip(fields, value, strict=False))
    if isinstance(value, list | tuple | collections.deque):
        return ((f"[{i}]", v) for i, v in enumerate(itertools.islice(value, _MAX_ITEMS)))
    if isinstance(value, set | frozenset):
        # iteration order follows id()/hash: sort by what the members are, not where they live
        members = sorted(itertools.islice(value, _MAX_ITEMS), key=_set_member_key)
        return ((f"{{{i}}}", v) for i, v in enumerate(members))
    if isinstance(value, _ATOMS):  # type is among them: classes are code, not state
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
    return ((f".{k}", v) for k, v in attrs.items())


def _set_member_key(value: Any) -> tuple[Any, ...]:
    """A content-free sort key for a set member: tensors by dtype, shape, device and size.

    Members that compare equal under this key look the same in every report
    (same dtype, shape, device, bytes), so their relative order does not show.
    """
    if isinstance(value, torch.Tensor):
        return (0, type(value).__name__, _dtype(value), _shape(value) or (), tensor_device(value),
                tensor_nbytes(value), "")
    shown = repr(value) if isinstance(value, _ATOMS) else ""
    return (1, type(value).__name__, "", (), "", 0, shown)


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


def reachable_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """Every tensor reachable from the attributes of ``model``'s modules, once each.

    Registered or not, through the same containers and helper objects the walk
    descends into (and through modules held in them); for code that must treat
    every tensor a model holds, such as copying it.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(model, 0)]
    while stack:
        value, depth = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            yield value
            continue
        if isinstance(value, nn.Module):
            children: Iterator[tuple[str, Any]] | None = iter(list(vars(value).items()))
        elif depth >= MAX_DEPTH:
            continue
        else:
            children = _items(value)
        for _, child in children or ():
            stack.append((child, depth + 1))


def _helper_class(parent: str | None) -> str:
    """The class name when the immediate holder is a plain helper object (``"helper:RopeCache"``), else ""."""
    return parent.removeprefix(_HELPER) if parent and parent.startswith(_HELPER) else ""


def _holder_name(path: str) -> str:
    """``"h.layer"`` -> ``"h"``: the path of the object holding the last step of ``path``."""
    cut = max(path.rfind("."), path.rfind("["), path.rfind("{"))
    return path[:cut] if cut > 0 else path


def _container_kind(value: Any) -> str:
    if isinstance(value, dict | types.MappingProxyType):
        return "dict"
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return "namedtuple"
    if isinstance(value, list | tuple | set | frozenset | collections.deque):
        return type(value).__name__ if type(value) in (list, tuple, set, frozenset, collections.deque) \
            else "sequence"
    return type(value).__name__


class _Walker:
    def __init__(self, model: nn.Module, target: str, snapshot: Snapshot) -> None:
        self.target = target
        self.snapshot = snapshot
        self.registered: set[int] = set()
        for _, p in model.named_parameters(remove_duplicate=False):
            self.registered.add(id(p))
        for _, b in model.named_buffers(remove_duplicate=False):
            self.registered.add(id(b))
        self.modules = {id(m) for m in model.modules()} | snapshot.modules
        self.seen: set[int] = set()
        self.findings: list[Finding] = []
        self.origins: dict[int, str] = {}
        self.storages: dict[int, str] = {}
        self.by_origin: dict[str, Finding] = {}
        self.found: dict[int, tuple[str, torch.Tensor]] = {}
        self.strays = 0
        self.class_paths: set[str] = set()
        """Paths of class-level attributes, for the message."""
        self.too_deep: list[str] = []
        """Paths where the walk stopped at MAX_DEPTH."""

    # -- registered state ---------------------------------------------------------
    def registered_off_device(self, model: nn.Module) -> None:
        for code, items in (("PC104", model.named_parameters()), ("PC105", model.named_buffers())):
            for name, t in items:
                dev = tensor_device(t)
                if dev == self.target:
                    continue
                owner, _, attr = name.rpartition(".")
                what = "parameter" if code == "PC104" else "buffer"
                self.findings.append(self._finding(
                    code, name, owner, t,
                    message=f"registered {what} {name!r} is on {dev} after .to({self.target!r})",
                    hint=("something overrode the move: a custom _apply()/to() that skips it, or "
                          f"{attr!r} re-assigned after .to(); keep the default _apply and create "
                          "replacements on the existing tensor's device"),
                ))

    # -- unregistered state -------------------------------------------------------
    def module_attributes(self, model: nn.Module, outer_modules: frozenset[int] = frozenset()) -> None:
        """Walk the attributes of every module under ``model`` except ``outer_modules``."""
        for mpath, module in model.named_modules():
            if id(module) in outer_modules:
                continue
            skip = _MODULE_INTERNALS | _hook_derived(module) | _library_managed(module)
            for attr, value in list(vars(module).items()):
                if attr in skip:
                    continue
                self.visit(value, join(mpath, attr), mpath, attr, container=None, helper=None, depth=0)
            for attr, value in class_attributes(module).items():
                if attr in skip or not isinstance(value, _CLASS_STATE):
                    continue  # methods, properties, constants: code, not state
                self.class_paths.add(join(mpath, attr))
                self.visit(value, join(mpath, attr), mpath, attr, container=None, helper=None, depth=0)

    def visit(self, value: Any, path: str, owner: str, attr: str, container: str | None,
              helper: str | None, depth: int, parent: str | None = None) -> None:
        """Report what ``value`` (found at ``path``) holds.

        ``container``/``helper`` name the outermost plain holder under the
        module attribute (for the message); ``parent`` is the kind of the
        immediate holder ("dict", "list", ... or "helper:ClassName"), which decides the fix.
        """
        if isinstance(value, torch.Tensor):
            self.tensor(value, path, owner, attr, container, helper, parent)
            return
        if isinstance(value, nn.Module):
            self.module(value, path, owner, container, helper, parent)
            return
        if id(value) in self.seen:
            return
        items = _items(value)
        if items is None:
            return
        if depth >= MAX_DEPTH:
            self.too_deep.append(path)
            return
        self.seen.add(id(value))
        is_container = isinstance(value, dict | list | tuple | set | frozenset | collections.deque |
                                  types.MappingProxyType)
        if container is None and helper is None:
            if is_container:
                container = _container_kind(value)
            else:
                helper = type(value).__name__
        kind = _container_kind(value) if is_container else f"{_HELPER}{type(value).__name__}"
        for suffix, child in items:
            self.visit(child, path + suffix, owner, attr, container, helper, depth + 1, kind)

    def tensor(self, t: torch.Tensor, path: str, owner: str, attr: str, container: str | None,
               helper: str | None, parent: str | None = None) -> None:
        key = id(t)
        if key in self.registered or key in self.snapshot.params or key in self.seen:
            return
        self.seen.add(key)
        self.strays += 1
        self.origins[key] = path
        self.found[key] = (path, t)
        skey = storage_key(t)
        if skey is not None:
            self.storages.setdefault(skey, path)
        dev = tensor_device(t)
        stale = self.snapshot.buffers.get(key)
        if dev == self.target and stale is None:
            return
        desc = f"{_dtype(t)}{list(_shape(t) or [])}"
        if stale is not None:
            finding = self._finding(
                "PC101", path, owner, t,
                message=(f"{path!r} holds buffer {stale!r} as it was before .to(): .to() replaced "
                         "the buffer with a moved copy, this reference still points at the old one "
                         f"on {dev}"),
                hint=f"do not keep references to buffers; read self.{stale} where it is needed",
            )
        elif isinstance(t, nn.Parameter):
            cls_name = _helper_class(parent)
            if cls_name:
                where = f"inside {cls_name} object {_holder_name(path)!r}"
                hint = (f"make {cls_name} an nn.Module, or hold the parameter on the model itself: "
                        ".to() does not look inside plain objects")
            else:
                where = f"in plain {container or helper or 'object'} {attr!r}"
                fix = "nn.ParameterDict" if parent == "dict" else "nn.ParameterList"
                hint = f"hold parameters in {fix} (or assign each as a module attribute)"
            finding = self._finding(
                "PC103", path, owner, t,
                message=(f"nn.Parameter {desc} {where} stays on {dev}: "
                         ".to(), state_dict() and the optimizer never see it"),
                hint=hint,
            )
        elif _shape(t) == () and dev == "cpu" and path not in self.class_paths:
            # PLACEMENT.md: a 0-dim CPU tensor used as a scalar with device tensors does
            # not raise, so this is waste (a host read per use) and a state_dict gap, not a crash
            finding = self._finding(
                "PC101", path, owner, t, severity=Severity.WARNING,
                message=(f"0-dim tensor {path!r} ({_dtype(t)}) stays on {dev}: used as a scalar beside "
                         f"{self.target} tensors it does not raise, but .to() does not move it, "
                         "state_dict() does not save it and each use reads it on the host"),
                hint=(f'self.register_buffer("{attr}", tensor, persistent=False) in __init__ (or a '
                      "Python number if it never changes)"),
            )
        elif path in self.class_paths:
            finding = self._finding(
                "PC101", path, owner, t,
                message=(f"class attribute {attr!r} {desc} stays on {dev}: a tensor defined in the class "
                         "body is shared by every instance and .to() never moves it"),
                hint=(f'create it in __init__ and self.register_buffer("{attr}", tensor, persistent=False), '
                      "or create it in forward() on the input's device"),
            )
        else:
            if container:
                what = f"tensor {desc} in plain {container} {attr!r}"
                hint = ("register each tensor with self.register_buffer(name, t, persistent=False), "
                        "or create it in forward() on the input's device: .to() does not look inside "
                        f"a plain {container}")
            elif helper:
                what = f"tensor {desc} inside {helper} object {attr!r}"
                hint = (f"make {helper} an nn.Module and register its tensors with register_buffer(), "
                        "or create them in forward() on the input's device: .to() does not look "
                        "inside plain objects")
            else:
                what = f"tensor attribute {attr!r} {desc}"
                hint = (f'self.register_buffer("{attr}", tensor, persistent=False) in __init__, or '
                        "create it in forward() on the input's device")
            finding = self._finding(
                "PC101", path, owner, t,
                message=f"{what} stays on {dev}: .to() moves only registered parameters and buffers",
                hint=hint,
            )
        self.findings.append(finding)
        self.by_origin[path] = finding

    def module(self, m: nn.Module, path: str, owner: str, container: str | None,
               helper: str | None = None, parent: str | None = None) -> None:
        key = id(m)
        if key in self.modules or key in self.seen:
            return
        self.seen.add(key)
        # A back-reference from the unregistered module to the model (registered as its
        # submodule, or held in a plain attribute) must not pull the model's own state
        # into this module's count: what the model registers, or walks itself, is skipped.
        outer = frozenset(self.modules)
        tensors: dict[int, tuple[str, torch.Tensor]] = {}
        named = (*m.named_parameters(remove_duplicate=False), *m.named_buffers(remove_duplicate=False))
        for name, tensor in named:
            if id(tensor) not in self.registered and id(tensor) not in self.snapshot.params:
                tensors.setdefault(id(tensor), (join(path, name), tensor))
        # plain tensor attributes of the unregistered module and its children
        sub = _Walker(m, self.target, Snapshot())
        sub.modules |= outer
        sub.module_attributes(m, outer_modules=outer)
        for tid, (tpath, t) in sub.found.items():
            tensors.setdefault(tid, (join(path, tpath), t))
        off = [(p, t) for p, t in tensors.values() if tensor_device(t) != self.target]
        # a tensor also reachable elsewhere (a plain attribute of the model) is reported,
        # and counted in the summary's bytes, only where the walk met it first
        counted = [(p, t) for tid, (p, t) in tensors.items()
                   if tid not in self.seen and tensor_device(t) != self.target]
        already = len(off) - len(counted)
        for tid, (tpath, t) in tensors.items():
            if tid in self.seen:
                continue
            self.origins[tid] = tpath
            self.found[tid] = (tpath, t)
            self.seen.add(tid)
            skey = storage_key(t)
            if skey is not None:
                self.storages.setdefault(skey, tpath)
        if not off:
            return
        nbytes = sum(tensor_nbytes(t) for _, t in counted)
        devices = sorted({tensor_device(t) for _, t in off})
        cls_name = _helper_class(parent)
        if cls_name:
            where = f"inside {cls_name} object {_holder_name(path)!r} at {path!r}"
            hint = (f"make {cls_name} an nn.Module, or hold the {type(m).__name__} on the model itself: "
                    ".to() does not look inside plain objects")
        else:
            kind = container or "attribute"
            where = f"in plain {kind} at {path!r}"
            fix = "nn.ModuleDict" if parent == "dict" else "nn.ModuleList"
            hint = f"hold submodules in {fix} (nn.Sequential for a pipeline) instead of a plain {kind}"
        also = f", {already} more already reported where the walk met them first" if already else ""
        finding = Finding(
            code="PC102", kind=rule("PC102").kind, severity=rule("PC102").severity,
            where=path, module=owner, device=", ".join(devices), expected=self.target,
            nbytes=nbytes, count=len(counted),
            message=(f"{type(m).__name__} {where}: its {len(counted)} tensor"
                     f"{'s' if len(counted) != 1 else ''} ({human_bytes(nbytes)}{also}) stay on "
                     f"{', '.join(devices)}; .to(), state_dict() and the optimizer never see them"),
            hint=hint,
        )
        self.findings.append(finding)
        for tpath, _ in counted:
            self.by_origin[tpath] = finding

    def _finding(self, code: str, where: str, owner: str, t: torch.Tensor, message: str,
                 hint: str, severity: Severity | None = None) -> Finding:
        r = rule(code)
        return Finding(
            code=code, kind=r.kind, severity=severity or r.severity, where=where, module=owner,
            device=tensor_device(t), expected=self.target, dtype=_dtype(t), shape=_shape(t),
            nbytes=tensor_nbytes(t), count=1, message=message, hint=hint,
        )


def walk(model: nn.Module, target: str, snapshot: Snapshot | None = None) -> WalkResult:
    """Walk ``model`` (already moved to ``target``) and report what ``.to()`` left behind.

    ``snapshot`` is :meth:`Snapshot.take` of the model before the move; without
    it, stale references to pre-move parameters cannot be told from strays.
    """
    walker = _Walker(model, target, snapshot or Snapshot())
    walker.registered_off_device(model)
    walker.module_attributes(model)
    n_params = sum(1 for _ in model.parameters())
    n_buffers = sum(1 for _ in model.buffers())
    stats = {
        "modules": sum(1 for _ in model.modules()),
        "parameters": n_params,
        "buffers": n_buffers,
        "unregistered_tensors": walker.strays,
    }
    notes = []
    if walker.too_deep:
        more = f" (and {len(walker.too_deep) - 1} more)" if len(walker.too_deep) > 1 else ""
        notes.append(f"walk: stopped {MAX_DEPTH} containers deep at {walker.too_deep[0]!r}{more}: "
                     "tensors nested deeper were not checked")
    return WalkResult(walker.findings, walker.origins, walker.storages, stats, walker.by_origin, notes)
