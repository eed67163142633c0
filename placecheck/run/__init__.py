"""``placecheck.run``: a whole training or inference script on a simulated GPU.

    >>> import placecheck
    >>> report = placecheck.run("train.py", ["--epochs", "1"], steps=2)
    >>> [f.code for f in report.findings]
    ['PC201']
    >>> from placecheck.basics.options import RunOptions
    >>> report = placecheck.run("train.py", options=RunOptions(steps=2, select=("PC2",)))

The script really runs, but never changes the user's files: its writes land
in a scratch area it reads back (:mod:`placecheck.run.scratch`); ``steps``
bounds the work. CUDA is simulated with real CPU values
(:mod:`placecheck.engines.tagged`): scripts print losses, call ``.item()`` and branch
on data, so the fake-tensor engine cannot run them; that is why this engine is
the default here. What the run finds is described in
:mod:`placecheck.run.recorder`.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from placecheck.basics.codes import Code
from placecheck.basics.errors import UsageError
from placecheck.basics.options import DEFAULT_STEPS, RunOptions
from placecheck.basics.quiet import quiet
from placecheck.engines import classify
from placecheck.engines.calls import device_of
from placecheck.engines.compat import FAKE_TENSOR_LOGGER, torch_note
from placecheck.findings.report import NOTHING_CHECKED, Report
from placecheck.findings.rules import selected
from placecheck.run.script import (
    Outcome,
    Program,
    RunInterrupted,
    Watchdog,
    execute,
    exit_status,
    exited,
    raised,
    user_traceback,
    watchdog_seconds,
)

if TYPE_CHECKING:
    from placecheck.run.children import Children
    from placecheck.run.fastforward import FastForward
    from placecheck.run.lines import ScriptLines
    from placecheck.run.recorder import RunRecorder


NO_FAST_FORWARD = "PLACECHECK_NO_FAST_FORWARD"
"""Set (to anything), the run stops at the ``--steps`` budget instead of fast-forwarding: what
``benchmarks/bench_fast_forward.py`` measures the fast-forward against."""


def run(target: str | Callable[[], Any], args: Sequence[str] = (), *, options: RunOptions | None = None,
        module: bool = False, steps: int = DEFAULT_STEPS, gpus: int | None = None,
        timeout: float | None = None, select: Iterable[str] | None = None,
        ignore: Iterable[str] | None = None, engine: str = "auto",
        memory: int | str | None = None, nproc_per_node: int | None = None,
        keep_scratch: bool = False) -> Report:
    """Run a script (path), a module (``module=True``: ``python -m target``) or a callable on a
    simulated GPU and report every placement problem the program meets.

    ``steps``: after that many ``optimizer.step()`` calls skip the rest of the training loop and run the
    rest of the script (:mod:`placecheck.run.fastforward`; 0: run every iteration).
    ``gpus``: what ``torch.cuda.device_count()`` answers (default 1, or ``nproc_per_node``).
    ``timeout``: stop after that many seconds. Stopping early is not an error; a note says where it
    stopped. ``engine``: ``tagged`` (real values on the CPU), ``fake`` (fake tensors: a job of any
    size) or ``auto``: fake when a real-valued step would hold more than ``memory`` bytes (default:
    2 GiB or half the memory available; ``PLACECHECK_RUN_MEMORY``), see :mod:`placecheck.run.auto`.
    ``nproc_per_node``: run the script as torchrun does, once per rank in a process of its own
    (:mod:`placecheck.run.ranks`); ``run("torch.distributed.run", ["--nproc-per-node", "2",
    "train.py"], module=True)`` is the same.
    The user's files are never changed: every write of the script lands in a scratch area it reads back
    (:mod:`placecheck.run.scratch`), which ``keep_scratch`` keeps after the run; the report's ``writes``
    list what it wrote and where each went.
    The keywords are the fields of :class:`~placecheck.basics.options.RunOptions`; ``options=``
    passes a whole options object instead (then give no other keyword), as ``placecheck run``
    does. Raises :class:`~placecheck.basics.errors.UsageError` for bad options and
    :class:`~placecheck.basics.errors.LoadError` for a missing script or
    module or a syntax error; what the script raises is reported, not raised. Ctrl-C during the script
    raises :class:`~placecheck.run.script.RunInterrupted` (a KeyboardInterrupt) whose ``report`` holds
    what was found until then.
    """
    from placecheck.engines import cudaapi
    from placecheck.run.ranks import TORCHRUN_MODULE, torchrun_command

    given = RunOptions(module=module, steps=steps, gpus=gpus, timeout=timeout,  # lists and strings too
                       select=select, ignore=ignore, engine=engine,  # type: ignore[arg-type]
                       memory=memory, nproc_per_node=nproc_per_node, keep_scratch=keep_scratch)
    if options is None:
        options = given
    elif given != RunOptions():
        raise UsageError("run(): pass options= or keyword arguments, not both")
    options.check()
    codes = selected(options.select, options.ignore)
    if options.module and target == TORCHRUN_MODULE:
        target, args, module, nproc = torchrun_command(args, options.nproc_per_node)
        options = options.replace(module=module, nproc_per_node=nproc,
                                  gpus=options.gpus if gpus is not None else nproc)
    if options.engine == "fake" and cudaapi.CPU_ONLY_BUILD:
        raise UsageError("--engine fake needs torch built with CUDA support (autograd on fake CUDA tensors); "
                         "this torch is a CPU-only build: use --engine tagged")
    program = Program(target, tuple(args), options.module)
    program.check()
    if options.nproc_per_node is not None and callable(target):
        raise UsageError("nproc_per_node runs a script or a module in a process per rank: give its path "
                         "or module name, not a callable")
    return _protected(program, options, codes)


def _protected(program: Program, options: RunOptions, codes: frozenset[str]) -> Report:
    """The run with the script's writes in a scratch area (:mod:`placecheck.run.scratch`), never in the
    user's files; the report says what it wrote, and what got past the scratch area."""
    from placecheck.run import scratch
    from placecheck.run.ranks import run_ranks
    from placecheck.run.redirect import protected

    session = scratch.start(program.filename, options.keep_scratch)
    try:
        with protected(session.overlay) if session is not None else contextlib.nullcontext():
            if options.nproc_per_node is not None:
                # each rank keeps real values: DDP reads its parameters' data when it is built, which the
                # fake engine has not (auto would switch a large model to fake tensors and fail there)
                report = run_ranks(program, options.replace(engine="tagged"), codes)
            else:
                report = _simulate(program, options, codes)[0]
        if session is None:
            return report
        return session.reported(report)
    except RunInterrupted as stop:  # what was found so far, with the writes until then
        if session is not None:
            stop.report = session.reported(stop.report)
        raise
    finally:
        if session is not None:
            session.close()


