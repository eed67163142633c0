"""The instrumented forward pass: what happened on which device, and where in the user's code.

In the style of ``torch/utils/flop_counter.py``: the public :class:`Tracer`
owns the state and the events; a private ``TorchFunctionMode`` only hands
each call to it. The checks (:meth:`Tracer.findings`) read the events
afterwards and turn them into findings PC201-PC207.

The mode sees every torch call before dispatch. When a call fails because it
mixes devices (PyTorch's own rule, raised by the fake-tensor engine, the
real-valued engine or a real GPU), the tracer records the mismatch (op,
devices, module, user line, where the offending tensor came from), moves the
offending argument to the target and runs the call again, so one forward
reports every mismatch.

A finding's ``source`` is the innermost frame of the forward outside torch,
placecheck and installed packages (site-packages), never a frame outside the
forward. Performance findings whose whole call chain is installed code
(torchvision's own ``.item()``) are counted in a note rather than reported. The
walk's stray tensors (PC101) are followed too: one the forward replaces with a
tensor on the target, or uses only in computations that never meet a device
tensor, is handled by the code and not reported (:meth:`Tracer.dismissed_strays`).

Cost: a clean op costs a dictionary lookup and a scan of its arguments (plus,
for off-target arguments only, a lookup among the strays); the
Python stack is walked only when an event is recorded, and which code objects
are torch's or placecheck's own is cached per code object.

Not reentrant: one tracer at a time per process (the registration hooks are global).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import CodeType, FrameType, TracebackType
from typing import Any

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from placecheck.errors import one_line
from placecheck.finding import Finding, Severity
from placecheck.rules import rule
from placecheck.tagged import INDEX_OPS, SimulatedDeviceMismatchError
from placecheck.walk import WalkResult, join, storage_key

# -- user frames -------------------------------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PLACECHECK_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_EXAMPLES_DIR = _PLACECHECK_DIR + "examples" + os.sep
_LIBRARY_FILES = frozenset(os.path.abspath(m.__file__ or "") for m in (contextlib, functools, typing))


@functools.cache
def _is_internal(code: CodeType) -> bool:
    """True for torch's, placecheck's and the stdlib wrappers' own frames (cached per code object)."""
    return _internal_file(code.co_filename)


def _internal_file(name: str) -> bool:
    return (name.startswith(_TORCH_DIR) or name.startswith("<frozen")
            or (name.startswith(_PLACECHECK_DIR) and not name.startswith(_EXAMPLES_DIR))
            or os.path.abspath(name) in _LIBRARY_FILES or "unittest/mock.py" in name)


def display_path(filename: str) -> str:
    """``filename`` relative to the working directory when it is under it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def _site_dirs() -> tuple[str, ...]:
    """Where installed packages live: sysconfig's purelib/platlib and site's package directories."""
    import site
    import sysconfig

    dirs = {sysconfig.get_paths().get(k, "") for k in ("purelib", "platlib")}
    with contextlib.suppress(AttributeError):  # site.getsitepackages is missing in some virtualenvs
        dirs.update(site.getsitepackages())
    return tuple(sorted(os.path.abspath(d) + os.sep for d in dirs if d))


_SITE_DIRS = _site_dirs()


@functools.cache
def library_package(code: CodeType) -> str:
    """The installed package ``code`` belongs to ("torchvision"), or "" for the user's own code.

    A file in site-packages/dist-packages is library code, unless the working
    directory is inside that package (a package audited in place). A project's
    own virtualenv under the working directory is still installed code; an
    editable install's files are outside site-packages anyway. Cached per code object.
    """
    return _library_of_file(code.co_filename)


def _library_of_file(filename: str) -> str:
    name = os.path.abspath(filename)
    cwd = os.getcwd() + os.sep
    for base in _SITE_DIRS:
        # a project's own virtualenv (./.venv) is still installed code; working inside
        # site-packages itself (auditing an installed package in place) is not
        if name.startswith(base) and not (cwd.startswith(base) and name.startswith(cwd)):
            return name[len(base):].split(os.sep, 1)[0].removesuffix(".py")
    return ""


def _user_frame(frame: FrameType | None) -> FrameType | None:
    while frame is not None and _is_internal(frame.f_code):
        frame = frame.f_back
    return frame


def user_line(exc: BaseException) -> str:
    """``file:line`` of the innermost user frame in ``exc``'s traceback: outside installed packages
    when there is one, else the innermost outside torch and placecheck ("" when none)."""
    frames = [f for f in _frames_of(exc.__traceback__) if not _is_internal(f.f_code)]
    frames = [f for f in frames if not library_package(f.f_code)] or frames
    if not frames:
        return ""
    tb = exc.__traceback__
    line = 0
    while tb is not None:
        if tb.tb_frame is frames[-1]:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f"{display_path(frames[-1].f_code.co_filename)}:{line}"


def _frames_of(tb: TracebackType | None) -> list[FrameType]:
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


# -- events ------------------------------------------------------------------------------------


@dataclass
class Site:
    """Where an event happened: the user's ``file:line`` and the module whose forward ran it."""

    source: str
    where: str
    library: str = ""
    """The installed package the line is in, when no frame of the forward's call chain is outside
    installed packages (torchvision's own code called from torchvision's own module)."""


