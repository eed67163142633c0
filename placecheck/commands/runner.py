"""Auditing every model of a config, each in its own process.

A model's audit runs real model code: it can segfault the interpreter, hang,
or exhaust memory. Each model therefore runs in a process of its own with a
timeout; ``--jobs N`` run at once. A child that dies by a signal, runs past
its timeout, or runs out of memory becomes a PC901 ``audit-incomplete``
finding on that model's report, and every other model's report is kept. A
model that cannot be loaded at all (bad target, bad arguments) is a usage
problem: it is reported the same way and also makes the run exit 2, as a
single ``placecheck audit TARGET`` would.

Where the child comes from is ``--isolation`` (:mod:`placecheck.commands.worker` runs
inside it): ``fork`` (the default where ``os.fork`` exists) keeps ``--jobs``
warm servers that import torch and the config's libraries once and fork a
fresh child per model (:class:`WarmPool`); ``spawn`` starts a fresh
interpreter per model (:func:`audit_in_subprocess`), which pays those imports
again for every model. Both give the same child the same spec, and read its
result, exit status and stderr the same way (:func:`_outcome`).

PC901 is outside the PC1/PC2/PC3 families on purpose: it says the audit did
not finish, not that a placement rule was broken, so ``--select PC1`` does not
hide it; only an explicit ``--ignore PC901`` (or an ``allow``) does.

The parent never imports torch; the children do.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from placecheck.basics.codes import Code
from placecheck.basics.config import ISOLATION_CHOICES, PROGRESS_CHOICES, ModelConfig, RunConfig, apply_allows
from placecheck.basics.devices import KEEP
from placecheck.basics.errors import UsageError, one_line
from placecheck.basics.forkserver import ChildFiles, ForkServer, ServerGone, fork_available
from placecheck.findings import rules
from placecheck.findings.formats.json import finding_from_dict, report_from_dict
from placecheck.findings.report import Report
from placecheck.findings.rules import expand

__all__ = ["INCOMPLETE", "ChildFiles", "ForkServer", "ModelOutcome", "ServerGone", "WarmPool",
           "audit_in_subprocess", "finding_from_dict", "finish", "fork_available", "preload_modules",
           "report_from_dict", "run_models", "show_progress"]

INCOMPLETE = Code.PC901
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
    seconds: float = 0.0
    """Wall time of the model's audit, its process included (set by :func:`run_models`)."""

    @property
    def failed(self) -> bool:
        """The audit did not finish (PC901: a crash, a timeout, out of memory, not loadable)."""
        return bool(self.load_error) or any(f.code == INCOMPLETE for f in self.report.findings)


# ---- the parent ----------------------------------------------------------------------------------


def _incomplete(model: ModelConfig, reason: str, message: str, stderr: str = "") -> Report:
    finding = rules.audit_incomplete(reason, message, stderr)
    try:
        device = str(model.options.target_device or KEEP)
    except UsageError:
        device = model.options.device
    return Report.build(model.label, device, "not run", [finding])


def _spec(model: ModelConfig, threads: int = 0) -> dict[str, Any]:
    """What the child needs to audit ``model``: the model and its options, as JSON-ready values, and
    torch's thread count for it (0: torch's default)."""
    return {"target": model.target, "kwargs": model.kwargs, "args": list(model.args),
            "options": model.options.to_dict(), "threads": threads}


def child_threads(jobs: int) -> int:
    """torch's intra-op thread count for each model's process while ``jobs`` run at once.

    The machine's cores shared out, at least one each: torch starts one OpenMP thread per core in
    every process, and ``jobs`` processes each spinning a thread per core on the same cores wait on
    each other (with 2 jobs on 2 cores, some audits took ten times as long). One job, or an
    ``OMP_NUM_THREADS`` the user set (each child inherits it, and torch follows it), keeps torch's
    default (0).
    """
    if jobs <= 1 or os.environ.get("OMP_NUM_THREADS", "").strip():
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // jobs)


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
    return [sys.executable, "-m", "placecheck.commands.worker", str(spec_path), str(result_path)]


class _Files:
    """One model's spec, result and stderr files, in a temporary folder removed afterwards."""

    def __init__(self, model: ModelConfig, threads: int = 0) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="placecheck-")
        folder = Path(self._tmp.name)
        self.spec, self.result, self.stderr = (folder / n for n in ("spec.json", "result.json",
                                                                     "stderr.txt"))
        try:
            self.spec.write_text(json.dumps(_spec(model, threads)), encoding="utf-8")
        except BaseException:
            self._tmp.cleanup()
            raise

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tmp.cleanup()


