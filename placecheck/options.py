"""Every option of one audit, in one frozen object: :class:`AuditOptions`.

The command line (``placecheck audit``), a config entry (``[[models]]``), the
child process of a ``--config`` run and Python callers (``audit(model,
device="cuda", engine="fake")``, the pytest plugin) all build the same object,
and :func:`placecheck.audit` reads it. The ``--engine`` and ``--init`` choices
are defined here once (:class:`EngineChoice`, :class:`InitChoice`); the engine
and the config checks use these.

An options object crosses to a child process as plain JSON
(:meth:`AuditOptions.to_dict` / :meth:`AuditOptions.from_dict`). Inputs given
as Python objects (:class:`ExampleInputs`) cannot: they stay in the process
that made them. This module never imports torch.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from placecheck.devices import KEEP
from placecheck.errors import UsageError


class EngineChoice(str, enum.Enum):
    """The ``--engine`` choices."""

    AUTO = "auto"
    REAL = "real"
    FAKE = "fake"
    TAGGED = "tagged"
    """CUDA simulated with real CPU values tagged as CUDA (placecheck.tagged)."""

    def __str__(self) -> str:
        return self.value


class InitChoice(str, enum.Enum):
    """The ``--init`` choices."""

    AUTO = "auto"
    CPU = "cpu"
    META = "meta"

    def __str__(self) -> str:
        return self.value


class WrapChoice(str, enum.Enum):
    """The ``--wrap`` choices: how the model is replicated or sharded over the simulated GPUs."""

    DP = "dp"
    """``nn.DataParallel``: one process, a replica of the model on each GPU."""
    DDP = "ddp"
    """``DistributedDataParallel``: one rank per GPU, each with its own model."""
    FSDP = "fsdp"
    """FSDP2's ``fully_shard``: one rank per GPU, parameters sharded over them as DTensors."""

    def __str__(self) -> str:
        return self.value


ENGINE_CHOICES = tuple(c.value for c in EngineChoice)
INIT_CHOICES = tuple(c.value for c in InitChoice)
WRAP_CHOICES = tuple(c.value for c in WrapChoice)


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


@dataclass(frozen=True)
class AuditOptions:
    """How to audit one model. Every field has the default ``placecheck audit`` has."""

    device: str = "cuda"
    """Target device: ``cuda``, ``cuda:N``, ``cpu``, ``mps`` or ``meta`` (``--device``); or ``keep``: no
    ``.to()``, the model audited as its own code places it (:mod:`placecheck.placement`)."""
    engine: str = "auto"
    """One of :data:`ENGINE_CHOICES` (``--engine``)."""
    gpus: int | None = None
    """Simulated GPUs (``--gpus``); None: enough for the device's index (with ``keep``: 8, and the model
    may use any of them)."""
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
    select: tuple[str, ...] = ()
    """Codes or prefixes to report (``--select``); empty: all."""
    ignore: tuple[str, ...] = ()
    """Codes or prefixes not to report (``--ignore``)."""
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
    dtypes and devices) takes that call's output shapes instead of running (:mod:`placecheck.reuse`);
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
        set_ = object.__setattr__
        set_(self, "select", split_codes(self.select))
        set_(self, "ignore", split_codes(self.ignore))
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
        from placecheck.devices import normalize_device
        from placecheck.rules import expand

        self._check_device_map()
        device = normalize_device(self.device, keep=True)
        if self.engine not in ENGINE_CHOICES:
            raise UsageError(f"unknown engine {self.engine!r}: use one of {', '.join(ENGINE_CHOICES)}")
        if self.init not in INIT_CHOICES:
            raise UsageError(f"unknown --init {self.init!r}: use one of {', '.join(INIT_CHOICES)}")
        if self.gpus is not None and (isinstance(self.gpus, bool) or not isinstance(self.gpus, int)
                                      or self.gpus < 1):
            raise UsageError(f"gpus {self.gpus!r}: expected an integer >= 1")
        self._check_replicas()
        for codes in (self.select, self.ignore):
            try:
                expand(codes)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        if self.inputs and self.example_inputs is not None:
            raise UsageError("--input and --example-inputs cannot be combined: pass one of them")
        if device == KEEP:
            self.check_keep()

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
        from placecheck.devices import normalize_device

        if self.wrap is not None and self.wrap not in WRAP_CHOICES:
            raise UsageError(f"unknown --wrap {self.wrap!r}: use one of {', '.join(WRAP_CHOICES)}")
        size = self.world_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise UsageError(f"--world-size {size!r}: expected an integer >= 1")
        if size is not None and self.gpus is not None and size > self.gpus:
            raise UsageError(f"--world-size {size} needs {size} GPUs; --gpus {self.gpus} was given: "
                             f"use --gpus {size} or a smaller --world-size")
        device = normalize_device(self.device, keep=True)
        if self.wrap is not None and device == "keep":
            raise UsageError(f"--wrap {self.wrap} places each replica on its own GPU (cuda:k) and --device "
                             "keep audits the placement the model's code makes: pass one of them")
        if self.wrap is not None and device != "cuda:0":
            raise UsageError(f"--wrap {self.wrap} runs replica k on cuda:k, so the target is CUDA: "
                             f"use --device cuda, not {self.device}")

    def _check_device_map(self) -> None:
        """``--device-map`` and its memory sizes: valid values, and no option that contradicts them."""
        from placecheck.devices import check_device_map_spec, parse_size

        for option, size in (("--gpu-memory", self.gpu_memory), ("--cpu-memory", self.cpu_memory)):
            if size is None:
                continue
            if self.device_map is None:
                raise UsageError(f"{option} sizes a device map: add --device-map auto (or balanced, "
                                 "sequential)")
            parse_size(size, option)
        if self.device_map is None:
            return
        check_device_map_spec(self.device_map)
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
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AuditOptions:
        """Options from :meth:`to_dict`'s output (or any mapping of field names); unknown keys fail."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UsageError(f"unknown audit option {unknown[0]!r}")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**values)

    def replace(self, **changes: Any) -> AuditOptions:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


OPTION_NAMES = tuple(f.name for f in fields(AuditOptions))
"""Every field of :class:`AuditOptions`, i.e. every keyword ``audit()`` takes besides ``device``."""