@dataclass
class Creation:
    """A tensor created in forward off the target (a factory without ``device=``, ``.cpu()``...)."""

    op: str
    device: str
    site: Site
    dtype: str
    shape: tuple[int, ...] | None
    fed_mismatch: bool = False
    """True once a tensor from here took part in a device mismatch."""
    moved: bool = False
    """True once a tensor from here was moved to the target explicitly (``.to(x.device)``)."""
    merged: list[Creation] = dataclasses.field(default_factory=list)
    """Other creations whose tensors were combined with this one's (``torch.meshgrid(a, b)``):
    what happens to the combination happens to them too."""

    def mark(self, attr: str, seen: set[int] | None = None) -> None:
        """Set ``moved`` or ``fed_mismatch`` here and on every creation merged into this one."""
        seen = seen if seen is not None else set()
        if id(self) in seen:
            return
        seen.add(id(self))
        setattr(self, attr, True)
        for other in self.merged:
            other.mark(attr, seen)


@dataclass
class Provenance:
    """Where an off-target tensor came from: an attribute path, or a creation in forward."""

    path: str = ""
    linked: Finding | None = None
    """The walk's finding about that attribute, when there is one."""
    creation: Creation | None = None
    lazy: bool = False
    """The tensor belongs to a module or parameter created during forward."""
    also: tuple[Provenance, ...] = ()
    """The other origins combined into this tensor (``torch.cat((created, self.stray))``)."""
    host_copy: Site | None = None
    """Where forward copied the tensor to the host (``.cpu()``, ``.to("cpu")``)."""

    @property
    def origin(self) -> str:
        if self.creation is not None:
            return self.creation.site.source
        if self.host_copy is not None:
            return self.host_copy.source
        return self.linked.where if self.linked else self.path

    @property
    def site(self) -> Site:
        """The line in forward that made the tensor, when forward made it."""
        if self.creation is not None:
            return self.creation.site
        return self.host_copy or Site("", "")


@dataclass
class Mismatch:
    op: str
    devices: tuple[str, ...]
    device: str
    site: Site
    provenance: Provenance
    dtype: str
    shape: tuple[int, ...] | None


@dataclass
class HostSync:
    op: str
    device: str
    site: Site


@dataclass
class ImplicitTransfer:
    op: str
    scalar: bool
    site: Site
    provenance: Provenance
    dtype: str
    shape: tuple[int, ...] | None


@dataclass
class Registration:
    """A module or parameter registered on the model during forward."""

    what: str
    """``module`` or ``parameter``."""
    path: str
    type_name: str
    device: str
    site: Site
    on_target: bool = False
    """Built on the target (``device=x.device``): placed right, still unknown to an earlier optimizer."""


@dataclass
class OutputOffDevice:
    path: str
    device: str
    dtype: str
    shape: tuple[int, ...] | None
    provenance: Provenance


@dataclass
class ForwardError:
    phase: str
    """``forward`` or ``backward``."""
    message: str
    site: Site
    mismatch: bool = False
    """The error is a device mismatch the tracer could not repair (PC201)."""


@dataclass
class GradOffDevice:
    path: str
    device: str


Event = typing.Union[Creation, Mismatch, HostSync, ImplicitTransfer, Registration, OutputOffDevice,
                     ForwardError, GradOffDevice]

# -- calls -------------------------------------------------------------------------------------

# Not .numpy(): on a CUDA tensor it raises TypeError (reported as PC207); .cpu().numpy() syncs at .cpu()
_HOST_SYNC = frozenset({torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu,
                        torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
                        torch.Tensor.__index__})
_MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.type_as})
_METADATA = frozenset({torch.Tensor.dim, torch.Tensor.size, torch.Tensor.numel, torch.Tensor.stride,
                       torch.Tensor.is_contiguous, torch.Tensor.data_ptr, torch.Tensor.__len__,
                       torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.__hash__,
                       torch.Tensor.element_size, torch.Tensor.get_device, torch.Tensor.is_floating_point,
                       torch.Tensor.is_complex, torch.Tensor.storage_offset, torch.Tensor.untyped_storage})
_HOST_FACTORIES = ("from_numpy", "frombuffer")
"""Factories that build a tensor from host memory without a torch function call the mode sees."""
_passthrough: dict[Any, bool] = {}
_MISMATCH_TEXTS = ("expected all tensors to be on the same device", "should be the same",
                   "but got mat2 is on", "is on cpu, different from")


def _is_passthrough(func: Callable[..., Any]) -> bool:
    known = _passthrough.get(func)
    if known is None:
        known = func in _METADATA or getattr(func, "__name__", "") in ("__get__", "__set__")
        _passthrough[func] = known
    return known