def _outcome(model: ModelConfig, returncode: int | None, timeout: float, files: _Files) -> ModelOutcome:
    """Read one child's end: its exit status (None: stopped at ``timeout``), result and stderr."""
    stderr_text = _tail(files.stderr)
    if returncode is None:
        return ModelOutcome(model, _incomplete(
            model, "timeout", f"the audit did not finish within {timeout:g} s and was stopped",
            stderr_text))
    if returncode < 0:
        name = _signal_name(-returncode)
        if -returncode == signal.SIGKILL:
            return ModelOutcome(model, _incomplete(
                model, "out-of-memory", "the audit was killed by SIGKILL, usually the kernel's "
                "out-of-memory killer", stderr_text))
        return ModelOutcome(model, _incomplete(
            model, "crash", f"the audit crashed the Python interpreter ({name})", stderr_text))
    if not files.result.is_file():
        return ModelOutcome(model, _incomplete(
            model, "crash", f"the audit process exited with status {returncode} without a report",
            stderr_text))
    try:
        result = json.loads(files.result.read_text(encoding="utf-8"))
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


def audit_in_subprocess(model: ModelConfig, timeout: float, workdir: str | None = None,
                        threads: int = 0) -> ModelOutcome:
    """Audit one model in a fresh interpreter (``--isolation spawn``), with ``threads`` torch threads
    (:func:`child_threads`; 0: torch's default); never raises for the model's doing."""
    with _Files(model, threads) as files:
        command = _child_command(files.spec, files.result)
        returncode: int | None
        with open(files.stderr, "wb") as stderr:
            # A new session, so that a timeout kills the child's own children too.
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=stderr, cwd=workdir, start_new_session=True)
            try:
                returncode = child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill(child)
                returncode = None
        return _outcome(model, returncode, timeout, files)