def _simulate(program: Program, options: RunOptions, codes: frozenset[str],
              rank: tuple[int, int, int] | None = None) -> tuple[Report, list[tuple[str, str, str]]]:
    """The run in this process; ``rank``: ``(rank, world size, local rank)`` when it is one rank of a
    torchrun launch (:mod:`placecheck.run.ranks`), whose collectives and DDP GPUs are returned too."""
    from placecheck.engines import cudaapi
    from placecheck.engines.engine import SIMULATED_CUDA, SIMULATED_CUDA_VALUES
    from placecheck.run.children import Children
    from placecheck.run.coverage import coverage_of
    from placecheck.run.fastforward import FastForward
    from placecheck.run.lines import ScriptLines
    from placecheck.run.ranks import RankChecks, launcher_note
    from placecheck.run.recorder import RunRecorder
    from placecheck.run.scratch import restarted

    gpus, steps, timeout = options.gpu_count, options.steps, options.timeout
    choice, memory = options.engine, options.memory
    cpu_only = cudaapi.CPU_ONLY_BUILD
    plural = "s" if gpus != 1 else ""
    notes: list[str] = []
    probe = None
    assumed: list[str] = []

    checks: list[RankChecks] = []  # the rank's checks of the newest recorder
    kids: list[Children] = []  # the child processes of the newest recorder's run

    def new_recorder() -> tuple[RunRecorder, ScriptLines]:
        recorder = RunRecorder(gpus=gpus, steps=steps)
        if rank is not None:
            checks[:] = [RankChecks(recorder, *rank)]
            recorder.ranks = checks[0]
            recorder.target = device_of(checks[0].own)
        lines = ScriptLines(program.filename)
        if steps and not os.environ.get(NO_FAST_FORWARD):
            # a callable runs as it is: only its DataLoaders fast-forward
            recorder.fastforward = FastForward(program.filename, lines=lines)
        kids[:] = [Children(recorder, lines, gpus, steps)]
        return recorder, lines

    recorder, lines = new_recorder()
    if choice in ("tagged", "auto"):
        from placecheck.engines.tagged import tagged_cuda

        if choice == "tagged":
            # a rank of --nproc-per-node runs so whatever --engine said (run_ranks: DDP reads its data)
            why = "requested with --engine tagged" if rank is None else \
                "as every rank of --nproc-per-node runs"
            notes.append(f"engine: CUDA simulated with real CPU values ({gpus} GPU{plural}), {why}: the "
                         "losses, .item() and data-driven branches the script reads are its real values; the "
                         "script really runs, its writes kept in a scratch area, never in your files")
        with contextlib.ExitStack() as stack:
            if choice == "auto" and cpu_only:
                notes.append(f"engine: CUDA simulated with real CPU values ({gpus} GPU{plural}): --engine "
                             "auto keeps real values on a CPU-only build of torch (the fake engine of run "
                             "needs CUDA support); the script really runs, its writes kept in a scratch "
                             "area, never in your files")
            elif choice == "auto":
                from placecheck.run.auto import Probe, memory_budget, random_state_kept

                probe = recorder.probe = Probe(*memory_budget(memory))
                stack.enter_context(random_state_kept())
                stack.enter_context(probe.capturing())
            with _environment_kept(), tagged_cuda(gpus), recorder.recording(), lines.watching(), \
                    kids[0].watching("tagged"):
                outcome = execute(program, timeout, notes, _rewritten(recorder), _watchdog(recorder))
            if probe is not None and probe.decided != "fake":
                probe.done()
                notes.insert(0, probe.note(f"{gpus} GPU{plural}"))
            if probe is None or probe.decided != "fake":
                choice = "tagged"
        if probe is not None and probe.decided == "fake":
            del outcome
            notes = [probe.note()]
            restarted()  # the script starts over: its writes so far discarded
            recorder, lines = new_recorder()
            gc.collect()  # the abandoned attempt's tensors
            choice = "fake"
    if choice == "fake":
        notes.append(f"engine: CUDA simulated with fake tensors ({gpus} GPU{plural}), "
                     f"{'requested with --engine fake' if probe is None else 'chosen by --engine auto'}: the "
                     "model's parameters, activations and optimizer state hold no data; values the script "
                     "reads on the host are known ones or assumed (a note each); the script really runs, its "
                     "writes kept in a scratch area, never in your files")
        measured = None
        if probe is not None:  # auto: what a real-valued step would hold, measured under fake tensors
            from placecheck.run.auto import Probe

            measured = recorder.probe = Probe(1 << 62, "measured under the fake engine")
        outcome, assumed = _run_fake(program, recorder, lines, gpus, timeout, notes, kids[0])
        finding = recorder.error_finding(outcome.error) if outcome.error is not None else None
        if measured is not None and recorder.limit and outcome.kind != "interrupted":
            # the fake engine cannot go on here (code that needs a CUDA driver, a value it cannot give):
            # auto does not give up while real values fit in memory
            from placecheck.engines.tagged import tagged_cuda
            from placecheck.run.auto import fallback_note, real_values_fit

            fits, room = real_values_fit(measured.estimate)
            notes.insert(1, fallback_note(recorder.limit, measured.estimate, room, fits))
            if fits:
                notes = notes[:2]
                del outcome
                restarted()
                recorder, lines = new_recorder()
                assumed = []
                gc.collect()  # the fake run's tensors
                with _environment_kept(), tagged_cuda(gpus), recorder.recording(), lines.watching(), \
                        kids[0].watching("tagged"):
                    outcome = execute(program, timeout, notes, _rewritten(recorder), _watchdog(recorder))
                finding = recorder.error_finding(outcome.error) if outcome.error is not None else None
                choice = "tagged"
    elif outcome.error is not None:
        finding = recorder.error_finding(outcome.error)
    notes.insert(1, torch_note())
    device_name = SIMULATED_CUDA_VALUES if choice == "tagged" else SIMULATED_CUDA
    findings = recorder.findings()
    for child_finding in kids[0].findings():  # once per code, line and place, as the recorder keeps them
        if all((f.code, f.source, f.where) != (child_finding.code, child_finding.source, child_finding.where)
               for f in findings):
            findings.append(child_finding)
    own_error = None
    if outcome.error is not None:
        if finding is not None and finding.code == Code.PC207 and not classify.is_device_error(outcome.error):
            # the script's own bug (a KeyError in its config), not a placement finding: the run did not
            # run through, and says so (exit code 2), with the script's own frames of the traceback
            finding, own_error = None, outcome.error
        if finding is not None:
            findings.append(finding)
    notes.append(recorder.limit or _ending(outcome, recorder.steps, lines, own_error is not None,
                                           recorder.fastforward))
    if recorder.fastforward is not None:
        notes.extend(recorder.fastforward.notes(f"{steps} optimizer step{'s' if steps != 1 else ''}"))
    if rank is None and launcher_note(outcome.error):
        notes.append(launcher_note(outcome.error))
    if not recorder.moves.moved_modules and not recorder.optimizers:
        notes.append("run: the script moved no module to the GPU and built no optimizer: nothing of a "
                     "training or inference loop was seen")
    notes.extend(recorder.notes)
    notes.extend(recorder.copy_notes())
    notes.extend(assumed)
    kept = [f for f in findings if f.code in codes]
    stats = {"optimizer_steps": recorder.steps, "modules_moved": len(recorder.moves.moved_modules),
             "optimizers": len(recorder.optimizers), "forward_passes": recorder.forward_passes,
             "device_ops": recorder.device_ops}
    lost = kids[0].add_to(stats, notes)  # their lines too, before the coverage
    covered = coverage_of(lines.filename, lines.executed) if lines.measured and lines.filename else None
    unfinished = "; ".join(u for u in (_unfinished(outcome, recorder.limit, own_error), lost) if u) \
        or _unchecked(outcome, stats)
    report = Report.build(program.name, recorder.target, device_name, kept, notes, stats,
                          unfinished=unfinished,
                          script_traceback=user_traceback(own_error) if own_error is not None else (),
                          coverage=covered)
    if outcome.kind == "interrupted":
        raise RunInterrupted(report)
    return report, list(checks[0].uses) if checks else []


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



