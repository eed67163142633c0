"""Replicas: a model audited as each DataParallel replica, DDP rank or FSDP2 rank sees it.

A replicated model runs the same forward on every GPU: replica (or rank) ``k``
holds its parameters and buffers on ``cuda:k`` and gets its inputs there. Code
that is right on the first GPU can be wrong on the others: a forward that
hard-codes ``"cuda:0"``, a device read from ``torch.cuda.current_device()`` in
``__init__`` (outside the replica's device context) and kept, a tensor created on
the first GPU and kept as a plain attribute. Each of these makes replica 1 mix
``cuda:0`` with ``cuda:1``: PC201 (or PC101/PC202) on that replica only.

The audit runs one attempt per replica, each an ordinary audit whose target is
``cuda:k`` (so every check and message is the single-device one), and merges
them (:func:`merge`): a finding every replica shares is reported once; one that
only some replicas have names them (``on replica 1 (cuda:1), ...``).
What each kind does per replica (:class:`Replica`):

- ``dp`` (``nn.DataParallel``): the model is built once with ``cuda:0`` current,
  moved to ``cuda:k`` (what ``replicate`` does to parameters and buffers; plain
  attributes stay shared, where they were), and its forward runs under
  ``torch.cuda.device(k)``, as ``parallel_apply``'s thread for that replica does.
  The replicas run one after the other, not in threads: the fake mode and the
  tracer's mode are thread-local, and DataParallel's own ``replicate``/``scatter``
  copy data that fake tensors do not have. Each replica gets the whole input, not
  its slice of the batch (``scatter``).
- ``ddp`` (``DistributedDataParallel``): rank ``k`` of a simulated process group
  (PyTorch's fake process group, one process, ``init_process_group("fake")``)
  with ``cuda:k`` current (``torch.cuda.set_device(rank)``, as a launcher script
  does) builds its own model, moves it to ``cuda:k`` and runs the module's
  forward. The DDP wrapper itself is not run: its constructor verifies and
  broadcasts the parameters' data, which fake tensors do not have; placement-wise
  its forward only moves the inputs to ``device_ids[0]``, which the audit does.
  ``torch.distributed.get_rank()``/``get_world_size()`` answer as on that rank.
- ``fsdp`` (FSDP2's ``fully_shard``): rank ``k`` as for ``ddp``, over a
  ``DeviceMesh("cuda", range(N))``. A model that the target already sharded is
  audited as placed (no ``.to()``: a module left out of ``fully_shard`` stays where
  the code put it); any other model gets ``fully_shard(model, mesh=mesh)`` on its
  root. Parameters are ``DTensor`` shards on ``cuda:k``; the forward's
  all-gathers run on the fake process group. The backward does not run without a
  GPU (fake tensors), so ``--train`` is refused; nor does the sharding itself on a CPU-only build
  of torch (fake CUDA tensors there cannot run FSDP2's ``narrow``/``copy_``), so ``fsdp`` needs a
  CUDA build (no GPU). An op that mixes a plain tensor with a DTensor (a sharded
  parameter read outside its module's forward) is PC201 (:class:`DTensorMixes`).

A target that is a ``DataParallel`` or ``DistributedDataParallel`` object is
unwrapped and audited this way without ``--wrap`` (detecting the wrapper is
structure, not a guess from names); a factory that builds DDP or shards the
model needs its process group while it runs, so it needs ``--wrap ddp|fsdp``.

Not reentrant: the process group is the process's default one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.codes import Code
from placecheck.basics.errors import UsageError
from placecheck.basics.options import AuditOptions, WrapChoice
from placecheck.basics.patching import patch
from placecheck.basics.values import Device
from placecheck.engines.calls import device_of
from placecheck.engines.compat import tree_map_only
from placecheck.engines.cudaapi import CPU_ONLY_BUILD, current_device
from placecheck.engines.dispatch import Call, subscribed
from placecheck.engines.engine import current_device_moves
from placecheck.engines.sources import Attribution
from placecheck.findings.events import EventSite
from placecheck.findings.finding import Finding
from placecheck.findings.rules import dtensor_mixed, left_out_of_sharding, on_replicas

__all__ = ["Replica", "Replicas", "data_parallel_simulated", "devices", "merge", "merged_notes",
           "no_replicas", "plan", "unwrap"]


@dataclass(frozen=True)
class Replicas:
    """How a model is replicated: the kind of wrapper and the number of replicas (or ranks)."""

    kind: WrapChoice
    count: int

    def label(self, index: int) -> str:
        """``replica 1 (cuda:1)`` (DataParallel) or ``rank 1 (cuda:1)`` (DDP, FSDP2)."""
        word = "replica" if self.kind is WrapChoice.DP else "rank"
        return f"{word} {index} (cuda:{index})"

    def describe(self) -> str:
        """The report's note: what ran, on how many simulated GPUs."""
        what = {WrapChoice.DP: "nn.DataParallel: one replica per GPU, replica k on cuda:k under "
                               "torch.cuda.device(k), run one after the other",
                WrapChoice.DDP: "DistributedDataParallel: rank k of a fake process group on cuda:k "
                                "(set_device(rank)), each building its own model",
                WrapChoice.FSDP: "FSDP2 fully_shard: rank k of a fake process group on cuda:k, "
                                 "parameters sharded over DeviceMesh('cuda', range(N))"}[self.kind]
        return (f"replicas: {self.count} ({what}); a finding only some of them have names them")

    def replica(self, index: int) -> Replica:
        return Replica(self, index)


