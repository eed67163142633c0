"""Auditing every model of a config, each in its own subprocess.

A model's audit runs real model code: it can segfault the interpreter, hang,
or exhaust memory. Each model therefore runs in a child process
(``python -m placecheck.runner SPEC RESULT``) with a timeout; ``--jobs N`` run
at once. A child that dies by a signal, runs past its timeout, or runs out of
memory becomes a PC901 ``audit-incomplete`` finding on that model's report,
and every other model's report is kept. A model that cannot be loaded at all
(bad target, bad arguments) is a usage problem: it is reported the same way
and also makes the run exit 2, as a single ``placecheck audit TARGET`` would.

PC901 is outside the PC1/PC2/PC3 families on purpose: it says the audit did
not finish, not that a placement rule was broken, so ``--select PC1`` does not
hide it; only an explicit ``--ignore PC901`` (or an ``allow``) does.

The parent never imports torch; the children do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from placecheck.classify import out_of_memory
from placecheck.config import ModelConfig, RunConfig, apply_allows
from placecheck.devices import normalize_device
from placecheck.errors import PlacecheckError, UsageError, one_line
from placecheck.finding import Finding
from placecheck.options import AuditOptions
from placecheck.report import DeviceMap, Report
from placecheck.rules import expand, rule

INCOMPLETE = "PC901"
"""The code of a model whose audit did not finish (crash, timeout, out of memory, not loadable)."""

_STDERR_TAIL = 12
"""Lines of a dead child's stderr kept in the finding (the faulthandler traceback fits)."""


@dataclass(frozen=True)
class ModelOutcome:
    """What happened to one model of a run."""

    model: ModelConfig
    report: Report
    load_error: str = ""
    """Non-empty when the model could not be loaded or its options were wrong (the run exits 2)."""


# ---- report <-> JSON -----------------------------------------------------------------------------


def finding_from_dict(data: dict[str, Any]) -> Finding:
    """The inverse of :meth:`Finding.to_dict`."""
    return Finding.from_dict(data)


def report_from_dict(data: dict[str, Any]) -> Report:
    """The inverse of ``formats.json.report_to_dict`` (the JSON a child sends back)."""
    return Report(
        target=data["target"], device=data["device"], engine=data["engine"],
        findings=tuple(finding_from_dict(f) for f in data["findings"]),
        notes=tuple(data.get("notes", ())),
        stats=tuple((str(k), int(v)) for k, v in data.get("stats", {}).items()),
        incomplete=str(data.get("summary", {}).get("incomplete", "")),
        device_map=DeviceMap.from_dict(data["device_map"], data.get("transfers"))
        if "device_map" in data else None,
    )


# ---- the child -----------------------------------------------------------------------------------


def _audit(spec: dict[str, Any]) -> Report:
    """Audit one model as ``placecheck audit TARGET`` would, with the options its entry gives."""
    from placecheck.api import audit
    from placecheck.load import build, parse_kwargs, resolve, split_target

    target = spec["target"]
    options = AuditOptions.from_dict(spec["options"]).replace(target=target)
    options.check()  # a bad option fails before any import of the target
    _, attr = split_target(target)
    constructor_kwargs = {**spec["kwargs"], **parse_kwargs(None, spec["args"])}

    def factory() -> Any:
        return build(resolve(target), attr, constructor_kwargs)

    return audit(factory, options=options)


def child_main(spec_path: str, result_path: str) -> int:
    """Run one model's audit and write ``{"status": ..., ...}`` JSON to ``result_path``."""
    import faulthandler

    faulthandler.enable()  # a segfault prints the Python stack to stderr, which the parent keeps
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    result: dict[str, Any]
    try:
        from placecheck.formats.json import report_to_dict

        report = _audit(spec)
        result = {"status": "ok", "report": report_to_dict(report)}
    except MemoryError:
        result = {"status": "oom", "message": "MemoryError"}
    except PlacecheckError as exc:
        status = "oom" if out_of_memory(exc) else "load-error"
        result = {"status": status, "message": str(exc)}
    except Exception as exc:
        status = "oom" if out_of_memory(exc) else "error"
        result = {"status": status, "message": f"unexpected {one_line(exc)}"}
    Path(result_path).write_text(json.dumps(result), encoding="utf-8")
    return 0


# ---- the parent ----------------------------------------------------------------------------------


def _incomplete(model: ModelConfig, reason: str, message: str, stderr: str = "") -> Report:
    r = rule(INCOMPLETE)
    hints = {
        "timeout": "raise --timeout (or the model's timeout), or make the model smaller to build",
        "crash": "run `placecheck audit` on this model alone with --debug; the interpreter's last "
                 "stack lines are in the finding's details (--format json or junit)",
        "out-of-memory": "give the runner more memory, or build the model with --init meta",
        "load-error": "fix the model's entry in the config (target, kwargs, inputs)",
        "error": "rerun this model alone with --debug and report it",
    }
    details = [("reason", reason)]
    if stderr:
        details.append(("stderr", stderr))
    finding = Finding(code=r.code, kind=r.kind, severity=r.severity, where="", message=message,
                      hint=hints[reason], details=tuple(details))
    try:
        device = normalize_device(model.options.device, keep=True)
    except UsageError:
        device = model.options.device
    return Report.build(model.label, device, "not run", [finding])


def _spec(model: ModelConfig) -> dict[str, Any]:
    """What the child needs to audit ``model``: the model and its options, as JSON-ready values."""
    return {"target": model.target, "kwargs": model.kwargs, "args": list(model.args),
            "options": model.options.to_dict()}


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    # faulthandler prints the crashing stack innermost first: keep its start, not the module list
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            return "\n".join(lines[i:i + _STDERR_TAIL])
    return "\n".join(lines[-_STDERR_TAIL:])


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _child_command(spec_path: Path, result_path: Path) -> list[str]:
    """The command line of one model's audit process (a seam for the tests)."""
    return [sys.executable, "-m", "placecheck.runner", str(spec_path), str(result_path)]


