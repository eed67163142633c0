"""``placecheck.run``: a whole training or inference script on a simulated GPU.

    >>> import placecheck
    >>> report = placecheck.run("train.py", ["--epochs", "1"], steps=2)
    >>> [f.code for f in report.findings]
    ['PC201']

The script really runs (its side effects happen: files it writes are
written); ``steps`` bounds the work. CUDA is simulated with real CPU values
(:mod:`placecheck.tagged`): scripts print losses, call ``.item()`` and branch
on data, so the fake-tensor engine cannot run them; that is why this engine is
the default here. What the run finds is described in
:mod:`placecheck.run.recorder`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from placecheck.compat import torch_note
from placecheck.report import Report
from placecheck.rules import selected
from placecheck.run.script import Outcome, Program, execute, exit_status

if TYPE_CHECKING:
    from placecheck.run.lines import ScriptLines

DEFAULT_STEPS = 2


def run(target: str | Callable[[], Any], args: Sequence[str] = (), *, module: bool = False,
        steps: int = DEFAULT_STEPS, gpus: int | None = None, timeout: float | None = None,
        select: Iterable[str] | None = None, ignore: Iterable[str] | None = None,
        nproc_per_node: int | None = None) -> Report:
    """Run a script (path), a module (``module=True``: ``python -m target``) or a callable on a
    simulated GPU and report every placement problem the program meets.

    ``steps``: stop after that many ``optimizer.step()`` calls (0: run to the end).
    ``gpus``: what ``torch.cuda.device_count()`` answers (default 1, or ``nproc_per_node``).
    ``timeout``: stop after that many seconds. Stopping early is not an error; a note says where it
    stopped. ``nproc_per_node``: run the script as torchrun does, once per rank in a process of its own
    (:mod:`placecheck.run.ranks`); ``run("torch.distributed.run", ["--nproc-per-node", "2",
    "train.py"], module=True)`` is the same.
    Raises :class:`~placecheck.errors.LoadError` for a missing script or
    module or a syntax error; what the script raises is reported, not raised.
    """
    from placecheck.run.ranks import TORCHRUN_MODULE, nproc_value, run_ranks, torchrun_command

    codes = selected(select, ignore)
    if nproc_per_node is not None:
        nproc_per_node = nproc_value(str(nproc_per_node))
    if module and target == TORCHRUN_MODULE:
        target, args, module, nproc_per_node = torchrun_command(args, nproc_per_node)
    program = Program(target, tuple(args), module)
    program.check()
    if nproc_per_node is not None:
        if callable(target):
            from placecheck.errors import UsageError

            raise UsageError("nproc_per_node runs a script or a module in a process per rank: give its path "
                             "or module name, not a callable")
        return run_ranks(program, nproc_per_node, steps=steps, gpus=gpus or nproc_per_node, timeout=timeout,
                         codes=codes)
    return _simulate(program, steps=steps, gpus=gpus or 1, timeout=timeout, codes=codes)[0]


def _simulate(program: Program, *, steps: int, gpus: int, timeout: float | None, codes: frozenset[str],
              rank: tuple[int, int, int] | None = None) -> tuple[Report, list[tuple[str, str, str]]]:
    """The run in this process; ``rank``: ``(rank, world size, local rank)`` when it is one rank of a
    torchrun launch (:mod:`placecheck.run.ranks`), whose collectives and DDP GPUs are returned too."""
    from placecheck.engine import SIMULATED_CUDA_VALUES
    from placecheck.run.lines import ScriptLines
    from placecheck.run.ranks import RankChecks, launcher_note
    from placecheck.run.recorder import RunRecorder
    from placecheck.tagged import tagged_cuda

    recorder = RunRecorder(gpus=gpus, steps=steps)
    if rank is not None:
        recorder.ranks = RankChecks(recorder, *rank)
        recorder.target = str(recorder.ranks.own)
    lines = ScriptLines(program.filename)
    notes = [f"engine: CUDA simulated with real CPU values ({gpus} GPU{'s' if gpus != 1 else ''}), the "
             "default for run: scripts read values (.item(), printed losses, data-driven branches) and "
             "run backward, which fake tensors cannot; the script really runs and its side effects happen",
             torch_note()]
    with _environment_kept(), tagged_cuda(gpus), recorder.recording(), lines.watching():
        outcome = execute(program, timeout, notes)
    findings = recorder.findings()
    if outcome.error is not None:
        finding = recorder.error_finding(outcome.error)
        if finding is not None:
            findings.append(finding)
    notes.append(recorder.limit or _ending(outcome, recorder.steps, lines))
    if rank is None and launcher_note(outcome.error):
        notes.append(launcher_note(outcome.error))
    if not recorder.moves.moved_modules and not recorder.optimizers:
        notes.append("run: the script moved no module to the GPU and built no optimizer: nothing of a "
                     "training or inference loop was seen")
    notes.extend(recorder.notes)
    notes.extend(recorder.copy_notes())
    kept = [f for f in findings if f.code in codes]
    stats = {"optimizer_steps": recorder.steps, "modules_moved": len(recorder.moves.moved_modules),
             "optimizers": len(recorder.optimizers)}
    report = Report.build(program.name, recorder.target, SIMULATED_CUDA_VALUES, kept, notes, stats,
                          unfinished=_unfinished(outcome, recorder.limit))
    return report, list(recorder.ranks.uses) if recorder.ranks is not None else []


@contextlib.contextmanager
def _environment_kept() -> Iterator[None]:
    """``os.environ`` as it was before the script: what a script (or a launcher in it: Lightning sets
    ``WORLD_SIZE`` and ``MASTER_ADDR``) sets would end with its process, not leak into the next run in
    this one (where another framework would read it as a distributed launch and wait for its peers)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        if dict(os.environ) != saved:
            os.environ.clear()
            os.environ.update(saved)


