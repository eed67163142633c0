"""``placecheck audit``: one model (TARGET) or every model of a config (``--config``).

A thin adapter: the command line becomes an :class:`~placecheck.basics.options.AuditOptions`
and an :class:`~placecheck.findings.output.OutputOptions`; :func:`run_audit` calls the
same :func:`placecheck.audit` Python users call; :func:`placecheck.findings.output.emit`
formats the report and gives the exit code. ``--config`` runs, ``--timeout``
and baselines go through :mod:`placecheck.commands.ci`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from placecheck.basics.config import ISOLATION_CHOICES, PROGRESS_CHOICES
from placecheck.basics.devices import DEVICE_MAP_HELP
from placecheck.basics.errors import PlacecheckError
from placecheck.basics.options import WRAP_CHOICES, AuditOptions, split_codes
from placecheck.cli.app import app
from placecheck.cli.common import (
    DEFAULT_DEVICE,
    FLAG,
    PANEL_CI,
    PANEL_DEVICE,
    PANEL_FIX,
    PANEL_INPUTS,
    PANEL_REPORTING,
    PANEL_TARGET,
    Arg,
    Baseline,
    Debug,
    Device,
    Engine,
    ExampleInputs,
    ExitZero,
    FailOn,
    Format,
    Gpus,
    Hints,
    Ignore,
    Init,
    Input,
    Key,
    Kwargs,
    NoGroup,
    Output,
    PanelCommand,
    Select,
    Timeout,
    Trust,
    WriteBaseline,
)
from placecheck.findings.formats import OutputFormat
from placecheck.findings.output import (
    OutputOptions,
    emit,
    errors_reported,
    fail,
    model_output_to_stderr,
    output_format,
)
from placecheck.findings.report import Report


@app.command(cls=PanelCommand)
def audit(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Argument(
        metavar="TARGET", show_default=False,
        help="The model: MODULE:ATTR (e.g. torchvision.models:resnet18) or path/to/file.py:ATTR. "
             "ATTR names an nn.Module instance, an nn.Module subclass or a function returning one. "
             "Optional with --config, or when ./pyproject.toml has a [tool.placecheck] table.")] = None,
    kwargs: Kwargs = None,
    arg: Arg = None,
    checkpoint: Annotated[str | None, typer.Option(
        "--checkpoint", metavar="FILE", rich_help_panel=PANEL_TARGET,
        help="Load this checkpoint into the model first (map_location as a script would), check it "
             "(PC301-PC306) and audit the loaded model.")] = None,
    key: Key = None,
    trust: Trust = False,
    device: Device = DEFAULT_DEVICE,
    engine: Engine = "auto",
    gpus: Gpus = None,
    init: Init = "auto",
    wrap: Annotated[str | None, typer.Option(
        "--wrap", metavar="WRAP", rich_help_panel=PANEL_DEVICE,
        help=f"{'|'.join(WRAP_CHOICES)}: audit the model as each replica or rank sees it, replica k on "
             "cuda:k: dp (nn.DataParallel), ddp (DistributedDataParallel, ranks on a simulated "
             "process group), fsdp (FSDP2 fully_shard; a model the target already sharded is audited "
             "as placed). A DataParallel target is audited this way without it.")] = None,
    world_size: Annotated[int | None, typer.Option(
        "--world-size", metavar="N", min=1, rich_help_panel=PANEL_DEVICE,
        help="Replicas (dp) or ranks (ddp, fsdp) (default: --gpus, else 2).")] = None,
    device_map: Annotated[str | None, typer.Option(
        "--device-map", metavar="MAP", rich_help_panel=PANEL_DEVICE,
        help=f"{DEVICE_MAP_HELP}: place the model as from_pretrained(device_map=...) does, on --gpus "
             "simulated GPUs: built on the meta device, the map computed by accelerate's "
             "infer_auto_device_map (or read from the JSON file, module name -> GPU index, \"cpu\" or "
             "\"disk\"), dispatched with accelerate's dispatch_model, and audited as placed. Needs "
             "accelerate (pip install 'placecheck[accelerate]').")] = None,
    gpu_memory: Annotated[str | None, typer.Option(
        "--gpu-memory", metavar="SIZE", rich_help_panel=PANEL_DEVICE,
        help="With --device-map: memory of each GPU, e.g. 80GiB, 24GB or 512MiB (default: 80GiB).")] = None,
    cpu_memory: Annotated[str | None, typer.Option(
        "--cpu-memory", metavar="SIZE", rich_help_panel=PANEL_DEVICE,
        help="With a computed --device-map: host memory weights may be offloaded to (default: none, "
             "so what does not fit on the GPUs is offloaded to disk).")] = None,
    input_specs: Input = None,
    example_inputs: ExampleInputs = None,
    train: Annotated[bool, typer.Option(
        "--train", metavar=FLAG, rich_help_panel=PANEL_INPUTS,
        help="Run the forward in training mode, then a backward of the summed outputs, and check "
             "every gradient lands on the device.")] = False,
    no_forward: Annotated[bool, typer.Option(
        "--no-forward", metavar=FLAG, rich_help_panel=PANEL_INPUTS,
        help="Skip the forward pass: only the walk after .to() (and --checkpoint).")] = False,
    no_reuse_calls: Annotated[bool, typer.Option(
        "--no-reuse-calls", metavar=FLAG, rich_help_panel=PANEL_INPUTS,
        help="On fake tensors, run every module call, even one identical to a call already run (same "
             "code, attributes, tensor shapes, dtypes and devices; by default it takes that call's "
             "output shapes, and the notes count it).")] = False,
    timeout: Timeout = None,
    fix_files: Annotated[bool, typer.Option(
        "--fix", metavar=FLAG, rich_help_panel=PANEL_FIX,
        help="Apply the fixes placecheck fix would offer (written into your files, as ruff's --fix "
             "does), then report what remains. To review the patch first: placecheck fix TARGET.")] = False,
    select: Select = None,
    ignore: Ignore = None,
    library_findings: Annotated[bool, typer.Option(
        "--library-findings", metavar=FLAG, rich_help_panel=PANEL_REPORTING,
        help="Report performance findings (PC202, PC204, PC205) raised entirely inside installed "
             "packages such as torchvision at their rule's severity (default: info, naming the "
             "package).")] = False,
    fmt: Format = OutputFormat.TABLE,
    output: Output = "-",
    no_group: NoGroup = False,
    hints: Hints = False,
    debug: Debug = False,
    fail_on: FailOn = "warning",
    exit_zero: ExitZero = False,
    config: Annotated[str | None, typer.Option(
        "--config", "-c", metavar="FILE", rich_help_panel=PANEL_CI,
        help="Audit every model a TOML config lists (`placecheck example-config` prints a commented "
             "one), each in its own process.")] = None,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", metavar="N", min=1, rich_help_panel=PANEL_CI,
        help="With --config: models audited in parallel (default: the config's, else 1), each "
             "process running torch with its share of the cores (unless OMP_NUM_THREADS is "
             "set).")] = None,
    isolation: Annotated[str | None, typer.Option(
        "--isolation", metavar="MODE", rich_help_panel=PANEL_CI,
        help=f"With --config: {'|'.join(ISOLATION_CHOICES)}, how each model gets its own process. "
             "fork (default): warm workers import torch and the targets' libraries once and fork a "
             "fresh child per model; spawn: a fresh interpreter per model (the imports each time). "
             "fork falls back to spawn where os.fork is missing or unsafe (Windows, macOS).")] = None,
    progress: Annotated[str | None, typer.Option(
        "--progress", metavar="MODE", rich_help_panel=PANEL_CI,
        help=f"With --config: {'|'.join(PROGRESS_CHOICES)}, what stderr shows while models run. "
             "bar: models done, running and failed and the time elapsed; lines: one line per "
             "finished model (CI logs); auto (default): bar at a terminal outside CI, else "
             "lines.")] = None,
    shard: Annotated[str | None, typer.Option(
        "--shard", metavar="K/N", rich_help_panel=PANEL_CI,
        help="With --config: audit only the K-th of N shards of the models (a stable hash of each "
             "model's name: adding a model moves no other). Combine the shards' --format json "
             "reports with `placecheck merge`, which applies the baseline once.")] = None,
    baseline: Baseline = None,
    write_baseline: WriteBaseline = None,
) -> None:
    """Load a model, move it to DEVICE as a training script would, and report what did not follow.

    Exit status: 0 when no finding is at or above --fail-on, 1 when one is,
    2 for usage errors and models that do not load, 3 for an internal error.
    """
    with errors_reported(debug):
        out = OutputOptions(format=output_format(fmt), output=output, fail_on=fail_on, exit_zero=exit_zero,
                            debug=debug, group=not no_group, hints=hints)
        if fix_files and (target is None or config is not None or timeout is not None
                          or baseline is not None or write_baseline is not None):
            raise fail("--fix fixes one TARGET: it does not go with --config, --timeout, --baseline or "
                       "--write-baseline", debug)
        if target is None or config is not None:
            from placecheck.commands.ci import run_config_audit

            raise typer.Exit(run_config_audit(ctx, target, config, out))
        from placecheck.commands.ci import audit_with_timeout, finish_with_baseline, reject_run_options
        from placecheck.findings.output import check_writable
        from placecheck.model.load import parse_kwargs

        try:
            out.check()
            check_writable(write_baseline, "--write-baseline")
            reject_run_options(ctx)
            options = AuditOptions(
                device=device, engine=engine, gpus=gpus, wrap=wrap, world_size=world_size, init=init,
                device_map=device_map, gpu_memory=gpu_memory, cpu_memory=cpu_memory,
                select=split_codes(select), ignore=split_codes(ignore), checkpoint=checkpoint,
                checkpoint_key=key, trust=trust, inputs=tuple(input_specs or ()),
                example_inputs=example_inputs, forward=not no_forward, train=train,
                library_findings=library_findings, reuse_calls=not no_reuse_calls, copy_model=False,
                target=target)
            constructor_kwargs = parse_kwargs(kwargs, arg or ())
            if fix_files:
                from placecheck.cli.fix import fix_and_write

                report = fix_and_write(target, constructor_kwargs, options)
            elif timeout is not None:
                report = audit_with_timeout(target, constructor_kwargs, options, timeout)
            else:
                report = run_audit(target, constructor_kwargs, options)
        except PlacecheckError as exc:
            refused = getattr(exc, "report", None)  # --checkpoint would run code: its PC306 report, then
            if refused is not None:                 # the line
                emit(refused, out)
            raise fail(str(exc), debug) from None
        if baseline is not None or write_baseline is not None:
            raise typer.Exit(finish_with_baseline([report], out, baseline, write_baseline, load_error=False))
        raise typer.Exit(emit(report, out))


def run_audit(target: str, constructor_kwargs: dict[str, Any], options: AuditOptions) -> Report:
    """Build ``target`` with ``constructor_kwargs`` and audit it; raises PlacecheckError subclasses."""
    from placecheck.commands.api import audit
    from placecheck.model.load import model_factory

    options.check()  # a bad device or code fails before any import of the target
    factory = model_factory(target, constructor_kwargs)
    with model_output_to_stderr():
        return audit(factory, options=options)
