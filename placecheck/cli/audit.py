"""``placecheck audit``: one model (TARGET) or every model of a config (``--config``).

The command parses its options into frozen objects and hands them to
:func:`run_audit` (which calls the same :func:`placecheck.audit` Python users
call) or, for ``--config``/``--timeout``/baselines, to :mod:`placecheck.ci`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from typer.core import DEFAULT_MARKUP_MODE

from placecheck.cli.app import app
from placecheck.devices import DEVICE_HELP
from placecheck.errors import PlacecheckError
from placecheck.formats import OutputFormat
from placecheck.output import OutputOptions, emit, fail, model_output_to_stderr
from placecheck.report import FAIL_ON_CHOICES, Report

# rich markup reads "[tool.placecheck]" as a style tag and drops it from --help
_TOOL_TABLE = "\\[tool.placecheck]" if DEFAULT_MARKUP_MODE == "rich" else "[tool.placecheck]"


@dataclass(frozen=True)
class AuditOptions:
    """Everything ``placecheck audit`` needs, parsed from the command line."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    device: str = "cuda"
    engine: str = "auto"
    gpus: int | None = None
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    init: str = "auto"
    checkpoint: str | None = None
    checkpoint_key: str | None = None
    trust: bool = False
    inputs: tuple[str, ...] = ()
    example_inputs: str | None = None
    forward: bool = True
    train: bool = False
    library_findings: bool = False


def split_codes(values: list[str] | None) -> tuple[str, ...]:
    """``--select PC1,PC204 --select PC3`` -> ``("PC1", "PC204", "PC3")``."""
    return tuple(c.strip() for v in values or () for c in v.split(",") if c.strip())