def _run_fake(program: Program, recorder: RunRecorder, lines: ScriptLines, gpus: int,
              timeout: float | None, notes: list[str], children: Children) -> tuple[Outcome, list[str]]:
    """The program under the fake engine (:mod:`placecheck.run.fake`); its outcome and assumptions."""
    import torch

    from placecheck.engines.compat import FakeTensor
    from placecheck.engines.datadep import on_host
    from placecheck.run.fake import fake_cuda

    recorder.host_types = (torch.Tensor, FakeTensor)
    recorder.loaders_in_process = True
    recorder.fake_engine = True
    recorder.host_data = on_host
    with _environment_kept(), quiet(FAKE_TENSOR_LOGGER), fake_cuda(gpus) as datadep, recorder.recording(), \
            lines.watching(), children.watching("fake"):
        datadep.host_values = True  # a dataset's data read from files stays real, as on the host of a GPU
        outcome = execute(program, timeout, notes, _rewritten(recorder), _watchdog(recorder))
    return outcome, datadep.notes(phase="run")


def _rewritten(recorder: RunRecorder) -> tuple[types.CodeType, dict[str, Any]] | None:
    """The script's code with its loops rewritten for the fast-forward, and the globals it needs."""
    ff = recorder.fastforward
    return (ff.code, ff.script_globals()) if ff is not None and ff.code is not None else None