def is_device_mismatch(exc: BaseException) -> bool:
    """True for PyTorch's device-mismatch errors, on any engine."""
    from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError

    if isinstance(exc, FakeTensorDeviceMismatchError | SimulatedDeviceMismatchError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(t in text for t in _MISMATCH_TEXTS) and (
        "device" in text or "cuda" in text)


def op_name(func: Callable[..., Any]) -> str:
    """``torch.randn``, ``Tensor.add``, ``torch.nn.functional.linear``: how a user would write the call."""
    name = getattr(func, "__name__", repr(func))
    qual = getattr(func, "__qualname__", name)
    if qual.startswith(("TensorBase.", "Tensor.")):
        return "Tensor." + name
    module = getattr(func, "__module__", None) or ""
    if module.startswith("torch._C") or module in ("", "torch") or "VariableFunctions" in qual:
        return "torch." + name
    return f"{module.replace('torch.nn.functional', 'F')}.{name}" if module else name


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _shape(t: torch.Tensor) -> tuple[int, ...] | None:
    try:
        return tuple(int(s) for s in t.shape)
    except (RuntimeError, TypeError, ValueError):
        return None


def _describe(t: torch.Tensor) -> str:
    return f"{_dtype(t)}{list(_shape(t) or [])}"


def _tensor_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[int, torch.Tensor]]:
    """``(argument position, tensor)``: tensors in args/kwargs and one level of lists and tuples."""
    found = []
    for pos, a in enumerate((*args, *kwargs.values())):
        if isinstance(a, torch.Tensor):
            found.append((pos, a))
        elif isinstance(a, list | tuple):
            found.extend((pos, x) for x in a if isinstance(x, torch.Tensor))
    return found


def _legal_cpu_argument(func: Callable[..., Any], pos: int, t: torch.Tensor) -> bool:
    """A CPU tensor a GPU op accepts: a 0-dim scalar, or an index tensor."""
    return t.device.type == "cpu" and (t.dim() == 0 or (func in INDEX_OPS and pos > 0))


