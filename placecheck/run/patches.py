"""The only patches ``placecheck run`` makes to torch, and why each is the only way.

PyTorch's own tools observe through modes and hooks, and so does the recorder
wherever torch offers one: a ``TorchFunctionMode`` sees every torch call
(syncs, copies, mismatches, printing), the global module hooks see every
forward and every layer registered, the global optimizer hooks see every step.
What none of them shows, and so is patched here, for the recorder's session only:

- ``nn.Module.to`` / ``nn.Module.cuda``: which module moved, and where to; the
  mode sees only the tensor copies inside, and the walk of what the move left
  behind (PC101-PC105) needs the module before and after. There is no global
  hook on ``Module._apply``.
- ``Optimizer.__init__``: no hook sees an optimizer built (the line PC308 names,
  and that the script built one at all); the step hooks see it only at its first step.
- ``Optimizer.load_state_dict``: its state-dict hooks are per instance, and the
  instance exists before the recorder could register one (the resume line of PC307).
- ``DataLoader.__iter__`` and ``_BaseDataLoaderIter.__next__``: batches come out
  of Python iteration, not torch calls (where each batch element came from: PC201's origin).
- ``torch.load`` / ``torch.save``: serialisation is no torch function a mode sees;
  the engine's tensors are saved as plain tensors and loaded back on the device
  they were saved from, and a load the simulated machine cannot do is PC301.
- ``torch.__future__.set_overwrite_module_params_on_conversion`` and
  ``set_swap_module_params_on_conversion``: the engine needs its own setting in force while the
  script runs; the script's wish is remembered.
- ``nn.Module.load_state_dict``: the engine's swap flag would make ``assign=True`` swap the loaded
  tensors into the module's Parameter objects; on a GPU (torch's default flag) the module gets new
  ones, which an optimizer built before does not hold (PC308). Its state-dict hooks are per instance
  and see the load, not the flag it runs under, so the load runs under the script's own flag.
- ``subprocess.Popen.__init__`` (:func:`no_copies_of_the_script`): a launcher that starts
  the script again in other processes (Lightning's ``Trainer(devices=N)`` runs
  ``python SCRIPT`` once per other rank) starts it outside the simulation, where it
  really runs on the CPU or dies, and takes the run down with it; no hook sees a
  process start, so the launch is refused with :class:`OutsideSimulation`, whose
  note says to run it with ``--nproc-per-node N`` (:mod:`placecheck.run.ranks`).
- ``torch.compile`` (:func:`eager_compile`): TorchDynamo rewrites a compiled
  function's bytecode into a graph before any mode sees a call, and traces into
  the engine's tensor subclass and the recorder's mode itself (it dies there:
  ``InternalTorchDynamoError: RecursionError``); the graph it would run hides every
  call from the modes. So the script's ``torch.compile`` returns what it returns
  on a GPU (an ``OptimizedModule`` with its ``_orig_mod``, a wrapped function)
  while TorchDynamo is disabled for the session (its own ``config.disable``,
  ``TORCH_COMPILE_DISABLE``): the eager code runs, and is what is checked, not
  the compiled graph. Patched rather than set up front because importing
  TorchDynamo costs seconds a script that never compiles should not pay.
- ``torch.jit.script`` (:func:`eager_script`): the TorchScript interpreter runs a
  scripted function's ops in C++, where no torch function mode sees them, so a
  problem inside it was reported at the forward's line that called it, or not at
  all. A function stays the Python function, as ``PYTORCH_JIT=0`` leaves it (the
  mode of torch.jit that its own debugging uses). A module is scripted as asked
  (a ``ScriptModule``: its ``save``, ``code`` and ``graph`` stay, and code
  TorchScript refuses is refused), and each of its compiled methods and its
  submodules' runs as the Python method it was compiled from, on the scripted
  module's own state (what it saves). A scripted class is scripted as asked.
- ``torch.from_numpy`` / ``torch.frombuffer``: they never reach a torch function mode (audit's tracer
  wraps them for the same reason), so a tensor the user's line makes from NumPy data would have no
  origin: its creation line is the cause of the mismatch it feeds (PC202).

- For ``--nproc-per-node N`` (:mod:`placecheck.run.ranks`), in each rank's process:
  ``torch.distributed.init_process_group`` (:func:`fake_process_group`): NCCL
  needs GPUs, so the group the script asks for is PyTorch's fake process group
  (collectives return at once), with the rank and world size torchrun's
  environment gives; the backend asked for is remembered (NCCL's rules apply
  to an NCCL group). The collectives (``all_reduce``, ``broadcast``, ...:
  :func:`watched_collective`) are Python functions of ``torch.distributed``,
  which no torch function mode sees, and the engine's tensors reach the
  process group as CPU tensors (no dispatch mode can tell their device): the
  wrapper sees the tensors with their simulated devices first. The fake group
  writes nothing into their outputs, so after it the wrapper gives them the rank's
  own values (:func:`own_values`: an all-gather's every slot the rank's input, a
  reduce-scatter's output its own slice), finite and deterministic where they would
  hold uninitialised memory.
  ``DistributedDataParallel.__init__`` (:func:`ddp_construction`): where NCCL
  checks that no two ranks share a GPU; no hook sees a wrapper built. DDP's
  comm hooks (:func:`ddp_comm_hooks`): each gradient bucket ends with torch's own
  no-op comm hook, because the fake group's all-reduce returns a future without a
  value, which DDP's reducer refuses; a hook the script registers runs first, on
  the bucket as the GPU would hold it, so that its collectives are checked. The
  object collectives (``broadcast_object_list``, ``all_gather_object``,
  ``gather_object``, ``scatter_object_list``: :func:`own_objects`) are the one
  exception to wrapping: the fake group moves no data, so a rank receiving a
  pickled object would unpickle garbage; each rank keeps its own object instead
  (what every rank computed alike: a seed, a log directory, a metric), and their
  internal tensors (which torch puts where the fake group says) are not the
  script's collectives. FSDP (every module's ``fully_shard``, FSDP1's
  ``FullyShardedDataParallel.__new__``: :mod:`placecheck.run.fsdp`) is the other
  exception: its sharding cannot run on the real-valued engine (a ``DTensor``
  reports the real device of its storage), so each rank runs it as its placement,
  whole parameters moved to the rank's FSDP device, inputs moved as FSDP moves them.

Each patch is the original wrapped, never a reimplementation (but for the object collectives and FSDP's
placement); every original is restored when the session ends, however it ends. Not reentrant.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from placecheck.basics.patching import Patch as Patch
from placecheck.basics.patching import patched as patched_with_reason
from placecheck.basics.patching import patched_once_imported as patched_once_imported_with_reason
from placecheck.engines.compat import compiler_errors, dynamo_disabled

_WHY = "placecheck run's recorder: what no mode or hook shows (placecheck.run.patches says why for each)"


@contextlib.contextmanager
def patched(patches: Sequence[Patch]) -> Iterator[None]:
    """Each ``owner.name`` replaced by ``make(original)`` for the block, then put back as it was
    (:func:`placecheck.basics.patching.patched`)."""
    with patched_with_reason(patches, _WHY):
        yield


@contextlib.contextmanager
def patched_once_imported(module: str, patches: Callable[[], Sequence[Patch]]) -> Iterator[None]:
    """:func:`patched` for code of ``module``, from when the script imports it (now, if imported
    already): :func:`placecheck.basics.patching.patched_once_imported`."""
    with patched_once_imported_with_reason(module, patches, _WHY):
        yield


_COMPILE_HOOKS_WARNING = "Using `torch.compile(module)` when there are global hooks"
"""What ``torch.compile(module)`` warns when global module hooks exist: the recorder's own."""


