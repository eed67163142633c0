"""The walk: after ``.to()``, find every tensor the move left behind.

``.to()`` moves what is registered (``_parameters``, ``_buffers``,
``_modules``). The walk reports registered tensors still off the target
(PC104/PC105) and everything reachable from module attributes that is not
registered: tensors (PC101), modules (PC102) and parameters (PC103) in plain
attributes, containers and helper objects, nested, de-duplicated by identity
(what is module state, and how it is traversed: :mod:`placecheck.checks.state`).
Modules and parameters in plain containers are reported on the target device
too: ``state_dict()`` and the optimizer miss them anywhere. Each finding's
``source`` is the user's line that assigned the attribute
(:mod:`placecheck.checks.assignments`); its words come from its rule's builder in
:mod:`placecheck.findings.rules`.

It also records where every stray tensor lives (:attr:`WalkResult.origins`),
so the forward pass can say which attribute an offending tensor came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.codes import Code
from placecheck.basics.values import Device
from placecheck.checks.assignments import Assignments
from placecheck.checks.expected import Placement
from placecheck.checks.state import (
    ATOMS,
    MAX_DEPTH,
    MODULE_INTERNALS,
    Held,
    Registry,
    attributes,
    class_state,
    held,
    holds_module,
)
from placecheck.checks.state import reachable_tensors as reachable_tensors  # the API's copy uses it from here
from placecheck.engines.calls import device_of
from placecheck.findings import rules
from placecheck.findings.events import HeldTensor, RegisteredOffTarget, StrayTensor, UnregisteredModuleFound
from placecheck.findings.finding import Finding

__all__ = ["MAX_DEPTH", "Snapshot", "WalkResult", "join", "reachable_tensors", "storage_key",
           "tensor_nbytes", "walk"]


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
        registry = Registry.of(model)  # each tensor under the first name it is reachable by
        for name, p in registry.parameters:
            snap.params.setdefault(id(p), name)
            snap.keep.append(p)
        for name, b in registry.buffers:
            snap.buffers.setdefault(id(b), name)
            snap.keep.append(b)
        snap.modules.update(id(m) for _, m in registry.modules)
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


def held_tensor(t: torch.Tensor) -> HeldTensor:
    """``t`` as plain data, for the walk's events."""
    return HeldTensor(device_of(t), _dtype(t), _shape(t), tensor_nbytes(t))


def storage_key(t: torch.Tensor) -> int | None:
    """The data pointer of a real tensor's storage; ``None`` for fake/meta tensors."""
    from placecheck.engines.compat import FakeTensor

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


def _holder_name(path: str) -> str:
    """``"h.layer"`` -> ``"h"``: the path of the object holding the last step of ``path``."""
    cut = max(path.rfind("."), path.rfind("["), path.rfind("{"))
    return path[:cut] if cut > 0 else path


