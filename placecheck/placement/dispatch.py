"""``--device-map``: place a meta-built model as ``from_pretrained(device_map=...)`` does, on simulated GPUs.

The map is accelerate's own: ``auto``/``balanced``/``balanced_low_0`` bound each
GPU's memory with ``accelerate.utils.get_balanced_memory`` and ``sequential``
with ``get_max_memory``, then ``accelerate.infer_auto_device_map`` places the
modules, with the model's ``no_split_module_classes`` (transformers'
``_get_no_split_modules``) exactly as transformers' ``_get_device_map`` calls
them. A ``FILE.json`` map is read and checked against the model instead.

The model is then placed as ``from_pretrained`` leaves it: each weight
materialised (as a fake tensor: no memory) on the device its module is mapped
to, weights mapped to ``cpu`` or ``disk`` on the CPU, and accelerate's
``dispatch_model`` attaches its ``AlignDevicesHook``s. Disk offload is
simulated as CPU offload (nothing is written): the hooks copy those weights to
the execution device on every forward either way.

Two shims let accelerate run on fake tensors (:func:`accelerate_on_fake_tensors`;
both only while a device-mapped audit runs): accelerate rebuilds a parameter
from its class (``type(param)(value)``), and a fake parameter's class is
``FakeTensor``, which cannot be built that way, so accelerate's module sees
``nn.Parameter`` there; and accelerate recognises tied weights by
``data_ptr()``, which is 0 for every fake tensor (all weights would look tied),
so a fake tensor's ``data_ptr()`` is its storage's identity plus its offset.

accelerate is an optional extra: :func:`accelerate_module` says how to install it.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.codes import Code
from placecheck.basics.devices import DEVICE_MAP_CHOICES, human_bytes, parse_size
from placecheck.basics.errors import UsageError, one_line
from placecheck.basics.patching import patch
from placecheck.basics.quiet import quiet
from placecheck.basics.values import Device
from placecheck.checks.expected import Expected, Placement
from placecheck.engines.cudaapi import cuda_queries_simulated
from placecheck.findings import rules
from placecheck.findings.events import Copy
from placecheck.findings.finding import Finding
from placecheck.findings.report import DeviceMap, StageRow

INSTALL_HINT = "pip install 'placecheck[accelerate]'"

DEFAULT_GPU_MEMORY = 80 * 2**30
"""Each simulated GPU's memory when ``--gpu-memory`` is not given: what the simulation's
``torch.cuda.mem_get_info`` reports."""

OFFLOADED = ("cpu", "disk")

_WHY_ACCELERATE = ("accelerate rebuilds a parameter from its class (type(param)(value)) and tells tensors "
                   "apart by data_ptr(); a fake parameter's class and a fake tensor's pointer must read as "
                   "a real one's")


def accelerate_module() -> Any:
    """``import accelerate``, or a UsageError saying how to install it."""
    try:
        import accelerate
    except ImportError:
        raise UsageError(f"--device-map needs accelerate, which is not installed: {INSTALL_HINT}") from None
    return accelerate


def device_name(value: int | str) -> Device:
    """accelerate's device (``0``, ``"cpu"``, ``"disk"``) as the report writes it (``cuda:0``, ``cpu``)."""
    return Device("cuda", value) if isinstance(value, int) else Device.of(value)


