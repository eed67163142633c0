"""Checkpoint pre-flight as a :class:`~placecheck.findings.report.Report`, and loading one into a model.

:func:`check_checkpoint` is what ``placecheck checkpoint FILE`` runs: it reads
the file's index (:mod:`~placecheck.checkpoint.metadata`), checks the
pickle's globals (PC306), the saved devices against the target machine
(PC301) and, given a model, the keys, shapes and dtypes (PC302-PC305).

:func:`load_into_model` is what ``placecheck audit TARGET --checkpoint FILE``
runs before moving the model: the same checks, then a real load as a
training script does it (``torch.load(map_location=...)`` then
``model.load_state_dict``), always ``weights_only=True`` unless ``trust``.
A ``.pt2`` program is not loaded with ``torch.export.load`` (which unpickles
its sample inputs and pickled payloads with ``weights_only=False``): its
state_dict is rebuilt from the raw weight files (:mod:`~placecheck.checkpoint.pt2`).

Order matters for safety: no loader runs before every pickle's globals are
checked, and with unsafe globals none runs at all without ``trust``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from placecheck.basics.codes import Code
from placecheck.basics.devices import human_bytes
from placecheck.basics.errors import LoadError, PlacecheckError, UsageError, one_line
from placecheck.basics.options import CheckpointOptions
from placecheck.basics.quiet import quiet
from placecheck.basics.values import Device
from placecheck.checkpoint.compare import Comparison, compare_state_dicts
from placecheck.checkpoint.metadata import (
    CheckpointFormat,
    CheckpointMeta,
    TensorMeta,
    find_state_dict,
    iter_tensors,
    read_checkpoint,
    state_dict_candidates,
    top_level_keys,
)
from placecheck.checkpoint.pt2 import load_pt2_state_dict
from placecheck.engines.compat import torch_note
from placecheck.findings import rules
from placecheck.findings.events import TensorSpec
from placecheck.findings.finding import Finding
from placecheck.findings.report import Report
from placecheck.findings.rules import selected


class UnsafeCheckpointError(LoadError):
    """The checkpoint needs code execution to load and ``trust`` was not given.

    ``report`` holds the PC306 finding, for the CLI to print before the error line.
    """

    def __init__(self, message: str, report: Report | None = None) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class DeviceUsage:
    """Tensors and bytes the file keeps for one saved location tag."""

    location: str
    tensors: int
    storages: int
    nbytes: int
    first_key: str


@dataclass(frozen=True)
class CheckpointResult:
    """A checkpoint report plus what the CLI needs beyond it."""

    report: Report
    meta: CheckpointMeta
    refused: bool
    """True when loading would run code and ``trust`` was not given: exit 2."""


def device_usage(meta: CheckpointMeta) -> list[DeviceUsage]:
    """Per saved location: tensors, distinct storages and their bytes, in location order."""
    tensors: dict[str, int] = defaultdict(int)
    first: dict[str, str] = {}
    for path, t in [*iter_tensors(meta.root), *meta.constants.items()]:
        tensors[t.location] += 1
        first.setdefault(t.location, path)
    storages: dict[str, int] = defaultdict(int)
    nbytes: dict[str, int] = defaultdict(int)
    for s in meta.storages:
        storages[s.location] += 1
        nbytes[s.location] += s.nbytes
    locations = sorted(set(tensors) | set(storages), key=_location_order)
    return [DeviceUsage(loc, tensors[loc], storages[loc], nbytes[loc], first.get(loc, ""))
            for loc in locations]


def _location_order(loc: str) -> tuple[str, int]:
    if not loc:  # a storage whose location the file does not say
        return "", -1
    device = Device.of(loc)
    return device.type, device.ordinal if ":" in device else -1


def device_table(usage: list[DeviceUsage], fmt: CheckpointFormat) -> str:
    """The saved-devices table (a report note)."""
    from tabulate import tabulate

    rows = [(u.location or "(not recorded)", u.tensors, u.storages, human_bytes(u.nbytes)) for u in usage]
    rows.append(("total", sum(u.tensors for u in usage), sum(u.storages for u in usage),
                 human_bytes(sum(u.nbytes for u in usage))))
    title = "saved devices (location tags in the file):"
    if fmt is CheckpointFormat.SAFETENSORS:
        title = "saved devices (safetensors records none; tensors load where load_file(device=...) says):"
    return title + "\n" + tabulate(rows, headers=("device", "tensors", "storages", "bytes"),
                                   tablefmt="simple", colalign=("left", "right", "right", "right"))


def target_gpus(device: Device, engine: Any) -> int:
    """How many GPUs the target machine has: the simulated count, or the real one."""
    if engine.simulated:
        return int(engine.gpus)
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _available(location: str, device: Device, gpus: int) -> bool:
    if not location:
        return True
    saved = Device.of(location)
    if saved.type in ("cpu", "meta"):
        return True
    if saved.type == "cuda":
        return saved.ordinal < gpus
    return saved.type == device.type


def _loader(meta: CheckpointMeta) -> str:
    """The function that restores this format's tensors where they were saved."""
    return {CheckpointFormat.TORCHSCRIPT: "torch.jit.load",
            CheckpointFormat.TORCH_EXPORT: "torch.export.load"}.get(meta.format, "torch.load")