def audit_in_subprocess(model: ModelConfig, timeout: float, workdir: str | None = None) -> ModelOutcome:
    """Audit one model in a child process; never raises for what the model does."""
    with tempfile.TemporaryDirectory(prefix="placecheck-") as tmp:
        spec_path, result_path, stderr_path = (Path(tmp) / n for n in ("spec.json", "result.json",
                                                                         "stderr.txt"))
        spec_path.write_text(json.dumps(_spec(model)), encoding="utf-8")
        command = _child_command(spec_path, result_path)
        with open(stderr_path, "wb") as stderr:
            # A new session, so that a timeout kills the child's own children too.
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=stderr, cwd=workdir, start_new_session=True)
            try:
                returncode = child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill(child)
                return ModelOutcome(model, _incomplete(
                    model, "timeout", f"the audit did not finish within {timeout:g} s and was stopped",
                    _tail(stderr_path)))
        stderr_text = _tail(stderr_path)
        if returncode < 0:
            name = _signal_name(-returncode)
            if -returncode == signal.SIGKILL:
                return ModelOutcome(model, _incomplete(
                    model, "out-of-memory", "the audit was killed by SIGKILL, usually the kernel's "
                    "out-of-memory killer", stderr_text))
            return ModelOutcome(model, _incomplete(
                model, "crash", f"the audit crashed the Python interpreter ({name})", stderr_text))
        if not result_path.is_file():
            return ModelOutcome(model, _incomplete(
                model, "crash", f"the audit process exited with status {returncode} without a report",
                stderr_text))
        try:
            result = json.loads(result_path.read_text(encoding="utf-8"))
            status = result["status"]
        except (OSError, ValueError, TypeError, KeyError) as exc:
            return ModelOutcome(model, _incomplete(
                model, "error", f"the audit process wrote an unreadable result ({one_line(exc)})",
                stderr_text))
    if status == "ok":
        return ModelOutcome(model, report_from_dict(result["report"]))
    if status == "oom":
        return ModelOutcome(model, _incomplete(model, "out-of-memory",
                                               f"the audit ran out of memory: {result['message']}"))
    if status == "load-error":
        report = _incomplete(model, "load-error", f"the model did not load: {result['message']}")
        return ModelOutcome(model, report, load_error=result["message"])
    return ModelOutcome(model, _incomplete(model, "error", f"the audit failed: {result['message']}",
                                           stderr_text))


def _kill(child: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()
    child.wait()


def finish(outcome: ModelOutcome) -> ModelOutcome:
    """Apply the model's ``allow`` entries and keep PC901 unless explicitly ignored."""
    model, report = outcome.model, outcome.report
    findings = report.findings
    ignore = model.options.ignore
    if any(f.code == INCOMPLETE for f in findings) and ignore and INCOMPLETE in expand(ignore):
        findings = tuple(f for f in findings if f.code != INCOMPLETE)
    kept, allowed, unused = apply_allows(findings, model.allow)
    notes = list(report.notes)
    for finding, entry in allowed:
        notes.append(f"allowed by config line {entry.line}: {finding.code} at "
                     f"{finding.where or '<root>'} ({entry.reason})")
    notes += [f"config line {entry.line}: allow {entry.code} where {entry.where!r} matched no finding"
              for entry in unused]
    return replace(outcome, report=replace(report, target=model.label, findings=tuple(kept),
                                           notes=tuple(notes)))


def show_progress() -> bool:
    """A progress bar only for a person at a terminal: not in CI, not when stderr is redirected.

    CI services set ``CI=true`` (or ``1``); ``CI=false`` or ``CI=0`` means "not CI", so only a
    truthy value hides the bar.
    """
    in_ci = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")
    return sys.stderr.isatty() and not in_ci


def run_models(config: RunConfig, jobs: int | None = None, timeout: float | None = None,
               progress: bool | None = None, workdir: str | None = None,
               audit_one: Callable[[ModelConfig, float, str | None], ModelOutcome] = audit_in_subprocess,
               ) -> list[ModelOutcome]:
    """Audit every model of ``config`` (``jobs`` at once); outcomes in config order."""
    workers = jobs or config.jobs
    default_timeout = timeout or config.timeout
    models: Sequence[ModelConfig] = config.models
    outcomes: list[ModelOutcome | None] = [None] * len(models)
    lock = threading.Lock()
    bar = _Progress(len(models)) if (show_progress() if progress is None else progress) else None

    def one(index: int) -> None:
        model = models[index]
        try:
            outcome = finish(audit_one(model, model.timeout or default_timeout, workdir))
        except Exception as exc:  # placecheck's own failure on this model must not lose the others
            outcome = ModelOutcome(model, _incomplete(
                model, "error", f"placecheck failed on this model: {one_line(exc)}"))
        with lock:
            outcomes[index] = outcome
            if bar is not None:
                bar.advance(model.label)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for future in [pool.submit(one, i) for i in range(len(models))]:
                future.result()
    finally:
        if bar is not None:
            bar.stop()
    return [o for o in outcomes if o is not None]


class _Progress:
    """A rich progress bar on stderr (rich comes with typer)."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("auditing"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}"),
                                 console=Console(stderr=True), transient=True)
        self.task = self.progress.add_task("", total=total)
        self.progress.start()

    def advance(self, label: str) -> None:
        self.progress.update(self.task, advance=1, description=label)

    def stop(self) -> None:
        self.progress.stop()


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1], sys.argv[2]))
