"""Every option of every command, declared once: :data:`DECLARED`.

One :class:`Declared` per option says all the views need: its name (the options object's field, the
Python keyword and the TOML key), its command-line spellings, type, default, metavar, help panel and
help, which commands' command lines take it, where a config may hold it (a ``[[models]]`` entry and
``[defaults]``, the config's top level) with what the key means there and the TOML shape its value
must have, and how a command-line value becomes the field's (``--no-forward`` is ``forward=False``).
From it :mod:`placecheck.cli.common` builds every command's typer parameters
(:func:`~placecheck.cli.common.declared_options`) and :mod:`placecheck.basics.config` its key tables
(``MODEL_KEYS``, ``TOP_KEYS``, and which fields a ``[run]``, ``[fix]`` or ``[checkpoint]`` table
takes). The options objects of :mod:`placecheck.basics.options` are the typed Python view of the same
options: ``tests/test_options_declared.py`` checks the views agree, so adding an option is one entry
here (and its field, where it is an options object's).

Two entries may share a name when one command's option means something else (``run --engine`` has no
real device, ``fix --format`` prints a patch, ``merge --fail-on`` defaults to the shards'); the
entries are listed in the order ``--help`` shows them within each panel. This module never imports
torch or typer.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from placecheck.basics.choices import FAIL_ON_CHOICES, OutputFormat
from placecheck.basics.devices import DEVICE_MAP_HELP
from placecheck.basics.errors import UsageError
from placecheck.basics.values import DEVICE_HELP

# -- the choices and values the options' help names ---------------------------------------------

class EngineChoice(str, enum.Enum):
    """The ``--engine`` choices."""

    AUTO = "auto"
    REAL = "real"
    FAKE = "fake"
    TAGGED = "tagged"
    """CUDA simulated with real CPU values tagged as CUDA (placecheck.engines.tagged)."""

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
RUN_ENGINE_CHOICES = ("auto", "tagged", "fake")
"""``placecheck run --engine``: ``real`` is audit's alone (a script's GPU is always simulated)."""

DEFAULT_STEPS = 2
"""What ``--steps`` not given means for ``placecheck run`` and ``fix --run``: after two optimizer steps
the rest of the training loop is skipped (the fast-forward)."""


def nproc_value(text: str) -> int:
    """``--nproc-per-node``'s value: an integer >= 1 (a :class:`UsageError` otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"--nproc-per-node {text!r}: give the number of ranks (processes) on the node, an "
                         "integer >= 1, e.g. --nproc-per-node 2")
    return value


ISOLATION_CHOICES = ("fork", "spawn")
"""``--isolation``: each model in a child forked from a warm worker, or in a fresh interpreter."""
PROGRESS_CHOICES = ("auto", "bar", "lines", "off")
"""``--progress``: auto is the bar at a terminal, one line per model elsewhere (CI logs)."""

FLAG = ""
"""The metavar of an on/off option: nothing after the flag in --help."""

# -- help panels, in the order every command's --help lists them --------------------------------

PANEL_TARGET = "Target"
PANEL_DEVICE = "Device and engine"
PANEL_INPUTS = "Inputs and limits"
PANEL_FIX = "Fixing"
PANEL_REPORTING = "Reporting"
PANEL_CI = "CI"
PANELS = (PANEL_TARGET, PANEL_DEVICE, PANEL_INPUTS, PANEL_FIX, PANEL_REPORTING, PANEL_CI)

COMMANDS = ("audit", "checkpoint", "rules", "explain", "example-config", "run", "merge", "fix")
"""Every command, in the order ``placecheck --help`` lists them."""

MODELS = "models"
"""The config table of a ``[[models]]`` entry (and ``[defaults]``)."""
TOP = "top"
"""The config's top level."""