class _Walker:
    def __init__(self, model: nn.Module, target: Device, snapshot: Snapshot,
                 assignments: Assignments | None = None, placement: Placement | None = None) -> None:
        self.root = model
        self.target = target
        self.placement = placement
        """``--device keep``: each module's own expected device (:mod:`placecheck.placement`), not
        ``target``."""
        self.snapshot = snapshot
        self.assignments = assignments or Assignments()
        self.registry = Registry.of(model)
        self.registered: set[int] = self.registry.ids()
        self.modules = {id(m) for _, m in self.registry.modules} | snapshot.modules
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
        self.owners: dict[int, str] = {}
        """id of each plain attribute value asked about -> the installed package whose object holding the
        model it is ("": state)."""
        self.owner_paths: dict[str, str] = {}
        """path -> ``lightning Trainer``: the framework objects left out of the walk."""

    def expected(self, owner: str) -> str:
        """The device a tensor held by the module at ``owner`` should be on (a finding's ``expected``)."""
        return self.placement.expected(owner).label if self.placement is not None else self.target

    def on_device(self, device: Device, owner: str) -> bool:
        """A tensor on ``device`` held by the module at ``owner`` is where it belongs."""
        if self.placement is not None:
            return self.placement.expected(owner).allows(device)
        return device == self.target

    # -- registered state ---------------------------------------------------------
    def registered_off_device(self) -> None:
        model = self.root
        for code, items in ((Code.PC104, self.registry.parameters), (Code.PC105, self.registry.buffers)):
            for name, t in items:
                dev = device_of(t)
                owner, _, attr = name.rpartition(".")
                if self.on_device(dev, owner):
                    continue
                self.findings.append(rules.walk_finding(RegisteredOffTarget(
                    name, owner, code == Code.PC104, held_tensor(t), self.expected(owner),
                    self.source(owner, model.get_submodule(owner), attr), keep=self.placement is not None)))

    # -- unregistered state -------------------------------------------------------
    def module_attributes(self, outer_modules: frozenset[int] = frozenset()) -> None:
        """Walk the attributes of every module under the walked model except ``outer_modules``."""
        for mpath, module in self.registry.modules:
            if id(module) in outer_modules:
                continue
            skip = _hook_derived(module)
            for attr, value in attributes(module):
                if attr not in skip and not isinstance(value, ATOMS) \
                        and not self.framework_owner(value, join(mpath, attr)):  # an atom holds nothing
                    self.visit(value, mpath, module, attr)
            for attr, value in class_state(module).items():
                if attr not in skip and attr not in MODULE_INTERNALS:
                    self.class_paths.add(join(mpath, attr))
                    self.visit(value, mpath, module, attr)

    def framework_owner(self, value: Any, path: str) -> bool:
        """``value`` is an installed package's object that holds the model (a trainer the framework
        attached to it, :func:`~placecheck.checks.state.holds_module`): not walked, and a note says so."""
        package = self.owners.get(id(value))
        if package is None:
            package = self.owners[id(value)] = holds_module(value, self.modules)
        if package:
            self.owner_paths.setdefault(path, f"{package} {type(value).__name__}")
        return bool(package)

    def source(self, mpath: str, module: nn.Module, attr: str) -> str:
        """Where the user's code assigned ``module.<attr>``; for an attribute of a class that is not
        the user's (``nn.Linear``'s ``weight``), where the module itself was assigned, and so on up."""
        found = self.assignments.source(module, attr)
        while not found and mpath:
            mpath, _, attr = mpath.rpartition(".")
            found = self.assignments.source(self.root.get_submodule(mpath), attr)
        return found

    def visit(self, value: Any, mpath: str, module: nn.Module, attr: str) -> None:
        """Report what the attribute ``attr`` of ``module`` (at ``mpath``) holds."""
        def source() -> str:  # asked only when there is something to report
            return self.source(mpath, module, attr)

        for found in held(value, join(mpath, attr), mpath, attr, self.seen, self.too_deep):
            if isinstance(found.value, torch.Tensor):
                self.tensor(found, source)
            else:
                self.module(found, source)

    def tensor(self, found: Held, source: Callable[[], str]) -> None:
        t: torch.Tensor = found.value
        path, owner, attr, parent, outer = found.path, found.owner, found.attr, found.parent, found.outer
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
        dev = device_of(t)
        stale = self.snapshot.buffers.get(key, "")
        is_param = isinstance(t, nn.Parameter)
        # a parameter in a plain container is missed by state_dict() and the optimizer on any device
        if self.on_device(dev, owner) and not stale and not is_param:
            return
        in_object = parent is not None and parent.is_object
        finding = rules.walk_finding(StrayTensor(
            path, attr, owner, held_tensor(t), self.expected(owner), source(), parameter=is_param,
            stale_buffer=stale, class_level=path in self.class_paths,
            container=outer.kind if outer and not outer.is_object else "",
            helper=outer.class_name if outer and outer.is_object else "",
            object_class=parent.class_name if parent and in_object else "",
            object_path=_holder_name(path) if in_object else "",
            in_dict=parent is not None and parent.kind == "dict", keep=self.placement is not None))
        self.findings.append(finding)
        self.by_origin[path] = finding

    def module(self, found: Held, source: Callable[[], str]) -> None:
        m: nn.Module = found.value
        path, owner, parent, outer = found.path, found.owner, found.parent, found.outer
        key = id(m)
        if key in self.modules or key in self.seen:
            return
        self.seen.add(key)
        # A back-reference from the unregistered module to the model (registered as its
        # submodule, or held in a plain attribute) must not pull the model's own state
        # into this module's count: what the model registers, or walks itself, is skipped.
        outer_modules = frozenset(self.modules)
        tensors: dict[int, tuple[str, torch.Tensor]] = {}
        named = (*m.named_parameters(remove_duplicate=False), *m.named_buffers(remove_duplicate=False))
        for name, tensor in named:
            if id(tensor) not in self.registered and id(tensor) not in self.snapshot.params:
                tensors.setdefault(id(tensor), (join(path, name), tensor))
        # plain tensor attributes of the unregistered module and its children
        sub = _Walker(m, self.target, Snapshot())
        sub.modules |= outer_modules
        sub.module_attributes(outer_modules=outer_modules)
        for tid, (tpath, t) in sub.found.items():
            tensors.setdefault(tid, (join(path, tpath), t))
        # off the target, its tensors are a crash waiting; on it, state_dict() and the optimizer
        # still miss them: reported either way, counting the off-target ones when there are any
        off = {tid for tid, (_, t) in tensors.items() if not self.on_device(device_of(t), owner)}
        reported = {tid: pt for tid, pt in tensors.items() if tid in off or not off}
        # a tensor also reachable elsewhere (a plain attribute of the model) is reported,
        # and counted in the summary's bytes, only where the walk met it first
        counted = [(p, t) for tid, (p, t) in reported.items() if tid not in self.seen]
        already = len(reported) - len(counted)
        for tid, (tpath, t) in tensors.items():
            if tid in self.seen:
                continue
            self.origins[tid] = tpath
            self.found[tid] = (tpath, t)
            self.seen.add(tid)
            skey = storage_key(t)
            if skey is not None:
                self.storages.setdefault(skey, tpath)
        if not reported:
            return
        in_object = parent is not None and parent.is_object
        finding = rules.walk_finding(UnregisteredModuleFound(
            type(m).__name__, path, owner, source(), len(counted), sum(tensor_nbytes(t) for _, t in counted),
            tuple(sorted({device_of(t) for _, t in reported.values()})), self.expected(owner),
            container=outer.kind if outer and not outer.is_object else "",
            object_class=parent.class_name if parent and in_object else "",
            object_path=_holder_name(path) if in_object else "",
            in_dict=parent is not None and parent.kind == "dict", reported_elsewhere=already))
        self.findings.append(finding)
        for tpath, _ in counted:
            self.by_origin[tpath] = finding


