"""``placecheck audit``: one model (TARGET) or every model of a config (``--config``).

A thin adapter: the command line becomes an :class:`~placecheck.options.AuditOptions`
and an :class:`~placecheck.output.OutputOptions`; :func:`run_audit` calls the
same :func:`placecheck.audit` Python users call; :func:`placecheck.output.emit`
formats the report and gives the exit code. ``--config`` runs, ``--timeout``
and baselines go through :mod:`placecheck.ci`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from placecheck.cli.app import app
from placecheck.config import ISOLATION_CHOICES, PROGRESS_CHOICES
from placecheck.devices import AUDIT_DEVICE_HELP, DEVICE_MAP_HELP
from placecheck.errors import PlacecheckError
from placecheck.formats import OutputFormat
from placecheck.options import ENGINE_CHOICES, INIT_CHOICES, WRAP_CHOICES, AuditOptions, split_codes
from placecheck.output import OutputOptions, emit, fail, model_output_to_stderr
from placecheck.report import FAIL_ON_CHOICES, Report

_FLAG = ""
"""The metavar of an on/off option: nothing after the flag in --help."""


@app.command()
def audit(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Argument(
        metavar="TARGET", show_default=False,
        help="The model: MODULE:ATTR (e.g. torchvision.models:resnet18) or path/to/file.py:ATTR. "
             "ATTR names an nn.Module instance, an nn.Module subclass or a function returning one. "
             "Optional with --config, or when ./pyproject.toml has a [tool.placecheck] table.")] = None,
    device: Annotated[str, typer.Option(
        "--device", "-d", metavar="DEVICE",
        help=f"Target device: {AUDIT_DEVICE_HELP} (keep: no .to(); the model is audited as its own code "
             "places it, across simulated GPUs, with a device map).")] = "cuda",
    engine: Annotated[str, typer.Option(
        metavar="ENGINE",
        help=f"{'|'.join(ENGINE_CHOICES)}. auto: the real device when present, CUDA simulated "
             "with fake tensors when not (and with real values when fake tensors cannot run the "
             "forward); real: require the real device; fake: always simulate CUDA with fake tensors; "
             "tagged: simulate CUDA with real CPU values (runs .item(), boolean masks, backward).",
    )] = "auto",
    gpus: Annotated[int | None, typer.Option(
        metavar="N", min=1,
        help="Number of simulated GPUs (default: enough for the target's index; with --device keep, "
             "8, the devices the model uses are listed in its device map).")] = None,
    wrap: Annotated[str | None, typer.Option(
        "--wrap", metavar="WRAP",
        help=f"{'|'.join(WRAP_CHOICES)}: audit the model as each replica or rank sees it, replica k on "
             "cuda:k: dp (nn.DataParallel), ddp (DistributedDataParallel, ranks on a simulated "
             "process group), fsdp (FSDP2 fully_shard; a model the target already sharded is audited "
             "as placed). A DataParallel target is audited this way without it.")] = None,
    world_size: Annotated[int | None, typer.Option(
        "--world-size", metavar="N", min=1,
        help="Replicas (dp) or ranks (ddp, fsdp) (default: --gpus, else 2).")] = None,
    init: Annotated[str, typer.Option(
        metavar="INIT",
        help=f"{'|'.join(INIT_CHOICES)}: where to build the model. cpu; meta (no memory for "
             "weights: for models bigger than this machine's RAM); auto: meta when a CPU build "
             "would not fit comfortably.")] = "auto",
    device_map: Annotated[str | None, typer.Option(
        "--device-map", metavar="MAP",
        help=f"{DEVICE_MAP_HELP}: place the model as from_pretrained(device_map=...) does, on --gpus "
             "simulated GPUs: built on the meta device, the map computed by accelerate's "
             "infer_auto_device_map (or read from the JSON file, module name -> GPU index, \"cpu\" or "
             "\"disk\"), dispatched with accelerate's dispatch_model, and audited as placed. Needs "
             "accelerate (pip install 'placecheck[accelerate]').")] = None,
    gpu_memory: Annotated[str | None, typer.Option(
        "--gpu-memory", metavar="SIZE",
        help="With --device-map: memory of each GPU, e.g. 80GiB, 24GB or 512MiB (default: 80GiB).")] = None,
    cpu_memory: Annotated[str | None, typer.Option(
        "--cpu-memory", metavar="SIZE",
        help="With a computed --device-map: host memory weights may be offloaded to (default: none, "
             "so what does not fit on the GPUs is offloaded to disk).")] = None,
    kwargs: Annotated[str | None, typer.Option(
        "--kwargs", metavar="JSON",
        help='Constructor arguments as a JSON object, e.g. \'{"num_classes": 10}\'.')] = None,
    arg: Annotated[list[str] | None, typer.Option(
        "--arg", metavar="KEY=VALUE",
        help="A constructor argument (int, float, bool, None or str); repeatable.")] = None,
    checkpoint: Annotated[str | None, typer.Option(
        "--checkpoint", metavar="FILE",
        help="Load this checkpoint into the model first (map_location as a script would), check it "
             "(PC301-PC306) and audit the loaded model.")] = None,
    key: Annotated[str | None, typer.Option(
        "--key", metavar="KEY",
        help="Where the state_dict is inside the checkpoint, e.g. model.ema (default: found "
             "automatically).")] = None,
    trust: Annotated[bool, typer.Option(
        "--trust", metavar=_FLAG,
        help="Allow loading a checkpoint that runs pickled code (weights_only=False).")] = False,
    input_specs: Annotated[list[str] | None, typer.Option(
        "--input", "-i", metavar="SPEC",
        help="A forward input: [NAME=]DTYPE[D0,D1,...][:LOW..HIGH], e.g. float32[8,3,224,224] or "
             "input_ids=int64[2,128]:0..32000; repeatable (default: inferred from the first "
             "layer).")] = None,
    example_inputs: Annotated[str | None, typer.Option(
        "--example-inputs", metavar="TARGET",
        help="MODULE:ATTR or file.py:ATTR returning the forward's inputs: a tensor, a tuple "
             "(positional), a dict (keyword) or (args, kwargs).")] = None,
    train: Annotated[bool, typer.Option(
        "--train", metavar=_FLAG,
        help="Run the forward in training mode, then a backward of the summed outputs, and check "
             "every gradient lands on the device.")] = False,
    no_forward: Annotated[bool, typer.Option(
        "--no-forward", metavar=_FLAG,
        help="Skip the forward pass: only the walk after .to() (and --checkpoint).")] = False,
    library_findings: Annotated[bool, typer.Option(
        "--library-findings", metavar=_FLAG,
        help="Report performance findings (PC202, PC204, PC205) raised entirely inside installed "
             "packages such as torchvision at their rule's severity (default: info, naming the "
             "package).")] = False,
    no_reuse_calls: Annotated[bool, typer.Option(
        "--no-reuse-calls", metavar=_FLAG,
        help="On fake tensors, run every module call, even one identical to a call already run (same "
             "code, attributes, tensor shapes, dtypes and devices; by default it takes that call's "
             "output shapes, and the notes count it).")] = False,
    select: Annotated[list[str] | None, typer.Option(
        metavar="CODES",
        help="Report only these codes or prefixes (PC1, PC204, ALL); comma-separated or repeated.")] = None,
    ignore: Annotated[list[str] | None, typer.Option(
        metavar="CODES", help="Do not report these codes or prefixes; comma-separated or repeated.")] = None,
    fmt: Annotated[OutputFormat, typer.Option(
        "--format", "-f", metavar="FORMAT",
        help=f"Output format: {', '.join(f.value for f in OutputFormat)}.")] = OutputFormat.TABLE,
    output: Annotated[str, typer.Option(
        "--output", "-o", metavar="FILE", help="Write the report to FILE ('-' is stdout).")] = "-",
    fail_on: Annotated[str, typer.Option(
        metavar="SEVERITY",
        help=f"Exit 1 when a finding is at or above this severity: {', '.join(FAIL_ON_CHOICES)}.",
    )] = "warning",
    exit_zero: Annotated[bool, typer.Option(
        "--exit-zero", metavar=_FLAG, help="Exit 0 even when there are findings.")] = False,
    no_group: Annotated[bool, typer.Option(
        "--no-group", metavar=_FLAG,
        help="One row per finding instance instead of one per problem.")] = False,
    hints: Annotated[bool, typer.Option(
        "--hints", metavar=_FLAG, help="Show the fix hint on every row, not once per rule.")] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", metavar=_FLAG, help="Show tracebacks for errors.")] = False,
    config: Annotated[str | None, typer.Option(
        "--config", "-c", metavar="FILE",
        help="Audit every model a TOML config lists (`placecheck example-config` prints a commented "
             "one), each in its own process.")] = None,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", metavar="N", min=1,
        help="With --config: models audited in parallel (default: the config's, else 1), each "
             "process running torch with its share of the cores (unless OMP_NUM_THREADS is "
             "set).")] = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", metavar="SECONDS", min=0.001,
        help="Seconds one model's audit may take before it is stopped. With --config each model "
             "runs in its own process and one that runs past it is reported as PC901 (default: the "
             "config's, else 600); with one TARGET the audit runs in a child process only when this "
             "is given, and running past it is an error (exit 2).")] = None,
    isolation: Annotated[str | None, typer.Option(
        "--isolation", metavar="MODE",
        help=f"With --config: {'|'.join(ISOLATION_CHOICES)}, how each model gets its own process. "
             "fork (default): warm workers import torch and the targets' libraries once and fork a "
             "fresh child per model; spawn: a fresh interpreter per model (the imports each time). "
             "fork falls back to spawn where os.fork is missing or unsafe (Windows, macOS).")] = None,
    progress: Annotated[str | None, typer.Option(
        "--progress", metavar="MODE",
        help=f"With --config: {'|'.join(PROGRESS_CHOICES)}, what stderr shows while models run. "
             "bar: models done, running and failed and the time elapsed; lines: one line per "
             "finished model (CI logs); auto (default): bar at a terminal outside CI, else "
             "lines.")] = None,
    shard: Annotated[str | None, typer.Option(
        "--shard", metavar="K/N",
        help="With --config: audit only the K-th of N shards of the models (a stable hash of each "
             "model's name: adding a model moves no other). Combine the shards' --format json "
             "reports with `placecheck merge`, which applies the baseline once.")] = None,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", metavar="FILE",
        help="Hide the findings this baseline file records; report entries it no longer matches as "
             "stale.")] = None,
    write_baseline: Annotated[str | None, typer.Option(
        "--write-baseline", metavar="FILE",
        help="Record every current finding in FILE (for --baseline) and exit 0.")] = None,
    fix_files: Annotated[bool, typer.Option(
        "--fix", metavar=_FLAG,
        help="Apply the fixes placecheck fix would offer (written into your files, as ruff's --fix "
             "does), then report what remains. To review the patch first: placecheck fix TARGET.")] = False,
) -> None:
    """Load a model, move it to DEVICE as a training script would, and report what did not follow.

    Exit status: 0 when no finding is at or above --fail-on, 1 when one is,
    2 for usage errors and models that do not load.
    """
    out = OutputOptions(format=fmt, output=output, fail_on=fail_on, exit_zero=exit_zero, debug=debug,
                        group=not no_group, hints=hints)
    if fix_files and (target is None or config is not None or timeout is not None or baseline is not None
                      or write_baseline is not None):
        raise fail("--fix fixes one TARGET: it does not go with --config, --timeout, --baseline or "
                   "--write-baseline", debug)
    if target is None or config is not None:
        from placecheck.ci import run_config_audit

        raise typer.Exit(run_config_audit(ctx, target, config, out))
    from placecheck.ci import audit_with_timeout, finish_with_baseline, reject_run_options
    from placecheck.load import parse_kwargs
    from placecheck.output import check_writable

    try:
        out.check()
        check_writable(write_baseline, "--write-baseline")
        reject_run_options(ctx)
        options = AuditOptions(
            device=device, engine=engine, gpus=gpus, wrap=wrap, world_size=world_size, init=init,
            device_map=device_map, gpu_memory=gpu_memory, cpu_memory=cpu_memory, select=split_codes(select),
            ignore=split_codes(ignore), checkpoint=checkpoint, checkpoint_key=key, trust=trust,
            inputs=tuple(input_specs or ()), example_inputs=example_inputs, forward=not no_forward,
            train=train, library_findings=library_findings, reuse_calls=not no_reuse_calls, copy_model=False,
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
        refused = getattr(exc, "report", None)  # --checkpoint would run code: its PC306 report, then the line
        if refused is not None:
            emit(refused, out)
        raise fail(str(exc), debug) from None
    except Exception as exc:  # a bug in placecheck or something unforeseen in the model
        from placecheck.errors import one_line

        raise fail(f"unexpected {one_line(exc)}; rerun with --debug and report it", debug) from None
    if baseline is not None or write_baseline is not None:
        raise typer.Exit(finish_with_baseline([report], out, baseline, write_baseline, load_error=False))
    raise typer.Exit(emit(report, out))


def run_audit(target: str, constructor_kwargs: dict[str, Any], options: AuditOptions) -> Report:
    """Build ``target`` with ``constructor_kwargs`` and audit it; raises PlacecheckError subclasses."""
    from placecheck.api import audit
    from placecheck.load import model_factory

    options.check()  # a bad device or code fails before any import of the target
    factory = model_factory(target, constructor_kwargs)
    with model_output_to_stderr():
        return audit(factory, options=options)
