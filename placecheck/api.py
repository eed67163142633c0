"""``audit()``: the Python API, and the one function the CLI calls.

    >>> import placecheck, torchvision
    >>> report = placecheck.audit(torchvision.models.resnet18(), device="cuda")
    >>> report.ok
    True
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable
from typing import Any, Union

import torch
import torch.nn as nn

from placecheck.construct import construct, leftovers_to_default_device, move_from_meta, parse_init
from placecheck.devices import normalize_device
from placecheck.engine import EngineChoice, choose_engine, cuda_queries_simulated, move_model
from placecheck.errors import LoadError, UsageError, one_line
from placecheck.finding import Finding
from placecheck.report import Report
from placecheck.rules import selected
from placecheck.walk import Snapshot, reachable_tensors, walk

ModelOrFactory = Union[nn.Module, Callable[[], nn.Module]]

# Errors that mean "this code wanted a real GPU while building the model".
_CUDA_BUILD_ERRORS = ("no nvidia driver", "not compiled with cuda", "cuda driver", "cuda error",
                      "found no nvidia", "not linked with support for cuda", "cudagetdevicecount")


def _build(model: ModelOrFactory, engine_simulated: bool, copy_model: bool, gpus: int) -> nn.Module:
    """The audit's own model object: a copy of an instance, or a factory's product.

    Under simulation a factory runs with ``torch.cuda`` answering for the
    simulated GPUs. If it then creates CUDA tensors outright (``torch.zeros(...,
    device="cuda")`` in ``__init__``), it is built again inside the fake mode.
    """
    if isinstance(model, nn.Module):
        return _copy(model) if copy_model else model
    if not engine_simulated:
        return _checked(model())
    with cuda_queries_simulated(gpus):
        try:
            return _checked(model())
        except Exception as exc:
            text = f"{exc} {exc.__cause__ or ''}".lower()
            if not any(s in text for s in _CUDA_BUILD_ERRORS):
                raise
    from torch._subclasses.fake_tensor import FakeTensorMode

    with cuda_queries_simulated(gpus), FakeTensorMode(allow_non_fake_inputs=True):
        return _checked(model())


def _copy(model: nn.Module) -> nn.Module:
    """A deep copy of the caller's model, so the audit never touches their object.

    ``copy.deepcopy`` refuses two kinds of tensor that legitimate models hold,
    so those are copied by hand first (through deepcopy's memo):
    non-leaf tensors that old-style ``torch.nn.utils.weight_norm`` /
    ``spectral_norm`` / ``prune`` leave as plain attributes (recomputed by a
    pre-hook before every forward), or that a model keeps in a container
    (``self.cache = {"k": self.proj.weight * 2}``), copied detached; and the uninitialised
    parameters and buffers of ``nn.Lazy*`` modules, re-created uninitialised.
    """
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    memo: dict[int, Any] = {}
    # torch's .pyi stubs omit the device/dtype arguments these constructors take
    for value in reachable_tensors(model):
        if isinstance(value, UninitializedParameter):
            memo[id(value)] = UninitializedParameter(  # type: ignore[call-arg]
                requires_grad=value.requires_grad, device=value.device, dtype=value.dtype)
        elif isinstance(value, UninitializedBuffer):
            memo[id(value)] = UninitializedBuffer(  # type: ignore[call-arg]
                requires_grad=value.requires_grad, device=value.device, dtype=value.dtype)
        elif not value.is_leaf:
            memo[id(value)] = value.detach().clone()
    try:
        return copy.deepcopy(model, memo)
    except Exception as exc:
        raise LoadError(f"cannot copy the model for the audit: {one_line(exc)}; "
                        "pass copy_model=False to audit it in place") from exc


def _checked(obj: Any) -> nn.Module:
    if not isinstance(obj, nn.Module):
        raise LoadError(f"the model factory returned a {type(obj).__name__}, not an nn.Module")
    return obj


def audit(
    model: ModelOrFactory,
    device: str = "cuda",
    *,
    engine: str = "auto",
    gpus: int | None = None,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    copy_model: bool = True,
    target: str | None = None,
    init: str = "auto",
    checkpoint: str | None = None,
    checkpoint_key: str | None = None,
    trust: bool = False,
) -> Report:
    """Move ``model`` to ``device`` as a training script would, and report what went wrong.

    ``model`` is an ``nn.Module`` (audited on a deep copy unless
    ``copy_model=False``, so the caller's object is never touched) or a
    zero-argument factory returning one. ``device`` is ``cuda``, ``cuda:N``,
    ``cpu``, ``mps`` or ``meta``; CUDA is simulated with fake tensors when
    no GPU is present (``engine="auto"``), or always with ``engine="fake"``.
    ``select``/``ignore`` take code prefixes (``PC1``, ``PC204``, ``ALL``).
    ``init`` (``auto``, ``cpu``, ``meta``) says where a factory builds the
    model: ``meta`` needs almost no memory for any size (see
    :mod:`placecheck.construct`); ``auto`` uses it when a CPU build would not fit.
    ``checkpoint`` (a file) is checked (PC301-PC306) and loaded into the model
    before the move, as a script does (``torch.load(map_location=...)`` then
    ``load_state_dict``; see :func:`placecheck.checkpoint.load_into_model`);
    ``checkpoint_key`` names the state_dict inside it (``model.ema``);
    ``trust`` allows a checkpoint whose pickle runs code (never by default).

    Raises :class:`~placecheck.errors.UsageError` for bad options and
    :class:`~placecheck.errors.LoadError` when the model cannot be built.
    """
    dev = normalize_device(device)
    try:
        choice = EngineChoice(engine)
    except ValueError:
        raise UsageError(f"unknown engine {engine!r}: use one of "
                         f"{', '.join(c.value for c in EngineChoice)}") from None
    try:
        codes = selected(select, ignore)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    init_choice = parse_init(init)
    eng = choose_engine(dev, choice, gpus)
    name = target or (type(model).__name__ if isinstance(model, nn.Module) else
                      getattr(model, "__name__", "model"))

    default_device = torch.get_default_device()  # where unmoved tensors of a meta build belong
    construction = construct(model, init_choice, dev,
                             lambda m: _build(m, eng.simulated, copy_model, eng.gpus))
    built = construction.model
    checkpoint_findings: tuple[Finding, ...] = ()
    checkpoint_notes: tuple[str, ...] = ()
    if checkpoint is not None:
        from placecheck.checkpoint import load_into_model

        loaded = load_into_model(built, checkpoint, device=dev, engine=eng, key=checkpoint_key,
                                 trust=trust, on_meta=construction.on_meta, model_name=str(name))
        checkpoint_findings, checkpoint_notes = loaded.findings, loaded.notes
    with eng.session() if eng.simulated else contextlib.nullcontext():
        snapshot = Snapshot.take(built)
        try:
            moved = move_from_meta(built, eng) if construction.on_meta else move_model(built, eng)
        except Exception as exc:
            raise LoadError(f"model.to({dev!r}) raised {one_line(exc)} "
                            "(--debug shows the traceback)") from exc
        if construction.on_meta:
            leftovers_to_default_device(moved, snapshot, default_device)
        result = walk(moved, dev, snapshot)

    findings = [f for f in (*result.findings, *checkpoint_findings) if f.code in codes]
    notes = [f"engine: {eng.name}: {eng.reason}"]
    if construction.note:
        notes.append(construction.note)
    notes.extend(checkpoint_notes)
    return Report.build(name, dev, eng.name, findings, notes, result.stats)