def _watchdog(recorder: RunRecorder) -> Watchdog | None:
    """The run's :class:`~placecheck.run.script.Watchdog`, given to its fast-forward, which arms it when the
    budget is spent; None without a fast-forward or when ``PLACECHECK_WATCHDOG`` is 0."""
    ff, seconds = recorder.fastforward, watchdog_seconds()
    if ff is None or seconds <= 0:
        return None
    watchdog = Watchdog(seconds, ff.progress)
    ff.watchdog = watchdog
    return watchdog


def _unfinished(outcome: Outcome, limit: str, own_error: BaseException | None) -> str:
    """Why the script did not run through, for the summary line (exit code 2 without a failing finding):
    the simulation's limit, the script's own exception (not a device error) or its own non-zero
    ``sys.exit``; "" otherwise."""
    at = f" at {outcome.line}" if outcome.line else ""
    if outcome.kind == "interrupted":
        return f"interrupted by Ctrl-C{at}"
    if limit:
        return f"the simulation stopped{at}"
    if outcome.kind == "stopped" and outcome.unfinished:
        return f"stopped {outcome.reason.partition(': ')[0]}{at}"
    if own_error is not None:
        return raised(own_error, outcome.line)
    if outcome.kind == "exit" and exit_status(outcome.exit_code) != 0:
        return exited(outcome.exit_code, outcome.line)
    return ""