@dataclass(frozen=True)
class MapPlan:
    """Where each module goes, how the map was made, and what each device holds."""

    entries: tuple[tuple[str, int | str], ...]
    """Module path -> accelerate's device (a GPU index, ``"cpu"`` or ``"disk"``), in the map's order."""
    how: str
    """``auto``, ``balanced``, ``balanced_low_0``, ``sequential`` or the map file's path."""
    gpus: int
    gpu_memory: int | None
    """Bytes per GPU the map was computed for (or is checked against); None: not given for a file."""
    cpu_memory: int | None = None
    module_bytes: tuple[int, ...] = ()
    """Bytes of parameters and buffers of each entry (same order as :attr:`entries`)."""
    no_split: tuple[str, ...] = ()
    """The module classes accelerate was told never to split."""
    notes: tuple[str, ...] = field(default=())

    def as_accelerate(self) -> dict[str, int | str]:
        """The map as ``dispatch_model`` and ``infer_auto_device_map`` write it."""
        return dict(self.entries)

    def bytes_per_device(self) -> dict[Device, int]:
        """``{"cuda:0": bytes, ..., "cpu": bytes, "disk": bytes}``: every GPU, then offload targets used."""
        totals = {device_name(i): 0 for i in range(self.gpus)}
        for (_, device), nbytes in zip(self.entries, self.module_bytes, strict=True):
            totals[device_name(device)] = totals.get(device_name(device), 0) + nbytes
        return totals

    def offloaded(self) -> list[tuple[str, str, int]]:
        """``(module, "cpu" | "disk", bytes)`` for each entry whose weights the hooks copy per forward."""
        return [(name, str(device), nbytes)
                for (name, device), nbytes in zip(self.entries, self.module_bytes, strict=True)
                if device in OFFLOADED]

    def over_budget(self) -> list[tuple[str, int, int]]:
        """``(device, bytes, budget)`` for each GPU holding more than ``--gpu-memory``."""
        if self.gpu_memory is None:
            return []
        return [(dev, nbytes, self.gpu_memory) for dev, nbytes in self.bytes_per_device().items()
                if dev.startswith("cuda:") and nbytes > self.gpu_memory]

    def summary(self) -> list[str]:
        """Lines for the report's notes: the map's origin, bytes per device against the budget."""
        origin = (f"computed by accelerate's infer_auto_device_map ({self.how})"
                  if self.how in DEVICE_MAP_CHOICES else f"read from {self.how}")
        budget = f" of {human_bytes(self.gpu_memory)}" if self.gpu_memory is not None else ""
        per_device = ", ".join(
            f"{dev} {human_bytes(n)}{budget if dev.startswith('cuda:') else ''}"
            for dev, n in self.bytes_per_device().items())
        lines = [f"device map: {origin}, {len(self.entries)} entries on {self.gpus} simulated GPU"
                 f"{'s' if self.gpus != 1 else ''}: {per_device}"]
        if self.no_split:
            lines.append(f"device map: modules never split across devices: {', '.join(self.no_split)}")
        lines.extend(f"device map: {dev} holds {human_bytes(n)}, more than --gpu-memory {human_bytes(b)}"
                     for dev, n, b in self.over_budget())
        lines.extend(self.notes)
        return lines


# ---- computing or reading the map ---------------------------------------------------------------


def gpus_named(spec: str) -> int | None:
    """The GPU count a map file needs (its highest GPU index + 1), read before the model is built;
    None for a computed map. Raises a UsageError for a file that cannot be read or is not a map."""
    if spec in DEVICE_MAP_CHOICES:
        return None
    indices = [v for v in _read_map_file(spec).values() if isinstance(v, int)]
    return max(indices) + 1 if indices else 1


def plan_device_map(model: nn.Module, spec: str, gpus: int | None, gpu_memory: str | None,
                    cpu_memory: str | None) -> MapPlan:
    """The map ``spec`` names for ``model`` (built on meta), on ``gpus`` simulated GPUs."""
    accelerate_module()
    from accelerate.utils import compute_module_sizes

    gpu_bytes = parse_size(gpu_memory, "--gpu-memory") if gpu_memory is not None else None
    cpu_bytes = parse_size(cpu_memory, "--cpu-memory") if cpu_memory is not None else None
    if spec in DEVICE_MAP_CHOICES:
        count = gpus or 1
        budget: int | None = gpu_bytes if gpu_bytes is not None else DEFAULT_GPU_MEMORY
        no_split = no_split_modules(model, spec)
        raw = compute_device_map(model, spec, count, budget or DEFAULT_GPU_MEMORY, cpu_bytes, no_split)
        entries = tuple(raw.items())
        notes: tuple[str, ...] = ()
        if gpu_bytes is None:
            notes = (f"device map: --gpu-memory not given: each GPU has {human_bytes(DEFAULT_GPU_MEMORY)}, "
                     "what the simulated GPU reports",)
    else:
        entries = tuple(_checked_map(model, spec, gpus).items())
        count = gpus or max([v for _, v in entries if isinstance(v, int)], default=0) + 1
        budget, no_split, notes = gpu_bytes, [], ()
    sizes = compute_module_sizes(model)
    return MapPlan(entries=entries, how=spec, gpus=count, gpu_memory=budget, cpu_memory=cpu_bytes,
                     module_bytes=tuple(sizes.get(name, 0) for name, _ in entries),
                     no_split=tuple(no_split), notes=notes)


