"""Every option of every command, in one frozen object per command.

:class:`AuditOptions` (``placecheck audit``), :class:`RunOptions` (``placecheck
run``), :class:`FixOptions` (``placecheck fix``) and :class:`CheckpointOptions`
(``placecheck checkpoint``) share :class:`CommonOptions` (``--gpus``,
``--select``, ``--ignore``). The command line, a config entry (``[[models]]``,
or a ``[run]``, ``[fix]`` or ``[checkpoint]`` table, read by
:func:`options_from_table`), the child process of a ``--config`` run and Python
callers (``audit(model, device="cuda", engine="fake")``, ``run("train.py",
steps=2)``, the pytest plugin) all build the same object, and the command's
Python function reads it.

Every value is validated here, once: :func:`check_value` is the one check of
one option's value (the same one-line :class:`~placecheck.basics.errors.UsageError`
wherever the value came from; a config adds the file, line and key to it), and
each object's ``check()`` runs those and the checks between options. Each option's command-line
spelling, help and config keys are declared once, in :mod:`placecheck.basics.declared` (with the
``--engine`` and ``--init`` choices, :class:`EngineChoice` and :class:`InitChoice`, which the engine
uses); these objects are its typed Python view.

An options object crosses to a child process as plain JSON
(:meth:`AuditOptions.to_dict` / :meth:`AuditOptions.from_dict`). Inputs given
as Python objects (:class:`ExampleInputs`) cannot: they stay in the process
that made them. This module never imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from placecheck.basics.declared import DEFAULT_STEPS as DEFAULT_STEPS
from placecheck.basics.declared import ENGINE_CHOICES as ENGINE_CHOICES
from placecheck.basics.declared import INIT_CHOICES as INIT_CHOICES
from placecheck.basics.declared import RUN_ENGINE_CHOICES as RUN_ENGINE_CHOICES
from placecheck.basics.declared import WRAP_CHOICES as WRAP_CHOICES
from placecheck.basics.declared import EngineChoice as EngineChoice
from placecheck.basics.declared import InitChoice as InitChoice
from placecheck.basics.declared import WrapChoice as WrapChoice
from placecheck.basics.declared import flag_of as flag_of
from placecheck.basics.declared import nproc_value as nproc_value
from placecheck.basics.devices import parse_target
from placecheck.basics.errors import UsageError, unknown_choice
from placecheck.basics.values import Device


@dataclass(frozen=True)
class ExampleInputs:
    """The forward's inputs as Python objects (a tensor, a tuple of positional arguments, a dict of
    keyword arguments, or ``(args, kwargs)``), where a ``--example-inputs`` target would name them."""

    value: Any = field(compare=False)

    def __repr__(self) -> str:
        return f"ExampleInputs({type(self.value).__name__})"


def split_codes(values: Iterable[str] | str | None) -> tuple[str, ...]:
    """``["PC1,PC204", "PC3"]`` (or one string) -> ``("PC1", "PC204", "PC3")``."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = (values,)
    return tuple(c.strip() for v in values for c in v.split(",") if c.strip())