def _kill(child: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()
    child.wait()


# ---- the warm pool (--isolation fork) ------------------------------------------------------------

def preload_modules(models: Sequence[ModelConfig]) -> list[str]:
    """The modules the models' targets (and ``example_inputs`` targets) name, for a warm server.

    File targets (``path/to/file.py:ATTR``) are left out; the server itself imports only the
    modules of installed libraries (:func:`placecheck.commands.worker.preload`).
    """
    names: set[str] = set()
    for model in models:
        example = model.options.example_inputs
        for target in (model.target, example if isinstance(example, str) else None):
            module = (target or "").rpartition(":")[0]
            if module and not module.endswith(".py") and "/" not in module and "\\" not in module:
                names.add(module)
    return sorted(names)


class WarmPool:
    """Up to ``jobs`` warm fork servers; :meth:`audit` runs one model in a child forked from one.

    A server is started when a job first needs one, and every server imports the same
    modules. When a server cannot start, that model and every later one is audited the
    ``spawn`` way; when one dies during an audit, that model is its PC901 and the pool
    starts a new server for the next one. Use as a context manager.
    """

    def __init__(self, models: Sequence[ModelConfig], jobs: int, workdir: str | None = None,
                 on_note: Callable[[str], None] | None = None) -> None:
        self.modules = preload_modules(models)
        self.workdir = workdir
        # Each child gets its share of the cores (child_threads), as a spawned one does; the child
        # sets it itself (the spec's threads). The server runs no torch op, so no OpenMP pool exists
        # before the fork to hang the child.
        self.threads = child_threads(jobs)
        self._idle: queue.SimpleQueue[ForkServer] = queue.SimpleQueue()
        self._servers: list[ForkServer] = []
        self._lock = threading.Lock()
        self._note = on_note
        self._broken = False
        """A server did not start: the rest of the run spawns (another try would fail alike)."""

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _checkout(self) -> ForkServer:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            server = ForkServer(self.modules, self.workdir)
            with self._lock:
                self._servers.append(server)
            return server

    def _discard(self, server: ForkServer) -> str:
        tail = server.stderr_tail()
        server.close()
        with self._lock:
            self._servers.remove(server)
        return tail

    def audit(self, model: ModelConfig, timeout: float, workdir: str | None = None) -> ModelOutcome:
        """Audit one model in a child forked from a warm server (the ``audit_one`` of :func:`run_models`)."""
        if self._broken:
            return audit_in_subprocess(model, timeout, workdir or self.workdir, self.threads)
        with _Files(model, self.threads) as files:  # first: a spec that cannot be written holds no server
            server = self._checkout()
            try:
                server.warm_up()
            except ServerGone:
                tail = self._discard(server)
                with self._lock:
                    first, self._broken = not self._broken, True
                if first and self._note is not None:
                    self._note("a warm worker did not start; auditing in fresh interpreters instead "
                               f"(as --isolation spawn){': ' + tail.splitlines()[-1] if tail else ''}")
                return audit_in_subprocess(model, timeout, workdir or self.workdir, self.threads)
            try:
                returncode = server.run(files, timeout)
            except ServerGone:
                tail = self._discard(server)
                return ModelOutcome(model, _incomplete(
                    model, "error", "the warm worker process stopped during this audit; rerun with "
                    "--isolation spawn", _tail(files.stderr) or tail))
            self._idle.put(server)
            return _outcome(model, returncode, timeout, files)

    def close(self) -> None:
        with self._lock:
            servers, self._servers = self._servers, []
        for server in servers:
            server.close()


# ---- the run -------------------------------------------------------------------------------------


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


def progress_mode(progress: bool | str | None) -> str:
    """``--progress`` (auto, bar, lines, off) as what is shown: ``bar``, ``lines`` or ``off``.

    ``auto``: the bar for a person at a terminal (:func:`show_progress`), else one line per
    model on stderr (a CI log). True and False mean ``bar`` and ``off``.
    """
    if progress is None or progress == "auto":
        return "bar" if show_progress() else "lines"
    if progress is True or progress is False:
        return "bar" if progress else "off"
    if progress not in PROGRESS_CHOICES:
        raise UsageError(f"--progress {progress!r}: use one of {', '.join(PROGRESS_CHOICES)}")
    return progress


def isolation_mode(isolation: str | None, on_note: Callable[[str], None] | None = None) -> str:
    """``--isolation`` as what runs here: ``fork`` falls back to ``spawn`` where it cannot run."""
    mode = isolation or "fork"
    if mode not in ISOLATION_CHOICES:
        raise UsageError(f"--isolation {mode!r}: use one of {', '.join(ISOLATION_CHOICES)}")
    if mode == "fork" and not fork_available():
        if on_note is not None:
            on_note(f"--isolation fork is not available on {sys.platform}: each model runs in a fresh "
                    "interpreter (--isolation spawn)")
        return "spawn"
    return mode


def run_models(config: RunConfig, jobs: int | None = None, timeout: float | None = None,
               progress: bool | str | None = None, workdir: str | None = None,
               audit_one: Callable[[ModelConfig, float, str | None], ModelOutcome] | None = None,
               isolation: str | None = None) -> list[ModelOutcome]:
    """Audit every model of ``config`` (``jobs`` at once); outcomes in config order.

    ``isolation`` (default: the config's): ``fork`` or ``spawn`` (see the module docstring);
    ``audit_one`` replaces both (the tests' seam). ``progress``: see :func:`progress_mode`;
    it goes to stderr, never stdout, which carries the report.
    """
    workers = jobs or config.jobs
    default_timeout = timeout or config.timeout
    models: Sequence[ModelConfig] = config.models
    outcomes: list[ModelOutcome | None] = [None] * len(models)
    at_once = max(1, min(workers, len(models)))  # the models' processes sharing the cores
    display = _display(progress_mode(config.progress if progress is None else progress), len(models))
    pool: WarmPool | None = None
    if audit_one is None:
        # the fallback is noted only when the command line asked for fork (the default is silent)
        if isolation_mode(isolation or config.isolation, _note if isolation else None) == "fork":
            pool = WarmPool(models, at_once, workdir, on_note=_note)
            audit_one = pool.audit
        else:
            audit_one = functools.partial(audit_in_subprocess, threads=child_threads(at_once))
    run_one = audit_one

    def one(index: int) -> None:
        model = models[index]
        display.started(model.label)
        started = time.monotonic()
        try:
            outcome = run_one(model, model.timeout or default_timeout, workdir)
        except Exception as exc:  # placecheck's own failure on this model must not lose the others
            outcome = ModelOutcome(model, _incomplete(
                model, "error", f"placecheck failed on this model: {one_line(exc)}"))
        outcome = replace(outcome, seconds=time.monotonic() - started)
        display.finished(outcome)
        outcomes[index] = finish(outcome)

    executor = ThreadPoolExecutor(max_workers=workers)
    try:
        for future in [executor.submit(one, i) for i in range(len(models))]:
            _wait_interruptibly(future)
    except KeyboardInterrupt:
        finished = [o for o in outcomes if o is not None]  # before the interrupt reached the children
        executor.shutdown(wait=False, cancel_futures=True)
        raise PartialRun(finished, len(models)) from None
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        display.stop()
        if pool is not None:
            pool.close()
    executor.shutdown(wait=True)
    return [o for o in outcomes if o is not None]


def _wait_interruptibly(future: Future[None]) -> None:
    """Wait for one model, waking now and then: a Ctrl-C the kernel delivers to a worker thread only
    sets Python's flag, which the main thread, blocked on a lock without a timeout, would not see until
    every model had finished (CI once saw all three outcomes of an interrupted run)."""
    while True:
        try:
            future.result(timeout=0.2)
            return
        except FuturesTimeout:
            continue


class PartialRun(KeyboardInterrupt):
    """Ctrl-C during a run of many models: the outcomes of the models that had finished (in config
    order), which the command still reports before it exits 130."""

    def __init__(self, finished: list[ModelOutcome], total: int) -> None:
        super().__init__()
        self.finished = finished
        self.total = total


# ---- progress on stderr --------------------------------------------------------------------------


def _note(message: str) -> None:
    print(f"placecheck: {message}", file=sys.stderr, flush=True)


def _describe(outcome: ModelOutcome) -> str:
    """How one model ended, in a few words: ``2 problems``, ``PC901 timeout``."""
    stopped = next((f for f in outcome.report.findings if f.code == INCOMPLETE), None)
    if stopped is not None:
        return f"{INCOMPLETE} {dict(stopped.details).get('reason', 'incomplete')}"
    return outcome.report.problem_count() if outcome.report.findings else "clean"  # the report's count


class _Display:
    """Counts models done, running and failed; shows nothing (``--progress off``)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = self.running = self.failed = 0
        self.began = time.monotonic()
        self._lock = threading.Lock()

    def started(self, label: str) -> None:
        with self._lock:
            self.running += 1
            self.show_start(label)

    def finished(self, outcome: ModelOutcome) -> None:
        with self._lock:
            self.running -= 1
            self.done += 1
            self.failed += outcome.failed
            self.show_end(outcome)

    def show_start(self, label: str) -> None:
        pass

    def show_end(self, outcome: ModelOutcome) -> None:
        pass

    def stop(self) -> None:
        pass


class _Lines(_Display):
    """One line per finished model on stderr, for CI logs (``--progress lines``)."""

    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        super().__init__(total)
        self.stream = stream

    def show_end(self, outcome: ModelOutcome) -> None:
        elapsed = time.monotonic() - self.began
        from placecheck.findings.output import stderr_text

        line = (f"placecheck: [{self.done}/{self.total}] {outcome.model.label}: {_describe(outcome)} in "
                f"{outcome.seconds:.1f} s ({self.running} running, {self.failed} failed, {elapsed:.0f} s "
                "elapsed)")
        print(stderr_text(line), file=self.stream or sys.stderr, flush=True)


def _console() -> Any:
    """The console the bar draws on: stderr (a seam for the tests)."""
    from rich.console import Console

    return Console(stderr=True)


class _Bar(_Display):
    """A rich progress bar on stderr (rich comes with typer): done/total, running, failed, elapsed."""

    def __init__(self, total: int) -> None:
        super().__init__(total)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("auditing"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[running]} running, {task.fields[failed]} failed"),
            TimeElapsedColumn(), TextColumn("{task.description}"), console=_console(), transient=True)
        self.task = self.progress.add_task("", total=total, running=0, failed=0)
        self.progress.start()

    def show_start(self, label: str) -> None:
        self.progress.update(self.task, running=self.running, description=label)

    def show_end(self, outcome: ModelOutcome) -> None:
        self.progress.update(self.task, advance=1, running=self.running, failed=self.failed,
                             description=outcome.model.label)

    def stop(self) -> None:
        self.progress.stop()


def _display(mode: str, total: int) -> _Display:
    if mode == "bar":
        return _Bar(total)
    if mode == "lines":
        return _Lines(total)
    return _Display(total)


if __name__ == "__main__":
    from placecheck.commands.worker import child_main

    sys.exit(child_main(sys.argv[1], sys.argv[2]))