def no_split_modules(model: nn.Module, spec: str) -> list[str]:
    """The classes ``from_pretrained`` tells accelerate never to split: a transformers model's own
    ``_get_no_split_modules(device_map)`` (its declared contract for device maps); none otherwise."""
    get = getattr(model, "_get_no_split_modules", None)
    if callable(get):
        try:
            return list(get(spec))
        except Exception as exc:  # transformers raises for a model that cannot be split at all
            raise UsageError(f"--device-map {spec}: {one_line(exc)}") from None
    return []


def compute_device_map(model: nn.Module, spec: str, gpus: int, gpu_memory: int, cpu_memory: int | None,
                       no_split: list[str]) -> dict[str, int | str]:
    """accelerate's map for ``spec``, computed as transformers' ``_get_device_map`` computes it.

    ``max_memory`` is ``gpu_memory`` on each of ``gpus`` GPUs (plus ``cpu_memory`` on the CPU when
    given); ``sequential`` fills the GPUs in order (``get_max_memory``), the others balance them
    (``get_balanced_memory``, ``low_zero`` for ``balanced_low_0``). Simulated GPUs have nothing
    reserved, so transformers' "unused reserved memory" adds nothing.
    """
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory, get_max_memory

    max_memory: dict[int | str, int] = {i: gpu_memory for i in range(gpus)}
    if cpu_memory is not None:
        max_memory["cpu"] = cpu_memory
    with cuda_queries_simulated(gpus), quiet("accelerate", logging.ERROR, warnings_too=True):
        if spec == "sequential":
            inferred = get_max_memory(dict(max_memory))
        else:
            low_zero = spec == "balanced_low_0"
            inferred = get_balanced_memory(model, max_memory=dict(max_memory),
                                           no_split_module_classes=no_split, low_zero=low_zero)
        for key, given in max_memory.items():  # respect the budget the user gave, as transformers does
            inferred[key] = min(inferred[key], given)
        computed = infer_auto_device_map(model, max_memory=inferred, no_split_module_classes=no_split)
    return dict(computed)


def _read_map_file(path: str) -> dict[str, int | str]:
    """A map file as accelerate's values (GPU index, ``cpu``, ``disk``); UsageErrors say what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        why = exc.strerror or one_line(exc)
        raise UsageError(f"--device-map {path}: cannot read it ({why}): give {', '.join(DEVICE_MAP_CHOICES)} "
                         "or a JSON file mapping module names to devices") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        msg = getattr(exc, "msg", str(exc))
        where = f" (line {exc.lineno}: {msg})" if hasattr(exc, "lineno") else ""
        raise UsageError(f"--device-map {path} is not JSON{where}: write an object such as "
                         '{"encoder": 0, "decoder": 1, "lm_head": "cpu"}') from None
    if not isinstance(data, dict) or not data:
        raise UsageError(f"--device-map {path}: expected a JSON object mapping module names to devices, "
                         'such as {"encoder": 0, "decoder": 1}')
    return {name: _map_device(path, name, value) for name, value in data.items()}


def _map_device(path: str, name: str, value: Any) -> int | str:
    """A map file's device (``1``, ``"cuda:1"``, ``"cuda"``, ``"cpu"``, ``"disk"``) as accelerate's."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in OFFLOADED:
            return text
        with contextlib.suppress(UsageError):
            device = Device.parse(text)
            if device.type == "cuda":
                return device.ordinal
    raise UsageError(f"--device-map {path}: {name!r} has device {value!r}: use a GPU index (0), "
                     '"cuda:N", "cpu" or "disk"')


def _checked_map(model: nn.Module, path: str, gpus: int | None) -> dict[str, int | str]:
    """The map file, checked against the model and ``--gpus`` as ``dispatch_model`` would need it."""
    raw = _read_map_file(path)
    for name, value in raw.items():
        if isinstance(value, int) and gpus is not None and value >= gpus:
            raise UsageError(f"--device-map {path} puts {name!r} on cuda:{value}, beyond --gpus {gpus}: "
                             f"use --gpus {value + 1} or change the map")
    modules = dict(model.named_modules())
    tensors = list(model.state_dict(keep_vars=True))  # in the model's order: the first one named is stable
    unknown = [name for name in raw if name != "" and name not in modules and name not in set(tensors)]
    if unknown:
        top = ", ".join(n for n, _ in model.named_children()) or "none"
        raise UsageError(f"--device-map {path} names {unknown[0]!r}, which is not a module of "
                         f"{type(model).__name__} (its top-level modules: {top}): fix the map")
    uncovered = [t for t in tensors if not any(_covers(name, t) for name in raw)]
    if uncovered:
        raise UsageError(f"--device-map {path} gives no device to {uncovered[0]!r}"
                         f"{f' and {len(uncovered) - 1} more' if len(uncovered) > 1 else ''}: map it or a "
                         "module that holds it")
    return raw