@dataclass(frozen=True)
class Declared:
    """One option: what its command line, a config and Python see."""

    name: str
    """The options object's field, the Python keyword and the TOML key (``checkpoint_key``,
    ``forward``, ``inputs``)."""
    flags: tuple[str, ...] = ()
    """Its command-line spellings, long first (``("--device", "-d")``); () for a config's or Python's
    option alone."""
    commands: tuple[str, ...] = ()
    """The commands whose command line takes it."""
    kind: Any = None
    """The command line's type (``int | None``, ``list[str] | None``, ``bool``)."""
    default: Any = None
    """The command line's default (None: not given)."""
    metavar: str = FLAG
    panel: str | None = None
    """Its ``--help`` panel (:data:`PANELS`); None with ``hidden``."""
    help: str = ""
    param: str = ""
    """The command function's parameter, where it is not ``name`` (``--key`` is ``key``, ``--no-forward``
    ``no_forward``, ``--format`` ``fmt``)."""
    invert: bool = False
    """An on/off flag that turns the field off (``--no-forward``: ``forward=False``)."""
    minimum: float | None = None
    """The command line refuses a value below it (click's ``min``)."""
    hidden: bool = False
    """Accepted, not shown in ``--help``."""
    parse: Callable[[Any], Any] | None = None
    """The command line's value (not None) -> the field's (``--nproc-per-node``'s text -> an int)."""
    config: Mapping[str, str] = field(default_factory=dict)
    """The config tables (:data:`MODELS`, :data:`TOP`) that take it as a key, with what it means there.
    ``[run]``, ``[fix]`` and ``[checkpoint]`` take every field of their command's options object that
    ``configurable`` allows."""
    toml: str = ""
    """The shape a config value must have in those tables (a name in
    :data:`placecheck.basics.config.SHAPES`; "" for none but the options module's check)."""
    configurable: bool = True
    """False: it says what one command line targets, not how, and no config table holds it."""

    @property
    def parameter(self) -> str:
        """The command function's parameter."""
        return self.param or self.name

    @property
    def flag(self) -> str:
        """The long flag (``--key``), or ``--name`` for an option without one."""
        return self.flags[0] if self.flags else "--" + self.name.replace("_", "-")

    def field_value(self, value: Any) -> Any:
        """The options field's value for the command line's ``value`` (not None)."""
        if self.invert:
            return not value
        if self.parse is not None:
            return self.parse(value)
        return tuple(value) if isinstance(value, list) else value


