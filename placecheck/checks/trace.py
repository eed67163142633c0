"""The instrumented forward pass: what happened on which device, and where in the user's code.

In the style of ``torch/utils/flop_counter.py``: the public :class:`Tracer`
owns the state and the events; it subscribes to the one dispatcher
(:mod:`placecheck.engines.dispatch`), which hands it each torch call read
once as a ``Call``. The checks (:meth:`Tracer.findings`) read the events
afterwards and turn them into findings PC201-PC207.

The tracer sees every torch call before dispatch. When a call fails and its
tensor arguments are on two devices (decided from the tensors, by
:mod:`placecheck.engines.classify`, whatever PyTorch's message says), the tracer
records the mismatch (op, devices, module, user line, where the offending
tensor came from), moves the offending argument to the target and runs the
call again, so one forward reports every mismatch.

Where an event happened is :mod:`placecheck.engines.sources`' answer; where an
off-target tensor came from is :mod:`placecheck.checks.provenance`'s.

Cost: a clean op costs a dictionary lookup and a scan of its arguments (plus,
for off-target arguments only, a lookup among the strays); the
Python stack is walked only when an event is recorded.

Not reentrant: one tracer at a time per process (the registration hooks are global).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
import typing
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.errors import one_line
from placecheck.basics.patching import patch
from placecheck.basics.values import Device
from placecheck.checks.expected import Placement
from placecheck.checks.flows import Flows
from placecheck.checks.host_syncs import HOST_SYNCS, host_sync
from placecheck.checks.hostcopies import PendingCopies, PendingCopy, nonblocking_host_copy
from placecheck.checks.provenance import Provenances, StrayVerdict
from placecheck.checks.walk import WalkResult, join
from placecheck.engines import classify, compat
from placecheck.engines.calls import device_of
from placecheck.engines.compat import DisableTorchFunction
from placecheck.engines.cudaapi import missing_gpu
from placecheck.engines.datadep import composite_call
from placecheck.engines.dispatch import Call, op_name, subscribed
from placecheck.engines.repair import repaired
from placecheck.engines.sources import Attribution, frames_of, module_being_built, treat_as_user_code
from placecheck.findings import rules
from placecheck.findings.events import (
    NOWHERE,
    Creation,
    Event,
    EventSite,
    ForwardError,
    GradOffDevice,
    HostSync,
    ImplicitTransfer,
    Mismatch,
    OutputOffDevice,
    Provenance,
    Registration,
    StaleRead,
)
from placecheck.findings.finding import Finding

if typing.TYPE_CHECKING:
    from placecheck.engines.reuse import CallReuse

# -- calls -------------------------------------------------------------------------------------

_MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.type_as})
_METADATA = frozenset({torch.Tensor.dim, torch.Tensor.size, torch.Tensor.numel, torch.Tensor.stride,
                       torch.Tensor.is_contiguous, torch.Tensor.data_ptr, torch.Tensor.__len__,
                       torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.__hash__,
                       torch.Tensor.element_size, torch.Tensor.get_device, torch.Tensor.is_floating_point,
                       torch.Tensor.is_complex, torch.Tensor.storage_offset, torch.Tensor.untyped_storage})
_HOST_FACTORIES = ("from_numpy", "frombuffer")
"""Factories that build a tensor from host memory without a torch function call the mode sees."""
_passthrough: dict[Any, bool] = {}


def _is_passthrough(func: Callable[..., Any]) -> bool:
    known = _passthrough.get(func)
    if known is None:
        known = func in _METADATA or getattr(func, "__name__", "") in ("__get__", "__set__")
        _passthrough[func] = known
    return known


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _shape(t: torch.Tensor) -> tuple[int, ...] | None:
    try:
        return tuple(int(s) for s in t.shape)
    except (RuntimeError, TypeError, ValueError):
        return None


# -- the tracer --------------------------------------------------------------------------------


class Tracer:
    """Runs one forward (and optionally backward) pass of a moved model and records what happens.

    ``walk`` is the walk's result for the same model, so that a mismatch can
    name the attribute its tensor came from. ``move`` moves one tensor to the
    target on the current engine (the same function the inputs went through).

    ``placement`` (``--device keep``: a model its own code placed across devices)
    makes the target of each call the device of the module whose forward runs it
    (:mod:`placecheck.placement`): :attr:`target` then changes from call to call,
    and ``target`` is only the fallback (the model's first device). Copies between
    devices are recorded (:class:`~placecheck.findings.events.Copy`, :attr:`flows`), not
    taken for tensors created off the target.
    """

    def __init__(self, model: nn.Module, target: Device, walk: WalkResult | None = None,
                 move: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 placement: Placement | None = None) -> None:
        self.model = model
        self.target = torch.device(target)
        self.target_name = target
        self.placement = placement
        self.flows: Flows | None = Flows(placement, model) if placement is not None else None
        """``--device keep``: the module stack, each tensor's stage and the copies between devices."""
        self.events: list[Event] = []
        self.module_paths: dict[int, str] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            self.module_paths.setdefault(id(module), path)
        treat_as_user_code(*{type(m) for m in model.modules()})
        self.parameters = {id(p) for p in model.parameters()}
        self.prov = Provenances(walk)
        """Where each off-target tensor came from, and what happened to the walk's strays."""
        self.completed = False
        """The forward returned (strays untouched so far may be used later otherwise)."""
        self.library: dict[str, int] = {}
        """Installed package -> performance findings raised entirely inside it (info findings)."""
        self._checked: rules.ForwardFindings | None = None
        self._unregistered_paths: dict[int, str] = {}
        self.attribution = Attribution(_RUN_CODE, self.module_paths, self._unregistered_path)
        self._recorded: set[tuple[Any, ...]] = set()
        self.scripted: list[str] = []
        """The TorchScript functions the forward ran as Python (:meth:`_scripted_eagerly`)."""
        self._device_copies: dict[int, tuple[torch.Tensor, Creation]] = {}
        """``id()`` of each device copy of a tensor created in forward -> it and its creation."""
        self._mismatch_errors: list[BaseException] = []
        """Errors of ops whose arguments mixed devices that the tracer could not repair."""
        self._after_repair: list[BaseException] = []
        """Errors a repaired call raised once its devices agreed (a shape the input does not fit): the
        forward stops there for a reason of its own, after the mismatch a GPU raises first."""
        self._move = move or (lambda t: t.to(self.target))
        self.pending = PendingCopies()
        """Non-blocking device-to-host copies no synchronize has covered yet (PC210)."""
        self.activity = 0
        """Calls so far that met an off-target tensor (argument or result) or registered a module or
        parameter: a call that adds none did nothing placement-related (:mod:`placecheck.engines.reuse`)."""

    @property
    def strays(self) -> set[str]:
        """The walk's stray tensors (PC101), whose use in forward is followed."""
        return self.prov.strays

    # -- the recording context ----------------------------------------------------------------
    @contextlib.contextmanager
    def recording(self) -> Iterator[Tracer]:
        """Record every torch call and every module/parameter registration inside."""
        from torch.nn.modules import module as module_mod

        handles = [module_mod.register_module_module_registration_hook(self._on_module_registered),
                   module_mod.register_module_parameter_registration_hook(self._on_parameter_registered)]
        if self.flows is not None:
            handles += self.flows.hooks(self.module_paths)
        try:
            with subscribed(self.on_call), _attention_fast_path_kept(self.target), \
                    self._host_factories_seen(), self.pending.synchronizations_seen(), \
                    self._scripted_eagerly():
                yield self
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def _scripted_eagerly(self) -> Iterator[None]:
        """TorchScript functions (``@torch.jit.script def encode(...)``) that the model's code calls run
        as the Python they were compiled from while recording (:func:`compat.scripted_python_function`),
        as ``PYTORCH_JIT=0`` runs them: their ops reach the mode, and a finding names the line inside
        them, not the forward's line that calls them. Swapped in the globals of the model's classes'
        ``forward`` functions, and of each function swapped in (a helper calling another); put back
        afterwards."""
        classes = {type(m) for m in self.model.modules()}
        namespaces = [f.__globals__ for f in (getattr(cls, "forward", None) for cls in classes)
                      if inspect.isfunction(f)]
        swapped: list[tuple[dict[str, Any], str, Any]] = []
        seen: set[int] = set()
        while namespaces:
            namespace = namespaces.pop()
            if id(namespace) in seen:
                continue
            seen.add(id(namespace))
            for name, value in list(namespace.items()):
                python = compat.scripted_python_function(value)
                if python is not None:
                    swapped.append((namespace, name, value))
                    namespace[name] = python
                    namespaces.append(python.__globals__)
        if swapped:
            self.scripted = sorted({name for _, name, _ in swapped})
        try:
            yield
        finally:
            for namespace, name, value in reversed(swapped):
                namespace[name] = value

    @contextlib.contextmanager
    def _host_factories_seen(self) -> Iterator[None]:
        """``torch.from_numpy`` and ``torch.frombuffer`` never reach a torch function mode: wrap them
        (as ``torch.X``, where model code looks them up) while recording, so their tensors are creations."""
        originals = {name: getattr(torch, name) for name in _HOST_FACTORIES}

        def wrapped(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def factory(*args: Any, **kwargs: Any) -> Any:
                with DisableTorchFunction():  # fake tensors' own conversion is not the model's
                    out = original(*args, **kwargs)
                if isinstance(out, torch.Tensor) and out.device != self.target:
                    self._off_target_result(original, args, [], out)
                return out
            return factory

        with contextlib.ExitStack() as stack:
            for name, original in originals.items():
                stack.enter_context(patch(torch, name, wrapped(original), _WHY_CONVERSIONS))
            yield

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any], train: bool = False,
            reuse: CallReuse | None = None) -> Any:
        """One forward pass (``eval()`` + ``no_grad`` unless ``train``), then the output check; in
        training mode a backward of the summed floating outputs and the gradient check. ``reuse``
        (fake engine): identical module calls run once (:mod:`placecheck.engines.reuse`).

        What the model raises propagates: the caller decides whether another
        engine can run it, or records it with :meth:`record_error`.
        """
        self.model.train(train)
        with torch.enable_grad() if train else torch.no_grad():
            with self.recording(), reuse.installed() if reuse is not None else contextlib.nullcontext():
                output = self.model(*args, **kwargs)
            self.completed = True
            self._caches_kept()
            self.check_output(output)
            if train:
                self.backward(output)
        return output

    def _caches_kept(self) -> None:
        """Creations whose device copy a module kept as a plain attribute after the forward: a cache
        (``self.src_mask = mask``), built when empty, not a copy on every call (``Creation.kept_in``)."""
        if not self._device_copies:
            return
        for path, module in self.model.named_modules():
            for attr, value in list(vars(module).items()):
                if not isinstance(value, torch.Tensor):
                    continue
                known = self._device_copies.get(id(value))
                if known is not None and known[0] is value and not known[1].kept_in:
                    known[1].kept_in = f"{path}.{attr}" if path else attr

    def is_mismatch(self, exc: BaseException) -> bool:
        """True when ``exc`` is a device mismatch: an op whose arguments mixed devices raised it (seen
        by this tracer), or an engine raised its own mismatch type."""
        chain: BaseException | None = exc
        while chain is not None:
            if any(chain is known for known in self._mismatch_errors):
                return True
            chain = chain.__cause__ or chain.__context__
        return classify.is_engine_mismatch(exc)

    def failed_after_repair(self, exc: BaseException) -> bool:
        """True when ``exc`` is what a call raised once :meth:`_repair` had put its arguments on one
        device: a GPU raises the mismatch there first (its PC201 is recorded), and the call fails for
        another reason after it, so the forward did not get past that line."""
        return any(exc is known for known in self._after_repair)

    def record_error(self, exc: BaseException, phase: str = "forward") -> None:
        """Record what the forward (or backward) raised, at the innermost user frame of its traceback."""
        frames = frames_of(exc.__traceback__)
        site = self._site(frames[-1]) if frames else NOWHERE
        # an error raised after the repair chains the mismatch (its __context__), which has its PC201 already
        after = self.failed_after_repair(exc)
        mismatch = self.is_mismatch(exc) and not after
        self.events.append(ForwardError(phase, one_line(exc), site, mismatch=mismatch, after_repair=after))

    def backward(self, output: Any) -> None:
        """Backward of the summed floating outputs; then every gradient must be on the target."""
        floats = [t for _, t in classify.tensors_with_paths(output, "")
                  if t.is_floating_point() and t.requires_grad]
        if not floats:
            return
        total = functools.reduce(lambda a, b: a + b, (self._move(t).sum() for t in floats))
        try:
            total.backward()  # type: ignore[no-untyped-call]
        except Exception as exc:
            self.record_error(exc, "backward")
            return
        for name, p in self.model.named_parameters():
            grad = p.grad
            if grad is not None and grad.device != (p.device if self.placement is not None else self.target):
                self.events.append(GradOffDevice(name, device_of(grad)))

    def check_output(self, output: Any) -> None:
        """PC206: every tensor in the (nested) output must be on the target."""
        expected = self.placement.expected("") if self.placement is not None else None
        for path, t in classify.tensors_with_paths(output, "output"):
            if (t.device != self.target) if expected is None else not expected.allows(device_of(t)):
                prov = self.provenance(t)
                self.prov.mark(prov, "met_device")
                copied_at = prov.host_copy.source if prov.host_copy is not None else None
                sync = next((e for e in self.events
                             if isinstance(e, HostSync) and e.site.source == copied_at), None)
                self.events.append(OutputOffDevice(path, device_of(t), _dtype(t), _shape(t), prov, sync,
                                                   expected=expected.label if expected else ""))

    # -- per call ---------------------------------------------------------------------------------
    def on_call(self, call: Call) -> Any:
        """One torch call (the dispatcher's): run it, recording what it does across devices."""
        func = call.func
        return self.pending.watched(func, call.args, call.kwargs, lambda: self._placed_call(call),
                                    lambda copy: self._record_stale_read(func, copy),
                                    lambda: self._site(sys._getframe()))

    def _placed_call(self, call: Call) -> Any:
        func, args = call.func, call.args
        flows = self.flows
        if flows is None or _is_passthrough(func):
            return self._on_call(call)
        # --device keep: this call's target is the device of the module running it
        tensors = call.tensors
        saved = self.target, self.target_name
        self.target = flows.target(tensors, self.target)
        self.target_name = device_of(self.target)
        try:
            out = self._on_call(call)
        finally:
            self.target, self.target_name = saved
        copied = flows.after_call(func, args, tensors, out, self._site)
        if copied is not None:
            self.events.append(copied)
        return out

    def _on_call(self, call: Call) -> Any:
        func, args, kwargs = call.func, call.args, call.kwargs
        sync = host_sync(func, args, kwargs)
        if sync is not None:
            self._record_host_sync(*sync)
        if _is_passthrough(func):
            return func(*args, **kwargs)
        refused = classify.refused_on_device(func, args)
        if refused is not None:
            raise refused  # what a GPU raises here, whatever the engine would do
        tensors = call.tensors
        target = self.target
        args, kwargs = self._misplaced_generator_or_host_argument(func, args, kwargs, tensors)
        off = [(pos, t) for pos, t in tensors if t.device != target]
        if off:
            self.activity += 1
            self.prov.touched(off)
        if off and len(off) < len(tensors):
            self._check_implicit(func, off)
        try:
            if off and classify.mixes_devices(func, tensors, args):
                # decided before the call: an engine may run a mix that a GPU refuses (fake tensors take
                # a 0-dim CPU tensor in clamp, the self of an in-place op, a foreach list's element)
                raise classify.DeviceMismatchError(f"{op_name(func)} mixed devices")
            handled, out = composite_call(func, args, kwargs)  # fake tensors: ATen reads data there
            if not handled:
                out = func(*args, **kwargs)
        except Exception as exc:
            if not off or not classify.mixes_devices(func, tensors, args):
                if off and classify.is_engine_mismatch(exc):
                    return self._accepted_mix(func, args, kwargs, off, exc)
                raise
            out = self._repair(func, args, kwargs, exc)
            off = []
        if isinstance(out, torch.Tensor) and out.device != target:
            missing = missing_gpu(out.device)
            if missing is not None:
                raise missing  # CUDA's "invalid device ordinal", at this line
            if self.flows is not None and self.flows.between_devices(func, args, out):
                return out  # a copy between devices: traffic (Flows), not a tensor created off the target
            self._off_target_result(func, args, off, out, kwargs)
        elif off and isinstance(out, torch.Tensor):
            self._copied_to_device(func, off, out)
        elif isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
            for o in out:
                if isinstance(o, torch.Tensor) and o.device != target:
                    self._off_target_result(func, args, off, o)
        return out

    def _accepted_mix(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                      off: list[tuple[int, torch.Tensor]], exc: Exception) -> Any:
        """An engine refused a mix a GPU accepts (a 0-dim CPU scalar, ``ctc_loss``'s CPU lengths): the
        simulation's limit, not the model's. Run the call again with those arguments on the target."""
        moved = {id(t): self._move(t) for _, t in off}
        try:
            return func(*classify.replace_tensors(args, moved), **classify.replace_tensors(kwargs, moved))
        except Exception:
            raise exc from None

    def _misplaced_generator_or_host_argument(
            self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
            tensors: list[tuple[int, torch.Tensor]]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """PC201 for what a GPU refuses that is no mix of tensors: a ``torch.Generator`` of another
        device type than the call's, or a tensor the op needs on the CPU (``pack_padded_sequence``'s
        lengths) on the device. Recorded, then the call goes on with it fixed."""
        device = self._call_device(kwargs, tensors)
        generator = classify.generator_off_device(args, kwargs, device)
        if generator is not None:
            device = device or torch.get_default_device()  # a factory with neither runs there
            self._record_mismatch(func, "generator", device_of(generator.device), None,
                                  (device_of(generator.device), device_of(device)), refused="generator",
                                  expected=str(device))
            args = tuple(None if a is generator else a for a in args)
            kwargs = {k: (None if v is generator else v) for k, v in kwargs.items()}
        host = classify.host_arguments_on_device(func, tensors)
        if host:
            moved: dict[int, torch.Tensor] = {}
            for pos, t in host:
                name = classify.host_argument_name(func, pos) or "tensor"
                self._record_mismatch(func, "tensor", device_of(t), t, (device_of(t), Device("cpu")),
                                      expected="cpu", refused=name)
                moved[id(t)] = t.cpu()
            args, kwargs = classify.replace_tensors(args, moved), classify.replace_tensors(kwargs, moved)
        return args, kwargs

    @staticmethod
    def _call_device(kwargs: dict[str, Any], tensors: list[tuple[int, torch.Tensor]]) -> torch.device | None:
        """Where a call runs: its ``device=``, else its first tensor's device."""
        device = kwargs.get("device")
        if isinstance(device, str | torch.device):
            return torch.device(device)
        return tensors[0][1].device if tensors else None

    def _record_mismatch(self, func: Callable[..., Any], what: str, device: Device, t: torch.Tensor | None,
                         devices: tuple[Device, ...], expected: str = "", refused: str = "") -> None:
        """A PC201 at the current user line that no retry of :meth:`_repair` decides; ``refused`` names
        what the GPU refuses (:attr:`~placecheck.findings.events.Mismatch.refused`)."""
        site = self._site(sys._getframe())
        prov = self.provenance(t) if t is not None else Provenance()
        key = ("mismatch", site.source, prov.origin, what)
        if key in self._recorded:
            return
        self._recorded.add(key)
        dtype, shape = (_dtype(t), _shape(t)) if t is not None else (what, None)
        self.events.append(Mismatch(op_name(func), tuple(sorted(set(devices))), device, site, prov, dtype,
                                    shape, expected=expected or self.target_name, refused=refused))

    def _copied_to_device(self, func: Callable[..., Any], off: list[tuple[int, torch.Tensor]],
                          out: torch.Tensor) -> None:
        """A call took off-target tensors and returned one on the target: a copy to the device
        (``.to(x.device)``, ``.cuda()``, ``.type_as(x)``, ``torch.as_tensor(t, device=...)``).
        A legal CPU scalar or index an op reads is not a copy of that tensor."""
        copied = off if func in _MOVES else [(pos, t) for pos, t in off
                                             if not classify.legal_cpu_argument(func, pos, t)]
        if not copied:
            return
        site: EventSite | None = None
        for _, t in copied:
            prov = self.provenance(t)
            if prov.creation is not None or prov.path or prov.also:
                site = site or self.attribution.site(sys._getframe(), subject=t)
                self.prov.mark(prov, "moved", at=site, to=device_of(out))
            if prov.creation is not None:
                self._device_copies[id(out)] = (out, prov.creation)

    def _repair(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                exc: Exception) -> Any:
        """Record the mismatch, move the offending arguments to the target, and run the call again
        (:func:`placecheck.engines.repair.repaired`)."""
        def fix(tensors: list[tuple[int, torch.Tensor]], _: Exception) -> dict[int, torch.Tensor]:
            off = [(pos, t) for pos, t in tensors if t.device != self.target]
            offending = classify.offending_arguments(func, off, self.target)
            if not offending:
                return {}
            devices = sorted({device_of(t) for _, t in off} | {self.target_name})
            site = self._site(sys._getframe())
            moved: dict[int, torch.Tensor] = {}
            for pos, t in offending:
                prov = self.provenance(t)
                self.prov.mark(prov, "fed_mismatch")
                stages = self.flows.stages(t) if self.flows is not None else None
                key = ("mismatch", site.source, prov.origin, stages)
                if key not in self._recorded:
                    self._recorded.add(key)
                    self.events.append(Mismatch(op_name(func), tuple(devices), device_of(t), site, prov,
                                                _dtype(t), _shape(t), expected=self.target_name,
                                                stages=stages, argument=pos))
                moved[id(t)] = self._move(t)
            return moved

        def gave_up(error: Exception, after_repair: bool) -> None:
            (self._after_repair if after_repair else self._mismatch_errors).append(error)

        return repaired(func, args, kwargs, exc, fix, gave_up)

    def _off_target_result(self, func: Callable[..., Any], args: tuple[Any, ...],
                           off: list[tuple[int, torch.Tensor]], out: torch.Tensor,
                           kwargs: dict[str, Any] | None = None) -> None:
        """An op returned a tensor off the target: derived from an off-target input, or created here."""
        self.activity += 1
        if func in (torch.Tensor.to, torch.Tensor.type_as) and args and isinstance(args[0], torch.Tensor) \
                and args[0].device.type != "cpu" and out.device.type == "cpu" \
                and nonblocking_host_copy(func, args, kwargs or {}, out) is None:
            self._record_host_sync(f".{func.__name__}()", args[0])  # a blocking device-to-host copy waits
        if self.prov.knows(out):
            return
        provenances = [p for p in (self.provenance(t) for _, t in off) if p.path or p.creation is not None]
        if provenances:
            first = provenances[0]
            head = first.creation
            for other in provenances[1:]:
                joined = other.creation
                if head is not None and joined is not None and joined is not head \
                        and all(c is not joined for c in head.merged):
                    head.merged.append(joined)
            if len(provenances) > 1:
                first = dataclasses.replace(first, also=(*first.also, *provenances[1:]))
            if func in _MOVES and head is not None and not head.moved_to:
                head.moved_to = device_of(out)  # a hard-coded .cuda()/.to("cuda:0"): where it went
            self.prov.remember(out, first)
            return
        if off:
            return
        if func is torch.Tensor.cpu or (func in (torch.Tensor.to, torch.Tensor.type_as) and args
                                        and isinstance(args[0], torch.Tensor)
                                        and args[0].device.type != "cpu" and out.device.type == "cpu"):
            # a device-to-host copy: PC204, not a creation; its line is where the result came from
            self.prov.remember(out, Provenance(host_copy=self._site(sys._getframe())))
            return
        frame = sys._getframe()
        site = self.attribution.site(frame, subject=out)
        building = module_being_built(frame)
        op = f"{building}(...) built in forward" if building else op_name(func)
        creation = Creation(op, device_of(out), site, _dtype(out), _shape(out), expected=self.target_name)
        key = ("creation", site.source, op)
        if key not in self._recorded:
            self._recorded.add(key)
            self.events.append(creation)
        else:
            creation = next(e for e in self.events if isinstance(e, Creation)
                            and e.site.source == site.source and e.op == op)
        self.prov.remember(out, Provenance(creation=creation))

    def _check_implicit(self, func: Callable[..., Any], off: list[tuple[int, torch.Tensor]]) -> None:
        for pos, t in off:
            if t.device.type != "cpu":
                continue
            scalar = t.dim() == 0
            if scalar or (func in classify.index_ops() and pos > 0):
                site = self.attribution.site(sys._getframe(), subject=t)
                key = ("implicit", site.source, scalar)
                prov = self.provenance(t)
                if not scalar:  # a copied index; a scalar is read on the host, legally
                    self.prov.mark(prov, "fed_mismatch", creations=False)
                    self.prov.mark(prov, "met_device")
                if key not in self._recorded:
                    self._recorded.add(key)
                    self.events.append(ImplicitTransfer(op_name(func), scalar, site, prov,
                                                        _dtype(t), _shape(t), expected=self.target_name))

    def stray_verdicts(self, after: WalkResult) -> list[StrayVerdict]:
        """The strays (PC101) the forward shows it handles, and how (``after``: the walk repeated after
        the forward; see :meth:`placecheck.checks.provenance.Provenances.stray_verdicts`)."""
        return self.prov.stray_verdicts(after, self.completed)

    def _record_host_sync(self, name: str, t: torch.Tensor) -> None:
        self.pending.synchronized()  # the host waited for the stream: earlier non-blocking copies landed
        site = self.attribution.site(sys._getframe(), subject=t)
        key = ("sync", site.source, name)
        if key not in self._recorded:
            self._recorded.add(key)
            self.events.append(HostSync(name, device_of(t), site))

    def _record_stale_read(self, func: Callable[..., Any], copy: PendingCopy) -> None:
        """PC210: ``func`` read on the host a tensor that a non-blocking copy was still filling."""
        site = self._site(sys._getframe())
        copied_at: EventSite = copy.copied_at
        key = ("stale", site.source, copied_at.source)
        if key in self._recorded:
            return
        self._recorded.add(key)
        known = HOST_SYNCS.get(func)
        self.events.append(StaleRead(known[0] if known is not None else op_name(func), copy.device, site,
                                     copied_at))

    # -- registrations (PC203) ----------------------------------------------------------------------
    def _on_module_registered(self, module: nn.Module, name: str, submodule: nn.Module | None) -> None:
        owner = self.module_paths.get(id(module))
        if owner is None or submodule is None or id(submodule) in self.module_paths:
            return
        self.activity += 1
        path = join(owner, name)
        for sub_path, sub in submodule.named_modules():
            self.module_paths.setdefault(id(sub), join(path, sub_path))
        for tname, t in [*submodule.named_parameters(), *submodule.named_buffers()]:
            self.prov.add_lazy(t, join(path, tname))
        if isinstance(submodule, nn.modules.lazy.LazyModuleMixin):
            return  # nn.Lazy* follow .to() correctly; not this bug
        # built on the target (device=x.device, or the target is the CPU) it is placed right, but an
        # optimizer built before the first forward still misses it: PC203 either way
        devices = {t.device for t in [*submodule.parameters(), *submodule.buffers()]}
        if not devices:
            return  # nothing to place or to train (nn.ReLU built in forward)
        placed = tuple(sorted(device_of(d) for d in devices))
        self.events.append(Registration("module", path, type(submodule).__name__, placed,
                                        self._site(sys._getframe()), on_target=devices == {self.target},
                                        expected=self.target_name))

    def _on_parameter_registered(self, module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        owner = self.module_paths.get(id(module))
        if owner is None or param is None or id(param) in self.parameters:
            return
        self.activity += 1
        path = join(owner, name)
        if path in self.prov.lazy_origins:
            return  # set while building a module registered in forward: reported with that module
        self.parameters.add(id(param))
        self.prov.add_lazy(param, path)
        self.events.append(Registration("parameter", path, "Parameter", (device_of(param),),
                                        self._site(sys._getframe()), on_target=param.device == self.target,
                                        expected=self.target_name))

    # -- provenance and sites -------------------------------------------------------------------------
    def provenance(self, t: torch.Tensor) -> Provenance:
        """Where ``t`` came from: created in forward, derived from, or itself an attribute."""
        return self.prov.of(t)

    def _site(self, frame: typing.Any) -> EventSite:
        return self.attribution.site(frame)

    def _unregistered_path(self, module: nn.Module) -> str:
        """The path of a module the model holds unregistered (``heads[0]`` in a plain list), read from
        where the walk found its parameters and buffers; "" when the walk did not find it."""
        known = self._unregistered_paths.get(id(module))
        if known is not None:
            return known
        path = ""
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            found = self.prov.origins.get(id(t), "")
            if found.endswith("." + name):
                path = found[:-len(name) - 1]
                break
        self._unregistered_paths[id(module)] = path
        return path

    # -- the checks -----------------------------------------------------------------------------------
    def findings(self, library_findings: bool = False) -> list[Finding]:
        """PC201-PC207 from the recorded events, as the forward's rules judge them
        (:func:`~placecheck.findings.rules.forward_findings`)."""
        self._checked = rules.forward_findings(self.events, self.target_name, library_findings)
        self.library = self._checked.library
        return self._checked.findings

    def notes(self) -> list[str]:
        """What :meth:`findings` left out, and the TorchScript functions run as Python, for the notes."""
        notes = self._checked.notes() if self._checked is not None else []
        if self.scripted:
            many = len(self.scripted) > 1
            notes.append(f"forward: TorchScript function{'s' if many else ''} {', '.join(self.scripted)} "
                         f"ran as the Python {'they were' if many else 'it was'} compiled from (as "
                         "PYTORCH_JIT=0 runs them): a finding names its line inside them")
        return notes


_WHY_CONVERSIONS = ("torch.from_numpy and torch.frombuffer never reach a torch function mode: their tensors "
                    "are creations in forward (PC202) all the same")


@contextlib.contextmanager
def _attention_fast_path_kept(target: torch.device) -> Iterator[None]:
    """Let ``nn.MultiheadAttention`` keep its inference fast path under the recording mode.

    Its ``forward`` leaves the fused kernel whenever any torch function mode is
    active, which made a traced ViT several times slower than a plain one. When
    every tensor it gets and holds is already on the target, nothing inside it
    can mix devices, so it runs with torch functions disabled (fused kernel
    included). Anything else, and the real-valued engine (whose tensors need
    ``__torch_function__``), takes the traced path. tests/test_attention_fast_path.py
    audits each attention configuration both ways: the findings must be the same.
    """
    from placecheck.engines.tagged import SimulatedTensor

    original = nn.MultiheadAttention.forward

    def forward(self: nn.MultiheadAttention, *args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if (self.training or torch.is_grad_enabled()
                or any(isinstance(t, SimulatedTensor) or t.device != target
                       for t in [*tensors, *self.parameters()])):
            return original(self, *args, **kwargs)
        with DisableTorchFunction():
            return original(self, *args, **kwargs)

    with patch(nn.MultiheadAttention, "forward", forward,
               "MultiheadAttention's inference fast path is decided inside forward, before any mode sees a "
               "call: it must be taken as on a GPU"):
        yield


_RUN_CODE = Tracer.run.__code__
"""The user-frame search stops here: frames outside the forward are never a finding's source."""