def _replace(obj: Any, moved: dict[int, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return moved.get(id(obj), obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_replace(o, moved) for o in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(_replace(o, moved) for o in obj)
    if isinstance(obj, dict):
        return {k: _replace(v, moved) for k, v in obj.items()}
    return obj


def _output_tensors(obj: Any, path: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a forward output: nested lists, tuples, dicts, namedtuples, dataclasses."""
    if depth > 8:
        return
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _output_tensors(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for name in obj._fields:
            yield from _output_tensors(getattr(obj, name), f"{path}.{name}", depth + 1)
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _output_tensors(v, f"{path}[{i}]", depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _output_tensors(getattr(obj, f.name, None), f"{path}.{f.name}", depth + 1)


# -- the tracer --------------------------------------------------------------------------------


class _RecordingMode(TorchFunctionMode):
    """Hands every torch call to the tracer; holds no state of its own."""

    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return self.tracer.on_call(func, args, kwargs or {})


class Tracer:
    """Runs one forward (and optionally backward) pass of a moved model and records what happens.

    ``walk`` is the walk's result for the same model, so that a mismatch can
    name the attribute its tensor came from. ``move`` moves one tensor to the
    target on the current engine (the same function the inputs went through).
    """

    _MAX_RETRIES = 8

    def __init__(self, model: nn.Module, target: str, walk: WalkResult | None = None,
                 move: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.model = model
        self.target = torch.device(target)
        self.target_name = target
        self.events: list[Event] = []
        self.module_paths: dict[int, str] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            self.module_paths.setdefault(id(module), path)
        self.parameters = {id(p) for p in model.parameters()}
        self.origins: dict[int, str] = dict(walk.origins) if walk else {}
        self.storages: dict[int, str] = dict(walk.storages) if walk else {}
        self.walk_findings = dict(walk.finding_by_origin) if walk else {}
        self.lazy_origins: set[str] = set()
        self.strays = {path for path, f in self.walk_findings.items() if f.code == "PC101"}
        """The walk's stray tensors (PC101), whose use in forward is followed."""
        self._stray_ids = {tid: path for tid, path in self.origins.items() if path in self.strays}
        self.stray_touched: set[str] = set()
        self.stray_fed: set[str] = set()
        """Strays that took part (themselves or through a result) in a mismatch or an implicit transfer."""
        self.stray_moved: set[str] = set()
        self.completed = False
        """The forward returned (strays untouched so far may be used later otherwise)."""
        self.library_hidden: dict[str, int] = {}
        """Installed package -> performance findings not reported because they are its own code."""
        self._provenance: dict[int, tuple[torch.Tensor, Provenance]] = {}
        self._recorded: set[tuple[Any, ...]] = set()
        self._move = move or (lambda t: t.to(self.target))
        self._keep: list[Any] = []

    # -- the recording context ----------------------------------------------------------------
    @contextlib.contextmanager
    def recording(self) -> Iterator[Tracer]:
        """Record every torch call and every module/parameter registration inside."""
        from torch.nn.modules import module as module_mod

        handles = [module_mod.register_module_module_registration_hook(self._on_module_registered),
                   module_mod.register_module_parameter_registration_hook(self._on_parameter_registered)]
        try:
            with _RecordingMode(self), _attention_fast_path_kept(self.target), self._host_factories_seen():
                yield self
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def _host_factories_seen(self) -> Iterator[None]:
        """``torch.from_numpy`` and ``torch.frombuffer`` never reach a torch function mode: wrap them
        (as ``torch.X``, where model code looks them up) while recording, so their tensors are creations."""
        originals = {name: getattr(torch, name) for name in _HOST_FACTORIES}

        def wrapped(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def factory(*args: Any, **kwargs: Any) -> Any:
                with torch._C.DisableTorchFunction():  # fake tensors' own conversion is not the model's
                    out = original(*args, **kwargs)
                if isinstance(out, torch.Tensor) and out.device != self.target:
                    self._off_target_result(original, args, [], out)
                return out
            return factory

        for name, original in originals.items():
            setattr(torch, name, wrapped(original))
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(torch, name, original)

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any], train: bool = False) -> Any:
        """One forward pass (``eval()`` + ``no_grad`` unless ``train``), then the output check; in
        training mode a backward of the summed floating outputs and the gradient check.

        What the model raises propagates: the caller decides whether another
        engine can run it, or records it with :meth:`record_error`.
        """
        self.model.train(train)
        with torch.enable_grad() if train else torch.no_grad():
            with self.recording():
                output = self.model(*args, **kwargs)
            self.completed = True
            self.check_output(output)
            if train:
                self.backward(output)
        return output

    def record_error(self, exc: BaseException, phase: str = "forward") -> None:
        """Record what the forward (or backward) raised, at the innermost user frame of its traceback."""
        frames = _frames_of(exc.__traceback__)
        site = self._site(frames[-1]) if frames else Site("", "")
        self.events.append(ForwardError(phase, one_line(exc), site, mismatch=is_device_mismatch(exc)))

    def backward(self, output: Any) -> None:
        """Backward of the summed floating outputs; then every gradient must be on the target."""
        floats = [t for _, t in _output_tensors(output, "") if t.is_floating_point() and t.requires_grad]
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
            if grad is not None and grad.device != self.target:
                self.events.append(GradOffDevice(name, str(grad.device)))

    def check_output(self, output: Any) -> None:
        """PC206: every tensor in the (nested) output must be on the target."""
        for path, t in _output_tensors(output, "output"):
            if t.device != self.target:
                self.events.append(OutputOffDevice(path, str(t.device), _dtype(t), _shape(t),
                                                   self.provenance(t)))

    # -- per call ---------------------------------------------------------------------------------
    def on_call(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One torch call: run it, recording what it does across devices."""
        if _is_passthrough(func):
            return func(*args, **kwargs)
        tensors = _tensor_args(args, kwargs)
        target = self.target
        off = [(pos, t) for pos, t in tensors if t.device != target]
        if off and self._stray_ids:
            for _, t in off:
                stray = self._stray_ids.get(id(t))
                if stray is not None:
                    self.stray_touched.add(stray)
        if func in _HOST_SYNC and args and isinstance(args[0], torch.Tensor) \
                and args[0].device.type != "cpu":
            self._record_host_sync(func, args[0])
        if off and len(off) < len(tensors):
            self._check_implicit(func, off)
        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            if not off or not is_device_mismatch(exc):
                raise
            out = self._repair(func, args, kwargs, off, exc)
            off = []
        if isinstance(out, torch.Tensor) and out.device != target:
            self._off_target_result(func, args, off, out)
        elif off and func in _MOVES and isinstance(out, torch.Tensor):
            for _, t in off:
                self._mark(self.provenance(t), "moved")
        elif isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
            for o in out:
                if isinstance(o, torch.Tensor) and o.device != target:
                    self._off_target_result(func, args, off, o)
        return out

    def _repair(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                off: list[tuple[int, torch.Tensor]], exc: Exception) -> Any:
        """Record the mismatch, move the offending arguments to the target, and run the call again."""
        for _ in range(self._MAX_RETRIES):
            offending = [(pos, t) for pos, t in off if not _legal_cpu_argument(func, pos, t)]
            if not offending:
                raise exc
            devices = sorted({str(t.device) for _, t in off} | {self.target_name})
            site = self._site(sys._getframe())
            moved: dict[int, torch.Tensor] = {}
            for _, t in offending:
                prov = self.provenance(t)
                self._mark(prov, "fed_mismatch")
                key = ("mismatch", site.source, prov.origin)
                if key not in self._recorded:
                    self._recorded.add(key)
                    self.events.append(Mismatch(op_name(func), tuple(devices), str(t.device), site, prov,
                                                _dtype(t), _shape(t)))
                moved[id(t)] = self._move(t)
            args, kwargs = _replace(args, moved), _replace(kwargs, moved)
            try:
                return func(*args, **kwargs)
            except Exception as again:
                if not is_device_mismatch(again):
                    raise
                exc = again
                off = [(pos, t) for pos, t in _tensor_args(args, kwargs) if t.device != self.target]
        raise exc

    def _off_target_result(self, func: Callable[..., Any], args: tuple[Any, ...],
                           off: list[tuple[int, torch.Tensor]], out: torch.Tensor) -> None:
        """An op returned a tensor off the target: derived from an off-target input, or created here."""
        if id(out) in self._provenance or id(out) in self.origins:
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
            self._provenance[id(out)] = (out, first)
            return
        if off:
            return
        if func in _HOST_SYNC or (func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor)
                                  and args[0].device.type != "cpu" and out.device.type == "cpu"):
            if func is torch.Tensor.to:
                self._record_host_sync(func, args[0])
            # a device-to-host copy: PC204, not a creation; its line is where the result came from
            self._provenance[id(out)] = (out, Provenance(host_copy=self._site(sys._getframe())))
            return
        frame = sys._getframe()
        site = self._site(frame)
        building = _module_being_built(frame)
        op = f"{building}(...) built in forward" if building else op_name(func)
        creation = Creation(op, str(out.device), site, _dtype(out), _shape(out))
        key = ("creation", site.source, op)
        if key not in self._recorded:
            self._recorded.add(key)
            self.events.append(creation)
        else:
            creation = next(e for e in self.events if isinstance(e, Creation)
                            and e.site.source == site.source and e.op == op)
        self._provenance[id(out)] = (out, Provenance(creation=creation))

    def _check_implicit(self, func: Callable[..., Any], off: list[tuple[int, torch.Tensor]]) -> None:
        for pos, t in off:
            if t.device.type != "cpu":
                continue
            scalar = t.dim() == 0
            if scalar or (func in INDEX_OPS and pos > 0):
                site = self._site(sys._getframe())
                key = ("implicit", site.source, scalar)
                prov = self.provenance(t)
                if not scalar or prov.path:  # PC205 reports a scalar only when it is stored
                    self._mark(prov, "fed_mismatch", creations=False)
                if key not in self._recorded:
                    self._recorded.add(key)
                    self.events.append(ImplicitTransfer(op_name(func), scalar, site, prov,
                                                        _dtype(t), _shape(t)))

    def _mark(self, prov: Provenance, what: str, creations: bool = True,
              seen: set[int] | None = None) -> None:
        """``what`` (``moved`` or ``fed_mismatch``) happened to a tensor of provenance ``prov``: note it
        on its creations (PC202) and its stray attributes (PC101), combined origins included."""
        seen = seen if seen is not None else set()
        if id(prov) in seen:
            return
        seen.add(id(prov))
        if creations and prov.creation is not None:
            prov.creation.mark(what)
        if prov.path in self.strays:
            (self.stray_moved if what == "moved" else self.stray_fed).add(prov.path)
        for other in prov.also:
            self._mark(other, what, creations, seen)

    def dismissed_strays(self, after: WalkResult) -> dict[str, str]:
        """Walk findings (PC101) the forward shows the code handles: path -> why it is not reported.

        ``after`` is the walk repeated after the forward. A stray is handled
        when the forward replaced it with a tensor on the target, or used it
        only in computations that never met a device tensor (no mismatch, no
        implicit transfer traced to it). One never used, or one that fed a
        mismatch, stays reported; so does every stray when the forward stopped early.
        """
        if not self.completed:
            return {}
        still_off = {f.where for f in after.findings if f.code == "PC101"}
        present = set(after.origins.values())
        target = self.target_name
        dismissed: dict[str, str] = {}
        for path in sorted(self.strays - self.stray_fed):
            if path not in still_off:
                dismissed[path] = (f"forward replaces it with a tensor on {target} before use"
                                   if path in present else "forward removes it before use")
            elif path in self.stray_touched:
                dismissed[path] = ("forward only uses it in CPU computations whose results it moves "
                                   "explicitly" if path in self.stray_moved else
                                   f"forward only uses it in computations that never meet a {target} tensor")
        return dismissed

    def _record_host_sync(self, func: Callable[..., Any], t: torch.Tensor) -> None:
        site = self._site(sys._getframe())
        key = ("sync", site.source, func)
        if key not in self._recorded:
            self._recorded.add(key)
            name = {"__bool__": "bool()", "__int__": "int()", "__float__": "float()",
                    "__index__": "an index"}.get(func.__name__, f".{func.__name__}()")
            self.events.append(HostSync(name, str(t.device), site))

    # -- registrations (PC203) ----------------------------------------------------------------------
    def _on_module_registered(self, module: nn.Module, name: str, submodule: nn.Module | None) -> None:
        owner = self.module_paths.get(id(module))
        if owner is None or submodule is None or id(submodule) in self.module_paths:
            return
        path = join(owner, name)
        for sub_path, sub in submodule.named_modules():
            self.module_paths.setdefault(id(sub), join(path, sub_path))
        for tname, t in [*submodule.named_parameters(), *submodule.named_buffers()]:
            self.origins.setdefault(id(t), join(path, tname))
            self.lazy_origins.add(join(path, tname))
            self._keep.append(t)
        if isinstance(submodule, nn.modules.lazy.LazyModuleMixin):
            return  # nn.Lazy* follow .to() correctly; not this bug
        # built on the target (device=x.device, or the target is the CPU) it is placed right, but an
        # optimizer built before the first forward still misses it: PC203 either way
        devices = {t.device for t in [*submodule.parameters(), *submodule.buffers()]}
        if not devices:
            return  # nothing to place or to train (nn.ReLU built in forward)
        device = ", ".join(sorted(str(d) for d in devices))
        self.events.append(Registration("module", path, type(submodule).__name__, device,
                                        self._site(sys._getframe()), on_target=devices == {self.target}))

    def _on_parameter_registered(self, module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        owner = self.module_paths.get(id(module))
        if owner is None or param is None or id(param) in self.parameters:
            return
        path = join(owner, name)
        if path in self.lazy_origins:
            return  # set while building a module registered in forward: reported with that module
        self.parameters.add(id(param))
        self.origins.setdefault(id(param), path)
        self.lazy_origins.add(path)
        self._keep.append(param)
        self.events.append(Registration("parameter", path, "Parameter", str(param.device),
                                        self._site(sys._getframe()), on_target=param.device == self.target))

    # -- provenance and sites -------------------------------------------------------------------------
    def provenance(self, t: torch.Tensor) -> Provenance:
        """Where ``t`` came from: created in forward, derived from, or itself an attribute."""
        path = self.origins.get(id(t))
        if path is None:
            known = self._provenance.get(id(t))
            if known is not None and known[0] is t:
                return known[1]
            key = storage_key(t)
            path = self.storages.get(key) if key is not None else None
        if path is None:
            return Provenance()
        return Provenance(path=path, linked=self.walk_findings.get(path), lazy=path in self.lazy_origins)

    def _site(self, frame: FrameType | None) -> Site:
        """Where the call at ``frame`` happened, looking outwards no further than the forward.

        ``source`` is the innermost frame outside torch, placecheck and
        installed packages; with none, the innermost line in an installed
        package (``library`` names it); with none either (torch code called from
        torch modules), the definition of the module's class when that is the
        user's, else "". ``where`` is the module whose forward ran that line:
        the innermost ``Module.__call__`` on the stack outside it (with no
        source, the innermost one: torch's own modules included).
        """
        first_outside: FrameType | None = None  # innermost frame outside torch and placecheck
        user: FrameType | None = None  # innermost frame outside installed packages too
        scan = frame
        while scan is not None and scan.f_code is not _RUN_CODE and user is None:
            if not _is_internal(scan.f_code):
                first_outside = first_outside or scan
                if not library_package(scan.f_code):
                    user = scan
            scan = scan.f_back
        shown = user or first_outside
        module = self._running_module(shown or frame)
        where = self.module_paths.get(id(module), "") if module is not None else ""
        if shown is not None:
            return Site(f"{display_path(shown.f_code.co_filename)}:{shown.f_lineno}", where,
                        "" if user is not None else library_package(shown.f_code))
        return Site(_class_definition(module), where)

    def _running_module(self, frame: FrameType | None) -> nn.Module | None:
        """The model's module whose ``Module.__call__`` is innermost on the stack from ``frame`` out."""
        while frame is not None and frame.f_code is not _RUN_CODE:
            if frame.f_code in _CALL_CODES:
                candidate = frame.f_locals.get("self")
                if id(candidate) in self.module_paths:
                    return typing.cast(nn.Module, candidate)
            frame = frame.f_back
        return None

    # -- the checks -----------------------------------------------------------------------------------
    def findings(self, library_findings: bool = False) -> list[Finding]:
        """PC201-PC207 from the recorded events, de-duplicated by (code, source line).

        Performance findings (warning or info: PC202 that fed no mismatch,
        PC204, PC205) whose call chain in the forward has no frame outside
        installed packages are library code the user cannot act on: counted
        in :attr:`library_hidden` instead, unless ``library_findings``.
        """
        found: dict[tuple[str, str, str], Finding] = {}
        library: dict[tuple[str, str, str], str] = {}
        lazy_lines = {e.site.source for e in self.events if isinstance(e, Registration)}
        for event in self.events:
            finding = self._finding(event, lazy_lines)
            if finding is None:
                continue
            # one finding per line; per output for PC206 (two host copies returned from one line)
            key = (finding.code, finding.source,
                   finding.module if not finding.source or finding.code == "PC206" else "")
            if key in found:
                found[key] = _also_in(found[key], finding.where)
                if finding.code == "PC201":
                    found[key] = _also_from(found[key], finding.origin)
                continue
            found[key] = finding
            site = getattr(event, "site", None)
            if isinstance(site, Site) and site.library:
                library[key] = site.library
        self.library_hidden = {}
        kept = []
        for key, finding in found.items():
            package = library.get(key, "")
            if package and not library_findings and finding.severity is not Severity.ERROR \
                    and finding.code in _PERFORMANCE_CODES:
                self.library_hidden[package] = self.library_hidden.get(package, 0) + 1
                continue
            kept.append(finding)
        return kept

    def notes(self) -> list[str]:
        """What :meth:`findings` left out, for the report's notes."""
        hidden = sum(self.library_hidden.values())
        if not hidden:
            return []
        return [f"forward: {hidden} performance finding{'s' if hidden != 1 else ''} inside installed "
                f"packages ({', '.join(sorted(self.library_hidden))}) not reported; --library-findings "
                "shows them"]

    def _finding(self, event: Event, lazy_lines: set[str]) -> Finding | None:
        target = self.target_name
        if isinstance(event, Mismatch):
            return self._mismatch_finding(event)
        if isinstance(event, Creation):
            if event.site.source in lazy_lines:
                return None  # the parameters of a layer built in forward: that is PC203
            fed = event.fed_mismatch
            if not fed and (event.moved or event.shape == ()):
                # moved to the device explicitly before use (seed 002's `torch.randn(...).to(device)`),
                # or a 0-dim scalar, which PyTorch reads on the host like a Python number
                return None
            return _make("PC202", event.site, Severity.ERROR if fed else None, device=event.device,
                         expected=target, dtype=event.dtype, shape=event.shape, origin=event.site.source,
                         message=(f"{event.op} in forward creates {event.dtype}{list(event.shape or [])} on "
                                  f"{event.device}, not {target}"
                                  + (": it then fed a device mismatch" if fed else "")),
                         hint=("tensors created in forward land on the default device (the CPU), not the "
                               "input's: pass device=x.device (and dtype=x.dtype), or use torch.zeros_like/"
                               "x.new_zeros"),
                         details=(("op", event.op),))
        if isinstance(event, HostSync):
            return _make("PC204", event.site, None, device=event.device, expected=target,
                         message=f"{event.op} on a {event.device} tensor in forward waits for the device "
                                 "and copies to the host",
                         hint="keep the value on the device (torch.where, masks, clamp) or move the check "
                              "out of forward", details=(("op", event.op),))
        if isinstance(event, ImplicitTransfer):
            if event.scalar and not event.provenance.path:
                # a scalar made in forward is a Python number to PyTorch; a stored one could be a buffer
                return None
            what = ("0-dim CPU tensor used as a scalar" if event.scalar
                    else f"CPU index tensor {event.dtype}{list(event.shape or [])}")
            return _make("PC205", event.site, Severity.INFO if event.scalar else None, device="cpu",
                         expected=target, dtype=event.dtype, shape=event.shape,
                         origin=event.provenance.origin,
                         message=(f"{event.op}: {what}" + (
                             ": PyTorch reads it on the host and passes the value to the kernel (legal, "
                             "no device copy), but .to() did not move it" if event.scalar
                             else f" is copied to {target} on every call (a blocking host-to-device "
                                  "transfer)")) + _came_from(event.provenance),
                         hint=("use a Python number" if event.scalar else
                               "create the index on the device once (register_buffer or device=x.device)"),
                         details=(("op", event.op),))
        if isinstance(event, Registration):
            on_target = event.on_target
            # on the target it cannot crash the job: only the optimizer misses it
            return _make("PC203", event.site, Severity.WARNING if on_target else None,
                         device=event.device, expected=target,
                         module=event.path,
                         message=(f"{event.what} {event.path!r} ({event.type_name}) is created during forward"
                                  + (f" on {event.device}" if event.device else "")
                                  + (": it is on the right device, but unregistered when an optimizer is "
                                     "built before the first forward, which then never trains it"
                                     if on_target else
                                     ": the earlier .to() never saw it and an optimizer built before the "
                                     "first forward does not train it")),
                         hint=("build layers and parameters in __init__ (or use nn.Lazy* modules), so that "
                               "an optimizer made before the first forward trains them" if on_target else
                               "build layers and parameters in __init__ (or use nn.Lazy* modules, which "
                               "follow .to()); a layer built in forward lands on the default device, the "
                               "CPU, whatever the input's device"))
        if isinstance(event, OutputOffDevice):
            prov = event.provenance
            return _make("PC206", prov.site, None, device=event.device, expected=target, dtype=event.dtype,
                         shape=event.shape, origin=prov.origin, module=event.path,
                         message=f"{event.path} ({event.dtype}{list(event.shape or [])}) is on "
                                 f"{event.device}, not {target}" + _came_from(prov),
                         hint="create every returned tensor on the input's device (device=x.device)",
                         details=(("output", event.path),))
        if isinstance(event, ForwardError):
            if event.mismatch:
                return _make("PC201", event.site, None, expected=target,
                             message=f"the {event.phase} raised a device mismatch placecheck could not "
                                     f"trace to an argument: {event.message}",
                             hint="look for tensors held outside the call's arguments on another device")
            return _make("PC207", event.site, None, expected=target,
                         message=f"the {event.phase} raised {event.message}",
                         hint="check the input (--input, --example-inputs); findings before this point "
                              "are still reported", details=(("phase", event.phase),))
        if isinstance(event, GradOffDevice):
            return _make("PC201", Site("", ""), None, device=event.device, expected=target,
                         module=event.path, origin=event.path,
                         message=f"the gradient of parameter {event.path!r} lands on {event.device}, not "
                                 f"{target}: optimizer.step() will mix devices",
                         hint="the parameter itself is off the target: create it in __init__ and register "
                              "it so that .to() moves it", details=(("op", "backward"),))
        return None

    def _mismatch_finding(self, event: Mismatch) -> Finding:
        prov = event.provenance
        if prov.creation is not None:
            hint = ("create it on the input's device: device=x.device (or torch.zeros_like / x.new_zeros); "
                    "tensors created in forward land on the default device, the CPU")
        elif prov.lazy:
            hint = "build the layer or parameter in __init__, so that .to() moves it"
        elif prov.linked is not None:
            hint = prov.linked.hint
        elif prov.path:
            attr = prov.path.rpartition(".")[2]
            hint = (f'register it: self.register_buffer("{attr}", tensor, persistent=False) in __init__ '
                    "(.to() moves only registered parameters and buffers), or create it in forward on the "
                    "input's device")
        else:
            hint = "move the tensor to the input's device where it is created"
        details = [("op", event.op), ("devices", ", ".join(event.devices))]
        origins = _origins(prov)
        if len(origins) > 1:
            details.append(("origins", ", ".join(origins)))
        return _make("PC201", event.site, None, device=event.device, expected=self.target_name,
                     dtype=event.dtype, shape=event.shape, origin=prov.origin,
                     message=(f"{event.op} mixed {' and '.join(event.devices)}: its "
                              f"{event.dtype}{list(event.shape or [])} argument is on {event.device}"
                              + _came_from(prov) + "; on a GPU this raises 'Expected all tensors to be on "
                              "the same device'"),
                     hint=hint, details=tuple(details))


_PERFORMANCE_CODES = frozenset({"PC202", "PC204", "PC205"})


def _also_from(first: Finding, origin: str) -> Finding:
    """``first`` listing one more origin of an offending tensor on the same line (``origins``)."""
    details = dict(first.details)
    origins = [o for o in details.get("origins", first.origin).split(", ") if o]
    if not origin or origin in origins:
        return first
    details["origins"] = ", ".join([*origins, origin])
    return dataclasses.replace(first, details=tuple(details.items()))


def _also_in(first: Finding, where: str) -> Finding:
    """``first`` noting that the same line also ran in module ``where`` (one finding per line)."""
    details = dict(first.details)
    also = [w for w in details.get("also", "").split(", ") if w]
    shown = where or "''"
    if where == first.where or shown in also:
        return first
    details["also"] = ", ".join([*also, shown])
    return dataclasses.replace(first, details=tuple(details.items()))


def _origins(prov: Provenance) -> list[str]:
    """Every origin combined into a tensor of provenance ``prov``, the first first."""
    found: list[str] = []
    pending = [prov]
    while pending and len(found) < 16:
        p = pending.pop(0)
        for origin in [p.origin, *(c.site.source for c in (p.creation.merged if p.creation else []))]:
            if origin and origin not in found:
                found.append(origin)
        pending.extend(p.also)
    return found


def _came_from(prov: Provenance) -> str:
    if prov.creation is not None:
        return f" (created by {prov.creation.op} at {prov.creation.site.source})"
    if prov.host_copy is not None:
        return f" (copied to the host at {prov.host_copy.source})"
    if prov.lazy:
        return f" (from {prov.path!r}, created during forward)"
    if prov.path:
        return f" (from attribute {prov.path!r}, which .to() did not move)"
    return ""


@contextlib.contextmanager
def _attention_fast_path_kept(target: torch.device) -> Iterator[None]:
    """Let ``nn.MultiheadAttention`` keep its inference fast path under the recording mode.

    Its ``forward`` leaves the fused kernel whenever any torch function mode is
    active, which made a traced ViT several times slower than a plain one. When
    every tensor it gets and holds is already on the target, nothing inside it
    can mix devices, so it runs with torch functions disabled (fused kernel
    included). Anything else, and the real-valued engine (whose tensors need
    ``__torch_function__``), takes the traced path.
    """
    from placecheck.tagged import SimulatedTensor

    original = nn.MultiheadAttention.forward

    def forward(self: nn.MultiheadAttention, *args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if (self.training or torch.is_grad_enabled()
                or any(isinstance(t, SimulatedTensor) or t.device != target
                       for t in [*tensors, *self.parameters()])):
            return original(self, *args, **kwargs)
        with torch._C.DisableTorchFunction():
            return original(self, *args, **kwargs)

    nn.MultiheadAttention.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.MultiheadAttention.forward = original  # type: ignore[method-assign]


def _class_definition(module: nn.Module | None) -> str:
    """``file:line`` of ``module``'s class when it is the user's own ("" for torch's classes)."""
    if module is None:
        return ""
    cls = type(module)
    try:
        import inspect

        filename = inspect.getsourcefile(cls) or ""
        line = inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return ""
    if not filename or _internal_file(filename) or _library_of_file(filename):
        return ""
    return f"{display_path(filename)}:{line}"


def _module_being_built(frame: FrameType | None) -> str:
    """``nn.Linear`` when the call came from an ``nn.Module.__init__`` called by user code."""
    building = ""
    while frame is not None and _is_internal(frame.f_code):
        if frame.f_code.co_name == "__init__":
            obj = frame.f_locals.get("self")
            if isinstance(obj, nn.Module):
                building = f"nn.{type(obj).__name__}" if type(obj).__module__.startswith("torch.") \
                    else type(obj).__name__
        frame = frame.f_back
    return building


def _make(code: str, site: Site, severity: Severity | None, **fields: Any) -> Finding:
    r = rule(code)
    fields.setdefault("module", site.where)
    return Finding(code=code, kind=r.kind, severity=severity or r.severity, where=site.where,
                   source=site.source, **fields)




_RUN_CODE = Tracer.run.__code__
"""The user-frame search stops here: frames outside the forward are never a finding's source."""
_CALL_CODES = frozenset({nn.Module._call_impl.__code__, nn.Module._wrapped_call_impl.__code__})
"""``Module.__call__``'s frames: the innermost one on the stack names the module whose forward runs."""