DECLARED: tuple[Declared, ...] = (
    # -- target ------------------------------------------------------------------------------------
    Declared(
        "module", ("--module", "-m"), ("run",), str | None, None, "MODULE", PANEL_TARGET,
        "Run a module as `python -m MODULE` would, instead of a script.",
        parse=lambda name: True, configurable=False),
    Declared(
        "nproc_per_node", ("--nproc-per-node", "--nproc_per_node"), ("run",), str | None, None, "N",
        PANEL_TARGET,
        "Run the script as torchrun --nproc-per-node N does: each of N ranks in a process of its "
        "own with torchrun's environment, on N simulated GPUs, with NCCL's rules.",
        parse=nproc_value),
    Declared(
        "standalone", ("--standalone",), ("run",), bool, False, hidden=True,
        help="torchrun's --standalone (one node): accepted, as it changes nothing in the simulation."),
    Declared(
        "run", ("--run",), ("fix",), bool, False, FLAG, PANEL_TARGET,
        "TARGET is a training or inference script: run it as placecheck run does (it REALLY "
        "runs, twice: once more for the proof) and fix what it meets, a batch element the "
        "loop does not move included.", param="run_script", configurable=False),
    Declared(
        "model", ("--model",), ("checkpoint",), str | None, None, "TARGET", PANEL_TARGET,
        "Compare with this model's state_dict(): MODULE:ATTR or path/to/file.py:ATTR."),
    Declared(
        "kwargs", ("--kwargs",), ("audit", "checkpoint", "fix"), str | None, None, "JSON", PANEL_TARGET,
        'The model\'s constructor arguments as a JSON object, e.g. \'{"num_classes": 10}\'.',
        config={MODELS: "constructor arguments, as --kwargs"}, toml="table"),
    Declared(
        "args", ("--arg",), ("audit", "checkpoint", "fix"), list[str] | None, None, "KEY=VALUE",
        PANEL_TARGET, "A constructor argument of the model (int, float, bool, None or str); repeatable.",
        param="arg", config={MODELS: "constructor arguments as KEY=VALUE strings, as --arg"},
        toml="str_list"),
    Declared(
        "checkpoint", ("--checkpoint",), ("audit",), str | None, None, "FILE", PANEL_TARGET,
        "Load this checkpoint into the model first (map_location as a script would), check it "
        "(PC301-PC306) and audit the loaded model.",
        config={MODELS: "a checkpoint to load first, as --checkpoint"}, toml="str"),
    Declared(
        "checkpoint_key", ("--key",), ("audit", "checkpoint"), str | None, None, "KEY", PANEL_TARGET,
        "Where the state_dict is inside the checkpoint, e.g. model.ema (default: found "
        "automatically).", param="key",
        config={MODELS: "where the state_dict is in the checkpoint, as --key"}, toml="str"),
    Declared(
        "trust", ("--trust",), ("audit", "checkpoint"), bool, False, FLAG, PANEL_TARGET,
        "Allow loading a checkpoint that runs pickled code (weights_only=False).",
        config={MODELS: "allow a checkpoint that runs pickled code, as --trust"}, toml="bool"),
    # -- device and engine -------------------------------------------------------------------------
    Declared(
        "device", ("--device", "-d"), ("audit",), str, "cuda", "DEVICE", PANEL_DEVICE,
        f"Target device: {DEVICE_HELP}; or keep (no .to(): the model is audited as "
        "its own code places it, across simulated GPUs, with a device map).",
        config={MODELS: "target device, as --device"}, toml="device"),
    Declared(  # without keep, which is audit's alone: each command's --help speaks of itself only
        "device", ("--device", "-d"), ("checkpoint", "fix"), str, "cuda", "DEVICE", PANEL_DEVICE,
        f"Target device: {DEVICE_HELP}."),
    Declared(
        "engine", ("--engine",), ("audit", "checkpoint", "fix"), str, "auto", "ENGINE", PANEL_DEVICE,
        f"{'|'.join(ENGINE_CHOICES)}. auto: the real device when present, CUDA simulated with fake "
        "tensors when not (and with real values when fake tensors cannot run the forward); real: "
        "require the real device; fake: always simulate CUDA with fake tensors; tagged: simulate "
        "CUDA with real CPU values (runs .item(), boolean masks, backward). checkpoint reads no "
        "values: fake and tagged both simulate the target machine's GPUs.",
        config={MODELS: "as --engine"}, toml="str"),
    Declared(
        "gpus", ("--gpus",), ("audit",), int | None, None, "N", PANEL_DEVICE,
        "Number of simulated GPUs, what torch.cuda.device_count() answers (default: enough for "
        "--device's index, at least 1; --device keep: 8).", minimum=1,
        config={MODELS: "number of simulated GPUs, as --gpus"}),
    Declared(
        "gpus", ("--gpus",), ("checkpoint", "run", "fix"), int | None, None, "N", PANEL_DEVICE,
        "Number of simulated GPUs, what torch.cuda.device_count() answers (default: enough for "
        "--device's index, at least 1).", minimum=1),
    Declared(  # after --gpus: run's --help has always listed it there
        "engine", ("--engine",), ("run",), str, "auto", "ENGINE", PANEL_DEVICE,
        "auto|tagged|fake. tagged: CUDA simulated with real CPU values (exact losses and branches; the "
        "model, its gradients and optimizer state in memory); fake: fake tensors (no memory for their "
        "data: a job of any size; values read on the host are assumed, a note each); auto (default): "
        "fake when a real-valued step would not fit in memory, else tagged."),
    Declared(
        "init", ("--init",), ("audit", "fix"), str, "auto", "INIT", PANEL_DEVICE,
        f"{'|'.join(INIT_CHOICES)}: where to build the model. cpu; meta (no memory for weights: "
        "for models bigger than this machine's RAM); auto: meta when a CPU build would not fit "
        "comfortably.", config={MODELS: "as --init"}, toml="str"),
    Declared(
        "wrap", ("--wrap",), ("audit",), str | None, None, "WRAP", PANEL_DEVICE,
        f"{'|'.join(WRAP_CHOICES)}: audit the model as each replica or rank sees it, replica k on "
        "cuda:k: dp (nn.DataParallel), ddp (DistributedDataParallel, ranks on a simulated "
        "process group), fsdp (FSDP2 fully_shard; a model the target already sharded is audited "
        "as placed). A DataParallel target is audited this way without it.",
        config={MODELS: "audit each replica or rank: DataParallel, DDP or FSDP2, as --wrap"}, toml="str"),
    Declared(
        "world_size", ("--world-size",), ("audit",), int | None, None, "N", PANEL_DEVICE,
        "Replicas (dp) or ranks (ddp, fsdp) (default: --gpus, else 2).", minimum=1,
        config={MODELS: "replicas or ranks, as --world-size"}),
    Declared(
        "device_map", ("--device-map",), ("audit",), str | None, None, "MAP", PANEL_DEVICE,
        f"{DEVICE_MAP_HELP}: place the model as from_pretrained(device_map=...) does, on --gpus "
        "simulated GPUs: built on the meta device, the map computed by accelerate's "
        "infer_auto_device_map (or read from the JSON file, module name -> GPU index, \"cpu\" or "
        "\"disk\"), dispatched with accelerate's dispatch_model, and audited as placed. Needs "
        "accelerate (pip install 'placecheck[accelerate]').",
        config={MODELS: "auto, balanced, balanced_low_0, sequential or a JSON file, as --device-map"}),
    Declared(
        "gpu_memory", ("--gpu-memory",), ("audit",), str | None, None, "SIZE", PANEL_DEVICE,
        "With --device-map: memory of each GPU, e.g. 80GiB, 24GB or 512MiB (default: 80GiB).",
        config={MODELS: "memory of each GPU for the device map, as --gpu-memory"}),
    Declared(
        "cpu_memory", ("--cpu-memory",), ("audit",), str | None, None, "SIZE", PANEL_DEVICE,
        "With a computed --device-map: host memory weights may be offloaded to (default: none, "
        "so what does not fit on the GPUs is offloaded to disk).",
        config={MODELS: "host memory a computed device map may offload to, as --cpu-memory"}),
    # -- inputs and limits -------------------------------------------------------------------------
    Declared(
        "inputs", ("--input", "-i"), ("audit", "fix"), list[str] | None, None, "SPEC", PANEL_INPUTS,
        "A forward input: [NAME=]DTYPE[D0,D1,...][:LOW..HIGH], e.g. float32[8,3,224,224] or "
        "input_ids=int64[2,128]:0..32000; repeatable (default: inferred from the first layer).",
        param="input_specs", config={MODELS: "forward inputs, as --input"}, toml="str_list"),
    Declared(
        "example_inputs", ("--example-inputs",), ("audit", "fix"), str | None, None, "TARGET", PANEL_INPUTS,
        "MODULE:ATTR or file.py:ATTR returning the forward's inputs: a tensor, a tuple "
        "(positional), a dict (keyword) or (args, kwargs).",
        config={MODELS: "a target giving the forward inputs, as --example-inputs"}, toml="str"),
    Declared(
        "train", ("--train",), ("audit",), bool, False, FLAG, PANEL_INPUTS,
        "Run the forward in training mode, then a backward of the summed outputs, and check "
        "every gradient lands on the device.",
        config={MODELS: "also audit a training step, as --train"}, toml="bool"),
    Declared(
        "forward", ("--no-forward",), ("audit",), bool, False, FLAG, PANEL_INPUTS,
        "Skip the forward pass: only the walk after .to() (and --checkpoint).", param="no_forward",
        invert=True,
        config={MODELS: "false: skip the forward pass, audit only what .to() leaves behind"}, toml="bool"),
    Declared(
        "reuse_calls", ("--no-reuse-calls",), ("audit",), bool, False, FLAG, PANEL_INPUTS,
        "On fake tensors, run every module call, even one identical to a call already run (same "
        "code, attributes, tensor shapes, dtypes and devices; by default it takes that call's "
        "output shapes, and the notes count it).", param="no_reuse_calls", invert=True,
        config={MODELS: "false: run every module call on fake tensors, as --no-reuse-calls"}, toml="bool"),
    Declared(
        "steps", ("--steps",), ("run", "fix"), int | None, None, "N", PANEL_INPUTS,
        f"After this many optimizer steps, skip the rest of the training loop and run the rest of the "
        f"script (0: run every iteration; default: {DEFAULT_STEPS}).", minimum=0),
    Declared(
        "keep_scratch", ("--keep-scratch",), ("run",), bool, False, FLAG, PANEL_INPUTS,
        "Keep the scratch area the script's writes went to (placecheck run never changes your files: "
        "each write lands there, and the script reads it back) and print its path in a note.",
        toml="bool"),
    Declared(
        "timeout", ("--timeout",), ("audit", "run", "fix"), float | None, None, "SECONDS", PANEL_INPUTS,
        "Seconds the work may take before it is stopped. audit TARGET: the audit runs in a child "
        "process, and running past it is an error (exit 2); audit --config: each model runs in its "
        "own process, and one that runs past it is PC901 (default: the config's, else 600); run "
        "and fix --run: the script is stopped there, which is not an error.", minimum=0.001,
        config={TOP: "seconds per model, as --timeout",
                MODELS: "seconds this model may take, overriding the run's"}, toml="seconds"),
    # -- fixing ------------------------------------------------------------------------------------
    Declared(
        "fix", ("--fix",), ("audit",), bool, False, FLAG, PANEL_FIX,
        "Apply the fixes placecheck fix would offer (written into your files, as ruff's --fix "
        "does), then report what remains. To review the patch first: placecheck fix TARGET.",
        param="fix_files"),
    Declared(
        "diff", ("--diff",), ("fix",), bool, False, FLAG, PANEL_FIX,
        "Print the patch as a unified diff (the default).", param="show_diff"),
    Declared(
        "write", ("--write",), ("fix",), bool, False, FLAG, PANEL_FIX,
        "Write the proven edits into the files (each replaced whole, atomically); refused, "
        "writing nothing, when a file changed since the audit.", param="write_files"),
    Declared(
        "check", ("--check",), ("fix",), bool, False, FLAG, PANEL_FIX,
        "Print what would be fixed, as without --write, and exit 1 when a proven edit is left to "
        "make, 0 when none is (findings no edit fixes do not count); never writes. For pre-commit "
        "and CI.", param="check_only"),
    Declared(
        "unsafe", ("--unsafe",), ("fix",), bool, False, FLAG, PANEL_FIX,
        "Register stray tensors as persistent buffers: state_dict() gains their keys, and "
        "checkpoints saved before lack them."),
    # -- reporting ---------------------------------------------------------------------------------
    Declared(
        "select", ("--select",), ("audit", "checkpoint", "run", "fix"), list[str] | None, None, "CODES",
        PANEL_REPORTING,
        "Only these codes or prefixes (PC1, PC204, ALL): what is reported, and what fix "
        "fixes; comma-separated or repeated.",
        config={MODELS: "codes or prefixes to report, as --select"}, toml="selectors"),
    Declared(
        "ignore", ("--ignore",), ("audit", "checkpoint", "run", "fix"), list[str] | None, None, "CODES",
        PANEL_REPORTING,
        "Not these codes or prefixes: neither reported nor fixed; comma-separated or repeated.",
        config={MODELS: "codes or prefixes not to report, as --ignore"}, toml="selectors"),
    Declared(
        "library_findings", ("--library-findings",), ("audit",), bool, False, FLAG, PANEL_REPORTING,
        "Report performance findings (PC202, PC204, PC205) raised entirely inside installed "
        "packages such as torchvision at their rule's severity (default: info, naming the "
        "package).",
        config={MODELS: "also report performance findings inside installed packages, as "
                        "--library-findings"}, toml="bool"),
    # a plain string: OutputOptions checks it with placecheck's message (click's enum check words it
    # differently on each typer, "Value error, ..." on some)
    Declared(
        "format", ("--format", "-f"), ("audit", "checkpoint", "run", "merge"), str, OutputFormat.TABLE,
        "FORMAT", PANEL_REPORTING, f"Output format: {', '.join(f.value for f in OutputFormat)}.",
        param="fmt"),
    Declared(
        "format", ("--format", "-f"), ("fix",), str, "text", "FORMAT", PANEL_REPORTING,
        "text (the diff and a summary) or json.", param="fmt"),
    Declared(
        "output", ("--output", "-o"), ("audit", "checkpoint", "run", "merge"), str, "-", "FILE",
        PANEL_REPORTING, "Write the report to FILE ('-' is stdout)."),
    Declared(
        "group", ("--no-group",), ("audit", "checkpoint", "run"), bool, False, FLAG, PANEL_REPORTING,
        "One row per finding instance instead of one per problem.", param="no_group", invert=True,
        config={TOP: "false: one row per instance instead of per problem, as --no-group"}, toml="bool"),
    Declared(
        "hints", ("--hints",), ("audit", "checkpoint", "run"), bool, False, FLAG, PANEL_REPORTING,
        "Show the fix hint on every row, not once per rule.",
        config={TOP: "the fix hint on every row, as --hints"}, toml="bool"),
    Declared(
        "debug", ("--debug",), COMMANDS, bool, False, FLAG, PANEL_REPORTING, "Show tracebacks for errors."),
    # -- CI ----------------------------------------------------------------------------------------
    Declared(
        "fail_on", ("--fail-on",), ("audit", "checkpoint", "run"), str, "warning", "SEVERITY", PANEL_CI,
        f"Exit 1 when a finding is at or above this severity: {', '.join(FAIL_ON_CHOICES)}.",
        config={TOP: "as --fail-on"}, toml="fail_on"),
    Declared(
        "fail_on", ("--fail-on",), ("merge",), str | None, None, "SEVERITY", PANEL_CI,
        f"Exit 1 when a finding is at or above this severity: {', '.join(FAIL_ON_CHOICES)} "
        "(default: the shards' own)."),
    Declared(
        "exit_zero", ("--exit-zero",), ("audit", "checkpoint", "run", "merge"), bool, False, FLAG, PANEL_CI,
        "Exit 0 even when there are findings."),
    Declared(
        "config", ("--config", "-c"), ("audit",), str | None, None, "FILE", PANEL_CI,
        "Audit every model a TOML config lists (`placecheck example-config` prints a commented "
        "one), each in its own process."),
    Declared(
        "jobs", ("--jobs", "-j"), ("audit",), int | None, None, "N", PANEL_CI,
        "With --config: models audited in parallel (default: the config's, else 1), each "
        "process running torch with its share of the cores (unless OMP_NUM_THREADS is "
        "set).", minimum=1, config={TOP: "models audited in parallel, as --jobs"}, toml="positive_int"),
    Declared(
        "isolation", ("--isolation",), ("audit",), str | None, None, "MODE", PANEL_CI,
        f"With --config: {'|'.join(ISOLATION_CHOICES)}, how each model gets its own process. "
        "fork (default): warm workers import torch and the targets' libraries once and fork a "
        "fresh child per model; spawn: a fresh interpreter per model (the imports each time). "
        "fork falls back to spawn where os.fork is missing or unsafe (Windows, macOS).",
        config={TOP: "how each model gets its own process, as --isolation"}, toml="isolation"),
    Declared(
        "progress", ("--progress",), ("audit",), str | None, None, "MODE", PANEL_CI,
        f"With --config: {'|'.join(PROGRESS_CHOICES)}, what stderr shows while models run. "
        "bar: models done, running and failed and the time elapsed; lines: one line per "
        "finished model (CI logs); auto (default): bar at a terminal outside CI, else "
        "lines.", config={TOP: "what stderr shows while models run, as --progress"}, toml="progress"),
    Declared(
        "shard", ("--shard",), ("audit",), str | None, None, "K/N", PANEL_CI,
        "With --config: audit only the K-th of N shards of the models (a stable hash of each "
        "model's name: adding a model moves no other). Combine the shards' --format json "
        "reports with `placecheck merge`, which applies the baseline once."),
    Declared(
        "baseline", ("--baseline",), ("audit", "merge"), str | None, None, "FILE", PANEL_CI,
        "Hide the findings this baseline file records; report entries it no longer matches as "
        "stale (merge: by default the one the shards name).",
        config={TOP: "a baseline file, as --baseline"}, toml="str"),
    Declared(
        "write_baseline", ("--write-baseline",), ("audit", "merge"), str | None, None, "FILE", PANEL_CI,
        "Record every current finding in FILE (for --baseline) and exit 0."),
    # -- a config's and Python's alone -------------------------------------------------------------
    Declared("target", config={MODELS: "MODULE:ATTR or path/to/file.py:ATTR (required)"}, toml="str",
             configurable=False, help="The model's name in the report (Python: its class or factory name)."),
    Declared("name", config={MODELS: "the model's name in reports and baselines (default: target)"},
             toml="str"),
    Declared("allow", config={MODELS: "accepted findings: [{ code, where, reason }]"}, toml="allow_list"),
    Declared("family", config={MODELS: "a free-form label, unused by the audit"}, toml="str"),
    Declared("unsupported", config={MODELS: "why this model cannot be audited yet (documentation only)"},
             toml="str"),
    Declared("models", config={TOP: "the models to audit (required)"}, toml="models"),
    Declared("defaults", config={TOP: "model keys applied to every model (a model's own value wins)"},
             toml="table"),
    Declared("memory", help="run's engine auto: the budget of a real-valued step (bytes or a size)."),
    Declared("copy_model", configurable=False, help="Audit a deep copy of an nn.Module instance."),
)
"""Every option, in the order ``--help`` lists them within each panel; then a config's and Python's own."""