def _check_int(flag: str, value: Any, least: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{flag} {value!r}: expected an integer >= {least}{why}")


def _check_choice(flag: str, choices: tuple[str, ...]) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value not in choices:
            raise unknown_choice(flag, value, choices)

    return check


def _check_device(value: Any) -> None:
    if not isinstance(value, str):
        raise UsageError(f"--device {value!r}: expected a device string such as cuda or cuda:1")
    parse_target(value)


def _check_codes(flag: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        from placecheck.basics.codes import expand

        if isinstance(value, (str, bytes)) or not all(isinstance(v, str) for v in value):
            raise UsageError(f"{flag} {value!r}: expected code prefixes such as PC1, PC204 or ALL")
        try:
            expand(value)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    return check


def _check_timeout(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UsageError(f"--timeout {value!r}: expected a number of seconds > 0")


def _check_device_map(value: Any) -> None:
    from placecheck.basics.devices import DEVICE_MAP_HELP, check_device_map_spec

    if not isinstance(value, str):
        raise UsageError(f"--device-map {value!r}: use {DEVICE_MAP_HELP}")
    check_device_map_spec(value)


def _check_size(flag: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        from placecheck.basics.devices import SIZE_HELP, parse_size

        if not isinstance(value, str):
            raise UsageError(f"{flag} {value!r}: expected {SIZE_HELP}")
        parse_size(value, flag)

    return check


_CHECKS: dict[str, Callable[[Any], None]] = {
    "device": _check_device,
    "engine": _check_choice("engine", ENGINE_CHOICES),
    "gpus": lambda v: _check_int("--gpus", v, 1),
    "init": _check_choice("--init", INIT_CHOICES),
    "wrap": _check_choice("--wrap", WRAP_CHOICES),
    "world_size": lambda v: _check_int("--world-size", v, 1),
    "device_map": _check_device_map,
    "gpu_memory": _check_size("--gpu-memory"),
    "cpu_memory": _check_size("--cpu-memory"),
    "select": _check_codes("--select"),
    "ignore": _check_codes("--ignore"),
    "steps": lambda v: _check_int("--steps", v, 0, " (0: run to the end)"),
    "timeout": _check_timeout,
    "nproc_per_node": lambda v: _check_int("--nproc-per-node", v, 1, " (the ranks on the node)"),
}
"""The one check of each option's value, by field name."""


def check_value(name: str, value: Any) -> None:
    """Raise the :class:`UsageError` a bad value of the option ``name`` (a field name) gets, the same
    from the command line, a config or Python; None (not given) is always accepted."""
    check = _CHECKS.get(name)
    if check is not None and value is not None:
        check(value)


_Self = TypeVar("_Self", bound="CommonOptions")


@dataclass(frozen=True)
class CommonOptions:
    """The options every command shares, with the defaults every command has."""

    COMMAND: ClassVar[str] = ""
    """The command these options are for (``run``: its config table, its messages)."""

    gpus: int | None = None
    """Simulated GPUs, what ``torch.cuda.device_count()`` answers (``--gpus``); None: enough for the
    device's index, at least 1 (``audit --device keep``: 8)."""
    select: tuple[str, ...] = ()
    """Codes or prefixes to report (``--select``); empty: all. ``fix``: the codes it fixes."""
    ignore: tuple[str, ...] = ()
    """Codes or prefixes not to report (``--ignore``); ``fix``: not to fix."""

    def __post_init__(self) -> None:
        # Python callers pass lists or one comma-separated string; the object keeps tuples
        set_ = object.__setattr__
        set_(self, "select", split_codes(self.select))
        set_(self, "ignore", split_codes(self.ignore))

    def configurable(self) -> frozenset[str]:
        """The fields a config's table for this command may set
        (:func:`placecheck.basics.config.command_values`)."""
        return frozenset(f.name for f in fields(self))

    def check_values(self) -> None:
        """Run :func:`check_value` on every field (the first bad one raises)."""
        for f in fields(self):
            check_value(f.name, getattr(self, f.name))

    def check(self) -> None:
        """Raise a :class:`UsageError` for a value the command does not accept, before any work."""
        self.check_values()

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON-ready values (for a child process); :meth:`from_dict` reverses it."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in fields(self)}

    @classmethod
    def from_dict(cls: type[_Self], data: Mapping[str, Any]) -> _Self:
        """Options from :meth:`to_dict`'s output (or any mapping of field names: a config table);
        unknown keys fail."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UsageError(f"unknown {cls.COMMAND} option {unknown[0]!r}: use one of "
                             f"{', '.join(sorted(names))}")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**values)

    def replace(self: _Self, **changes: Any) -> _Self:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class AuditOptions(CommonOptions):
    """How to audit one model. Every field has the default ``placecheck audit`` has."""

    COMMAND: ClassVar[str] = "audit"

    device: str = "cuda"
    """Target device: ``cuda``, ``cuda:N``, ``cpu``, ``mps`` or ``meta`` (``--device``); or ``keep``: no
    ``.to()``, the model audited as its own code places it (:mod:`placecheck.placement`)."""
    engine: str = "auto"
    """One of :data:`ENGINE_CHOICES` (``--engine``)."""
    init: str = "auto"
    """Where a factory builds the model, one of :data:`INIT_CHOICES` (``--init``)."""
    device_map: str | None = None
    """Place the model as accelerate would (``--device-map``): ``auto``, ``balanced``,
    ``balanced_low_0``, ``sequential`` (computed by ``accelerate.infer_auto_device_map``) or a JSON
    file mapping module names to devices; None: move the whole model to ``device``."""
    gpu_memory: str | None = None
    """Memory of each simulated GPU for a computed device map (``--gpu-memory 24GiB``); None: 80GiB."""
    cpu_memory: str | None = None
    """Host memory a computed device map may offload weights to (``--cpu-memory``); None: none, so
    what does not fit on the GPUs goes to disk."""
    checkpoint: str | None = None
    """A checkpoint file loaded into the model before the move (``--checkpoint``)."""
    checkpoint_key: str | None = None
    """Where the state_dict is inside the checkpoint (``--key``)."""
    trust: bool = False
    """Allow a checkpoint whose pickle runs code (``--trust``)."""
    inputs: tuple[str, ...] = ()
    """Forward inputs as ``--input`` specs (``float32[8,3,224,224]``)."""
    example_inputs: str | ExampleInputs | None = None
    """The forward's inputs: a ``MODULE:ATTR`` target (``--example-inputs``) or the objects themselves."""
    forward: bool = True
    """False skips the forward pass (``--no-forward``)."""
    train: bool = False
    """Training mode, then a backward (``--train``)."""
    library_findings: bool = False
    """Report performance findings raised entirely inside installed packages (``--library-findings``)."""
    reuse_calls: bool = True
    """On fake tensors, a module call identical to one already run (same code, attributes, tensor shapes,
    dtypes and devices) takes that call's output shapes instead of running (:mod:`placecheck.engines.reuse`);
    False runs every call (``--no-reuse-calls``)."""
    copy_model: bool = True
    """Audit a deep copy of an ``nn.Module`` instance (a factory's model is the audit's own anyway)."""
    target: str | None = None
    """The model's name in the report (default: its class or factory name)."""
    wrap: str | None = None
    """Audit the model as each replica or rank sees it, one of :data:`WRAP_CHOICES` (``--wrap``); None:
    only when the model is itself a DataParallel/DistributedDataParallel wrapper."""
    world_size: int | None = None
    """Replicas (DataParallel) or ranks (DDP, FSDP2) (``--world-size``); None: ``gpus``, else 2."""

    def __post_init__(self) -> None:
        # Python callers pass lists, a single spec string or the input objects themselves;
        # the object keeps one shape: tuples of strings, and objects wrapped in ExampleInputs
        super().__post_init__()
        set_ = object.__setattr__
        inputs: Any = self.inputs
        if isinstance(inputs, str):
            inputs = (inputs,)
        elif inputs is None:
            inputs = ()
        if isinstance(inputs, (list, tuple)) and all(isinstance(i, str) for i in inputs):
            set_(self, "inputs", tuple(inputs))
        else:  # the objects themselves, read as an --example-inputs target's value would be
            if self.example_inputs is not None:
                raise UsageError("inputs given as objects and example_inputs cannot be combined: "
                                 "pass one of them")
            set_(self, "inputs", ())
            set_(self, "example_inputs", inputs)
        example = self.example_inputs
        if example is not None and not isinstance(example, (str, ExampleInputs)):
            set_(self, "example_inputs", ExampleInputs(example))

    def check(self) -> None:
        """Raise a :class:`UsageError` for a value no audit accepts (before any model is built)."""
        self.check_values()
        self._check_device_map()
        self._check_replicas()
        if self.inputs and self.example_inputs is not None:
            raise UsageError("--input and --example-inputs cannot be combined: pass one of them")
        if self.target_device is None:
            self.check_keep()

    @property
    def target_device(self) -> Device | None:
        """``device`` read once: the :class:`~placecheck.basics.values.Device` the model is moved to
        (``cuda`` -> ``cuda:0``), or None for ``keep`` (a UsageError for anything else)."""
        return parse_target(self.device)

    def check_keep(self) -> None:
        """``--device keep`` audits the placement the model's code makes: options that move the model,
        or load a checkpoint onto one target device, make no sense with it."""
        if self.init == InitChoice.META.value:
            raise UsageError("--device keep builds the model as its code places it, on the CPU and the "
                             "simulated GPUs: use --init cpu (or auto) with it, not --init meta")
        if self.checkpoint is not None:
            raise UsageError("--device keep cannot load --checkpoint: a checkpoint is loaded onto one "
                             "target device; audit it with `placecheck checkpoint`, or with --device cuda")

    def _check_replicas(self) -> None:
        size = self.world_size
        if size is not None and self.gpus is not None and size > self.gpus:
            raise UsageError(f"--world-size {size} needs {size} GPUs; --gpus {self.gpus} was given: "
                             f"use --gpus {size} or a smaller --world-size")
        device = self.target_device
        if self.wrap is not None and device is None:
            raise UsageError(f"--wrap {self.wrap} places each replica on its own GPU (cuda:k) and --device "
                             "keep audits the placement the model's code makes: pass one of them")
        if self.wrap is not None and device != "cuda:0":
            raise UsageError(f"--wrap {self.wrap} runs replica k on cuda:k, so the target is CUDA: "
                             f"use --device cuda, not {self.device}")

    def _check_device_map(self) -> None:
        """``--device-map`` and its memory sizes: valid values, and no option that contradicts them."""
        for option, size in (("--gpu-memory", self.gpu_memory), ("--cpu-memory", self.cpu_memory)):
            if size is not None and self.device_map is None:
                raise UsageError(f"{option} sizes a device map: add --device-map auto (or balanced, "
                                 "sequential)")
        if self.device_map is None:
            return
        if self.device.strip().lower() == "keep":
            raise UsageError("--device keep and --device-map cannot be combined: the device map places "
                             "the model; drop --device keep")
        if self.device.strip().lower() not in ("cuda", "cuda:0"):
            raise UsageError(f"--device {self.device} and --device-map cannot be combined: the device "
                             "map places the model on the simulated GPUs; drop --device")
        if self.engine in ("real", "tagged") or self.train:
            why = "--train" if self.train else f"--engine {self.engine}"
            raise UsageError(f"{why} and --device-map cannot be combined: a device map is audited on the "
                             "meta-built model with fake tensors; drop it")
        if self.wrap is not None:
            raise UsageError(f"--wrap {self.wrap} and --device-map cannot be combined: the device map places "
                             "the model across the GPUs, --wrap replicates it on each: pass one of them")
        if self.init == "cpu":
            raise UsageError("--init cpu and --device-map cannot be combined: the model is built on the "
                             "meta device, as from_pretrained(device_map=...) builds it; drop --init cpu")

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON-ready values, for a child process; :meth:`from_dict` reverses it."""
        if isinstance(self.example_inputs, ExampleInputs):
            raise UsageError("inputs given as Python objects cannot be sent to another process: name "
                             "them with a MODULE:ATTR target (example_inputs) or give --input specs")
        return super().to_dict()


@dataclass(frozen=True)
class RunOptions(CommonOptions):
    """How to run one script (``placecheck run``, :func:`placecheck.run`). Every field has the
    default ``placecheck run`` has; ``gpus`` not given is 1."""

    COMMAND: ClassVar[str] = "run"

    module: bool = False
    """The target is a module, run as ``python -m MODULE`` would (``-m``/``--module``), not a script."""
    steps: int = DEFAULT_STEPS
    """After this many ``optimizer.step()`` calls (``--steps``) the rest of the training loop is skipped
    and the rest of the script runs; 0: run every iteration."""
    timeout: float | None = None
    """Stop the script after this many seconds (``--timeout``), which is not an error; None: no limit."""
    engine: str = "auto"
    """One of :data:`RUN_ENGINE_CHOICES` (``--engine``): ``tagged`` real values on the CPU, ``fake`` fake
    tensors (a job of any size), ``auto`` fake when a real-valued step would not fit in ``memory``."""
    nproc_per_node: int | None = None
    """Run the script as torchrun does (``--nproc-per-node``): each of this many ranks in a process of its
    own with torchrun's environment (:mod:`placecheck.run.ranks`); ``gpus`` not given is this many."""
    memory: int | str | None = None
    """auto's budget of a real-valued step, bytes or a size (``"8GiB"``); None: 2 GiB or half the
    available memory, or ``PLACECHECK_RUN_MEMORY`` (:mod:`placecheck.run.auto`)."""
    keep_scratch: bool = False
    """Keep the scratch area the script's writes went to (``--keep-scratch``; never the user's files,
    :mod:`placecheck.run.scratch`) after the run; the report says where."""

    def check(self) -> None:
        # run's own engine choices first: audit's check of the field would offer "real"
        if self.engine not in RUN_ENGINE_CHOICES:
            choices = "|".join(RUN_ENGINE_CHOICES)
            raise UsageError(f"--engine {self.engine!r} is not one of {choices}: use auto "
                             "(the default), tagged (real values on the CPU) or fake (fake tensors, at the "
                             "size of the job)")
        self.check_values()
        if self.engine == "fake" and self.nproc_per_node is not None:
            raise UsageError("--engine fake and --nproc-per-node cannot be combined yet: "
                             "DistributedDataParallel reads its parameters' data when it is built; use "
                             "--engine tagged (or auto)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.engine, str):  # the CLI's enum and " Fake " alike
            engine = str(getattr(self.engine, "value", self.engine))
            object.__setattr__(self, "engine", engine.strip().lower())
        # not given (the command line's None) is the default, so that every way of building the
        # object that means the same builds an equal one
        if self.gpus is None:
            object.__setattr__(self, "gpus", self.nproc_per_node or 1)
        if self.steps is None:
            object.__setattr__(self, "steps", DEFAULT_STEPS)

    @property
    def gpu_count(self) -> int:
        """``gpus`` as an int (never None after construction)."""
        return int(self.gpus or 1)


@dataclass(frozen=True)
class FixOptions(AuditOptions):
    """How to fix one model or script (``placecheck fix``, :func:`placecheck.fix.fix`): the audit's
    options (the model is audited, and the proof re-audits it, with them) and fix's own. Every field
    has the default ``placecheck fix`` has."""

    COMMAND: ClassVar[str] = "fix"

    run: bool = False
    """The target is a training or inference script, run as ``placecheck run`` runs it (``--run``);
    then only ``gpus``, ``steps``, ``timeout``, ``select``, ``ignore`` and ``unsafe`` apply."""
    steps: int | None = None
    """With ``run``: fast-forward after this many optimizer steps (``--steps``; None: 2, as ``placecheck
    run``)."""
    timeout: float | None = None
    """With ``run``: stop the script after this many seconds (``--timeout``)."""
    unsafe: bool = False
    """Register stray tensors as persistent buffers: ``state_dict()`` gains their keys (``--unsafe``)."""

    _SCRIPT_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"gpus", "select", "ignore", "run", "steps", "timeout", "unsafe", "copy_model", "target"})

    def model_flags(self) -> list[str]:
        """The flags given that describe a model TARGET (not a script run with ``--run``)."""
        default = FixOptions()
        return [flag_of(f.name) for f in fields(self)
                if f.name not in self._SCRIPT_FIELDS and getattr(self, f.name) != getattr(default, f.name)]

    @staticmethod
    def refuse_model_flags(flags: Iterable[str]) -> None:
        """Raise the error for model options given with ``--run`` (``flags``: their flags)."""
        flags = list(flags)
        if flags:
            raise UsageError(f"{', '.join(flags)} describe a model TARGET, not a script run with --run "
                             "(it runs on simulated GPUs; --gpus sets how many)")

    def configurable(self) -> frozenset[str]:
        """With ``run``: the script's options; without: the model's (a config's ``[fix]`` table may hold
        both, each applied where it means something)."""
        if self.run:
            return self._SCRIPT_FIELDS
        return super().configurable() - {"steps", "timeout"}

    def check(self) -> None:
        self.check_values()
        if self.run:
            self.refuse_model_flags(self.model_flags())
            return
        if self.steps is not None or self.timeout is not None:
            raise UsageError(SCRIPT_ONLY)
        super().check()

    def audit_options(self) -> AuditOptions:
        """The options of the audit of a model TARGET (fix's own fields dropped)."""
        return AuditOptions(**{f.name: getattr(self, f.name) for f in fields(AuditOptions)})

    def run_options(self) -> RunOptions:
        """The options of the ``placecheck run`` of a script (with ``run``)."""
        return RunOptions(gpus=self.gpus, steps=self.steps, timeout=self.timeout,  # type: ignore[arg-type]
                          select=self.select, ignore=self.ignore)


SCRIPT_ONLY = ("script arguments, --steps and --timeout go with --run (TARGET a script): "
               "placecheck fix --run SCRIPT.py -- ARGS")
"""The error for a script's options given to ``placecheck fix`` of a model TARGET."""


@dataclass(frozen=True)
class CheckpointOptions(CommonOptions):
    """How to check one checkpoint file (``placecheck checkpoint``,
    :func:`placecheck.checkpoint.check_checkpoint`). Every field has the default ``placecheck
    checkpoint`` has."""

    COMMAND: ClassVar[str] = "checkpoint"

    device: str = "cuda"
    """The device the job loads the checkpoint onto (``--device``; not ``keep``)."""
    engine: str = "auto"
    """One of :data:`ENGINE_CHOICES` (``--engine``): the real machine's GPUs, or simulated ones (fake and
    tagged alike: no value is read)."""
    checkpoint_key: str | None = None
    """Where the state_dict is inside the checkpoint (``--key``); None: found automatically."""
    trust: bool = False
    """Allow loading a checkpoint whose pickle runs code (``--trust``)."""
    group: bool = True
    """Findings of one root cause are one problem; False lists each (``--no-group``)."""

    def check(self) -> None:
        if isinstance(self.device, str):  # first: keep is an audit's (a checkpoint loads onto one
            self.target_device  # noqa: B018  # device), so the error lists the devices without it
        self.check_values()

    @property
    def target_device(self) -> Device:
        """``device`` read once (``cuda`` -> ``cuda:0``); a UsageError for anything else, ``keep``
        included."""
        return Device.parse(self.device)


OPTION_NAMES = tuple(f.name for f in fields(AuditOptions))
"""Every field of :class:`AuditOptions`, i.e. every keyword ``audit()`` takes besides ``device``."""