def _unfinished(outcome: Outcome, limit: str) -> str:
    """Why the script did not run through, for the summary line (exit code 2 without a failing finding):
    the simulation's limit, or the script's own non-zero ``sys.exit``; "" otherwise."""
    at = f" at {outcome.line}" if outcome.line else ""
    if limit:
        return f"the simulation stopped{at}"
    if outcome.kind == "exit" and exit_status(outcome.exit_code) != 0:
        return f"sys.exit({outcome.exit_code!r}){at}"
    return ""


def _ending(outcome: Outcome, steps: int, lines: ScriptLines) -> str:
    at = f" at {outcome.line}" if outcome.line else ""
    done = f"{steps} optimizer step{'s' if steps != 1 else ''}"
    if outcome.kind == "stopped":
        again = "--steps 0 runs" if outcome.reason.startswith("after") else "a longer --timeout runs"
        unrun = lines.unrun_after_stop(outcome.stack)
        if unrun:
            return (f"run: stopped {outcome.reason}{at}; stopping early is not an error, but the code "
                    f"after it never ran, and is unchecked: {unrun}; {again} the script to its end")
        return f"run: stopped {outcome.reason}{at}; stopping early is not an error"
    if outcome.kind == "exit":
        status = exit_status(outcome.exit_code)
        if status == 0:
            return f"run: the script called sys.exit({outcome.exit_code!r}){at} after {done}"
        said = f"prints {outcome.exit_code!r} and " if not isinstance(outcome.exit_code, int) else ""
        return (f"run: the script called sys.exit({outcome.exit_code!r}){at} after {done}: python "
                f"{said}exits with status {status} there: the script did not run through (exit code 2 unless "
                "a finding fails the run)")
    if outcome.kind == "error":
        return f"run: the script raised an exception{at} after {done}"
    return f"run: the script ran to its end ({done})"


class _CallableModule(types.ModuleType):
    """``placecheck.run`` is both this package and the function: importing the package makes it the
    parent's attribute, shadowing the function, so calling the package calls :func:`run`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Report:
        return run(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["DEFAULT_STEPS", "run"]