@app.command()
def audit(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Argument(
        help="The model: MODULE:ATTR (e.g. torchvision.models:resnet18) or path/to/file.py:ATTR. "
             "ATTR names an nn.Module instance, an nn.Module subclass or a function returning one. "
             f"Optional with --config, or when ./pyproject.toml has a {_TOOL_TABLE} table.",
        show_default=False)] = None,
    device: Annotated[str, typer.Option("--device", "-d", help=f"Target device: {DEVICE_HELP}.")] = "cuda",
    engine: Annotated[str, typer.Option(
        metavar="auto|real|fake|tagged",
        help="auto: the real device when present, CUDA simulated with fake tensors when not (and "
             "with real values when fake tensors cannot run the forward); real: require the real "
             "device; fake: always simulate CUDA with fake tensors; tagged: simulate CUDA with real "
             "CPU values (runs .item(), boolean masks, backward).")] = "auto",
    gpus: Annotated[int | None, typer.Option(
        help="Number of simulated GPUs (default: enough for the target's index).", min=1)] = None,
    init: Annotated[str, typer.Option(
        help="Where to build the model: cpu; meta (no memory for weights: for models bigger than "
             "this machine's RAM); auto: meta when a CPU build would not fit comfortably.")] = "auto",
    kwargs: Annotated[str | None, typer.Option(
        "--kwargs", help='Constructor arguments as a JSON object, e.g. \'{"num_classes": 10}\'.')] = None,
    arg: Annotated[list[str] | None, typer.Option(
        "--arg", help="Constructor argument KEY=VALUE (int, float, bool, None or str); repeatable.")] = None,
    checkpoint: Annotated[str | None, typer.Option(
        "--checkpoint", help="Load this checkpoint into the model first (map_location as a script would), "
                             "check it (PC301-PC306) and audit the loaded model.")] = None,
    key: Annotated[str | None, typer.Option(
        "--key", help="Where the state_dict is inside the checkpoint, e.g. model.ema (default: found "
                      "automatically).")] = None,
    trust: Annotated[bool, typer.Option(
        "--trust", help="Allow loading a checkpoint that runs pickled code (weights_only=False).")] = False,
    input_specs: Annotated[list[str] | None, typer.Option(
        "--input", "-i", help="A forward input [NAME=]DTYPE[D0,D1,...][:LOW..HIGH], e.g. "
                              "float32[8,3,224,224] or input_ids=int64[2,128]:0..32000; repeatable "
                              "(default: inferred from the first layer).")] = None,
    example_inputs: Annotated[str | None, typer.Option(
        "--example-inputs", help="MODULE:ATTR or file.py:ATTR returning the forward's inputs: a tensor, "
                                 "a tuple (positional), a dict (keyword) or (args, kwargs).")] = None,
    train: Annotated[bool, typer.Option(
        "--train", help="Run the forward in training mode, then a backward of the summed outputs, and "
                        "check every gradient lands on the device.")] = False,
    no_forward: Annotated[bool, typer.Option(
        "--no-forward", help="Skip the forward pass: only the walk after .to() (and --checkpoint).")] = False,
    library_findings: Annotated[bool, typer.Option(
        "--library-findings", help="Also report performance findings (PC202 warnings, PC204, PC205) raised "
                                   "entirely inside installed packages such as torchvision.")] = False,
    select: Annotated[list[str] | None, typer.Option(
        help="Report only these codes or prefixes (PC1, PC204, ALL); comma-separated or repeated.")] = None,
    ignore: Annotated[list[str] | None, typer.Option(
        help="Do not report these codes or prefixes; comma-separated or repeated.")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")] = OutputFormat.TABLE,
    output: Annotated[str, typer.Option(
        "--output", "-o", help="Write the report to FILE ('-' is stdout).")] = "-",
    fail_on: Annotated[str, typer.Option(
        help=f"Exit 1 when a finding is at or above this severity: {', '.join(FAIL_ON_CHOICES)}.",
    )] = "warning",
    exit_zero: Annotated[bool, typer.Option(
        "--exit-zero", help="Exit 0 even when there are findings.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    config: Annotated[str | None, typer.Option(
        "--config", "-c", help="Audit every model a TOML config lists (see configs/example.toml), each in "
                               "its own process.")] = None,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", help="With --config: models audited in parallel (default: the config's, else 1).",
        min=1)] = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", help="Seconds one model's audit may take before it is stopped. With --config "
                          "each model runs in its own process and one that runs past it is reported "
                          "as PC901 (default: the config's, else 600); with one TARGET the audit runs "
                          "in a child process only when this is given, and running past it is an "
                          "error (exit 2).", min=0.001)] = None,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", help="Hide the findings this baseline file records; report entries it no longer "
                           "matches as stale.")] = None,
    write_baseline: Annotated[str | None, typer.Option(
        "--write-baseline", help="Record every current finding in FILE (for --baseline) and exit 0.")] = None,
) -> None:
    """Load a model, move it to DEVICE as a training script would, and report what did not follow.

    Exit status: 0 when no finding is at or above --fail-on, 1 when one is,
    2 for usage errors and models that do not load.
    """
    from placecheck.errors import UsageError
    from placecheck.load import parse_kwargs

    if target is None or config is not None:
        from placecheck.ci import run_config_audit

        raise typer.Exit(run_config_audit(ctx, target, config, debug))
    try:
        if fail_on not in FAIL_ON_CHOICES:
            raise UsageError(f"--fail-on {fail_on!r} is not one of {', '.join(FAIL_ON_CHOICES)}")
        from placecheck.ci import reject_run_options

        reject_run_options(ctx)
        opts = AuditOptions(
            target=target, kwargs=parse_kwargs(kwargs, arg or ()), device=device, engine=engine,
            gpus=gpus, select=split_codes(select), ignore=split_codes(ignore), init=init,
            checkpoint=checkpoint, checkpoint_key=key, trust=trust, inputs=tuple(input_specs or ()),
            example_inputs=example_inputs, forward=not no_forward, train=train,
            library_findings=library_findings,
        )
        out = OutputOptions(format=fmt, output=output, fail_on=fail_on, exit_zero=exit_zero, debug=debug)
        if timeout is not None:
            from placecheck.ci import audit_with_timeout

            report = audit_with_timeout(opts, timeout)
        else:
            report = run_audit(opts)
    except PlacecheckError as exc:
        refused = getattr(exc, "report", None)  # --checkpoint would run code: its PC306 report, then the line
        if refused is not None:
            emit(refused, out)
        raise fail(str(exc), debug) from None
    except Exception as exc:  # a bug in placecheck or something unforeseen in the model
        from placecheck.errors import one_line

        raise fail(f"unexpected {one_line(exc)}; rerun with --debug and report it", debug) from None
    if baseline is not None or write_baseline is not None:
        from placecheck.ci import finish_with_baseline

        raise typer.Exit(finish_with_baseline([report], out, baseline, write_baseline, load_error=False))
    raise typer.Exit(emit(report, out))


def run_audit(opts: AuditOptions) -> Report:
    """Resolve the target and audit it; raises PlacecheckError subclasses."""
    from placecheck.api import audit as run
    from placecheck.devices import normalize_device
    from placecheck.load import build, resolve, split_target

    normalize_device(opts.device)  # a bad device fails before any import of the target
    _, attr = split_target(opts.target)

    def factory() -> Any:
        return build(resolve(opts.target), attr, opts.kwargs)

    with model_output_to_stderr():
        return run(factory, opts.device, engine=opts.engine, gpus=opts.gpus, select=opts.select or None,
                   ignore=opts.ignore or None, copy_model=False, target=opts.target, init=opts.init,
                   checkpoint=opts.checkpoint, checkpoint_key=opts.checkpoint_key, trust=opts.trust,
                   inputs=opts.inputs, example_inputs=opts.example_inputs, forward=opts.forward,
                   train=opts.train, library_findings=opts.library_findings)