CONFIG_ORDER: Mapping[str, tuple[str, ...]] = {
    MODELS: ("target", "name", "kwargs", "args", "inputs", "example_inputs", "train", "forward", "device",
             "engine", "gpus", "wrap", "world_size", "init", "device_map", "gpu_memory", "cpu_memory",
             "checkpoint", "checkpoint_key", "trust", "select", "ignore", "allow", "timeout", "family",
             "unsupported", "library_findings", "reuse_calls"),
    TOP: ("models", "defaults", "jobs", "timeout", "fail_on", "baseline", "group", "hints", "isolation",
          "progress"),
}
"""The order a config's errors have always listed each table's keys in ("unknown key; models[0] takes:
target, name, ..."); a key declared later and not named here follows them, in :data:`DECLARED`'s order."""


def of_command(command: str) -> Iterator[Declared]:
    """The options ``command``'s command line takes, in ``--help`` order."""
    return (d for d in DECLARED if command in d.commands)


def in_config(table: str) -> dict[str, Declared]:
    """The keys of a config's ``table`` (:data:`MODELS` or :data:`TOP`), in its error messages' order."""
    keys = {d.name: d for d in DECLARED if table in d.config}
    order = CONFIG_ORDER.get(table, ())
    ranked = sorted(keys, key=lambda n: order.index(n) if n in order else len(order))
    return {name: keys[name] for name in ranked}


def declared(name: str, command: str | None = None) -> Declared:
    """The entry of ``name`` (an options field): ``command``'s where two commands' options differ."""
    found = [d for d in DECLARED if d.name == name]
    if command is not None:
        found = [d for d in found if command in d.commands] or found
    if not found:
        raise KeyError(name)
    return found[0]


def flag_of(name: str) -> str:
    """The command-line flag of an options field (``checkpoint_key`` -> ``--key``)."""
    try:
        return declared(name).flag
    except KeyError:
        return "--" + name.replace("_", "-")