def _unchecked(outcome: Outcome, stats: dict[str, int]) -> str:
    """Why a run that ended without an error checked nothing (exit code 2 all the same, ``--exit-zero``
    included: a pre-flight check must not pass what it never looked at), "" when it checked something.

    Decided from what the recorder counted, never from why the script stopped: no forward pass and no
    optimizer step before a ``sys.exit(0)`` (argparse's ``--help`` is one) or a ``--timeout`` stop, or no
    module moved and no torch call on a simulated GPU at all (a script that runs on the CPU by design). An
    inference script (forwards on the GPU, no optimizer) checked its forwards, and passes."""
    forwards, steps = stats.get("forward_passes", 0), stats.get("optimizer_steps", 0)
    counted = f"{forwards} forward pass{'es' if forwards != 1 else ''}, {steps} optimizer step" \
              f"{'s' if steps != 1 else ''}"
    at = f" at {outcome.line}" if outcome.line else ""
    if outcome.kind == "error":  # a device error the script raised: a finding, it checked that much
        return ""
    if outcome.kind in ("exit", "stopped") and not forwards and not steps:
        how = f"at sys.exit({outcome.exit_code!r}){at}" if outcome.kind == "exit" else f"{outcome.reason}{at}"
        return f"the script stopped {how}, before any forward pass: {counted}{NOTHING_CHECKED}"
    if not stats.get("device_ops", 0) and not stats.get("modules_moved", 0):
        where = ", all on the CPU" if forwards or steps else ""
        return f"the script ran no op on a simulated GPU ({counted}{where}){NOTHING_CHECKED}"
    return ""


def _ending(outcome: Outcome, steps: int, lines: ScriptLines, own_error: bool = False,
            ff: FastForward | None = None) -> str:
    at = f" at {outcome.line}" if outcome.line else ""
    done = f"{steps} optimizer step{'s' if steps != 1 else ''}"
    if outcome.kind == "interrupted":  # the fast-forward's story would say the rest of the script ran
        unrun = lines.unrun_after_stop(outcome.stack)
        left = f": {unrun}" if unrun else ""
        return (f"run: interrupted by Ctrl-C{at}, after {done}: the findings are those made until then, the "
                f"code after it is unchecked{left}")
    if ff is not None and ff.on:
        done = (f"{done}, the last {steps - ff.budget} after a fast-forward from {ff.began_at} (--steps "
                f"{ff.budget}): the rest of the training loop skipped, the rest of the script run; --steps 0 "
                "runs every iteration") if steps > ff.budget else (
            f"{done}, then a fast-forward from {ff.began_at} (--steps {ff.budget}): the rest of the training "
            "loop skipped, the rest of the script run; --steps 0 runs every iteration")
    if outcome.kind == "stopped":
        again = "--steps 0 runs" if outcome.reason.startswith("after") else "a longer --timeout runs"
        unrun = lines.unrun_after_stop(outcome.stack)
        if outcome.unfinished:  # the watchdog: the script did not run through
            left = f": {unrun}" if unrun else ""
            head, _, why = outcome.reason.partition(": ")
            return (f"run: stopped {head}{at}: {why}; after {done}: the script did not run through, the code "
                    f"after it is unchecked{left} (exit code 2 unless a finding fails the run)")
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
    if outcome.kind == "error" and own_error and outcome.error is not None:
        return (f"run: {raised(outcome.error, outcome.line)}, after {done}: an error of the script's own, "
                "not a placement problem; the script did not run through, the rest is unchecked (exit code 2 "
                "unless a finding fails the run)")
    if outcome.kind == "error":
        return f"run: the script raised an exception{at} after {done}"
    return f"run: the script ran to its end ({done})"


class _CallableModule(types.ModuleType):
    """``placecheck.run`` is both this package and the function: importing the package makes it the
    parent's attribute, shadowing the function, so calling the package calls :func:`run`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Report:
        return run(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        """:func:`run`'s, for ``inspect.signature(placecheck.run)`` and ``help``, whichever of the two
        ``placecheck.run`` is at the moment."""
        return inspect.signature(run)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["DEFAULT_STEPS", "run"]