def _load_call(meta: CheckpointMeta, device: Device) -> str:
    if meta.format is CheckpointFormat.TORCHSCRIPT:
        return f'torch.jit.load({json.dumps(meta.path)}, map_location="{device}")'
    return f'torch.load({json.dumps(meta.path)}, map_location="{device}", weights_only=True)'


def device_findings(meta: CheckpointMeta, device: Device, gpus: int) -> list[Finding]:
    """PC301: storages saved on devices the target machine lacks, or on several devices."""
    usage = [u for u in device_usage(meta) if u.location]
    loader = _loader(meta)
    hint = rules.checkpoint_load_hint(loader, _load_call(meta, device), device)
    out = [rules.checkpoint_on_absent_device(u.location, u.tensors, u.nbytes, u.first_key, loader=loader,
                                             gpus=gpus, target=device, hint=hint)
           for u in usage if not _available(u.location, device, gpus)]
    if not out and len(usage) > 1:
        out.append(rules.checkpoint_on_several_devices([(u.location, u.tensors, u.nbytes) for u in usage],
                                                       loader=loader, target=device, hint=hint))
    return out


def unsafe_globals_text(meta: CheckpointMeta) -> str:
    """The unsafe globals, the first eight, for one-line messages (as PC306's message names them)."""
    return rules.unsafe_globals_text(meta.unsafe_globals)


def unsafe_finding(meta: CheckpointMeta, trusted: bool, loaded: bool = True) -> Finding:
    """PC306 for a pickle that names globals outside torch's weights_only allowlist."""
    return rules.unsafe_checkpoint(meta.unsafe_globals, trusted=trusted, loaded=loaded)


def _spec(t: Any) -> TensorSpec:
    if isinstance(t, TensorMeta):
        return t.shape, t.dtype
    return tuple(int(d) for d in t.shape), str(t.dtype).removeprefix("torch.")


def model_state_specs(model: Any) -> dict[str, TensorSpec]:
    """``model.state_dict()`` as shapes and dtypes (non-persistent buffers are not in it)."""
    return {k: _spec(v) for k, v in model.state_dict().items() if hasattr(v, "shape")}


def _build_for_keys(factory: Callable[[], Any]) -> Any:
    """Build a model only to read its state_dict: on the meta device (no memory), else normally."""
    import torch

    try:
        with torch.device("meta"):
            return factory()
    except LoadError:
        raise
    except Exception:  # construction code that needs real values (.item() in an init)
        return factory()


def _trusted_state(meta: CheckpointMeta) -> Any:
    """``torch.load(weights_only=False)``: runs the file's code; only ever called with ``trust``."""
    import torch

    try:
        with quiet("torch", logging.CRITICAL + 1, warnings_too=True):
            obj = torch.load(meta.path, map_location="meta", weights_only=False)
    except Exception as exc:
        raise LoadError(f"torch.load({meta.path!r}, weights_only=False) raised {one_line(exc)} "
                        "(--debug shows the traceback)") from exc
    if isinstance(obj, torch.nn.Module):
        return dict(obj.state_dict())
    return obj


def _as_meta_tree(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """A loaded object's tensors as TensorMeta, so :func:`find_state_dict` reads it like the index.

    ``memo`` keeps shared and cyclic containers one object (a config dict that holds its parent).
    """
    import torch

    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.nn.Module):
        obj = dict(obj.state_dict())
    if isinstance(obj, torch.Tensor):
        return TensorMeta(tuple(obj.shape), str(obj.dtype).removeprefix("torch."), str(obj.device))
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        memo[id(obj)] = out
        out.update((k, _as_meta_tree(v, memo)) for k, v in obj.items())
        return out
    if isinstance(obj, list):
        items: list[Any] = []
        memo[id(obj)] = items
        items.extend(_as_meta_tree(v, memo) for v in obj)
        return items
    if isinstance(obj, tuple):
        return tuple(_as_meta_tree(v, memo) for v in obj)
    return obj


