"""The command-line grammar every command shares: each common option declared once, and help panels.

Each alias is an ``Annotated`` type a command's parameter uses as is, so ``--device``,
``--gpus``, ``--engine``, ``--select``, ``--ignore``, ``--format``, ``--output``,
``--fail-on``, ``--exit-zero``, ``--timeout``, ``--steps`` and ``--debug`` (and the model
options ``audit``, ``fix`` and ``checkpoint`` share) mean the same, with the same help, metavar
and panel, in ``audit``, ``run``, ``fix``, ``checkpoint`` and ``merge``. The default lives in
the command's signature; it is the same in every command that has the option
(``tests/test_cli_grammar.py`` checks all of it on every typer of the supported range).

Every flag is spelled in its declaration (``typer.Option("--engine", ...)``), never derived
from the parameter's name: typer 0.27.0 to 0.27.3 derive it from the metavar instead
(``--ENGINE``). A short flag has one meaning in every command (``-m`` is only ``run``'s
``--module``). torch-free, like the rest of the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand

from placecheck.basics.devices import DEVICE_HELP
from placecheck.basics.options import DEFAULT_STEPS, ENGINE_CHOICES, INIT_CHOICES, CommonOptions
from placecheck.findings.formats import OutputFormat
from placecheck.findings.report import FAIL_ON_CHOICES

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


class PanelCommand(TyperCommand):
    """A command whose ``--help`` lists its options under their panels (``rich_help_panel``).

    typer draws panels only with rich's boxed help, which ``rich_markup_mode=None`` turns off
    (its 25-character help column at 80 columns is hard to read); this draws them as click's
    plain sections, the same on every typer of the supported range.
    """

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            elif param.param_type_name == "option":
                panels.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        for panel in sorted(panels, key=lambda p: PANELS.index(p) if p in PANELS else len(PANELS)):
            with formatter.section(panel):
                formatter.write_dl(panels[panel])


_O = TypeVar("_O", bound=CommonOptions)


def configured(ctx: typer.Context, options: _O, fields: Mapping[str, str] | None = None) -> _O:
    """``options`` (built from the command line) with the values of ./pyproject.toml's
    ``[tool.placecheck.COMMAND]`` table for the options the command line did not give.

    ``fields`` maps a parameter of the command to the options field it sets where their names differ
    (``key`` -> ``checkpoint_key``). The table's values are checked as the command line's are
    (:func:`placecheck.basics.config.command_values`); the result is checked by the caller.
    """
    from placecheck.basics.config import pyproject_command_values

    _, table = pyproject_command_values(options.COMMAND)
    if not table:
        return options
    names = dict(fields or {})
    given = set()
    for param in ctx.params:
        source = ctx.get_parameter_source(param)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            given.add(names.get(param, param))
    return options.replace(**{name: value for name, value in table.items()
                              if name not in given and name in options.configurable()})


# -- device and engine ---------------------------------------------------------------------------

DEFAULT_DEVICE = "cuda"
Device = Annotated[str, typer.Option(
    "--device", "-d", metavar="DEVICE", rich_help_panel=PANEL_DEVICE,
    help=f"Target device: {DEVICE_HELP}; audit also takes keep (no .to(): the model is audited as "
         "its own code places it, across simulated GPUs, with a device map).")]
Engine = Annotated[str, typer.Option(
    "--engine", metavar="ENGINE", rich_help_panel=PANEL_DEVICE,
    help=f"{'|'.join(ENGINE_CHOICES)}. auto: the real device when present, CUDA simulated with fake "
         "tensors when not (and with real values when fake tensors cannot run the forward); real: "
         "require the real device; fake: always simulate CUDA with fake tensors; tagged: simulate "
         "CUDA with real CPU values (runs .item(), boolean masks, backward). checkpoint reads no "
         "values: fake and tagged both simulate the target machine's GPUs.")]
Gpus = Annotated[int | None, typer.Option(
    "--gpus", metavar="N", min=1, rich_help_panel=PANEL_DEVICE,
    help="Number of simulated GPUs, what torch.cuda.device_count() answers (default: enough for "
         "--device's index, at least 1; audit --device keep: 8).")]
Init = Annotated[str, typer.Option(
    "--init", metavar="INIT", rich_help_panel=PANEL_DEVICE,
    help=f"{'|'.join(INIT_CHOICES)}: where to build the model. cpu; meta (no memory for weights: "
         "for models bigger than this machine's RAM); auto: meta when a CPU build would not fit "
         "comfortably.")]

# -- the model and its checkpoint ----------------------------------------------------------------

Kwargs = Annotated[str | None, typer.Option(
    "--kwargs", metavar="JSON", rich_help_panel=PANEL_TARGET,
    help='The model\'s constructor arguments as a JSON object, e.g. \'{"num_classes": 10}\'.')]
Arg = Annotated[list[str] | None, typer.Option(
    "--arg", metavar="KEY=VALUE", rich_help_panel=PANEL_TARGET,
    help="A constructor argument of the model (int, float, bool, None or str); repeatable.")]
Key = Annotated[str | None, typer.Option(
    "--key", metavar="KEY", rich_help_panel=PANEL_TARGET,
    help="Where the state_dict is inside the checkpoint, e.g. model.ema (default: found "
         "automatically).")]
Trust = Annotated[bool, typer.Option(
    "--trust", metavar=FLAG, rich_help_panel=PANEL_TARGET,
    help="Allow loading a checkpoint that runs pickled code (weights_only=False).")]

# -- inputs and limits ---------------------------------------------------------------------------

Input = Annotated[list[str] | None, typer.Option(
    "--input", "-i", metavar="SPEC", rich_help_panel=PANEL_INPUTS,
    help="A forward input: [NAME=]DTYPE[D0,D1,...][:LOW..HIGH], e.g. float32[8,3,224,224] or "
         "input_ids=int64[2,128]:0..32000; repeatable (default: inferred from the first layer).")]
ExampleInputs = Annotated[str | None, typer.Option(
    "--example-inputs", metavar="TARGET", rich_help_panel=PANEL_INPUTS,
    help="MODULE:ATTR or file.py:ATTR returning the forward's inputs: a tensor, a tuple "
         "(positional), a dict (keyword) or (args, kwargs).")]
Steps = Annotated[int | None, typer.Option(
    "--steps", metavar="N", min=0, rich_help_panel=PANEL_INPUTS,
    help=f"After this many optimizer steps, skip the rest of the training loop and run the rest of the "
         f"script (0: run every iteration; default: {DEFAULT_STEPS}).")]
Timeout = Annotated[float | None, typer.Option(
    "--timeout", metavar="SECONDS", min=0.001, rich_help_panel=PANEL_INPUTS,
    help="Seconds the work may take before it is stopped. audit TARGET: the audit runs in a child "
         "process, and running past it is an error (exit 2); audit --config: each model runs in its "
         "own process, and one that runs past it is PC901 (default: the config's, else 600); run "
         "and fix --run: the script is stopped there, which is not an error.")]

# -- reporting -----------------------------------------------------------------------------------

Select = Annotated[list[str] | None, typer.Option(
    "--select", metavar="CODES", rich_help_panel=PANEL_REPORTING,
    help="Only these codes or prefixes (PC1, PC204, ALL): what is reported, and what fix "
         "fixes; comma-separated or repeated.")]
Ignore = Annotated[list[str] | None, typer.Option(
    "--ignore", metavar="CODES", rich_help_panel=PANEL_REPORTING,
    help="Not these codes or prefixes: neither reported nor fixed; comma-separated or repeated.")]
# a plain string: OutputOptions checks it with placecheck's message (click's enum check words it
# differently on each typer, "Value error, ..." on some)
Format = Annotated[str, typer.Option(
    "--format", "-f", metavar="FORMAT", rich_help_panel=PANEL_REPORTING,
    help=f"Output format: {', '.join(f.value for f in OutputFormat)}.")]
Output = Annotated[str, typer.Option(
    "--output", "-o", metavar="FILE", rich_help_panel=PANEL_REPORTING,
    help="Write the report to FILE ('-' is stdout).")]
NoGroup = Annotated[bool, typer.Option(
    "--no-group", metavar=FLAG, rich_help_panel=PANEL_REPORTING,
    help="One row per finding instance instead of one per problem.")]
Hints = Annotated[bool, typer.Option(
    "--hints", metavar=FLAG, rich_help_panel=PANEL_REPORTING,
    help="Show the fix hint on every row, not once per rule.")]
Debug = Annotated[bool, typer.Option(
    "--debug", metavar=FLAG, rich_help_panel=PANEL_REPORTING,
    help="Show tracebacks for errors.")]

# -- CI ------------------------------------------------------------------------------------------

FailOn = Annotated[str, typer.Option(
    "--fail-on", metavar="SEVERITY", rich_help_panel=PANEL_CI,
    help=f"Exit 1 when a finding is at or above this severity: {', '.join(FAIL_ON_CHOICES)}.")]
ExitZero = Annotated[bool, typer.Option(
    "--exit-zero", metavar=FLAG, rich_help_panel=PANEL_CI,
    help="Exit 0 even when there are findings.")]
Baseline = Annotated[str | None, typer.Option(
    "--baseline", metavar="FILE", rich_help_panel=PANEL_CI,
    help="Hide the findings this baseline file records; report entries it no longer matches as "
         "stale (merge: by default the one the shards name).")]
WriteBaseline = Annotated[str | None, typer.Option(
    "--write-baseline", metavar="FILE", rich_help_panel=PANEL_CI,
    help="Record every current finding in FILE (for --baseline) and exit 0.")]