@contextlib.contextmanager
def eager_compile(on_compile: Callable[[], None]) -> Iterator[None]:
    """``torch.compile`` as the script calls it, with TorchDynamo disabled from its first call (or from the
    start, when TorchDynamo is already imported: something may have been compiled before the session)
    until the block ends; ``on_compile()`` is called at each ``torch.compile`` call."""
    with contextlib.ExitStack() as stack:
        disabled: list[bool] = []

        def disable() -> None:
            if not disabled:
                stack.enter_context(dynamo_disabled())
                disabled.append(True)

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def compile(*args: Any, **kwargs: Any) -> Any:
                disable()
                on_compile()
                return original(*args, **kwargs)
            return compile

        if compiler_errors():  # TorchDynamo already imported: something may have been compiled
            disable()
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=re.escape(_COMPILE_HOOKS_WARNING))
        stack.enter_context(patched([(torch, "compile", make)]))
        yield


def eager_script(notes: dict[str, None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The maker of ``torch.jit.script`` for :func:`patched`: a Python function is returned as it is, a
    module scripted by ``original`` with its compiled methods run as their Python (:func:`_as_python`),
    each noted in ``notes``; anything else scripted by ``original``."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def script(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(obj, torch.nn.Module) and not isinstance(obj, torch.jit.ScriptModule):
                scripted = original(obj, *args, **kwargs)
                if not isinstance(scripted, torch.jit.ScriptModule):
                    return scripted
                _moved_by_assignment(scripted)
                if _as_python(scripted, obj):
                    for method in ("save", "save_to_buffer"):
                        scripted.__dict__[method] = _saved_without_fakes(scripted, getattr(scripted, method))
                    notes[f"run: TorchScript module {type(obj).__qualname__} ran its Python forward (its "
                          "scripted code kept for save, code and graph): a finding names its line inside "
                          "it"] = None
                return scripted
            if not inspect.isfunction(obj) or "_rcb" in kwargs:
                # _rcb: TorchScript compiling a function that a scripted module's code calls
                # (torch.jit._recursive.try_compile_fn), which its saved code must hold compiled
                return original(obj, *args, **kwargs)
            notes[f"run: TorchScript function {obj.__qualname__} ran as its Python (as PYTORCH_JIT=0 runs "
                  "it): a finding names its line inside it"] = None
            return obj
        return script
    return make


def _saved_without_fakes(scripted: torch.nn.Module, save: Callable[..., Any]) -> Callable[..., Any]:
    """A scripted module's ``save``/``save_to_buffer`` that writes each fake tensor of the fake engine
    (which holds no data; TorchScript's writer reads it and crashes the process) as a ``meta`` tensor of
    its shape, as ``torch.save`` of the run writes one, and puts the fake tensors back after."""
    from placecheck.engines.compat import FakeTensor
    from placecheck.engines.datadep import on_host

    def saved(*args: Any, **kwargs: Any) -> Any:
        modules: list[Any] = list(scripted.modules())  # each with its C++ module (_c): the slots
        fakes = [(sub._c, key, t) for sub in modules
                 for key, t in [*sub._parameters.items(), *sub._buffers.items()] if isinstance(t, FakeTensor)]
        with on_host():
            for slots, key, t in fakes:
                slots.setattr(key, torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"))
        try:
            return save(*args, **kwargs)
        finally:
            for slots, key, t in fakes:
                slots.setattr(key, t)
    return saved


class _PythonMethod:
    """A scripted module's method run as the Python function it was compiled from, bound to the scripted
    module; anything else asked of it (``code``, ``graph``, ``schema``) is the compiled method's."""

    def __init__(self, func: Callable[..., Any], module: torch.nn.Module, compiled: Any) -> None:
        self.func = func
        self.module = module
        self.compiled = compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(self.module, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)


def _moved_by_assignment(scripted: torch.nn.Module) -> None:
    """``scripted.to(device)`` (and ``.cuda()``, ``.half()``) puts each moved tensor into its module's slot
    by assignment, as ``Module._apply`` does under ``set_overwrite_module_params_on_conversion``.

    Both engines' moved tensors are tensor subclasses, which ``Module._apply`` swaps into the existing
    Parameter object (``torch.utils.swap_tensors``); a scripted module's C++ slots hold a weak reference
    to each of its tensors, which ``swap_tensors`` refuses ("Couldn't swap RecursiveScriptModule.weight"),
    while assigning a new Parameter to the slot (``_parameters[key] = ...``, its C++ ``setattr``) keeps
    the subclass. Set on each scripted submodule's own ``__dict__``: the class is torch's.
    """
    for sub in scripted.modules():
        sub.__dict__["_apply"] = functools.partial(_apply_by_assignment, sub)


def _apply_by_assignment(module: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor],
                         recurse: bool = True) -> torch.nn.Module:
    """``Module._apply``'s overwriting path for a scripted module: :func:`_moved_by_assignment`."""
    if recurse:
        for child in module.children():
            child._apply(fn)  # type: ignore[no-untyped-call]  # torch leaves it untyped
    for key, param in list(module._parameters.items()):
        if param is None:
            continue
        with torch.no_grad():
            moved = torch.nn.Parameter(fn(param), param.requires_grad)
            if param.grad is not None:
                moved.grad = fn(param.grad).requires_grad_(param.grad.requires_grad)
        module._parameters[key] = moved
    for key, buffer in list(module._buffers.items()):
        if buffer is not None:
            module._buffers[key] = fn(buffer)
    return module


def _as_python(scripted: torch.nn.Module, eager: torch.nn.Module) -> bool:
    """Each compiled method of ``scripted`` and its submodules runs as the Python method of the module it
    was scripted from (found by its name in ``eager``); whether any does. Dunder methods stay compiled."""
    import types

    modules = dict(eager.named_modules())
    replaced = False
    for name, sub in scripted.named_modules():
        source = modules.get(name)
        compiled_names = getattr(getattr(sub, "_c", None), "_method_names", None)
        if source is None or compiled_names is None:
            continue
        for attr, value in list(vars(sub).items()):
            # what TorchScript copied from the eager module bound to it (a container's __iter__,
            # __getitem__, __len__): bound to the scripted module, so that the Python forward of a
            # scripted Sequential runs the scripted submodules (moved with it), not the eager ones
            if isinstance(value, types.MethodType) and value.__self__ is source:
                sub.__dict__[attr] = types.MethodType(value.__func__, sub)
        for method in compiled_names():
            func = inspect.getattr_static(type(source), method, None)
            if not isinstance(func, types.FunctionType) or method.startswith("__"):
                continue
            sub.__dict__[method] = _PythonMethod(func, sub, getattr(sub, method))
            replaced = True
    return replaced


class OutsideSimulation(RuntimeError):
    """Raised into the script where it would leave the simulation (start copies of itself as other
    processes): a limit of ``placecheck run``, reported as a note, never as the script's error."""


def _runs_the_program(command: Any) -> bool:
    """``command`` (``Popen``'s first argument) is this Python running the program again: its script
    (``sys.argv[0]``) or its module (``-m``, ``__main__``'s spec)."""
    if not isinstance(command, list | tuple) or len(command) < 2 \
            or not all(isinstance(a, str) for a in command):
        return False
    if os.path.realpath(command[0]) != os.path.realpath(sys.executable):
        return False
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = getattr(spec, "name", "")
    return (bool(script) and os.path.abspath(command[1]) == script) or \
        (command[1] == "-m" and len(command) > 2 and command[2] == module)


def no_copies_of_the_script(original: Callable[..., Any]) -> Callable[..., Any]:
    """``subprocess.Popen.__init__``: a launch of the program itself in another process is refused."""
    def __init__(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        if _runs_the_program(args):
            env = kwargs.get("env") or {}
            n = env.get("WORLD_SIZE", "N") if isinstance(env, dict) else "N"
            raise OutsideSimulation(
                "run: stopped where the script starts copies of itself in other processes "
                f"({' '.join(args)}): a launcher's other ranks would run outside the simulation (a "
                "framework's multi-device launcher: Lightning's Trainer(devices=N) with its ddp strategy); "
                "run the script "
                f"as torchrun would instead, each rank simulated: placecheck run --nproc-per-node {n} SCRIPT "
                "(the framework then sees torchrun's environment and starts no process)")
        original(self, args, *rest, **kwargs)
    return __init__


def fake_process_group(on_init: Callable[[Any, int, int], tuple[int, int]]) -> Callable[..., Any]:
    """``init_process_group``: the script's group becomes PyTorch's fake process group; ``on_init(backend,
    rank, world_size)`` (the script's arguments, -1 when not given) says which rank and world size."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None,
                               world_size: int = -1, rank: int = -1, store: Any = None,
                               *args: Any, **kwargs: Any) -> Any:
            from placecheck.engines.compat import fake_store

            rank, world_size = on_init(backend, rank, world_size)
            more = {"timeout": timeout} if timeout is not None else {}
            return original("fake", store=fake_store(), rank=rank, world_size=world_size, **more)
        return init_process_group
    return make


def watched_collective(name: str, check: Callable[[str, tuple[Any, ...], dict[str, Any]], None],
                       received: Callable[[str, dict[str, Any]], None] | None = None
                       ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A ``torch.distributed`` collective: ``check(name, args, kwargs)`` sees its arguments first;
    ``received(name, arguments)`` (by parameter name) after it, to give its outputs values."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        try:
            signature: inspect.Signature | None = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            check(name, args, kwargs)
            out = original(*args, **kwargs)
            if received is not None and signature is not None:
                with contextlib.suppress(TypeError):
                    received(name, dict(signature.bind(*args, **kwargs).arguments))
            return out
        return collective
    return make


def own_values(name: str, given: dict[str, Any], rank: int, world_size: int) -> None:
    """The outputs of a collective on the fake group (which moves no data: they would keep uninitialised
    memory) filled from the rank's own input, standing in for every rank's, as the object collectives
    keep each rank's own object: an all-gather's every slot is the rank's input, a reduce-scatter's
    output its own slice, a scatter's its own entry. Finite, deterministic values, never another rank's."""
    def copy(out: Any, value: Any) -> None:
        if isinstance(out, torch.Tensor) and isinstance(value, torch.Tensor) and out.numel() == value.numel():
            out.copy_(value.reshape(out.shape))

    def rows(t: Any) -> Any:  # (world_size, -1) view of a flat or stacked tensor, or None
        if isinstance(t, torch.Tensor) and t.numel() % world_size == 0 and t.is_contiguous():
            return t.view(world_size, -1)
        return None

    if name == "all_gather":
        for out in given.get("tensor_list") or ():
            copy(out, given.get("tensor"))
    elif name in ("all_gather_into_tensor", "all_gather_single"):
        out, value = rows(given.get("output_tensor")), given.get("input_tensor")
        if out is not None and isinstance(value, torch.Tensor):
            for slot in out:
                copy(slot, value)
    elif name == "reduce_scatter":
        inputs = given.get("input_list") or ()
        if len(inputs) > rank:
            copy(given.get("output"), inputs[rank])
    elif name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        value = rows(given.get("input"))
        if value is not None:
            copy(given.get("output"), value[rank])
    elif name == "all_to_all":
        for out, value in zip(given.get("output_tensor_list") or (), given.get("input_tensor_list") or (),
                              strict=False):
            copy(out, value)
    elif name == "all_to_all_single" and given.get("output_split_sizes") is None \
            and given.get("input_split_sizes") is None:
        copy(given.get("output"), given.get("input"))
    elif name == "gather":
        for out in given.get("gather_list") or ():
            copy(out, given.get("tensor"))
    elif name == "scatter":
        inputs = given.get("scatter_list") or ()
        if len(inputs) > rank:
            copy(given.get("tensor"), inputs[rank])


def ddp_construction(before: Callable[[Any], None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``DistributedDataParallel.__init__``: ``before(module)`` sees the module it wraps."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            before(module)
            original(self, module, *args, **kwargs)
        return __init__
    return make


def ddp_comm_hooks() -> dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """``DistributedDataParallel``'s comm hooks on the fake group, whose all-reduce returns a future
    without a value, which DDP's reducer refuses: each bucket ends with torch's own no-op hook (the
    gradients are the rank's own). A hook the script registers (``register_comm_hook``) still runs
    first, so its collectives are checked like the script's others; a built-in one (C++) is replaced
    by the no-op. Without either, the no-op is registered at the wrapper's first ``forward``, after any
    the script registers. The patches, per method name."""
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

    from placecheck.engines.callbacks import called_back

    def register(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def register_comm_hook(self: Any, state: object, hook: Callable[..., Any]) -> None:
            @functools.wraps(hook)
            def checked(state: object, bucket: Any) -> Any:
                # the reducer calls it inside the backward: the script's code, simulated as the rest
                with called_back():
                    hook(state, _OnDevice(bucket))  # its collectives checked; their futures never complete
                return noop_hook(None, bucket)
            original(self, state, checked)
        return register_comm_hook

    def builtin(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
            self.register_comm_hook(None, noop_hook)
        return _register_builtin_comm_hook

    def forward(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def ddp_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not self._comm_hooks:  # DDP's list of the Python hooks registered
                self.register_comm_hook(None, noop_hook)
            return original(self, *args, **kwargs)
        return ddp_forward

    return {"register_comm_hook": register, "_register_builtin_comm_hook": builtin, "forward": forward}


class _OnDevice:
    """A ``dist.GradBucket`` as a hook sees it on a GPU: its buffer and gradients on the device of its
    parameters (DDP's reducer, C++, makes them as plain CPU tensors under the real-valued engine)."""

    def __init__(self, bucket: Any) -> None:
        self._bucket = bucket
        params = bucket.parameters()
        self._device: torch.device | None = params[0].device if params else None

    def buffer(self) -> torch.Tensor:
        from placecheck.engines.tagged import as_on

        return as_on(self._bucket.buffer(), self._device)  # type: ignore[no-any-return]

    def gradients(self) -> list[torch.Tensor]:
        from placecheck.engines.tagged import as_on

        return [as_on(g, self._device) for g in self._bucket.gradients()]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bucket, name)


def own_objects(name: str, rank: Callable[[], int], world_size: Callable[[], int]
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An object collective on the fake group: each rank's own object stands for every rank's."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> None:
            given = signature.bind_partial(*args, **kwargs).arguments
            if name == "all_gather_object":
                output, obj = given.get("object_list"), given.get("obj")
            elif name == "gather_object":
                output, obj = given.get("object_gather_list"), given.get("obj")
            elif name == "scatter_object_list":
                output = given.get("scatter_object_output_list")
                inputs = given.get("scatter_object_input_list")
                if isinstance(output, list) and isinstance(inputs, list | tuple) and len(inputs) > rank():
                    output[:1] = [inputs[rank()]]
                return
            else:  # broadcast_object_list: each rank keeps what its list holds
                return
            if isinstance(output, list):
                output[:] = [obj] * world_size()
        return collective
    return make