def _notes(meta: CheckpointMeta, sd_path: str | None, n_keys: int, model_name: str | None,
           others: list[str], loaded_trusted: bool = False) -> list[str]:
    how = ("loaded with torch.load(weights_only=False) because --trust was given (its code ran); "
           "saved devices read from the index" if loaded_trusted else
           "read from the index only, no tensor data was loaded")
    notes = [f"format: {meta.format}, {human_bytes(meta.size)}; {how}", torch_note()]
    notes.append(device_table(device_usage(meta), meta.format))
    if sd_path is not None:
        where = f"under {sd_path!r}" if sd_path else "at the top level"
        line = f"state_dict: {n_keys} tensors {where}"
        extra = [p for p in others if p != sd_path]
        if extra:
            line += f" (also found: {', '.join(extra)}; pick one with --key)"
        notes.append(line + (f"; compared with {model_name}" if model_name else ""))
    if meta.format is CheckpointFormat.TORCHSCRIPT:
        notes.append("TorchScript archive: load it with torch.jit.load(path, map_location=...); "
                     "its code is TorchScript, not pickled Python")
    if meta.constants:
        notes.append(f"{len(meta.constants)} constant tensor(s) (non-persistent buffers, lifted constants) "
                     "are placed on a device but are not in ExportedProgram.state_dict")
    if meta.metadata:
        shown = ", ".join(f"{k}={v}" for k, v in list(meta.metadata.items())[:5])
        notes.append(f"safetensors metadata: {shown}")
    return notes


def _stats(meta: CheckpointMeta) -> dict[str, int]:
    usage = device_usage(meta)
    stats = {"tensors": sum(u.tensors for u in usage), "storages": sum(u.storages for u in usage),
             "bytes": sum(u.nbytes for u in usage), "devices": len([u for u in usage if u.location]),
             "file_bytes": meta.size, "unsafe_globals": len(meta.unsafe_globals)}
    for u in usage:
        label = u.location or "unrecorded"
        stats[f"tensors@{label}"] = u.tensors
        stats[f"bytes@{label}"] = u.nbytes
    return stats


def check_checkpoint(
    path: str,
    *,
    model: Callable[[], Any] | Any | None = None,
    options: CheckpointOptions | None = None,
    device: str = "cuda",
    engine: str = "auto",
    gpus: int | None = None,
    key: str | None = None,
    trust: bool = False,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    model_name: str | None = None,
    group: bool = True,
) -> CheckpointResult:
    """Inspect ``path`` for loading on ``device`` (and into ``model``, an ``nn.Module`` or a factory).

    ``group``: findings of one root cause are one problem (every size mismatch of a checkpoint saved
    from a differently sized model is one PC304); ``False`` lists each (``--no-group``).
    The keywords besides ``model`` and ``model_name`` are the fields of
    :class:`~placecheck.basics.options.CheckpointOptions` (``key`` is its ``checkpoint_key``);
    ``options=`` passes a whole options object instead (then give none of them), as
    ``placecheck checkpoint`` does.
    """
    from placecheck.engines.engine import EngineChoice, choose_engine

    given = CheckpointOptions(device=device, engine=engine, gpus=gpus, checkpoint_key=key, trust=trust,
                              select=select, ignore=ignore, group=group)  # type: ignore[arg-type]
    if options is None:
        options = given
    elif given != CheckpointOptions():
        raise UsageError("check_checkpoint(): pass options= or keyword arguments, not both")
    options.check()
    dev = options.target_device
    eng = choose_engine(dev, EngineChoice(options.engine), options.gpus)
    codes = selected(options.select, options.ignore)
    key, trust, group = options.checkpoint_key, options.trust, options.group
    meta = read_checkpoint(path)
    findings: list[Finding] = []
    refused = meta.needs_code_execution and not trust
    tree_meta = meta
    # Only a pickled object tree (a whole nn.Module) needs the real load to show its state_dict;
    # a .pt2's or TorchScript's index already is one.
    loaded_trusted = trust and meta.needs_code_execution and \
        meta.format in (CheckpointFormat.TORCH_ZIP, CheckpointFormat.TORCH_LEGACY)
    if meta.needs_code_execution:
        findings.append(unsafe_finding(meta, trusted=trust, loaded=loaded_trusted))
        if loaded_trusted:
            tree_meta = dataclasses.replace(meta, root=_as_meta_tree(_trusted_state(meta)))
    findings += device_findings(meta, dev, target_gpus(dev, eng))
    found = find_state_dict(tree_meta, key)
    sd_path, n_keys, name = None, 0, None
    if found is not None:
        sd_path, n_keys = found[0], len(found[1])
    if model is not None:
        if found is None:
            raise UsageError(_no_state_dict(meta, path))
        name = model_name or "the model"
        import torch

        built = model if isinstance(model, torch.nn.Module) else _build_for_keys(model)
        comparison = compare_state_dicts({k: _spec(v) for k, v in found[1].items()},
                                         model_state_specs(built), name)
        findings += comparison.findings
    notes = _notes(meta, sd_path, n_keys, name, state_dict_candidates(tree_meta), loaded_trusted)
    if model is not None and comparison.architecture_note:
        notes.append(comparison.architecture_note)
    if found is None:
        notes.append(_no_state_dict(tree_meta, path))
    if refused:
        notes.append("refused: loading would run code from the file; rerun with --trust to allow it")
    report = Report.build(path, dev, eng.name, [f for f in findings if f.code in codes],
                          notes, _stats(meta), group=group)
    return CheckpointResult(report, meta, refused)