def walk(model: nn.Module, target: Device, snapshot: Snapshot | None = None,
         assignments: Assignments | None = None, placement: Placement | None = None) -> WalkResult:
    """Walk ``model`` (already moved to ``target``) and report what ``.to()`` left behind.

    ``snapshot`` is :meth:`Snapshot.take` of the model before the move; without
    it, stale references to pre-move parameters cannot be told from strays.
    ``assignments`` (recorded while the model was built, see
    :mod:`placecheck.checks.assignments`) give each finding its ``source``; without
    them it is read from the classes' source code. ``placement`` (``--device keep``: the model was
    not moved) judges each tensor against the device of the module holding it instead of ``target``.
    """
    walker = _Walker(model, target, snapshot or Snapshot(), assignments, placement)
    walker.registered_off_device()
    walker.module_attributes()
    stats = {
        "modules": len(walker.registry.modules),
        "parameters": len(walker.registry.parameters),
        "buffers": len(walker.registry.buffers),
        "unregistered_tensors": walker.strays,
    }
    notes = []
    if walker.too_deep:
        more = f" (and {len(walker.too_deep) - 1} more)" if len(walker.too_deep) > 1 else ""
        notes.append(f"walk: stopped {MAX_DEPTH} containers deep at {walker.too_deep[0]!r}{more}: "
                     "tensors nested deeper were not checked")
    for path, what in walker.owner_paths.items():
        notes.append(f"walk: {path!r} holds a {what} that holds the model itself: the framework's object "
                     "driving the model, not the model's state; not walked")
    return WalkResult(walker.findings, walker.origins, walker.storages, stats, walker.by_origin, notes)
