"""``audit()``: the Python API, and the one function the CLI calls.

    >>> import placecheck, torchvision
    >>> report = placecheck.audit(torchvision.models.resnet18(), device="cuda")
    >>> report.ok
    True
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

import torch
import torch.nn as nn

from placecheck.basics.codes import Code
from placecheck.basics.devices import KEEP
from placecheck.basics.errors import LoadError, UsageError, one_line
from placecheck.basics.options import AuditOptions, WrapChoice
from placecheck.basics.patching import patch
from placecheck.basics.quiet import quiet
from placecheck.basics.values import Device
from placecheck.checks.provenance import stray_package
from placecheck.checks.walk import Snapshot, WalkResult, reachable_tensors, walk
from placecheck.engines import classify
from placecheck.engines.compat import FAKE_TENSOR_LOGGER, torch_note
from placecheck.engines.engine import (
    Engine,
    EngineChoice,
    choose_engine,
    cuda_queries_simulated,
    fallback_engine,
    move_model,
)
from placecheck.engines.sources import treat_as_user_code, user_line
from placecheck.findings.finding import Finding
from placecheck.findings.report import ASSUMED_BRANCHES, DeviceMap, Report
from placecheck.findings.rules import rule, selected, stray_verdict
from placecheck.model.construct import (
    construct,
    leftovers_to_default_device,
    materialise_lazy,
    move_from_meta,
    parse_init,
)
from placecheck.placement.replicas import Replica, devices, merge, merged_notes, no_replicas, plan, unwrap

if TYPE_CHECKING:
    from placecheck.checks.expected import Placement
    from placecheck.findings.events import Copy

ModelOrFactory = Union[nn.Module, Callable[[], nn.Module]]

def _build(model: ModelOrFactory, engine: Engine, copy_model: bool, in_session: bool = False) -> nn.Module:
    """The audit's own model object: a copy of an instance, or a factory's product.

    Under simulation a factory runs with ``torch.cuda`` answering for the
    simulated GPUs. If it then creates CUDA tensors outright (``torch.zeros(...,
    device="cuda")`` or ``.cuda()`` in ``__init__``, a factory returning
    ``Net().to("cuda")``), it is built again inside the engine's session: the
    fake engine's sessions share one fake mode, so the move and the forward
    later run on the same fake tensors. ``in_session``: build it there at once (an FSDP2 rank's
    factory shards the model onto the rank's GPU as it builds it).
    """
    if isinstance(model, nn.Module):
        treat_as_user_code(*{type(m) for m in model.modules()})
        return _copy(model) if copy_model else model
    with _module_classes_are_user_code():
        if not engine.simulated:
            return _checked(model())
        gpus = engine.gpus
        if in_session:
            with engine.session():
                return _checked(model())
        with cuda_queries_simulated(gpus):
            try:
                return _checked(model())
            except Exception as exc:
                if not classify.needs_cuda_driver(exc):
                    raise
        with engine.session():
            return _checked(model())


@contextlib.contextmanager
def _module_classes_are_user_code() -> Iterator[None]:
    """While a factory builds the model, every module class it builds is code under audit
    (:func:`placecheck.engines.sources.treat_as_user_code`), so that its lines are sources even when it lives
    in placecheck's own package (the examples), from its first ``__init__`` line on."""
    original = nn.Module.__init__

    def init(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        treat_as_user_code(type(self))
        original(self, *args, **kwargs)

    with patch(nn.Module, "__init__", init, "a model class defined in placecheck's own package (the "
               "examples) is the user's code: its lines are sources; no hook sees a module's "
               "construction begin"):
        yield


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
    options: AuditOptions | None = None,
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
    inputs: Sequence[str] | str | Any = (),
    example_inputs: str | Any = None,
    forward: bool = True,
    train: bool = False,
    library_findings: bool = False,
    reuse_calls: bool = True,
    wrap: str | None = None,
    world_size: int | None = None,
    device_map: str | None = None,
    gpu_memory: str | None = None,
    cpu_memory: str | None = None,
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
    :mod:`placecheck.model.construct`); ``auto`` uses it when a CPU build would not fit.
    ``checkpoint`` (a file) is checked (PC301-PC306) and loaded into the model
    before the move, as a script does (``torch.load(map_location=...)`` then
    ``load_state_dict``; see :func:`placecheck.checkpoint.load_into_model`);
    ``checkpoint_key`` names the state_dict inside it (``model.ema``);
    ``trust`` allows a checkpoint whose pickle runs code (never by default).

    After the walk, one forward pass runs on the target (``forward=False``
    skips it; so does a ``select`` with no forward code): ``inputs`` are
    ``--input`` specs (``float32[8,3,224,224]``, ``ids=int64[2,128]:0..32000``),
    ``example_inputs`` a ``MODULE:ATTR`` returning the inputs; with neither, an
    input is inferred from the first layer (see :mod:`placecheck.model.inputs`). The
    forward runs in ``eval()`` under ``torch.no_grad()``; ``train=True`` runs
    it in training mode followed by a backward (see :mod:`placecheck.checks.trace`).
    When fake tensors cannot run the forward, ``engine="auto"`` repeats the
    audit on the real-valued engine (:mod:`placecheck.engines.tagged`) and says so in
    the report's notes. A stray tensor (PC101) that the forward replaces with
    one on the target, uses only in computations that never meet a device
    tensor, or uses only as a 0-dim scalar stays a PC101 at ``info`` saying
    how the forward handled it. Performance findings (PC202, PC204, PC205)
    raised entirely inside installed packages (torchvision's own code) are
    ``info`` findings naming the package, unless ``library_findings=True``
    gives them their rule's severity. The report lists one finding per
    instance; ``report.grouped()`` gives one problem per root cause. On fake
    tensors, a module call identical to one already run that made no
    placement event (the 255 other experts of a router's layer) takes that
    call's output shapes without running (:mod:`placecheck.engines.reuse`), which
    the notes count; ``reuse_calls=False`` runs every call.

    ``wrap`` (``dp``, ``ddp``, ``fsdp``) audits the model as each of
    ``world_size`` replicas or ranks sees it, replica k on ``cuda:k`` (DDP and
    FSDP2 ranks on PyTorch's fake process group, in this process); a
    ``DataParallel``/``DistributedDataParallel`` model is audited so without it.
    A finding only some replicas have names them (see
    :mod:`placecheck.placement.replicas`).

    ``device_map`` (``auto``, ``balanced``, ``balanced_low_0``, ``sequential`` or a JSON file) places
    the model as ``from_pretrained(device_map=...)`` does instead of moving it to ``device``: built on
    the meta device, the map computed by accelerate's ``infer_auto_device_map`` for ``gpus`` GPUs of
    ``gpu_memory`` each (``"24GiB"``; ``cpu_memory`` allows CPU offload), dispatched with accelerate's
    ``dispatch_model`` on simulated GPUs and audited as placed; the report's ``device_map`` holds the
    map, bytes per device and the forward's copies between devices (see
    :mod:`placecheck.placement.dispatch`). It needs accelerate (``placecheck[accelerate]``).

    The keywords are the fields of :class:`~placecheck.basics.options.AuditOptions`;
    ``options=`` passes a whole options object instead (then give no other
    keyword). ``inputs`` also takes the input objects themselves (a tensor, a
    tuple of positional arguments, a dict of keyword arguments), as does
    ``example_inputs``.

    Raises :class:`~placecheck.basics.errors.UsageError` for bad options and
    :class:`~placecheck.basics.errors.LoadError` when the model cannot be built. Ctrl-C during the
    forward raises :class:`AuditInterrupted` (a ``KeyboardInterrupt``) whose ``report`` holds what was
    found until then; elsewhere a plain ``KeyboardInterrupt``.
    """
    given = AuditOptions(
        device=device, engine=engine, gpus=gpus,
        select=select, ignore=ignore,  # type: ignore[arg-type]  # lists and strings are split
        copy_model=copy_model, target=target, init=init, checkpoint=checkpoint,
        checkpoint_key=checkpoint_key, trust=trust,
        inputs=inputs,  # type: ignore[arg-type]  # specs or the objects; AuditOptions tells them apart
        example_inputs=example_inputs,
        forward=forward, train=train, library_findings=library_findings, reuse_calls=reuse_calls, wrap=wrap,
        world_size=world_size, device_map=device_map, gpu_memory=gpu_memory, cpu_memory=cpu_memory)
    if options is None:
        options = given
    elif given != AuditOptions():
        raise UsageError("audit(): pass options= or keyword arguments, not both")
    return _audit(model, options)


_GC_THRESHOLDS = (10_000, 10, 10)
"""The collector's thresholds while an audit runs (Python's are 700, 10, 10)."""


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Run the cyclic garbage collector less often while an audit runs, then as before.

    A model with tens of thousands of modules is millions of Python objects, made in one go (the
    build, the move, the walk): at Python's default thresholds the collector scans the growing
    heap over and over, about a quarter of building a DeepSeek-V3-shaped model on the meta device.
    Collections every 10,000 allocations instead of 700 leave little garbage waiting (the audit's
    objects are small; tensors are freed by reference counting as before).
    """
    saved = gc.get_threshold()
    gc.set_threshold(*(max(mine, theirs) for mine, theirs in zip(_GC_THRESHOLDS, saved, strict=False)))
    try:
        yield
    finally:
        gc.set_threshold(*saved)


AUDIT_SEED = 0
"""The seed of torch's CPU generator while an audit runs."""


@contextlib.contextmanager
def _repeatable() -> Iterator[None]:
    """Seed torch's CPU generator for the audit, and give the caller's state back afterwards.

    The weights a factory draws and the inputs placecheck makes are random; the fake engine computes
    with the values of small tensors (:mod:`placecheck.engines.datadep`), so a detection model's boxes, and
    the ops its forward runs, depended on the draw: one audit of fasterrcnn_resnet50_fpn_v2 found a
    PC205 that the next did not. Seeded, an audit finds the same findings every time, in this
    process or in a worker. A factory that seeds itself still wins: it runs inside.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(AUDIT_SEED)
        yield


def _audit(model: ModelOrFactory, opts: AuditOptions) -> Report:
    """:func:`audit` with its options in one object: one audit, or one per replica (merged)."""
    with _fewer_collections(), _repeatable():
        return _audit_replicas(model, opts)


def _audit_replicas(model: ModelOrFactory, opts: AuditOptions) -> Report:
    opts.check()
    if opts.device_map is not None:
        return _audit_device_map(model, opts)
    model, replicas = plan(model, opts)
    if replicas is None:
        try:
            return _audit_on(model, opts)
        except _WrapperBuilt as built:  # a factory returned a DataParallel/DDP object: audit its replicas
            model, replicas = plan(model, opts.replace(wrap=built.kind.value))
            assert replicas is not None
    gpus = max(opts.gpus or 0, replicas.count)
    reports = [_audit_on(model, opts.replace(device=f"cuda:{k}", gpus=gpus), replicas.replica(k))
               for k in range(replicas.count)]
    first = reports[0]
    findings = merge(replicas, [r.findings for r in reports])
    notes = merged_notes(replicas, [r.notes for r in reports])
    incomplete = next((f"{replicas.label(k)}: {r.incomplete}" for k, r in enumerate(reports) if r.incomplete),
                      "")
    return Report.build(first.target, devices(replicas), first.engine, findings, notes, dict(first.stats),
                        incomplete=incomplete)


class AuditInterrupted(KeyboardInterrupt):
    """Ctrl-C during the forward of :func:`audit`: ``report`` holds what was found until then (the walk,
    judged on the part of the forward that ran, and that part's findings; its ``incomplete`` names the
    line). A ``KeyboardInterrupt``, so Ctrl-C still interrupts whoever called the audit."""

    def __init__(self, report: Report) -> None:
        super().__init__()
        self.report = report


class _WrapperBuilt(Exception):
    """The factory of a model audited unreplicated built a DataParallel/DDP wrapper: audit its replicas."""

    def __init__(self, kind: WrapChoice) -> None:
        super().__init__(kind.value)
        self.kind = kind


def _audit_on(model: ModelOrFactory, opts: AuditOptions, replica: Replica | None = None) -> Report:
    """One audit on one target device (for ``replica``, when it is one of a replicated model's)."""
    # the options were checked (AuditOptions.check) before the first attempt
    dev = opts.target_device
    keep = dev is None
    choice = EngineChoice(opts.engine)
    codes = selected(opts.select or None, opts.ignore or None)
    init_choice = parse_init(opts.init)
    if replica is not None and replica.placed:
        if init_choice.value == "meta":
            raise UsageError("--wrap fsdp builds each rank's model on its GPU as fully_shard places it: "
                             "use --init cpu (or auto)")
        init_choice = parse_init("cpu")
    if dev is None:  # keep: the model places itself: real GPUs when there are as many as it may use
        from placecheck.placement import DEFAULT_GPUS

        gpus = opts.gpus or DEFAULT_GPUS
        eng = choose_engine(Device("cuda", gpus - 1), choice, gpus, train=opts.train and opts.forward)
        eng = dataclasses.replace(eng, device=Device("cuda", 0), gpus_given=opts.gpus is not None)
    elif replica is not None:  # every replica on one engine: real only when the machine has the last GPU
        last = Device("cuda", replica.replicas.count - 1)
        eng = dataclasses.replace(choose_engine(last, choice, opts.gpus, train=opts.train and opts.forward),
                                  device=dev)
    else:
        eng = choose_engine(dev, choice, opts.gpus, train=opts.train and opts.forward)
    name = opts.target or (type(model).__name__ if isinstance(model, nn.Module) else
                           getattr(model, "__name__", "model"))

    if eng.real_values and init_choice.value == "meta":
        raise UsageError("the real-valued engine (--engine tagged, or --train) needs the weights in "
                         "memory: use --init cpu")
    run_forward = opts.forward and any(rule(c).phase == "forward" for c in codes)
    options = _Options(opts, model, dev, _init_for(eng, init_choice, keep), str(name), run_forward,
                       replica=replica)
    attempt = _replica_attempt(eng, options)
    if attempt.fallback and choice is EngineChoice.AUTO and attempt.fits_in_memory:  # (never after Ctrl-C)
        eng = fallback_engine(eng, attempt.fallback)
        attempt = _replica_attempt(eng, dataclasses.replace(options, init=_init_for(eng, init_choice, keep)))
    elif attempt.fallback:
        instead = ("the real-valued engine needs the weights in memory, and this model does not fit"
                   if choice is EngineChoice.AUTO else "use --engine tagged (or auto) to run it")
        attempt.notes.append(f"forward: checked only up to where fake tensors stopped "
                             f"({attempt.fallback}); {instead}")
        attempt.incomplete = f"fake tensors stopped ({attempt.fallback})"
    found = replica.explained(attempt.findings) if replica is not None else attempt.findings
    findings = [f for f in found if f.code in codes]
    notes = [f"engine: {eng.name}: {eng.reason}", torch_note(), *attempt.notes]
    report = Report.build(str(name), dev or KEEP, eng.name, findings, notes, attempt.stats,
                          incomplete=attempt.incomplete, device_map=attempt.device_map)
    if attempt.interrupted:
        raise AuditInterrupted(report)
    return report


def _init_for(eng: Engine, init: Any, keep: bool = False) -> Any:
    """The real-valued engine computes with the weights: it always builds them on the CPU. So does
    ``--device keep``: the model's code places its own tensors (a meta build would place nothing)."""
    return parse_init("cpu") if eng.real_values or keep else init


@dataclass(frozen=True)
class _Options:
    """What one attempt of the audit needs (an attempt runs on one engine): the audit's options as
    given, and what the audit resolved from them for this attempt."""

    given: AuditOptions
    """The options as given (checked); ``gpus`` None: not given."""
    model: ModelOrFactory
    device: Device | None
    """The target device (``cuda:1``); None: ``--device keep`` (audit the model as its own code placed
    it, no ``.to()``)."""
    init: Any
    """The :class:`~placecheck.basics.options.InitChoice` this attempt's engine builds with."""
    name: str
    """The model's name in the report."""
    forward: bool
    """Run the forward: the options' ``forward``, and a selected code is a forward one."""
    replica: Replica | None = None
    """The replica (or rank) of a replicated model this attempt audits; None: not replicated."""


@dataclass
class _Attempt:
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    fallback: str = ""
    """Why fake tensors could not run the forward ("" when they could, or were not used)."""
    incomplete: str = ""
    """Why the forward was not checked to its end ("" when it was, or did not run)."""
    on_meta: bool = False
    fits_in_memory: bool = True
    """The weights fit in this machine's memory (always true for a CPU build)."""
    device_map: DeviceMap | None = None
    """``--device keep``: the stages' devices and bytes, and the copies between devices of the forward."""
    interrupted: bool = False
    """Ctrl-C stopped the forward: the report says so, then :class:`AuditInterrupted` carries it."""


def _replica_attempt(eng: Engine, opts: _Options) -> _Attempt:
    """:func:`_attempt`, inside the replica's context (a DDP/FSDP rank's process group) when it is one."""
    with opts.replica.attempt() if opts.replica is not None else contextlib.nullcontext():
        return _attempt(eng, opts)


def _attempt(eng: Engine, opts: _Options) -> _Attempt:
    """Build, load, move, walk and (optionally) run the forward on one engine."""
    dev = opts.device
    default_device = torch.get_default_device()  # where unmoved tensors of a meta build belong
    replica = opts.replica
    in_session = replica is not None and replica.placed
    construction = construct(opts.model, opts.init, dev,
                             lambda m: _build(m, eng, opts.given.copy_model, in_session),
                             values_needed=not eng.fake)
    wrapper = unwrap(construction.model)[1] if replica is None else None
    if wrapper is not None:
        raise _WrapperBuilt(wrapper)
    if replica is None and opts.given.world_size:
        raise no_replicas()  # the factory built no DataParallel/DDP object after all
    if replica is not None:
        construction = dataclasses.replace(construction, model=replica.built(construction.model))
    if in_session:
        construction.note = ("init: cpu (--wrap fsdp: each rank builds its model in the simulation, where "
                             "fully_shard places it on the rank's GPU)")
    built = construction.model
    if isinstance(built, torch.jit.ScriptModule):
        raise UsageError(f"{opts.name} is a TorchScript module (torch.jit.script or torch.jit.load), whose "
                         "compiled forward no Python-level check can follow: audit the module it was "
                         "scripted from (its class, or a factory that returns it unscripted), or check the "
                         "script that scripts it with `placecheck run`, which runs a scripted module's "
                         "Python forward")
    attempt = _Attempt(on_meta=construction.on_meta)
    if construction.on_meta:
        from placecheck.model.construct import COMFORTABLE_FRACTION, available_memory, state_nbytes

        attempt.fits_in_memory = state_nbytes(built) <= COMFORTABLE_FRACTION * available_memory()
    if eng.real_values and not isinstance(opts.model, nn.Module):
        attempt.notes.append("init: cpu (the real-valued engine computes with the weights)")
    elif dev is None and not isinstance(opts.model, nn.Module):
        attempt.notes.append("init: cpu (--device keep: the model's code places its own tensors)")
    elif construction.note:
        attempt.notes.append(construction.note)
    checkpoint_findings: tuple[Finding, ...] = ()
    given = opts.given
    if given.checkpoint is not None:
        from placecheck.checkpoint import load_into_model

        assert dev is not None, "AuditOptions.check_keep refuses --checkpoint with --device keep"
        loaded = load_into_model(built, given.checkpoint, device=dev, engine=eng, key=given.checkpoint_key,
                                 trust=given.trust, on_meta=construction.on_meta, model_name=opts.name)
        checkpoint_findings = loaded.findings
        attempt.notes.extend(loaded.notes)
    inputs: tuple[tuple[Any, ...], dict[str, Any], str] | None = None
    if opts.forward and type(built).forward is nn.Module.forward:
        attempt.notes.append(f"forward: not checked: {type(built).__name__} defines no forward()")
    elif opts.forward:
        from placecheck.model.inputs import resolve_inputs

        inputs = resolve_inputs(built, opts.given.inputs, opts.given.example_inputs)
        attempt.notes.append(f"forward: {inputs[2]}" + ("; training mode, then a backward of the summed "
                                                         "floating outputs" if opts.given.train else ""))
        if materialise_lazy(built, inputs, Device("meta" if construction.on_meta else "cpu")):
            attempt.notes.append("forward: nn.Lazy* parameters materialised by one forward before .to() "
                                 "(they follow .to() either way)")
    if dev is not None:
        _note_collapsed(built, dev, attempt)
    with eng.session() if eng.simulated else contextlib.nullcontext():
        snapshot = Snapshot.take(built)
        placement = _placement(built, eng, opts, attempt) if dev is None else None
        if placement is not None:
            moved = built  # --device keep: no .to(); audited as its code placed it
        else:
            try:
                def move(m: nn.Module) -> nn.Module:
                    return move_from_meta(m, eng) if construction.on_meta else move_model(m, eng)

                moved = move(built) if replica is None else replica.place(built, move)
            except Exception as exc:
                raise LoadError(f"model.to({dev!r}) raised {one_line(exc)} "
                                "(--debug shows the traceback)") from exc
        if construction.on_meta:
            leftovers_to_default_device(moved, snapshot, default_device)
        target = dev or (placement.expected("").primary if placement else None) or Device("cpu")
        inferred = not opts.given.inputs and opts.given.example_inputs is None
        checked = _walk_and_forward(moved, eng, target, snapshot, construction.assignments, placement,
                                    inputs, opts.given.train, opts.given.library_findings, inferred,
                                    opts.given.reuse_calls,
                                    around_forward=(lambda: replica.forward(moved)) if replica is not None
                                    else contextlib.nullcontext)
        attempt.notes.extend(checked.notes)
        attempt.fallback, attempt.incomplete = checked.fallback, checked.stopped
        attempt.interrupted = bool(checked.interrupted)
        if placement is not None:
            from placecheck.placement.devicemap import device_map

            attempt.device_map = device_map(moved, placement, checked.copies)
    attempt.findings = [*checked.findings, *checkpoint_findings]
    attempt.stats = checked.stats
    return attempt


@dataclass
class _Checked:
    """What the walk after the placement and the traced forward found, together."""

    findings: list[Finding]
    """The walk's (its strays judged by what the forward did with them) and the forward's."""
    notes: list[str]
    stats: dict[str, int]
    """The walk's counts, and the branches on assumed values (:data:`ASSUMED_BRANCHES`) when any."""
    fallback: str = ""
    """Why fake tensors could not run the forward ("" when they could, or it did not run)."""
    stopped: str = ""
    """Where and why the forward stopped at a limit of the simulation ("" when it did not)."""
    copies: list[Copy] = field(default_factory=list)
    """Placed models: every copy between devices the forward made."""
    interrupted: str = ""
    """Ctrl-C stopped the forward (:attr:`_ForwardResult.interrupted`)."""


def _walk_and_forward(
        model: nn.Module, eng: Engine, target: Device, snapshot: Snapshot, assignments: Any,
        placement: Placement | None, inputs: tuple[tuple[Any, ...], dict[str, Any], str] | None,
        train: bool, library_findings: bool, inferred: bool, reuse_calls: bool,
        around_forward: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> _Checked:
    """The walk of the placed ``model``, then (with ``inputs``) the traced forward, inside
    ``around_forward()`` (a replica's context): every placement (a ``.to()``, the model's own, a device
    map, a replica's) is judged by this one sequence."""
    result = walk(model, target, snapshot, assignments, placement)
    if inputs is None:
        return _Checked(result.findings, result.notes, result.stats)
    with around_forward():
        traced = _forward(model, eng, result, snapshot, inputs, train, library_findings, inferred, placement,
                          reuse_calls=reuse_calls)
    walk_findings = [
        stray_verdict(f, traced.handled.get(f.where), f.expected or target, stray_package(f, model))
        if f.code == Code.PC101 else f for f in result.findings]
    stats = result.stats
    if traced.assumed_branches:  # the summary then says that paths other values take did not run
        stats = {**stats, ASSUMED_BRANCHES: traced.assumed_branches}
    return _Checked([*walk_findings, *traced.findings], [*result.notes, *traced.notes], stats,
                    traced.fallback, traced.stopped or traced.interrupted, traced.copies, traced.interrupted)


def _note_collapsed(model: nn.Module, target: Device, attempt: _Attempt) -> None:
    """A model whose own code placed its tensors on several GPUs is about to be moved to one: say so,
    since the move hides every mismatch between its stages (``--device keep`` audits them as placed)."""
    from placecheck.placement.placed import devices_used

    gpus = [d for d in devices_used(model) if d.startswith("cuda")]
    if len(gpus) > 1:
        attempt.notes.append(f"placement: the model's code put its tensors on {', '.join(gpus)}; "
                             f".to({target!r}) moves them all to one device, which hides mismatches "
                             "between its stages: audit with --device keep to check them as placed")


def _placement(model: nn.Module, eng: Engine, opts: _Options, attempt: _Attempt) -> Placement:
    """``--device keep``: the devices the model's code used (checked against ``--gpus``) and each module's
    expected device; the report's notes say what was found."""
    from placecheck.checks.expected import Placement
    from placecheck.placement import DEFAULT_GPUS
    from placecheck.placement.placed import devices_used, highest_gpu

    used = devices_used(model)
    highest = highest_gpu(used)
    gpus = opts.given.gpus
    if gpus is not None and highest >= gpus:
        have = "1 GPU (cuda:0)" if gpus == 1 else f"{gpus} GPUs (cuda:0 to cuda:{gpus - 1})"
        raise UsageError(f"--device keep: the model places tensors on cuda:{highest}, but --gpus {gpus} "
                         f"gives it {have}: use --gpus {highest + 1} (or more)")
    if not eng.simulated:
        count = "real GPUs"
    elif opts.given.gpus is not None:
        count = f"torch.cuda.device_count() answered {opts.given.gpus} (--gpus)"
    else:
        count = f"torch.cuda.device_count() answered {DEFAULT_GPUS} (no --gpus)"
    attempt.notes.append(f"placement: kept as the model's code placed it, no .to(): its tensors are on "
                         f"{', '.join(used) or 'no device'}; {count}")
    return Placement(model)


@dataclass
class _ForwardResult:
    findings: list[Finding]
    fallback: str
    """Why fake tensors could not run the forward ("" when they could)."""
    notes: list[str]
    handled: dict[str, str]
    """Stray tensors (PC101) the forward shows the code handles: path -> how
    (:attr:`placecheck.checks.provenance.StrayVerdict.how`)."""
    stopped: str = ""
    """Where and why the forward stopped at a limit of the simulation ("" when it did not)."""
    copies: list[Copy] = field(default_factory=list)
    """``--device keep``: every copy between devices the forward made."""
    assumed_branches: int = 0
    """Lines where the code branched on a value the fake engine assumed: a path another value takes
    there did not run."""
    interrupted: str = ""
    """Ctrl-C stopped the forward: ``interrupted by Ctrl-C at model.py:41 ...`` ("" when it did not)."""


def _forward(model: nn.Module, eng: Engine, result: WalkResult, snapshot: Snapshot,
             inputs: tuple[tuple[Any, ...], dict[str, Any], str], train: bool,
             library_findings: bool, inferred: bool = False, placement: Placement | None = None,
             reuse_calls: bool = True) -> _ForwardResult:
    """The traced forward pass, then the walk again: what the forward replaced or handled.

    ``inferred``: placecheck guessed the input. A forward that then raises anything but a
    placement error most likely says the guess was wrong, not that the model is: the audit is
    incomplete (a note asks for --input), not a PC207 that fails CI on a correct model.
    """
    from placecheck.checks.trace import Tracer
    from placecheck.model.inputs import move_inputs

    dev = eng.device
    notes: list[str] = []
    if placement is not None:  # --device keep: the inputs go where the model's first layer is
        from placecheck.placement.placed import input_device

        dev, how = input_device(model, inputs[0], inputs[1], placement)
        notes.append(f"forward: inputs on {dev} ({how})")
    # with --device keep a repaired mismatch moves the tensor to the device of the module running
    tracer = Tracer(model, dev, result, move=lambda t: move_inputs(t, tracer.target_name),
                    placement=placement)
    args, kwargs = move_inputs(inputs[0], dev), move_inputs(inputs[1], dev)
    if tracer.flows is not None:
        tracer.flows.mark_inputs((args, kwargs))
    from placecheck.engines.datadep import active  # what the fake engine assumed to run data-dependent ops

    mode = active()
    reuse = None
    if reuse_calls and eng.fake and mode is not None and placement is None and not train:
        from placecheck.engines.reuse import CallReuse

        reuse = CallReuse(model, lambda: tracer.activity, mode, tracer.module_paths)
    why = limit = interrupted = ""
    try:
        with quiet(FAKE_TENSOR_LOGGER):
            tracer.run(args, kwargs, train=train, reuse=reuse)
    except KeyboardInterrupt as exc:  # Ctrl-C: what the forward did until then is judged, then reported
        line = user_line(exc)
        interrupted = f"interrupted by Ctrl-C{f' at {line}' if line else ''}"
        notes.append(f"forward: {interrupted}: the findings are judged on the part of the forward that ran")
    except Exception as exc:
        # after ops that ran on assumed values, any error but a device mismatch may be the assumption's
        assumed = mode is not None and bool(mode.assumptions) and not tracer.is_mismatch(exc)
        why = classify.fake_limit(exc, assumed=assumed) if eng.fake else ""
        # code correct on a GPU that needs the real driver (an unsimulated torch.cuda API) is the
        # simulation's limit, not a PC207 against the user's code
        limit = classify.simulation_limit(exc) if eng.simulated and not why else ""
        # a call that still fails once its devices agree stopped the forward too (after its PC201)
        if not limit and not why and inferred \
                and (not tracer.is_mismatch(exc) or tracer.failed_after_repair(exc)) \
                and not classify.is_missing_device(exc):  # no input makes a missing GPU exist
            line = user_line(exc)
            limit = (f"forward: stopped{f' at {line}' if line else ''} with the inferred input "
                     f"({one_line(exc)}): pass --input (or --example-inputs) to check the rest")
        if limit:
            notes.append(limit)
        elif not why:  # else keep what the forward found before fake tensors stopped
            tracer.record_error(exc)
    findings = tracer.findings(library_findings)
    handled = ({v.path: v.how for v in tracer.stray_verdicts(walk(model, dev, snapshot, placement=placement))}
               if tracer.strays and not why else {})
    assumption_notes = mode.notes() if mode is not None else []
    reuse_notes = reuse.notes() if reuse is not None else []
    all_notes = [*notes, *tracer.notes(), *reuse_notes, *assumption_notes]
    return _ForwardResult(findings, why, all_notes, handled, limit,
                          tracer.flows.copies if tracer.flows is not None else [],
                          assumed_branches=len(mode.branched()) if mode is not None else 0,
                          interrupted=interrupted)


# ---- --device-map ---------------------------------------------------------------------------------


def _audit_device_map(model: ModelOrFactory, opts: AuditOptions) -> Report:
    """``device_map``: the model placed as ``from_pretrained(device_map=...)`` places it, audited as placed.

    Built on the meta device; the map computed by accelerate (or read from the file) and checked; the
    weights materialised on their mapped devices as fake tensors and ``dispatch_model`` run, on
    simulated GPUs (:mod:`placecheck.placement.dispatch`); then the walk and the forward judge each
    module against the device the map gives it.
    """
    from placecheck.basics.options import InitChoice
    from placecheck.model.construct import Construction
    from placecheck.placement import dispatch

    opts.check()
    dispatch.accelerate_module()
    spec = str(opts.device_map)
    if isinstance(model, nn.Module) and not opts.copy_model:
        raise UsageError("device_map with copy_model=False would empty the model's own weights (they go "
                         "to the meta device before the dispatch): pass copy_model=True, or a factory")
    codes = selected(opts.select or None, opts.ignore or None)  # checked by opts.check()
    gpus = opts.gpus or dispatch.gpus_named(spec) or 1
    eng = choose_engine(Device("cuda", 0), EngineChoice.FAKE, gpus)
    plural = "s" if gpus != 1 else ""
    eng = dataclasses.replace(eng, reason=f"--device-map: CUDA simulated with fake tensors ({gpus} "
                                          f"GPU{plural})")
    name = opts.target or (type(model).__name__ if isinstance(model, nn.Module) else
                           getattr(model, "__name__", "model"))
    default_device = torch.get_default_device()
    if isinstance(model, nn.Module):  # a copy, its registered state on meta as from_pretrained builds it
        copied = _build(model, eng, copy_model=True)
        construction = Construction(copied.to("meta"), on_meta=True,
                                    note="init: a copy of the model, its parameters and buffers on the meta "
                                         "device before the dispatch")
    else:
        construction = construct(model, InitChoice.META, eng.device,
                                 lambda m: _build(m, eng, opts.copy_model))
        construction.note = ("init: meta (--device-map: built on the meta device as from_pretrained builds "
                             "it, no memory for weights; tensors no module registers are reported on the "
                             "default device)")
    built = construction.model
    plan = dispatch.plan_device_map(built, spec, opts.gpus, opts.gpu_memory, opts.cpu_memory)
    notes = [f"engine: {eng.name}: {eng.reason}", torch_note(),
             *([construction.note] if construction.note else []), *plan.summary()]
    run_forward = opts.forward and any(rule(c).phase == "forward" for c in codes)
    inputs: tuple[tuple[Any, ...], dict[str, Any], str] | None = None
    if run_forward and type(built).forward is nn.Module.forward:
        notes.append(f"forward: not checked: {type(built).__name__} defines no forward()")
    elif run_forward:
        from placecheck.model.inputs import resolve_inputs

        inputs = resolve_inputs(built, opts.inputs, opts.example_inputs)
        notes.append(f"forward: {inputs[2]}")
    with eng.session() as fake_mode, dispatch.accelerate_on_fake_tensors():
        snapshot = Snapshot.take(built)
        offloaded = dispatch.materialise(built, plan, fake_mode)
        leftovers_to_default_device(built, snapshot, default_device)
        placed = dispatch.dispatch(built, plan)
        # the offloaded weights the hooks hold are the parameters' data, not strays
        held = dispatch.offloaded_copies(placed, offloaded) if offloaded else {}
        snapshot.params.update(held)
        placement = dispatch.MappedPlacement(placed, plan, held)
        target = placement.expected("").primary or eng.device
        inferred = not opts.inputs and opts.example_inputs is None
        checked = _walk_and_forward(placed, eng, target, snapshot, construction.assignments, placement,
                                    inputs, False, opts.library_findings, inferred, opts.reuse_calls)
        notes.extend(checked.notes)
        incomplete = checked.stopped
        if checked.fallback:
            notes.append(f"forward: checked only up to where fake tensors stopped ({checked.fallback})")
            incomplete = f"fake tensors stopped ({checked.fallback})"
    # an offloaded weight is on meta between forwards: where accelerate's hooks keep it
    findings = [f for f in checked.findings
                if not (f.code in (Code.PC104, Code.PC105) and f.where in offloaded)]
    findings = [f for f in dispatch.offload_findings(findings, checked.copies, plan, offloaded)
                if f.code in codes]
    device_map = dispatch.report_map(plan, checked.copies)
    report = Report.build(str(name), "device-map", eng.name, findings, notes, checked.stats,
                          incomplete=incomplete, device_map=device_map)
    if checked.interrupted:
        raise AuditInterrupted(report)
    return report