def _covers(prefix: str, name: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


# ---- placing the model -----------------------------------------------------------------------------


def device_for(name: str, device_map: Mapping[str, int | str]) -> int | str | None:
    """The device of tensor or module ``name`` under ``device_map``: its longest mapped prefix."""
    best: str | None = None
    for prefix in device_map:
        if _covers(prefix, name) and (best is None or len(prefix) > len(best)):
            best = prefix
    return device_map[best] if best is not None else None


def materialise(model: nn.Module, device_map: MapPlan, fake_mode: Any) -> dict[str, torch.Tensor]:
    """Give each registered meta tensor a fake one on its mapped device, as ``from_pretrained``'s
    loading leaves it before dispatch (offloaded weights on the CPU); return the offloaded ones by
    name (the hooks keep their data and copy it to the execution device on every forward).

    Shared tensors (tied weights) stay shared. Tensors no module registers are left on meta: the
    audit puts them on the default device, as for any meta build.
    """
    from placecheck.engines.engine import fake_tensor_like

    placed = device_map.as_accelerate()
    replaced: dict[int, torch.Tensor] = {}
    offloaded: dict[str, torch.Tensor] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for store in (module._parameters, module._buffers):
            for name, t in list(store.items()):
                if t is None or t.device.type != "meta":
                    continue
                if id(t) not in replaced:
                    full = f"{module_name}.{name}" if module_name else name
                    where = device_for(full, placed)
                    dev = torch.device("cpu") if where is None or where in OFFLOADED else torch.device(
                        "cuda", int(where))
                    new = fake_tensor_like(fake_mode, t, dev)
                    if isinstance(t, nn.Parameter):
                        new = nn.Parameter(new, requires_grad=t.requires_grad)
                    replaced[id(t)] = new
                    if where in OFFLOADED:
                        offloaded[full] = new
                store[name] = replaced[id(t)]
    return offloaded


def offloaded_copies(model: nn.Module, offloaded: Mapping[str, torch.Tensor]) -> dict[int, str]:
    """``id -> weight name`` of every tensor ``model`` reaches that holds an offloaded weight's data:
    what accelerate's hooks keep (inside their weights map) to load on every forward. Told by the
    storage they share with the weight, never by where they are held."""
    from placecheck.checks.state import reachable_tensors

    by_storage = {_storage_id(t): name for name, t in offloaded.items()}
    found: dict[int, str] = {}
    for t in reachable_tensors(model):
        name = by_storage.get(_storage_id(t))
        if name is not None:
            found[id(t)] = name
    return found


def _storage_id(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def dispatch(model: nn.Module, device_map: MapPlan) -> nn.Module:
    """accelerate's ``dispatch_model`` with the arguments ``from_pretrained`` passes; disk is
    simulated as CPU offload (nothing is written). Call inside :func:`accelerate_on_fake_tensors`."""
    from accelerate import dispatch_model

    # GPUs as "cuda:K": torch.device(K) asks for a real accelerator on a CPU-only build of torch; the
    # main device as dispatch_model would pick it from the indices (a set of strings has no stable order)
    simulated = {name: "cpu" if device == "disk" else device_name(device)
                 for name, device in device_map.entries}
    skip_keys = getattr(model, "_skip_keys_device_placement", None)
    main = main_device(device_map)
    try:
        with quiet("accelerate", logging.ERROR, warnings_too=True):
            dispatched = dispatch_model(model, simulated, main_device=None if main == "cpu" else main,
                                        skip_keys=skip_keys)
    except ValueError as exc:  # accelerate's own check of the map against the model
        raise UsageError(f"--device-map {device_map.how}: accelerate refused it: {one_line(exc)}") from None
    return dispatched if isinstance(dispatched, nn.Module) else model


@contextlib.contextmanager
def accelerate_on_fake_tensors() -> Iterator[None]:
    """While a device-mapped model is dispatched and run: the two shims the module docstring explains."""
    import accelerate.utils.modeling as modeling

    from placecheck.engines.compat import FakeTensor

    def param_type(obj: Any) -> type:
        if isinstance(obj, FakeTensor) and getattr(obj, "_is_param", False):
            return nn.Parameter
        return builtins.type(obj)

    def data_ptr(self: torch.Tensor) -> int:
        return int(self.untyped_storage()._cdata) + int(self.storage_offset()) * self.element_size()

    with patch(modeling, "type", param_type, _WHY_ACCELERATE, create=True), \
            patch(FakeTensor, "data_ptr", data_ptr, _WHY_ACCELERATE):
        yield


# ---- judging the dispatched model ------------------------------------------------------------------


def main_device(device_map: MapPlan) -> Device:
    """The execution device of offloaded modules, chosen as ``dispatch_model`` chooses it (the first
    device of the map that is not ``cpu`` or ``disk``; ``cpu`` when there is none)."""
    devices = {device for _, device in device_map.entries} - set(OFFLOADED)
    return device_name(next(iter(devices))) if devices else Device("cpu")  # dispatch_model: list(set)[0]


class MappedPlacement(Placement):
    """Where each module of a dispatched model computes: the device of the map entry holding it, and
    for entries offloaded to ``cpu`` or ``disk`` the execution device their hooks load the weights to.
    Modules no entry covers (the root, when the map names its children) are judged from their state,
    as :class:`~placecheck.checks.expected.Placement` does.

    ``held`` are the copies of offloaded weights the hooks keep (:func:`offloaded_copies`): copying one
    in forward copies that weight (PC208).
    """

    def __init__(self, model: nn.Module, device_map: MapPlan, held: Mapping[int, str]) -> None:
        super().__init__(model)
        self._map = device_map.as_accelerate()
        self._main = main_device(device_map)
        self._held = dict(held)
        self._modules = {path for path, _ in model.named_modules(remove_duplicate=False)}

    def expected(self, path: str) -> Expected:
        module = path
        while module not in self._modules and module:  # a module in a plain list (heads[0]): its holder
            cut = max(module.rfind("."), module.rfind("["), module.rfind("{"))
            module = module[:cut] if cut > 0 else ""
        where = device_for(module, self._map)
        if where is None:
            return super().expected(path)
        return Expected((self._main if where in OFFLOADED else device_name(where),), "device map")

    def held_weights(self) -> dict[int, str]:
        return dict(self._held)


def report_map(device_map: MapPlan, copies: Iterable[Copy] = ()) -> DeviceMap:
    """The report's device map: one row per map entry (module -> device, bytes), each GPU's budget, and
    the copies between devices of the forward (accelerate's hooks' included)."""
    from placecheck.placement.devicemap import transfers

    main = main_device(device_map)
    rows = []
    for (name, device), nbytes in zip(device_map.entries, device_map.module_bytes, strict=True):
        note = (f"offloaded to {device}: its weights are copied to {main} on every forward"
                if device in OFFLOADED else "")
        rows.append(StageRow(name, (device_name(device),), nbytes, (), note))
    budgets = tuple((device_name(i), device_map.gpu_memory) for i in range(device_map.gpus)
                    if device_map.gpu_memory is not None)
    return DeviceMap(tuple(rows), transfers(copies), budgets, rows="map entry")


def offload_findings(findings: Iterable[Finding], copies: Iterable[Copy], device_map: MapPlan,
                     offloaded: Mapping[str, torch.Tensor]) -> list[Finding]:
    """``findings`` with one PC208 per offloaded map entry whose weights the forward copied, in the
    rule's words for an offload, instead of the per-line PC208s of those copies: what a user decides
    on is the entry, not each of its tensors. Decided from the copies the forward made."""
    placed = device_map.as_accelerate()
    main = main_device(device_map)
    kept = [f for f in findings
            if not (f.code == Code.PC208 and dict(f.details).get("weights", "") in offloaded)]
    by_entry: dict[str, list[Copy]] = {}
    for c in copies:
        if c.weights in offloaded:
            by_entry.setdefault(_entry_of(c.weights, placed), []).append(c)
    for entry, moved in by_entry.items():
        device = str(placed[entry])
        nbytes = sum(c.nbytes for c in moved)
        weights = list(dict.fromkeys(c.weights for c in moved))
        kept.append(rules.offloaded_weights(entry, device, main, weights, nbytes, moved[0].site.source))
    return kept


def _entry_of(name: str, device_map: Mapping[str, int | str]) -> str:
    """The map entry (its longest prefix) that places tensor ``name``."""
    return max((p for p in device_map if _covers(p, name)), key=len)
