"""What a whole script does with devices: the recorder behind ``placecheck run``.

In the style of ``torch/utils/flop_counter.py``: the public :class:`RunRecorder`
owns the state; it subscribes to the one dispatcher (:mod:`placecheck.engines.dispatch`), which
hands it each torch call read once as a ``Call``; global module and optimizer hooks and a few patches
(:mod:`placecheck.run.patches` says which, and why) tell it what the script is doing.
:meth:`RunRecorder.findings` turns what it saw into findings afterwards.

It runs on the real-valued engine (:func:`placecheck.engines.tagged.tagged_cuda`):
values are real (a script prints losses, calls ``.item()``, branches on
data) and backward runs, while every tensor reports its simulated device.
A problem of a model's forward is decided as ``audit`` decides it: the same
classifier (:mod:`placecheck.engines.classify`), host-sync table
(:mod:`placecheck.checks.host_syncs`), source attribution (:mod:`placecheck.engines.sources`),
traversal and rule messages. This module records, per torch call:

- an op mixing devices, with the user's line and which tensor was off (a batch
  element and the loader line it came from, a module's buffer named by the
  script's variable, a tensor created at a line); then the offending argument
  is moved and the call runs again, so the script goes on and every mismatch is found;
- host syncs: in a module's forward they are PC204; in the loop itself one
  info finding per line, counting calls per optimizer step;
- in forward: a tensor made on the CPU then copied to the device (PC202), a
  layer built there (PC203), CPU index tensors indexing device tensors (PC205);
- copies of the same host tensor to the device at every step (PC209).

What is particular to a script lives in its own room: where a CPU tensor came
from (:mod:`~placecheck.run.origins`), the module moves and their walks
(:mod:`~placecheck.run.moves`, PC101-PC105), the optimizers
(:mod:`~placecheck.run.optimizers`, PC307, PC308), the DataLoaders
(:mod:`~placecheck.run.loaders`, ``non_blocking`` notes) and ``torch.save`` /
``torch.load`` (:mod:`~placecheck.run.checkpoints`, PC301).

Not reentrant: one recorder at a time per process (the hooks are global).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.codes import Code
from placecheck.basics.errors import one_line
from placecheck.basics.values import Device, Site
from placecheck.checks.host_syncs import HOST_SYNCS, host_sync
from placecheck.checks.hostcopies import PendingCopies, PendingCopy, nonblocking_host_copy
from placecheck.checks.provenance import CallCounts
from placecheck.engines import classify
from placecheck.engines.callbacks import in_callbacks
from placecheck.engines.calls import device_of
from placecheck.engines.dispatch import Call, op_name, subscribed
from placecheck.engines.repair import repaired
from placecheck.engines.sources import here, user_line
from placecheck.findings import rules
from placecheck.findings.events import EventSite, StaleRead
from placecheck.findings.finding import Finding
from placecheck.placement.replicas import data_parallel_simulated
from placecheck.run.causes import Causes, crash_site, creation_cause, expression_of, host_tensor, module_owner
from placecheck.run.checkpoints import Checkpoints
from placecheck.run.fastforward import MAX_STEPS_AFTER, FastForward
from placecheck.run.loaders import PIN_WARNING, Loaders
from placecheck.run.moves import Moves, raised_by_swap
from placecheck.run.optimizers import Optimizers
from placecheck.run.origins import Origin, Origins, in_module_init
from placecheck.run.patches import (
    OutsideSimulation,
    eager_compile,
    eager_script,
    no_copies_of_the_script,
    patched,
)
from placecheck.run.session import EngineProbe, RankPlacement, StopRun
from placecheck.run.sites import called_from_user, fake_tolist, library_caller, names_of

_MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda})
_BACKWARDS = frozenset({torch.Tensor.backward, torch.autograd.backward})
_DEVICE_TO_HOST = frozenset({torch.Tensor.to, torch.Tensor.type_as})
"""Calls that copy a device tensor to the host when asked for the CPU (``.cpu()`` is in the sync table)."""
_FACTORIES = frozenset(getattr(torch, name) for name in (
    "zeros", "ones", "empty", "full", "tensor", "as_tensor", "arange", "linspace", "rand", "randn",
    "randint", "randperm", "eye", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like",
    "randn_like"))


@dataclass
class _Copies:
    """Host-to-device copies of one host tensor at one line, by optimizer step."""

    ref: weakref.ref[torch.Tensor]
    nbytes: int
    device: Device
    steps: set[int] = field(default_factory=set)


def _tensor(t: torch.Tensor) -> str:
    """``int64[3]``: a tensor as a finding's message names it."""
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def _scope() -> CodeType | None:
    """The code of the user's function running now (a creation's, or where a tensor is computed)."""
    frame = here()[1]
    return frame.f_code if frame is not None else None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class RunRecorder:
    """Records a whole script's use of devices under simulated CUDA and turns it into findings.

    ``gpus`` is the simulated machine's GPU count; after ``steps`` optimizer steps (0: never) the
    run fast-forwards (:attr:`fastforward`, :mod:`placecheck.run.fastforward`), or without one ends
    (:class:`StopRun`).
    """

    def __init__(self, gpus: int = 1, steps: int = 2) -> None:
        self.gpus = gpus
        self.max_steps = steps
        self.target = Device("cuda", 0)
        """The device the report names: cuda:0, or a rank's own GPU."""
        self.steps = 0
        """Optimizer steps completed."""
        self.forward_passes = 0
        """Forwards of a top-level module (one module's call, its submodules' inside it not counted)."""
        self.device_ops = 0
        """Torch calls of the script with a tensor on a simulated GPU among their arguments or results (a
        move, a factory with ``device="cuda"``, an op): 0 means nothing about placement on a GPU was
        checked (:func:`placecheck.run._unchecked`)."""
        self.step_line = ""
        self.stopped_by_steps = False
        self.found: dict[tuple[str, str, str], Finding] = {}
        self.notes: dict[str, None] = {}
        self.syncs: dict[tuple[str, str], list[Any]] = {}
        """(source, call) -> [count, in-forward module name or "", device, optimizer steps it ran in]."""
        self.copies: dict[tuple[str, int], _Copies] = {}
        self.origins = Origins()
        self.causes = Causes()
        self.moves = Moves(self)
        self.optimizers = Optimizers(self)
        self.loaders = Loaders(self)
        self.checkpoints = Checkpoints(self)
        self._forward_stack: list[nn.Module] = []
        self._registered: set[int] = set()
        """ids of the parameters registered during a forward (one PC203 each)."""
        self.registered_lines: set[str] = set()
        """Lines that registered a parameter during a forward (PC203): the tensor made there is that
        parameter's data, not a creation of its own (PC202)."""
        self._held: set[int] = set()
        """ids of the modules the outermost module running held when its forward began."""
        self._backwards_seen = 0
        """Backward calls looked at for custom Functions the fake engine cannot run (the first two)."""
        self.roots: dict[int, nn.Module] = {}
        """Top-level modules called since the last optimizer step."""
        self._quiet = 0
        self.reported_errors: set[int] = set()
        """ids of exceptions raised to reproduce a failure already reported (a PC301 load)."""
        self._simulated_errors: set[int] = set()
        """ids of the errors the recorder raised as CUDA would (a device index beyond ``gpus``)."""
        self.limit = ""
        """The note when the script stopped at a limit of the simulation, not at an error of its own."""
        self.probe: EngineProbe | None = None
        """``--engine auto``'s watch of the real-valued attempt (:mod:`placecheck.run.auto`)."""
        self.host_types: tuple[type, ...] = (torch.Tensor,)
        """The classes of the engine's host tensors (its device tensors are another class, or fake tensors
        on a CUDA device): plain tensors; under the fake engine, fake tensors on the CPU too."""
        self.host_data: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
        """Where a DataLoader makes its batches: under the fake engine, real CPU values (a dataset reads
        files, numpy and PIL images, which fake tensors cannot give), as on a GPU machine's host."""
        self.fake_engine = False
        """The script runs under the fake engine (:mod:`placecheck.run.fake`)."""
        self.loaders_in_process = False
        """DataLoader workers run in the script's process (the fake engine: fake tensors cannot cross
        into worker processes); a note says so."""
        self.ranks: RankPlacement | None = None
        """One rank of a torchrun launch (``--nproc-per-node``): its NCCL rules
        (:mod:`placecheck.run.ranks`)."""
        self.pending = PendingCopies()
        self.per_call = CallCounts()
        """Forwards per module class and creations per line: PC202's "on every call" is counted."""
        """Non-blocking device-to-host copies no synchronize has covered yet (PC210), as audit's tracer."""
        self.fastforward: FastForward | None = None
        """What the run does once ``steps`` are spent: skip the rest of the training loop, run the rest
        of the script (None: stop there)."""

    # -- the session ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def recording(self) -> Iterator[RunRecorder]:
        """Inside the real-valued engine's session: record every call, move, step and load."""
        from torch.nn.modules import module as module_mod
        from torch.optim import optimizer as optimizer_mod
        from torch.utils.data import dataloader

        swap = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        handles = [
            optimizer_mod.register_optimizer_step_pre_hook(self.optimizers.before_step),
            optimizer_mod.register_optimizer_step_post_hook(self.optimizers.after_step),
            module_mod.register_module_forward_pre_hook(self._forward_enter),
            module_mod.register_module_forward_hook(self._forward_exit, always_call=True),
            module_mod.register_module_module_registration_hook(self._module_registered),
            module_mod.register_module_parameter_registration_hook(self._parameter_registered),
        ]
        if self.probe is not None:
            probe = self.probe
            handles += [
                module_mod.register_module_parameter_registration_hook(
                    lambda module, name, t: probe.registered(t, buffer=False)),
                module_mod.register_module_buffer_registration_hook(
                    lambda module, name, t: probe.registered(t, buffer=True)),
            ]
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(warnings.catch_warnings())
                warnings.filterwarnings("ignore", message=PIN_WARNING)  # the simulation has no pinned memory
                stack.enter_context(patched([
                    (nn.Module, "to", self.moves.module_to), (nn.Module, "cuda", self.moves.module_cuda),
                    (torch.optim.Optimizer, "__init__", self.optimizers.optimizer_init),
                    (torch.optim.Optimizer, "load_state_dict", self.optimizers.optimizer_load),
                    (dataloader.DataLoader, "__iter__", self.loaders.loader_iter),
                    (dataloader._BaseDataLoaderIter, "__next__", self.loaders.loader_next),
                    (torch, "load", self.checkpoints.torch_load),
                    (torch, "save", self.checkpoints.torch_save),
                    (torch.__future__, "set_overwrite_module_params_on_conversion",
                     self.moves.overwrite_flag),
                    (torch.__future__, "set_swap_module_params_on_conversion", self.moves.swap_flag),
                    (nn.Module, "load_state_dict", self.moves.load_state_dict),
                    (subprocess.Popen, "__init__", no_copies_of_the_script),
                    (torch.jit, "script", eager_script(self.notes)),
                    (torch, "from_numpy", self._host_factory), (torch, "frombuffer", self._host_factory),
                ]))
                stack.enter_context(eager_compile(self._compiled))
                stack.enter_context(data_parallel_simulated(self.gpus, self.quiet))
                if self.ranks is not None:
                    stack.enter_context(self.ranks.session())
                stack.enter_context(self.pending.synchronizations_seen())
                dispatcher = stack.enter_context(subscribed(self.on_call))
                stack.enter_context(in_callbacks(dispatcher))  # a gradient hook's calls are the script's too
                yield self
        finally:
            for handle in handles:
                handle.remove()
            torch.__future__.set_swap_module_params_on_conversion(swap)

    def _host_factory(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``torch.from_numpy``/``torch.frombuffer``, which no torch function mode sees (as audit's tracer
        wraps them): a tensor the user's own line made on the host is a creation there."""
        def factory(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if self._quiet or not isinstance(out, torch.Tensor) or not self.is_host_tensor(out):
                return out
            line, frame = here()
            if line and frame is sys._getframe(1):  # the user's line called it, not a library for it
                module = type(self._forward_stack[-1]).__name__ if self._forward_stack else ""
                self.origins.track(out, Origin("created", f"torch.{original.__name__}", line, module=module,
                                               init=in_module_init(frame), scope=frame.f_code))
            return out
        return factory

    def _compiled(self) -> None:
        """The script called ``torch.compile``: what runs is its eager code (:func:`eager_compile`)."""
        self.notes["run: torch.compile ran eagerly (TorchDynamo is off under placecheck run): the eager code "
                   "of the compiled model or function is what was checked, not the compiled graph"] = None

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """placecheck's own torch calls: not recorded."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    @property
    def quieted(self) -> bool:
        """Inside :meth:`quiet`: placecheck's own calls are running."""
        return self._quiet > 0

    def step_done(self) -> None:
        """One more optimizer step: once ``steps`` are done the run fast-forwards (the rest of the
        training loop skipped, the rest of the script run), or stops here (:class:`StopRun`) without a
        fast-forward or when it still steps :data:`MAX_STEPS_AFTER` steps later."""
        self.steps += 1
        if self.probe is not None:
            self.probe.done(here()[0])
        self.roots.clear()
        self._prune()
        self.step_line, frame = here()
        ff = self.fastforward
        if ff is not None:
            ff.steps += 1
            ff.activity += 1
        if not self.max_steps or self.steps < self.max_steps:
            return
        if ff is not None and not ff.on:
            ff.begin(self.step_line, frame)
            ff.training_loader = self.loaders.last_loader
            return
        if ff is None or self.steps >= self.max_steps + MAX_STEPS_AFTER:
            self.stopped_by_steps = True
            more = "" if ff is None else (f", {MAX_STEPS_AFTER} of them after the budget: the fast-forward "
                                          "did not end the training loop")
            raise StopRun(f"after {self.steps} optimizer step{'s' if self.steps != 1 else ''} (--steps "
                          f"{self.max_steps}{more})")

    def is_host_tensor(self, t: torch.Tensor) -> bool:
        """``t`` is one of the engine's host tensors, not a device tensor nor a parameter."""
        return type(t) in self.host_types and t.device.type == "cpu"

    def copy_notes(self) -> list[str]:
        """Batches copied with ``non_blocking`` that does not match the loader's ``pin_memory``."""
        return self.loaders.copy_notes()

    def add(self, finding: Finding, key_extra: str = "") -> None:
        """Record ``finding``, once per code, line and ``key_extra`` (default: its ``where``)."""
        key = (finding.code, finding.source, key_extra or finding.where)
        self.found.setdefault(key, finding)

    # -- per call -------------------------------------------------------------------------------------
    def on_call(self, call: Call) -> Any:
        """One torch call (the dispatcher's): run it, recording syncs, copies and mismatches."""
        if self._quiet:
            return call.run()
        func = call.func
        return self.pending.watched(func, call.args, call.kwargs, lambda: self._recorded_call(call),
                                    lambda copy: self._stale_read(func, copy), lambda: here()[0])

    def _recorded_call(self, call: Call) -> Any:
        func, args, kwargs = call.func, call.args, call.kwargs
        sync = host_sync(func, args, kwargs)
        if sync is not None:
            self.pending.synchronized()  # the host waited for the stream: earlier copies landed
            self._record_sync(*sync)
            if func is torch.Tensor.__format__ and args[0].dim() == 0 and len(args) > 1:
                with self.quiet():
                    # f"{loss:.3f}": a GPU formats the value (Tensor.__format__ does so only for
                    # exact torch.Tensor, not for the engine's subclass)
                    return args[0].item().__format__(args[1])
        if func is torch.Tensor.module_load and len(args) > 1 and not kwargs.get("assign", False):
            # load_state_dict under the swap flag: a copy into the parameter, legal across devices
            # on a GPU as copy_ is (the tagged engine does not list module_load as a copy)
            return args[0].copy_(args[1]).detach()
        if self.moves.strays:
            self.moves.touched(t for _, t in call.tensors)
        if self.fake_engine and func in _BACKWARDS and self._backwards_seen < 2:
            self._unrun_backwards(args, kwargs)
        if func in classify.index_ops() and args and isinstance(args[0], torch.Tensor) \
                and args[0].device.type == "cuda":
            self._implicit_index(func, args)
        try:
            if self.fake_engine and any(t.dim() == 0 and t.device.type == "cpu" for _, t in call.tensors) \
                    and len({t.device for _, t in call.tensors}) > 1 \
                    and classify.mixes_devices(func, list(call.tensors), args):
                # decided before the call, as audit does: fake tensors take a 0-dim CPU tensor (clamp's
                # bound) that a GPU refuses as a tensor argument
                raise classify.DeviceMismatchError(f"{op_name(func)} mixed devices")
            out = func(*args, **kwargs)
        except Exception as exc:
            out = self._repair(func, args, kwargs, exc)
        if any(t.device.type == "cuda" for _, t in call.tensors) \
                or (isinstance(out, torch.Tensor) and out.device.type == "cuda"):
            self.device_ops += 1
        if self.probe is not None and self._forward_stack and not self.probe.decided:
            self.probe.made(out)
        if isinstance(out, torch.Tensor) and out.device.type == "cuda" \
                and (out.device.index or 0) >= self.gpus:
            raise self.no_such_gpu(out.device)
        if self.ranks is not None and isinstance(out, torch.Tensor) \
                and (func in _MOVES or func in _FACTORIES):
            self.ranks.placed(func, out)
        if func in _DEVICE_TO_HOST and isinstance(out, torch.Tensor) and args \
                and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu" \
                and out.device.type == "cpu" and nonblocking_host_copy(func, args, kwargs, out) is None \
                and called_from_user():  # (a library's own copies differ with the engine's tensors)
            self._record_sync(f".{func.__name__}()", args[0])  # a blocking device-to-host copy, as audit's
        if self.moves.strays and isinstance(out, torch.Tensor):
            self.moves.derived(out, [t for _, t in call.tensors], func in _MOVES)
        if func in _MOVES and isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
            if out.device != args[0].device and out.device.type == "cuda":
                self.causes.moved(func, args, kwargs, out, *here())
            self._record_move(func, args, kwargs, args[0], out)
        elif isinstance(out, torch.Tensor) and self.is_host_tensor(out):
            if func in _FACTORIES:
                line = called_from_user()
                if line:
                    module = type(self._forward_stack[-1]).__name__ if self._forward_stack else ""
                    frame = here()[1]
                    self.origins.track(out, Origin("created", op_name(func), line, module=module,
                                                   init=not module and in_module_init(frame),
                                                   scope=frame.f_code if frame is not None else None))
            elif self.origins:
                # a view or a cast of a batch element keeps its origin; of several, a module's state made
                # in its __init__ is the walk's (PC101), so the other one is the result's
                found = (self.origins.of(t) for _, t in classify.tensor_arguments(args, kwargs))
                known = [o for o in found if o is not None]
                if known:
                    self.origins.derive(out, next((o for o in known if not o.init), known[0]), _scope)
        return out

    def _unrun_backwards(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Under the fake engine, a backward through a custom ``autograd.Function``: a note that its
        backward code did not run (the first two backward calls are looked at)."""
        from placecheck.engines.sources import display_path
        from placecheck.run.fake import custom_backwards

        self._backwards_seen += 1
        first = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
        roots = [first] if isinstance(first, torch.Tensor) else [t for t in first or () if
                                                                    isinstance(t, torch.Tensor)]
        for cls in custom_backwards(roots):
            code = getattr(getattr(cls, "backward", None), "__code__", None)
            where = f" ({display_path(code.co_filename)}:{code.co_firstlineno})" if code is not None else ""
            self.notes[f"run: the backward of {cls.__name__}{where}, a custom "
                       "autograd.Function, did not run: the fake engine gives gradients without running "
                       "backward code; --engine tagged runs it"] = None

    def _stale_read(self, func: Callable[..., Any], copy: PendingCopy) -> None:
        """PC210: ``func`` read on the host a tensor a non-blocking copy was still filling."""
        line, _ = here()
        if not line:
            return
        known = HOST_SYNCS.get(func)
        op = known[0] if known is not None else op_name(func)
        copied_at = Site.parse(str(copy.copied_at))
        read = StaleRead(op, copy.device, EventSite(Site.parse(line), ""), EventSite(copied_at, ""))
        finding = rules.event_finding(read, Device("cpu"))
        if finding is not None:
            self.add(finding, key_extra=copied_at)

    def no_such_gpu(self, device: torch.device) -> RuntimeError:
        """What CUDA raises for a device index the machine lacks (--gpus sets how many it has): the
        script's error (PC207), not a limit of the simulation, although its text is CUDA's."""
        error = classify.InvalidDeviceError(str(device), self.gpus)
        self._simulated_errors.add(id(error))
        return error

    def _prune(self) -> None:
        """Forget tensors that no longer exist (their ids may be reused)."""
        self.origins.prune()
        self.moves.prune()
        self.causes.prune()
        self.copies = {k: v for k, v in self.copies.items() if v.ref() is not None or len(v.steps) > 1}

    def _repair(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                exc: Exception) -> Any:
        """Record a device mismatch, move the offending arguments to the majority device, run again
        (:func:`placecheck.engines.repair.repaired`, audit's loop).

        The mismatch is :mod:`placecheck.engines.classify`'s decision, as in ``audit``: the engine raised its
        mismatch type, and the devices of the arguments mix in a way no GPU kernel accepts; never an
        error's text. Any other error is the script's and propagates.
        """
        def fix(tensors: list[tuple[int, torch.Tensor]], error: Exception) -> dict[int, torch.Tensor]:
            # the fake engine checks an in-place op's own device apart, with another exception type
            # (``cpu_total += cuda_loss``): the arguments' devices decide there
            if not classify.is_engine_mismatch(error) and not self.fake_engine:
                return {}
            on_cuda = [t.device for _, t in tensors if t.device.type == "cuda"]
            if not on_cuda:
                return {}
            # the model's device when a parameter takes part (a batch sent to "cuda" is what is off), else
            # the devices most arguments are on
            held = [t.device for _, t in tensors if isinstance(t, nn.Parameter) and t.device.type == "cuda"]
            reference = max(set(held or on_cuda), key=(held or on_cuda).count)
            offending = [t for _, t in classify.offending_arguments(func, tensors, reference)]
            line, frame = here()
            crash = crash_site(sys._getframe())
            moved: dict[int, torch.Tensor] = {}
            for t in offending:
                self.moves.fed(t)
                self._mismatch(func, t, reference, line, frame, crash)
                with self.quiet():
                    moved[id(t)] = t.to(reference)
            return moved

        return repaired(func, args, kwargs, exc, fix)

    def _mismatch(self, func: Callable[..., Any], t: torch.Tensor, reference: torch.device, line: str,
                  frame: FrameType | None, crash: tuple[str, str] = ("", "")) -> None:
        """PC201 for one offending argument: what it is, where it came from, and the line to edit
        (:mod:`~placecheck.run.causes`); ``crash``: the installed package and line where the op ran."""
        names = names_of(t, frame)
        name = names[0] if names else expression_of(t, frame)
        origin = self.origins.of(t)
        owner = module_owner(t, frame)
        discarded, current = self.causes.discarded_move(t), self.causes.current_device_move(t)
        in_module = self._forward_stack[-1] if self._forward_stack else None
        batch = origin is not None and origin.kind == "batch"
        if batch and origin is not None:
            where, origin_text = name or origin.path, origin.line
        elif owner:
            where, origin_text = owner, owner
        else:
            where, origin_text = name, origin.line if origin is not None else ""
        if in_module is not None and not owner:
            where = where or type(in_module).__name__
        op = op_name(func)
        details: tuple[tuple[str, str], ...] = (("op", op),)
        if batch and origin is not None:  # placecheck fix moves it beside its siblings
            details += (("batch", origin.path),)
        cause = discarded or current
        if cause is not None and not owner:  # the move to edit is the origin
            origin_text = cause.line
            details += (("discarded move" if discarded else "current-device move", cause.line),)
        if crash[1]:
            details += (("crashes at", crash[1]),)
        finding = rules.script_device_mismatch(
            op, device_of(reference), device_of(t), f"a {t.device} tensor {tuple(t.shape)}", where=where,
            line=line, dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape), nbytes=_nbytes(t),
            origin=origin_text, details=details, name=name,
            batch=origin.path if batch and origin is not None else "",
            loader_at=origin.line if origin is not None else "", owner=owner,
            created_by=origin.path if origin is not None and not batch else "",
            created_at=origin.line if origin is not None else "",
            in_forward=bool(origin.module) if origin is not None and not batch else in_module is not None,
            discarded_at=discarded.line if discarded is not None and not owner else "",
            current_at=current.line if current is not None and not owner else "",
            library=crash[0], crashes_at=crash[1])
        if origin is not None and origin.kind == "created" and not owner and not origin.init \
                and id(t) not in self.moves.strays and origin.line not in self.registered_lines \
                and discarded is None and not origin.elsewhere:
            # (a module's buffer is fixed by moving the module, its state made in __init__ by registering
            # it (PC101), a parameter built in forward at its PC203's line, a discarded move at its line;
            # the script's data made on the host and sliced into batches later (a corpus tokenized into one
            # tensor) is where data belongs: the batch's missing move is the fix, and the PC201 names the
            # creation as its origin)
            self.add(creation_cause(origin, t, device_of(reference), fed=True),
                     key_extra=f"{origin.module}|fed")
        self.add(finding, key_extra=f"{where}|{origin_text}")

    def _record_sync(self, call: str, t: torch.Tensor) -> None:
        line, _ = here()
        if not line:
            return
        module = type(self._forward_stack[-1]).__name__ if self._forward_stack else ""
        via = library_caller()
        tolist = fake_tolist() if via and self.fake_engine else None
        if tolist is not None:  # a .tolist(), which torch runs on fake tensors as one .item() per element
            call, via = ".tolist()", tolist
        if via:
            call = f"{call} in {via}"
        entry = self.syncs.setdefault((line, call),
                                      [0, module, device_of(t), set()])
        entry[0] += 1
        entry[3].add(self.steps)

    def _record_move(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                     source: torch.Tensor, out: torch.Tensor) -> None:
        """A host-to-device copy: the same host tensor every step (PC209), pinned memory and non_blocking."""
        if out.device.type != "cuda" or source.device.type != "cpu" or out is source \
                or isinstance(source, nn.Parameter):  # a weak reference would stop .to() swapping it
            return
        line, _ = here()
        if not line:
            return
        origin = self.origins.of(source)
        if origin is not None and origin.kind == "batch":
            self.loaders.copied(origin, line, args, kwargs)
            return
        if origin is not None and origin.module:
            self._created_in_forward(origin, device_of(out), source, copied_at=line)
            return
        key = (line, id(source))
        copies = self.copies.get(key)
        if copies is None or copies.ref() is not source:
            copies = self.copies[key] = _Copies(weakref.ref(source), _nbytes(source), device_of(out))
        copies.steps.add(self.steps)

    def _created_in_forward(self, origin: Origin, device: Device, t: torch.Tensor, copied_at: str) -> None:
        """PC202: made on the host in a forward, then copied to the device at ``copied_at``, on every call."""
        self.per_call.created(origin.line, origin.path, _tensor(t), device, copied_at)
        # a 0-dim one is one scalar copy per call, as PyTorch's own code makes (issue 42 item 11)
        self.add(rules.creation_in_run(origin.path, host_tensor(t), device, line=origin.line,
                                       module=origin.module, copied_at=copied_at))

    def _implicit_index(self, func: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """PC205: a CPU index tensor indexing a device tensor (a host-to-device copy per call)."""
        index = args[1] if len(args) > 1 else None
        items = index if isinstance(index, tuple | list) else (index,)
        cpu = [t for t in items if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() > 0]
        if not cpu:
            return
        line, _ = here()
        if not line:
            return
        target = device_of(args[0])
        origin = self.origins.of(cpu[0])
        # a forward's creation is named as audit names it (audit sees no other), and, as audit, the
        # creation is a finding of its own (PC202 at its line: a host allocation and a copy per call)
        in_forward = origin is not None and origin.kind == "created" and bool(origin.module)
        self.moves.fed(cpu[0])
        if in_forward and origin is not None:
            self.add(creation_cause(origin, cpu[0], target, fed=False), key_extra=f"{origin.module}|met")
        came_from = rules.came_from(created_by=origin.path, created_at=origin.line) \
            if origin is not None and in_forward else ""
        self.add(rules.index_in_run(
            op_name(func), host_tensor(cpu[0]), target, line=line,
            module=type(self._forward_stack[-1]).__name__ if self._forward_stack else "", came_from=came_from,
            origin=origin.line if origin is not None and in_forward else ""))

    # -- module moves ----------------------------------------------------------------------------------
    def _module_registered(self, owner: nn.Module, name: str, submodule: nn.Module | None) -> None:
        """PC203: a layer with parameters built during a forward (an optimizer built before misses it)."""
        if not self._forward_stack or submodule is None \
                or isinstance(submodule, nn.modules.lazy.LazyModuleMixin) or id(submodule) in self._held:
            # nn.Lazy* follow .to() correctly; a layer the model held before this forward is not built
            # here (slicing a ModuleList, self.layers[:n], registers the existing layers in a new one)
            return
        devices = sorted({str(t.device) for t in [*submodule.parameters(), *submodule.buffers()]})
        if not devices:
            return  # nothing to place or to train (nn.ReLU built in forward)
        line, _ = here()
        target = next((str(t.device) for m in self._forward_stack for t in m.parameters()
                       if t.device.type == "cuda"), "")
        self.add(rules.layer_built_in_forward(type(submodule).__name__, name, type(owner).__name__,
                                              ", ".join(devices), target, line))

    def _parameter_registered(self, owner: nn.Module, name: str, param: nn.Parameter | None) -> None:
        """PC203: a parameter registered on a module the forward held, during that forward (as audit
        reports it); the line that made its data is this finding's, not a creation's (PC202)."""
        if not self._forward_stack or param is None or id(owner) not in self._held or self._quiet \
                or id(param) in self._registered:
            return
        self._registered.add(id(param))  # kept alive by its module: the id is not reused
        line, _ = here()
        target = next((device_of(t) for m in self._forward_stack for t in m.parameters()
                       if t.device.type == "cuda"), None)
        self.registered_lines.add(line)
        self.add(rules.parameter_built_in_forward(f"{type(owner).__name__}.{name}", device_of(param), target,
                                                  line=line))

    def _forward_enter(self, module: nn.Module, args: Any) -> None:
        self.per_call.forward(type(module).__name__)
        if not self._forward_stack:
            self.forward_passes += 1
            self.roots[id(module)] = module
            if self.fastforward is not None:
                self.fastforward.activity += 1
            self._held = {id(m) for m in module.modules()}
        self._forward_stack.append(module)

    def _forward_exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._forward_stack and self._forward_stack[-1] is module:
            self._forward_stack.pop()
        if not self._forward_stack and self.probe is not None and not self.probe.decided:
            self.probe.done(here()[0])

    # -- results ---------------------------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        """Everything recorded, host syncs and repeated copies summarised per line."""
        out = [self.moves.verdict(key, f) if key[0] == Code.PC101 else
               self.per_call.verdict(f) if key[0] == Code.PC202 else f for key, f in self.found.items()]
        if self.ranks is not None:
            out += self.ranks.findings()
        for (line, call), (count, module, device, steps) in self.syncs.items():
            out.append(rules.script_host_sync(call, device, module=module, line=line, count=count,
                                              rate=self._rate(count, steps)))
        repeated: dict[str, _Copies] = {}
        for (line, _), copies in self.copies.items():
            if len(copies.steps) >= 2 and copies.nbytes > repeated.get(line, copies).nbytes - 1:
                repeated[line] = copies
        for line, copies in repeated.items():
            out.append(rules.repeated_copy(copies.nbytes, copies.device, len(copies.steps), line))
        return out

    def _rate(self, count: int, ran_in: set[int]) -> str:
        """How often a line's sync ran, from the counts: ``1 per optimizer step`` only when it ran in
        every step, else ``2 times in 20 optimizer steps`` (a line under ``if step % 10 == 0``).

        ``ran_in`` holds the optimizer steps completed when it ran: a line before ``optimizer.step()``
        runs in steps 0 to N-1; a line after it in 1 to N, and a ``--steps`` stop (raised inside the
        N-th ``step()``) cuts the last of those short. One step that could show it is too few to tell a
        line run every step from one under ``if step % 10 == 0`` (``--steps 2``, a line after ``step()``):
        the rate says so.
        """
        n = self.steps
        if n == 0 or not ran_in:
            return "once" if count == 1 else f"{count} times"
        before_step = set(range(n)) <= ran_in
        after_step = (n >= 2 and set(range(1, n)) <= ran_in <= set(range(1, n + 1))
                      and (self.stopped_by_steps or n in ran_in))
        if before_step or after_step:
            seen = n if before_step else len(ran_in)  # the steps in which it could show its rate
            if seen >= 2:
                return f"{count / len(ran_in):g} per optimizer step"
            more = f": run with --steps {self.max_steps + 1}" if self.stopped_by_steps else ""
            times = "once" if count == 1 else f"{count} times"
            return (f"{times} in 1 optimizer step (too few to tell a per-step sync from an every-N-steps "
                    f"one{more})")
        if ran_in == {n} and not self.stopped_by_steps:  # after the loop
            return "once after the last optimizer step" if count == 1 else \
                f"{count} times after the last optimizer step"
        return f"{'once' if count == 1 else f'{count} times'} in {n} optimizer step{'s' if n != 1 else ''}"

    def error_finding(self, exc: BaseException) -> Finding | None:
        """The script's own exception, as :mod:`placecheck.engines.classify` decides for ``audit``: PC201 when
        it mixed devices, PC207 otherwise; None when already reported, or when it is a limit of the
        simulation (then :attr:`limit` says what could not be simulated, and where)."""
        seen: BaseException | None = exc
        raised_here = False
        while seen is not None:
            if id(seen) in self.reported_errors:
                return None
            if isinstance(seen, OutsideSimulation):  # a limit of the run, said in its own words
                if str(seen) != self.limit:  # (the limit itself is the run's ending note)
                    self.notes[str(seen)] = None
                return None
            raised_here = raised_here or id(seen) in self._simulated_errors
            seen = seen.__cause__ or seen.__context__
        if self.fake_engine and raised_by_swap(exc):  # a module move the fake engine could not make
            if self.stopped_by_steps:  # the script's own clean-up while the --steps stop unwound it
                self.notes[f"run: after the --steps stop, the script's clean-up at {user_line(exc)} moved a "
                           "module, which the fake engine could not (the graph of the backward it simulated "
                           "still holds the parameters; a real backward frees it): that clean-up is unchecked"
                           ] = None
            else:
                self.moves.unswappable(user_line(exc))
            return None
        limit = "" if raised_here else classify.simulation_limit(exc, phase="run")
        if not limit and not raised_here and self.fake_engine:
            # fake tensors' own refusals (a value read where the engine could not assume one): the
            # simulation's limit, never the script's error
            why = classify.fake_limit(exc)
            limit = (f"run: stopped: the fake engine could not go on: {why}; a limit of placecheck's "
                     "simulated GPU, not a bug of the code: --engine tagged (real values) runs it where it "
                     "fits in memory, or run on a GPU") if why else ""
        if not limit and self.ranks is not None:
            limit = self.ranks.limit_of(exc)
        if limit:
            self.limit = limit
            return None
        line = user_line(exc)
        mismatch = classify.is_engine_mismatch(exc)
        return rules.script_error(one_line(exc), type(exc).__name__, line, mismatch=mismatch)