def unwrap(model: Any) -> tuple[Any, WrapChoice | None]:
    """``model.module`` and its kind when ``model`` is a DataParallel or DistributedDataParallel object;
    otherwise ``model`` itself and None."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return model.module, WrapChoice.DDP
    if isinstance(model, nn.DataParallel):
        return model.module, WrapChoice.DP
    return model, None


def no_replicas() -> UsageError:
    """The error for ``--world-size`` given for a model that is not replicated."""
    return UsageError("--world-size needs replicas: pass --wrap dp|ddp|fsdp (a DataParallel or "
                      "DistributedDataParallel target is replicated without it)")


def _device_ids(model: Any) -> int:
    """How many GPUs a DataParallel object was built for (0: none were visible when it was built)."""
    return len(getattr(model, "device_ids", None) or ())


def plan(model: Any, options: AuditOptions) -> tuple[Any, Replicas | None]:
    """The model to build and how it is replicated (None: not replicated)."""
    ids = _device_ids(model) if isinstance(model, nn.DataParallel) else 0
    inner, wrapped = unwrap(model)
    kind = WrapChoice(options.wrap) if options.wrap is not None else wrapped
    if kind is None:
        if options.world_size is not None and isinstance(model, nn.Module):
            raise no_replicas()
        return model, None  # a factory may still return a DataParallel object: see no_replicas()
    if kind is WrapChoice.FSDP and CPU_ONLY_BUILD:
        raise UsageError("--wrap fsdp needs a CUDA build of torch (no GPU needed): on a CPU-only build fake "
                         "CUDA tensors cannot run FSDP2's sharding (its narrow/copy_ on them raise 'not "
                         "linked with support for cuda devices'); --wrap dp and ddp work on either build")
    if options.train and kind is WrapChoice.FSDP:
        raise UsageError("--train with --wrap fsdp needs a backward through FSDP2's reduce-scatter, which "
                         "the simulation cannot run without a GPU: audit the forward (drop --train)")
    count = options.world_size or options.gpus or ids or 2
    if options.gpus is not None and count > options.gpus:
        raise UsageError(f"{count} replicas need {count} GPUs; --gpus {options.gpus} was given: use "
                         f"--gpus {count} or --world-size {options.gpus}")
    return inner, Replicas(kind, count)


@dataclass(frozen=True)
class Replica:
    """One replica (or rank) of a replicated audit: the contexts its attempt runs in."""

    replicas: Replicas
    index: int
    mixes: list[Mix] = dataclasses.field(default_factory=list, compare=False, repr=False)
    """What the last forward's :class:`DTensorMixes` recorded."""

    @property
    def kind(self) -> WrapChoice:
        return self.replicas.kind

    @property
    def device(self) -> Device:
        return Device("cuda", self.index)

    @property
    def label(self) -> str:
        return self.replicas.label(self.index)

    @property
    def placed(self) -> bool:
        """The rank's model is audited as its code places it (FSDP2: ``fully_shard`` places the
        parameters), built inside the simulation, never moved with ``.to()``."""
        return self.kind is WrapChoice.FSDP

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        """The whole attempt (build, move, forward): a DDP/FSDP rank's process group and current device.
        A DataParallel model is built once, on the default current device (``cuda:0``). In both,
        ``device="cuda"`` and ``.cuda()`` follow the current device
        (:func:`~placecheck.engines.engine.current_device_moves`)."""
        if self.kind is WrapChoice.DP:
            with current_device_moves():
                yield
            return
        with _fake_process_group(self.index, self.replicas.count), current_device(self.index), \
                _fsdp_moves_fake_tensors(), current_device_moves():
            yield

    @contextlib.contextmanager
    def forward(self, model: nn.Module) -> Iterator[None]:
        """The forward of ``model`` (placed): DataParallel runs replica k under ``torch.cuda.device(k)``;
        an FSDP2 rank's ops are watched for a plain tensor meeting a DTensor (:class:`DTensorMixes`)."""
        self.mixes.clear()
        if self.kind is WrapChoice.DP:
            with current_device(self.index):
                yield
        elif self.kind is WrapChoice.FSDP:
            with subscribed(DTensorMixes(model, self.mixes)):
                yield
        else:
            yield

    def explained(self, findings: Sequence[Finding]) -> list[Finding]:
        """The attempt's findings, with what only this kind of replica can say: on an FSDP2 rank,
        registered state off the rank's GPU was left out of every ``fully_shard`` (no ``.to()`` ran),
        and each op that mixed a plain tensor with a DTensor is PC201."""
        if not self.placed:
            return list(findings)
        out = []
        for f in findings:
            if f.code in (Code.PC104, Code.PC105):
                what = "parameter" if f.code == Code.PC104 else "buffer"
                message, hint = left_out_of_sharding(what, f.where, f.device, f.expected)
                f = dataclasses.replace(f, message=message, hint=hint)
            out.append(f)
        return [*out, *(m.finding(self.device) for m in self.mixes)]

    def built(self, model: nn.Module) -> nn.Module:
        """The module to audit from what the factory returned: a DataParallel/DDP object's module."""
        inner, _ = unwrap(model)
        return inner  # type: ignore[no-any-return]

    def place(self, model: nn.Module, move: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """Put the replica's model on its GPU: ``move`` (``.to(cuda:k)``) for DataParallel and DDP; for
        FSDP2, ``fully_shard`` on the root unless the target sharded the model itself (then as placed)."""
        if self.kind is not WrapChoice.FSDP:
            return move(model)
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if any(isinstance(m, FSDPModule) for m in model.modules()):
            return model
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh("cuda", list(range(self.replicas.count)))
        fully_shard(model, mesh=mesh)  # shards in place; the returned object is the same model
        return model


@dataclass(frozen=True)
class Mix:
    """An op that mixed a plain tensor with a DTensor, where the user's code ran it."""

    op: str
    site: EventSite
    plain: str
    dtensor: str
    device: Device
    origin: str

    def finding(self, target: Device) -> Finding:
        """PC201 (see :func:`placecheck.findings.rules.dtensor_mixed` for why that code)."""
        return dtensor_mixed(self.op, self.plain, self.dtensor, self.dtensor, where=self.site.where,
                             source=self.site.source, device=self.device, expected=target, origin=self.origin)


@dataclass(frozen=True)
class DTensorMix:
    """A call that mixes a plain tensor (not a 0-dim scalar) with a DTensor, which DTensor refuses on the
    ranks ("got mixed torch.Tensor and DTensor"): decided from the arguments' types, never from
    DTensor's message. One decision for audit (:class:`DTensorMixes`) and run
    (:class:`placecheck.run.dtensors.ScriptDTensorMixes`)."""

    op: str
    dtensors: tuple[Any, ...]
    plain: torch.Tensor

    @staticmethod
    def of(call: Call) -> DTensorMix | None:
        """The mix ``call`` makes; None when it makes none (or only reads a DTensor's metadata)."""
        if "torch.distributed.tensor" not in sys.modules or call.func in _DTENSOR_METADATA:
            return None
        from torch.distributed.tensor import DTensor

        tensors = [t for _, t in call.tensors]
        dtensors = tuple(t for t in tensors if isinstance(t, DTensor))
        plain = [t for t in tensors if not isinstance(t, DTensor) and t.dim() > 0]
        return DTensorMix(call.name, dtensors, plain[0]) if dtensors and plain else None

    @property
    def dtensor(self) -> Any:
        return self.dtensors[0]

    @property
    def placements(self) -> str:
        """``Shard(dim=0) over DeviceMesh(...)``: how the first DTensor is laid out."""
        return f"{', '.join(str(p) for p in self.dtensor.placements)} over {self.dtensor.device_mesh}"

    @property
    def described(self) -> tuple[str, str]:
        """The plain tensor and the DTensor, for the rule's message."""
        return (f"{_describe(self.plain)} on {self.plain.device}",
                f"{_describe(self.dtensor)} {self.placements}")

    def full_values(self, detach: bool = False) -> dict[int, torch.Tensor]:
        """``id(dtensor) -> its full value`` (detached: no gradient reaches the DTensor through it)."""
        return {id(d): d.full_tensor().detach() if detach else d.full_tensor() for d in self.dtensors}

    @staticmethod
    def run_on(call: Call, full: dict[int, torch.Tensor]) -> Any:
        """``call`` run with its DTensors replaced by their ``full`` values, so the forward goes on."""
        args, kwargs = tree_map_only(torch.Tensor, lambda x: full.get(id(x), x), (call.args, call.kwargs))
        return call.func(*args, **kwargs)


class DTensorMixes:
    """Records every op that mixes a plain tensor with a DTensor (:class:`DTensorMix`), and runs it on the
    DTensor's full value instead, so that the forward goes on and one run reports every such op.

    A handler of the dispatcher, subscribed before the tracer, so the tracer sees the call as the
    model made it and this handler sees it just before the engine.
    """

    def __init__(self, model: nn.Module, found: list[Mix]) -> None:
        from placecheck.checks.trace import Tracer

        paths: dict[int, str] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            paths.setdefault(id(module), path)
        self.parameters = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
        self.attribution = Attribution(Tracer.run.__code__, paths)
        self.found = found
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, call: Call) -> Any:
        mix = DTensorMix.of(call)
        if mix is None:
            return call.run()
        site = self.attribution.site(sys._getframe(1))
        if (site.source, mix.op) not in self.seen:
            self.seen.add((site.source, mix.op))
            self.found.append(Mix(mix.op, site, *mix.described, device_of(mix.dtensor),
                                  self.parameters.get(id(mix.dtensor), "")))
        return mix.run_on(call, mix.full_values())