def _no_state_dict(meta: CheckpointMeta, path: str) -> str:
    """The one-line error when no state_dict is found: an empty file's, or one to name with --key."""
    if not meta.storages and not any(True for _ in iter_tensors(meta.root)):
        return (f"{path!r} holds no tensors at all (an empty state_dict?): check that it was saved after "
                "the model was built, e.g. torch.save(model.state_dict(), path)")
    return (f"no state_dict found in {path!r} (top-level keys: "
            f"{', '.join(top_level_keys(meta)[:20]) or 'none'}): name it with --key")


# --- loading into a model for `audit --checkpoint` -------------------------------------------------

@dataclass(frozen=True)
class Loaded:
    """What loading a checkpoint into a model found and did."""

    findings: tuple[Finding, ...]
    notes: tuple[str, ...]


def _navigate(obj: Any, path: str) -> Any:
    """Follow a dotted path found in the index through the really loaded object."""
    import torch

    if not path:
        return obj
    parts = path.split(".")
    while parts:
        children = dict(obj.state_dict()) if isinstance(obj, torch.nn.Module) else obj
        for n in range(len(parts), 0, -1):
            candidate = ".".join(parts[:n])
            if isinstance(children, dict) and candidate in children:
                obj, parts = children[candidate], parts[n:]
                break
        else:
            raise LoadError(f"the loaded checkpoint has no {path!r} although its index does: "
                            "the file may have changed while placecheck read it")
    return obj


def _real_load(meta: CheckpointMeta, map_location: str, trust: bool) -> Any:
    try:
        with quiet("torch", logging.CRITICAL + 1, warnings_too=True):
            return _load_by_format(meta, map_location, trust)
    except PlacecheckError:
        raise
    except Exception as exc:
        raise LoadError(f"loading {meta.path!r} with map_location={map_location!r} raised "
                        f"{one_line(exc)} (--debug shows the traceback)") from exc


def _load_by_format(meta: CheckpointMeta, map_location: str, trust: bool) -> Any:
    """The state (or the loaded object) as a training script would load it; no code runs without trust."""
    import torch

    if meta.format is CheckpointFormat.SAFETENSORS:
        if map_location == "meta":
            with torch.device("meta"):
                return {k: torch.empty(t.shape, dtype=getattr(torch, t.dtype))
                        for k, t in meta.root.items()}
        try:
            from safetensors.torch import load_file
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != "safetensors":
                raise
            raise UsageError(f"loading the tensors of {meta.path!r} needs safetensors: "
                             "pip install 'placecheck[safetensors]'") from None
        return load_file(meta.path, device=map_location)
    if meta.format is CheckpointFormat.TORCHSCRIPT:
        scripted = torch.jit.load(meta.path, map_location=map_location)  # type: ignore[no-untyped-call]
        return dict(scripted.state_dict())
    if meta.format is CheckpointFormat.TORCH_EXPORT:
        if meta.pt2 is None:
            raise LoadError(f"{meta.path!r}: the .pt2 index was not read")
        return load_pt2_state_dict(meta.path, meta.pt2, map_location, trust)
    return torch.load(meta.path, map_location=map_location, weights_only=not trust)


