"""The multi-model side of ``placecheck audit``: ``--config``, ``--jobs``, ``--timeout``, baselines, shards.

Kept out of :mod:`placecheck.cli.audit` so that the command stays thin: the command
parses options, this module turns a config into per-model audits
(:mod:`placecheck.commands.runner`), applies a baseline (:mod:`placecheck.findings.baseline`),
writes the formatted run and returns one exit code for every model:
2 when the config is wrong or a model could not be loaded, else 1 when any
model has a finding at or above ``--fail-on``, else 0.

``placecheck audit TARGET --timeout N`` also runs its one audit in a child
process (:func:`audit_with_timeout`), so that a hanging forward is stopped.

``--shard K/N`` audits one shard of the config (:mod:`placecheck.findings.shards`) and
leaves the baseline to ``placecheck merge`` (:func:`merge_reports`), which
puts the shards' JSON reports back into one run and judges it as one.

Options given on the command line next to ``--config`` apply to every model:
``--device``, ``--engine``, ``--gpus``, ``--init``, ``--select`` and
``--ignore`` override the config's values; options that describe one model
(``--kwargs``, ``--checkpoint``, ``--input``...) are refused, since they
belong in the model's entry. No torch import here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NoReturn

import typer

from placecheck.basics.errors import PlacecheckError, UsageError, one_line
from placecheck.basics.options import AuditOptions, check_value, split_codes
from placecheck.cli.output import fail, interrupted
from placecheck.findings import baseline as baselines
from placecheck.findings.output import OutputOptions, check_writable, emit_reports, grouped, say
from placecheck.findings.report import EXIT_OK, EXIT_USAGE, Report
from placecheck.findings.shards import combine, parse_shard, run_info, select

# Command-line options that apply to every model of a config run: the command's parameters, the
# config's model keys and the AuditOptions fields share these names.
MODEL_OVERRIDES = ("device", "engine", "gpus", "init", "select", "ignore")
# Options about the run as a whole.
RUN_OPTIONS = {"target", "config", "jobs", "timeout", "baseline", "write_baseline", "fmt", "output",
               "fail_on", "exit_zero", "debug", "no_group", "hints", "isolation", "progress", "shard"}
# Output options a config may set (OutputOptions field -> command-line parameter that wins over it).
_CONFIG_OUTPUT = {"fail_on": "fail_on", "group": "no_group", "hints": "hints"}
CONFIG_ONLY = ("jobs", "isolation", "progress", "shard")


def _given(ctx: typer.Context) -> list[str]:
    """Names of the parameters given on the command line (or by environment), not defaulted."""
    # typer vendors click, so its ParameterSource enum is compared by name
    given = []
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            given.append(name)
    return given


def _flag(ctx: typer.Context, name: str) -> str:
    for param in ctx.command.params:
        if param.name == name and param.opts:
            return max(param.opts, key=len)
    return name


def reject_run_options(ctx: typer.Context) -> None:
    """A single TARGET run: refuse options that only mean something with --config."""
    given = [n for n in _given(ctx) if n in CONFIG_ONLY]
    if given:
        flags = " and ".join(_flag(ctx, n) for n in given)
        raise UsageError(f"{flags} apply to --config runs (many models); for one TARGET drop them")


def audit_with_timeout(target: str, constructor_kwargs: dict[str, Any], options: AuditOptions,
                       timeout: float) -> Report:
    """``placecheck audit TARGET --timeout N``: the audit in a child process, stopped after N s.

    The child is the one a ``--config`` run uses for each model
    (:func:`placecheck.commands.runner.audit_in_subprocess`). Whatever stops the audit
    (the timeout, a crash, a load error) is one UsageError line: with one
    target there are no other results to keep. Without ``--timeout`` the audit
    runs in this process, which spares a second interpreter and torch import.
    """
    from placecheck.basics.config import ModelConfig
    from placecheck.commands.runner import INCOMPLETE, audit_in_subprocess

    model = ModelConfig(target=target, kwargs=constructor_kwargs, options=options)
    outcome = audit_in_subprocess(model, timeout)
    if outcome.load_error:
        raise UsageError(outcome.load_error)
    stopped = next((f for f in outcome.report.findings if f.code == INCOMPLETE), None)
    if stopped is None:
        return outcome.report
    reason = dict(stopped.details).get("reason", "")
    if reason == "timeout":
        raise UsageError(f"{target} did not finish within {timeout:g} s (a forward that hangs? "
                         "if it is only slow, raise --timeout)")
    raise UsageError(f"{target}: {stopped.message}; rerun without --timeout (with --debug) to see why")


def _check_overrides(overrides: dict[str, Any]) -> None:
    """Refuse a bad ``--device``/``--engine``/... once, before any model's process starts.

    The config's checks only see the file's values; an override is applied to
    every model after them, so a bad one would otherwise fail in each child and
    be blamed on the config's lines.
    """
    for key, value in overrides.items():
        check_value(key, value)  # the same one-line UsageError as for one TARGET


def run_config_audit(ctx: typer.Context, target: str | None, config_path: str | None,
                     out: OutputOptions) -> int:
    """``placecheck audit --config FILE`` (or ``[tool.placecheck]``); returns the exit code.

    ``out`` holds the command line's output options; the config's ``fail_on``,
    ``group`` and ``hints`` apply where the command line does not set them.
    """
    from placecheck.commands.runner import PartialRun

    debug = out.debug
    params = ctx.params
    try:
        if target is not None:
            raise UsageError("give a TARGET or --config FILE, not both")
        if config_path is None:
            from placecheck.basics.config import find_pyproject

            found = find_pyproject()
            if found is None:
                raise UsageError("no TARGET given: name a model (MODULE:ATTR or path/to/file.py:ATTR), "
                                 "pass --config FILE, or add [tool.placecheck] to ./pyproject.toml")
            config_path = str(found)
        shard = parse_shard(params["shard"]) if params.get("shard") is not None else None
        given = _given(ctx)
        refused = [n for n in given if n not in RUN_OPTIONS and n not in MODEL_OVERRIDES]
        if refused:
            flags = ", ".join(_flag(ctx, n) for n in refused)
            raise UsageError(f"{flags} describe one model: put them in the model's entry of "
                             f"{config_path} instead")
        overrides: dict[str, Any] = {}
        for name in given:
            if name in MODEL_OVERRIDES:
                value = params[name]
                overrides[name] = split_codes(value) if name in ("select", "ignore") else value
        _check_overrides(overrides)
        from placecheck.basics.config import load

        config = load(config_path, overrides)
        from_config: dict[str, Any] = {"fail_on": config.fail_on, "group": config.group,
                                       "hints": config.hints}
        out = replace(out, **{name: value for name, value in from_config.items()
                              if _CONFIG_OUTPUT[name] not in given})
        out.check()
        check_writable(params["write_baseline"], "--write-baseline")
        baseline_path = params["baseline"] or config.baseline
        run: dict[str, Any] | None = None
        if shard is not None:
            if params["write_baseline"] is not None:
                raise UsageError("--write-baseline with --shard would record one shard's findings: "
                                 "write it from the merged run (placecheck merge ... --write-baseline FILE)")
            whole = config
            config, positions = select(whole, shard)
            judged = {**overrides, "fail_on": out.fail_on, "group": out.group, "hints": out.hints}
            run = run_info(whole, shard, positions, judged, baseline_path)
            say(f"placecheck: shard {shard}: {len(config.models)} of the config's {len(whole.models)} models"
                + ("; the baseline is applied by `placecheck merge`" if baseline_path else ""))
        from placecheck.commands.runner import run_models

        outcomes = run_models(config, jobs=params["jobs"], timeout=params["timeout"],
                              isolation=params.get("isolation"), progress=params.get("progress"))
    except PartialRun as partial:
        _report_partial(partial, out)
    except PlacecheckError as exc:
        raise fail(str(exc), debug) from None
    except Exception as exc:  # a bug in placecheck
        raise fail(f"unexpected {one_line(exc)}; rerun with --debug and report it", debug) from None
    for outcome in outcomes:
        if outcome.load_error:
            say(f"placecheck: error: {outcome.model.label} (config line {outcome.model.line}): "
                f"{outcome.load_error}")
    if run is not None:  # a shard: the baseline is applied once, to the merged run
        baseline_path = None
    return finish_with_baseline([o.report for o in outcomes], out, baseline_path, params["write_baseline"],
                                load_error=any(o.load_error for o in outcomes), config_run=True, run=run)


def _report_partial(partial: Any, out: OutputOptions) -> NoReturn:
    """Ctrl-C during a config run: the report of the models that finished (what was found so far, no
    baseline written), then one line and exit 130."""

    reports = [o.report for o in partial.finished]
    if reports:
        emit_reports(reports, out, config_run=True)
    say(f"placecheck: {len(reports)} of {partial.total} models audited"
        + (", their findings above" if reports else ""))
    raise interrupted()


def finish_with_baseline(reports: list[Report], out: OutputOptions, baseline_path: str | None,
                         write_path: str | None, load_error: bool, config_run: bool = False,
                         run: dict[str, Any] | None = None) -> int:
    """Record and/or apply a baseline, write the run, return the exit code.

    ``config_run``: every model of a config was audited, so baseline entries of
    models the config no longer lists are stale too. ``run``: a shard's ``run``
    object, written by ``--format json`` for ``placecheck merge``.
    """
    reports = grouped(reports, out)  # baselines are keyed by problem, as the user sees them
    try:
        if write_path is not None:
            recorded = baselines.write(write_path, reports)
            typer.echo(f"placecheck: recorded {recorded} finding{'s' if recorded != 1 else ''} "
                       f"in {write_path}", err=True)
        if baseline_path is not None:
            result = baselines.apply(reports, baselines.read(baseline_path), complete=config_run)
            reports = list(result.reports)
            if result.stale:
                typer.echo(f"placecheck: {baseline_path}: {len(result.stale)} stale "
                           f"entr{'ies' if len(result.stale) != 1 else 'y'} (no longer found; remove "
                           "them or rewrite with --write-baseline):", err=True)
                for entry in result.stale:
                    typer.echo(f"  {entry.describe()}", err=True)
    except PlacecheckError as exc:
        raise fail(str(exc), out.debug) from None
    code = emit_reports(reports, out, config_run=config_run, run=run)
    if load_error:
        return EXIT_USAGE
    return EXIT_OK if write_path is not None else code


def merge_reports(paths: list[str], out: OutputOptions, fail_on: str | None, baseline_path: str | None,
                  write_path: str | None) -> int:
    """``placecheck merge REPORT.json...``: the shards' reports as one run; returns the exit code.

    The output options the shards recorded (``fail_on``, ``group``, ``hints``) apply unless
    ``fail_on`` is given here; the baseline the shards recorded (their ``--baseline``, else the
    config's) unless ``baseline_path`` is. The baseline is applied once, to every model, and
    its entries for models no shard audited are stale, as in one ``--config`` run.
    """
    try:
        combined = combine(paths)
        recorded = combined.options
        out = replace(out, fail_on=fail_on or str(recorded.get("fail_on", out.fail_on)),
                      group=bool(recorded.get("group", out.group)),
                      hints=bool(recorded.get("hints", out.hints)) or out.hints)
        out.check()
        check_writable(write_path, "--write-baseline")
    except PlacecheckError as exc:
        raise fail(str(exc), out.debug) from None
    for model, message in combined.load_errors:
        say(f"placecheck: error: {model}: {message}")
    return finish_with_baseline(list(combined.reports), out, baseline_path or combined.baseline, write_path,
                                load_error=bool(combined.load_errors), config_run=True)