_DTENSOR_METADATA = frozenset({torch.Tensor.dim, torch.Tensor.size, torch.Tensor.numel, torch.Tensor.stride,
                               torch.Tensor.__repr__, torch.Tensor.__format__})


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


@contextlib.contextmanager
def _fake_process_group(rank: int, world_size: int) -> Iterator[None]:
    """PyTorch's fake process group as the default group, for ``rank`` of ``world_size``: collectives
    return at once without moving data (:func:`placecheck.engines.compat.fake_store`)."""
    import torch.distributed as dist

    if not dist.is_available():
        raise UsageError("this build of torch has no torch.distributed: --wrap ddp|fsdp needs it "
                         "(--wrap dp does not)")
    if dist.is_initialized():
        raise UsageError("a process group is already initialised in this process: audit replicated "
                         "models before init_process_group, or from the command line")
    from placecheck.engines.compat import fake_store

    dist.init_process_group("fake", store=fake_store(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _fsdp_moves_fake_tensors() -> Iterator[None]:
    """Let ``fully_shard`` move a CPU-built model's parameters and buffers to the rank's simulated GPU.

    FSDP2 moves them with ``tensor.data = tensor.to(device)``, which cannot make a real CPU tensor a
    fake CUDA one (the parameter silently stays on the CPU, and FSDP2 then asserts it was not moved);
    under the fake mode each is swapped for its moved self instead (``torch.utils.swap_tensors``, as
    FSDP2 itself does for tensor subclasses), which keeps every Parameter object, as on a GPU.
    """
    from placecheck.engines.compat import fsdp_init_module

    _fsdp_init = fsdp_init_module()
    if _fsdp_init is None:  # no FSDP2 in this build: nothing to patch
        yield
        return
    original = getattr(_fsdp_init, "_move_states_to_device", None)
    if original is None:
        yield
        return

    def move_states(params: list[nn.Parameter], buffers: list[torch.Tensor], device: torch.device) -> None:
        from torch.distributed.tensor import DTensor

        from placecheck.engines.compat import active_fake_mode

        mode = active_fake_mode()
        rest: list[torch.Tensor] = []
        for tensor in [*params, *buffers]:
            if mode is None or isinstance(tensor, DTensor) or tensor.device in (device, _META):
                rest.append(tensor)
                continue
            with torch.no_grad():
                moved = tensor.to(device)
            _forget_converted(mode, tensor)
            swapped = (nn.Parameter(moved, requires_grad=tensor.requires_grad)
                       if isinstance(tensor, nn.Parameter) else moved)
            torch.utils.swap_tensors(tensor, swapped)  # type: ignore[no-untyped-call]
        original([t for t in rest if isinstance(t, nn.Parameter)],
                 [t for t in rest if not isinstance(t, nn.Parameter)], device)

    with patch(_fsdp_init, "_move_states_to_device", move_states,
               "FSDP1 moves its states with plain .to() calls inside its constructor, which the fake "
               "engine must turn into moves to the rank's simulated GPU"):
        yield


_META = torch.device("meta")


def _forget_converted(mode: Any, t: torch.Tensor) -> None:
    """Drop the fake mode's memo of ``t`` (the weak reference its conversion left), so that it can be
    swapped (``swap_tensors`` refuses a tensor with a weak reference)."""
    memo = mode.fake_tensor_converter.tensor_memo
    for ref in weakref.getweakrefs(t):
        key = getattr(ref, "key", None)
        if isinstance(ref, weakref.KeyedRef) and key is not None and key in memo:
            del memo[key]


def _key(finding: Finding) -> tuple[str, str, str, str]:
    return (finding.code, finding.kind, finding.where, finding.source)


def merge(replicas: Replicas, runs: Sequence[Sequence[Finding]]) -> list[Finding]:
    """The findings of every replica's attempt (``runs[k]`` for replica k) as one list.

    A finding every replica has (same code, place and line: a stray left on the
    CPU) is reported once, as the first replica has it. One that only some
    replicas have (replica 1 meeting a tensor kept on ``cuda:0``) is reported
    once, as the first of them has it, naming them all, with their labels in
    ``details["replicas"]``.
    """
    seen: dict[tuple[tuple[str, str, str, str], int], list[tuple[int, Finding]]] = {}
    for index, findings in enumerate(runs):
        counts: dict[tuple[str, str, str, str], int] = {}
        for f in findings:
            key = _key(f)
            nth = counts.get(key, 0)
            counts[key] = nth + 1
            seen.setdefault((key, nth), []).append((index, f))
    merged: list[Finding] = []
    for members in seen.values():
        first = members[0][1]
        if len(members) == replicas.count:
            merged.append(first)
            continue
        labels = [replicas.label(i) for i, _ in members]
        merged.append(dataclasses.replace(
            first, message=on_replicas(labels, first.message),
            details=(*first.details, ("replicas", ", ".join(labels)))))
    return merged


def merged_notes(replicas: Replicas, runs: Sequence[Sequence[str]]) -> list[str]:
    """What the replicas ran, then every replica's notes, once each; a note only some replicas have
    names them. The first replica's engine and init notes stand for all (the others differ only in
    the memory they found available)."""
    order: list[str] = []
    where: dict[str, list[int]] = {}
    for index, notes in enumerate(runs):
        for note in notes:
            if index and note.startswith(_SAID_ONCE):
                continue
            if note not in where:
                order.append(note)
            where.setdefault(note, []).append(index)
    out = [replicas.describe()]
    for note in order:
        indexes = where[note]
        out.append(note if len(indexes) == replicas.count or note.startswith(_SAID_ONCE)
                   else f"{', '.join(replicas.label(i) for i in indexes)}: {note}")
    return out


_SAID_ONCE = ("engine: ", "torch: ", "init: ")


def devices(replicas: Replicas) -> str:
    """The report's device: every replica's GPU (``cuda:0, cuda:1``)."""
    return ", ".join(Device("cuda", k) for k in range(replicas.count))


@contextlib.contextmanager
def data_parallel_simulated(gpus: int, quiet: Callable[[], contextlib.AbstractContextManager[Any]]
                            ) -> Iterator[None]:
    """``nn.DataParallel`` in ``placecheck run`` as on a machine with ``gpus`` GPUs.

    torch's own code asks for the GPUs through ``torch._utils`` (which the simulation answers with the
    real machine's none: ``device_ids`` would be empty and the forward run on the inputs as given), and
    its ``scatter``/``replicate``/``gather`` copy data in C++ with the CUDA driver. So, for the session:
    ``DataParallel(module)`` gets ``device_ids = range(gpus)`` and ``output_device = device_ids[0]`` as on
    a GPU machine (the balance check, which reads device properties, is skipped), and its forward does
    what DataParallel does to placement: the same check that the module is on ``device_ids[0]``, the
    inputs scattered to the replicas' GPUs (run as replica 0: the whole input on ``device_ids[0]``, as
    ``audit --wrap dp`` gives each replica the whole input), the module's forward, and, with more
    than one GPU, the outputs gathered on ``output_device`` (the CPU for -1). The scatter and the
    gather are DataParallel's copies, not the script's (``quiet``): a CPU input is correct."""
    import importlib

    data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")  # the module, not its function
    original = data_parallel.DataParallel.forward

    def forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        if not self.device_ids:
            return original(self, *inputs, **kwargs)
        for t in [*self.module.parameters(), *self.module.buffers()]:
            if t.device != self.src_device_obj:
                raise RuntimeError(f"module must have its parameters and buffers on device "
                                   f"{self.src_device_obj} (device_ids[0]) but found one of them on device: "
                                   f"{t.device}")
        with quiet():  # scatter: each input tensor copied to the replica's GPU
            inputs, kwargs = tree_map_only(torch.Tensor, lambda t: t.to(self.src_device_obj),
                                           (inputs, kwargs))
        out = self.module(*inputs, **kwargs)
        if len(self.device_ids) == 1:
            return out  # one GPU: DataParallel returns the module's output as it is
        target = torch.device("cpu") if self.output_device == -1 else \
            torch.device(self.src_device_obj.type, self.output_device)
        with quiet():  # gather: the outputs copied to output_device
            return tree_map_only(torch.Tensor, lambda t: t.to(target), out)

    why = ("DataParallel asks the driver for its GPUs and scatters and gathers through NCCL kernels; on the "
           "simulated machine it gets --gpus GPUs and moves its inputs and outputs as those kernels would")
    with patch(data_parallel, "_get_available_device_type", lambda: "cuda" if gpus else None, why), \
            patch(data_parallel, "_get_all_device_indices", lambda: list(range(gpus)), why), \
            patch(data_parallel, "_check_balance", lambda device_ids: None, why), \
            patch(data_parallel.DataParallel, "forward", forward, why):
        yield
