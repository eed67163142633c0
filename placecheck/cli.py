"""The ``placecheck`` command line: a thin layer over :func:`placecheck.audit`.

Options are parsed into a frozen object, the same ``audit()`` Python users call
does the work, a formatter renders the report and :func:`exit_code` decides the
exit status (0 clean, 1 findings at or above ``--fail-on``, 2 usage or load
error). torch is imported only when an audit actually runs, so ``--help`` is fast.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import DEFAULT_MARKUP_MODE

from placecheck import __version__
from placecheck.devices import DEVICE_HELP
from placecheck.errors import PlacecheckError
from placecheck.formats import OutputFormat, formatter_for
from placecheck.report import EXIT_USAGE, FAIL_ON_CHOICES, Report, exit_code

app = typer.Typer(
    name="placecheck",
    help="Find PyTorch device-placement bugs before they cost a GPU job.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


# rich markup reads "[tool.placecheck]" as a style tag and drops it from --help
_TOOL_TABLE = "\\[tool.placecheck]" if DEFAULT_MARKUP_MODE == "rich" else "[tool.placecheck]"


@dataclass(frozen=True)
class OutputOptions:
    """How to render and judge a report."""

    format: OutputFormat = OutputFormat.TABLE
    output: str = "-"
    fail_on: str = "warning"
    exit_zero: bool = False
    debug: bool = False


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


def _split_codes(values: list[str] | None) -> tuple[str, ...]:
    return tuple(c.strip() for v in values or () for c in v.split(",") if c.strip())


def fail(message: str, debug: bool = False) -> typer.Exit:
    """Print ``placecheck: error: ...`` (and the traceback under --debug); exit 2."""
    if debug:
        traceback.print_exc()
        message = message.replace(" (--debug shows the traceback)", "")  # it just did
    typer.echo(f"placecheck: error: {message}", err=True)
    return typer.Exit(EXIT_USAGE)


@contextlib.contextmanager
def _model_output_to_stderr() -> Iterator[None]:
    """Send what the model's own code prints (import, constructor, forward) to stderr.

    stdout carries the report alone: ``--format json`` stays parseable, and an
    error leaves stdout empty.
    """
    with contextlib.redirect_stdout(sys.stderr):
        yield


def emit(report: Report, out: OutputOptions) -> int:
    """Write the formatted report where ``--output`` says; return the exit code."""
    return emit_reports([report], out)


def emit_reports(reports: list[Report], out: OutputOptions, config_run: bool = False) -> int:
    """Write a run's reports (one or many models) where ``--output`` says; return the exit code.

    ``config_run``: a ``--config`` run, rendered in the run shape even with one model.
    """
    to_terminal = out.output == "-" and sys.stdout.isatty()
    formatter = formatter_for(out.format, shutil.get_terminal_size().columns if to_terminal else None)
    text = formatter.format_run(reports) if config_run else formatter.format_reports(reports)
    if out.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:
            Path(out.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise fail(f"cannot write --output {out.output!r}: {exc.strerror or exc}") from None
    return exit_code(reports, out.fail_on, out.exit_zero)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"placecheck {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """Find PyTorch device-placement bugs before they cost a GPU job."""


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
            gpus=gpus, select=_split_codes(select), ignore=_split_codes(ignore), init=init,
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

    with _model_output_to_stderr():
        return run(factory, opts.device, engine=opts.engine, gpus=opts.gpus, select=opts.select or None,
                   ignore=opts.ignore or None, copy_model=False, target=opts.target, init=opts.init,
                   checkpoint=opts.checkpoint, checkpoint_key=opts.checkpoint_key, trust=opts.trust,
                   inputs=opts.inputs, example_inputs=opts.example_inputs, forward=opts.forward,
                   train=opts.train, library_findings=opts.library_findings)


@app.command()
def checkpoint(
    file: Annotated[str, typer.Argument(
        help="The checkpoint: a torch.save file (zip or legacy), a TorchScript archive, a .pt2 "
             "program or a .safetensors file.", show_default=False)],
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="Compare with this model's state_dict(): MODULE:ATTR or "
                              "path/to/file.py:ATTR.")] = None,
    device: Annotated[str, typer.Option("--device", "-d", help=f"Target device: {DEVICE_HELP}.")] = "cuda",
    engine: Annotated[str, typer.Option(
        help="auto: the real machine's GPUs when present, simulated ones when not; real; fake.")] = "auto",
    gpus: Annotated[int | None, typer.Option(
        help="Number of GPUs the target machine has when simulated (default: enough for --device).",
        min=1)] = None,
    key: Annotated[str | None, typer.Option(
        "--key", help="Where the state_dict is inside the checkpoint, e.g. model.ema (default: found "
                      "automatically).")] = None,
    trust: Annotated[bool, typer.Option(
        "--trust", help="Allow loading a checkpoint that runs pickled code (weights_only=False).")] = False,
    kwargs: Annotated[str | None, typer.Option(
        "--kwargs", help="Constructor arguments for --model as a JSON object.")] = None,
    arg: Annotated[list[str] | None, typer.Option(
        "--arg", help="Constructor argument KEY=VALUE for --model; repeatable.")] = None,
    select: Annotated[list[str] | None, typer.Option(
        help="Report only these codes or prefixes (PC3, PC301, ALL); comma-separated or repeated.")] = None,
    ignore: Annotated[list[str] | None, typer.Option(
        help="Do not report these codes or prefixes; comma-separated or repeated.")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")] = OutputFormat.TABLE,
    output: Annotated[str, typer.Option(
        "--output", "-o", help="Write the report to FILE ('-' is stdout).")] = "-",
    fail_on: Annotated[str, typer.Option(
        help=f"Exit 1 when a finding is at or above this severity: {', '.join(FAIL_ON_CHOICES)}."
    )] = "warning",
    exit_zero: Annotated[bool, typer.Option(
        "--exit-zero", help="Exit 0 even when there are findings.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    """Check a checkpoint before a job loads it: saved devices, keys against a model, and safety.

    Reads only the file's index (never its tensor data, never its pickled
    code) and never modifies it. Exit status: 0 when no finding is at or above
    --fail-on, 1 when one is, 2 for unreadable files, bad options and
    checkpoints that would run code (unless --trust).
    """
    from placecheck.errors import UsageError
    from placecheck.load import parse_kwargs

    try:
        if fail_on not in FAIL_ON_CHOICES:
            raise UsageError(f"--fail-on {fail_on!r} is not one of {', '.join(FAIL_ON_CHOICES)}")
        out = OutputOptions(format=fmt, output=output, fail_on=fail_on, exit_zero=exit_zero, debug=debug)
        constructor_kwargs = parse_kwargs(kwargs, arg or ())
        result = run_checkpoint(file, model, constructor_kwargs, device=device, engine=engine, gpus=gpus,
                                key=key, trust=trust, select=_split_codes(select),
                                ignore=_split_codes(ignore))
    except PlacecheckError as exc:
        raise fail(str(exc), debug) from None
    except Exception as exc:  # a bug in placecheck or something unforeseen in the file
        from placecheck.errors import one_line

        raise fail(f"unexpected {one_line(exc)}; rerun with --debug and report it", debug) from None
    code = emit(result.report, out)
    if result.refused:
        from placecheck.checkpoint.preflight import unsafe_globals_text

        names = unsafe_globals_text(result.meta)
        typer.echo(f"placecheck: error: {file!r} would run pickled code when loaded (it names {names}); "
                   "not loaded (pass --trust if you trust it)", err=True)
        code = EXIT_USAGE
    raise typer.Exit(code)


def run_checkpoint(file: str, model: str | None, kwargs: dict[str, Any], **options: Any) -> Any:
    """Resolve ``--model`` (if any) and check the checkpoint; raises PlacecheckError subclasses."""
    from placecheck.checkpoint import check_checkpoint
    from placecheck.devices import normalize_device
    from placecheck.load import build, resolve, split_target

    normalize_device(options["device"])
    factory = None
    with _model_output_to_stderr():
        if model is not None:
            _, attr = split_target(model)
            obj = resolve(model)

            def factory() -> Any:
                return build(obj, attr, kwargs)

        return check_checkpoint(file, model=factory, model_name=model, **options)


@app.command("rules")
def rules_command() -> None:
    """List every finding code with its severity and title."""
    from tabulate import tabulate

    from placecheck.rules import RULES

    rows = [(r.code, r.kind, r.severity.value, r.phase, r.title) for r in RULES.values()]
    typer.echo(tabulate(rows, headers=("code", "kind", "severity", "found by", "title"), tablefmt="simple"))
    typer.echo("\nplacecheck explain CODE shows what a code means, why it matters and how to fix it.")


@app.command()
def explain(
    code: Annotated[str, typer.Argument(help="A finding code (PC101) or its kind (stray-tensor).",
                                        show_default=False)],
) -> None:
    """Explain a finding code: what it means, why it matters, a wrong and a right example."""
    from placecheck.rules import RULES, Rule

    wanted = code.strip()
    found: Rule | None = RULES.get(wanted.upper()) or next(
        (r for r in RULES.values() if r.kind == wanted.lower()), None)
    if found is None:
        raise fail(f"unknown code {code!r}: `placecheck rules` lists them (PC101 ... {list(RULES)[-1]})")
    typer.echo(explain_text(found))


def explain_text(r: Any) -> str:
    """The text ``placecheck explain`` prints for one rule."""
    def indent(text: str) -> str:
        return "\n".join(f"    {line}" if line else "" for line in text.splitlines())

    return (f"{r.code} {r.kind} ({r.severity.value}, found by the {r.phase} phase)\n"
            f"{r.title}\n\n{r.explanation}\n\nWrong:\n{indent(r.wrong)}\n\nRight:\n{indent(r.right)}")


def entrypoint() -> None:
    """Console-script entry point: click's own usage errors as one line, like placecheck's.

    typer would draw a usage block and an error box; a bad ``--format`` or
    ``--gpus`` gets ``placecheck: error: ...`` and exit 2 instead, like every
    other bad input. ``--help``, ``--version`` and bare ``placecheck`` are unchanged.
    """
    if len(sys.argv) <= 1:
        app()  # no arguments: typer's help screen, as before
        return
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # click's ClickException, UsageError, BadParameter, ...
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()  # type: ignore[attr-defined]  # a subcommand's help screen, not an error
            sys.exit(EXIT_USAGE)
        message = " ".join(exc.format_message().split())
        typer.echo(f"placecheck: error: {message}", err=True)
        sys.exit(getattr(exc, "exit_code", EXIT_USAGE))
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