def strict_load_verdict(comparison: Comparison) -> str:
    """What ``model.load_state_dict(state)`` (``strict=True``, the default) would do with this checkpoint.

    The audit loads leniently (prefix fixed, unloadable keys left out) so that it
    can go on; a training script that loads strictly gets an exception instead,
    and the note must not suggest otherwise.
    """
    codes = [f.code for f in comparison.findings]
    reasons = []
    if comparison.fix is not None:
        reasons.append(f"every key is missing and unexpected (prefix {comparison.fix.prefix!r})")
    missing, unexpected = comparison.missing, comparison.unexpected  # keys: a finding can cover many
    if missing:
        reasons.append(f"{missing} missing key{'s' if missing != 1 else ''}")
    sizes = codes.count(Code.PC304)
    if unexpected:
        reasons.append(f"{unexpected} unexpected key{'s' if unexpected != 1 else ''}")
    if sizes:
        reasons.append(f"{sizes} size mismatch{'es' if sizes != 1 else ''} (strict=False raises too)")
    if not reasons:
        return "; a strict load_state_dict (the default) accepts it as it is"
    return ("; placecheck fixed or left out what does not load, but a training script's "
            f"load_state_dict(state) (strict=True, the default) raises: {', '.join(reasons)}")


def load_into_model(model: Any, path: str, *, device: Device, engine: Any, key: str | None = None,
                    trust: bool = False, on_meta: bool = False, model_name: str = "the model") -> Loaded:
    """Check ``path`` against ``model`` (PC301-PC306), then load it into ``model`` in place.

    The load is what a training script does before ``model.to(device)``:
    ``torch.load(path, map_location=...)`` and ``model.load_state_dict``.
    Under simulated CUDA (and for a model built on meta) the map_location is
    ``cpu`` (``meta``): the model is still on the CPU, and that is where a
    script loads the weights before moving it. On a real device it is the
    target device. Keys a prefix fix cures are renamed; keys that cannot load
    (unexpected, other shape) are left out, so the audit goes on; they are
    reported as findings. Raises :class:`UnsafeCheckpointError` when loading
    would run code and ``trust`` is false.
    """
    meta = read_checkpoint(path)
    findings: list[Finding] = []
    if meta.needs_code_execution:
        if not trust:
            notes = [f"format: {meta.format}, {human_bytes(meta.size)}; refused: loading would run code "
                     "from the file; rerun with --trust to allow it", torch_note(),
                     device_table(device_usage(meta), meta.format)]
            report = Report.build(model_name, device, engine.name, [unsafe_finding(meta, trusted=False)],
                                  notes, _stats(meta))
            raise UnsafeCheckpointError(
                f"{path!r} needs code execution to load (PC306: it names {unsafe_globals_text(meta)}); "
                "placecheck runs a checkpoint's code only with --trust: pass it if you trust the file",
                report)
        findings.append(unsafe_finding(meta, trusted=True))
    findings += device_findings(meta, device, target_gpus(device, engine))
    found = find_state_dict(meta, key)
    if found is None:
        raise UsageError(_no_state_dict(meta, path))
    sd_path, sd_meta = found
    comparison: Comparison = compare_state_dicts({k: _spec(v) for k, v in sd_meta.items()},
                                                 model_state_specs(model), model_name)
    findings += comparison.findings
    map_location = "meta" if on_meta else ("cpu" if engine.simulated else device)
    loaded = _real_load(meta, map_location, trust)
    if meta.format in (CheckpointFormat.TORCH_ZIP, CheckpointFormat.TORCH_LEGACY):
        loaded = _navigate(loaded, sd_path)  # the other formats load as one flat state_dict
    import torch

    if isinstance(loaded, torch.nn.Module):
        loaded = loaded.state_dict()
    state = {comparison.key_map[k]: v for k, v in dict(loaded).items() if k in comparison.key_map}
    try:
        with torch.no_grad():
            model.load_state_dict(state, strict=False)
    except Exception as exc:
        raise LoadError(f"model.load_state_dict(...) with {path!r} raised {one_line(exc)} "
                        "(--debug shows the traceback)") from exc
    notes = [f"checkpoint {path!r} ({meta.format}) loaded into the model with map_location="
             f"{map_location!r} before .to({device!r}): {len(state)} of {len(sd_meta)} tensors loaded"
             + (f" from {sd_path!r}" if sd_path else "") + strict_load_verdict(comparison)]
    if comparison.architecture_note:
        notes.append(comparison.architecture_note)
    with contextlib.suppress(Exception):
        notes.append(device_table(device_usage(meta), meta.format))
    return Loaded(tuple(findings), tuple(notes))
