"""Child processes of the script under the simulation: ``multiprocessing``/``torch.multiprocessing``
``Process`` (a Hogwild model shared with ``share_memory()``) and ``torch.multiprocessing.spawn``.

A child runs the target the script gave it, and its placement problems are the script's: they are
checked there and brought back into the one report, as :mod:`placecheck.run.ranks` brings the ranks'
reports back.

- ``Process.start`` is patched for the run (:meth:`Children.watching`): the target becomes a
  :class:`ChildTarget` (picklable, it wraps the script's target), which runs it under the recorder of
  its process and writes what it found to ``child-PID.json`` in the run's directory: the findings, the
  counts (optimizer steps, forward passes, ops on a simulated GPU), the lines of the script that ran
  and how the target ended (its own error, a limit of the simulation).
- Under the ``fork`` start method the child inherits the parent's simulation (its engine, its recorder,
  its hooks); the target forgets what the parent recorded before it forked and records its own.
- Under ``spawn`` (``mp.spawn`` uses it) the child is a fresh interpreter: its command line is
  placecheck's bootstrap (:func:`spawned_main`), which installs the engine and a recorder before
  multiprocessing's own ``spawn_main`` imports the script (as ``__mp_main__``) and unpickles the
  process. A model on the real-valued engine's simulated GPU crosses as ``SimulatedTensor`` (its
  storage shared as torch shares a CPU tensor's), rebuilt as a leaf on the same simulated device
  (:func:`_reduce_simulated`). The fake engine's tensors have no data to send: a spawned child under
  ``--engine fake`` is a limit of the simulation (a note; ``auto`` runs it again with real values);
  so is the ``forkserver`` start method, whose server is started outside the simulation.

A child whose target raised an error of its own (not a device error, which is a finding), or that
ended without its report, leaves the run unfinished (exit code 2): its work is unchecked.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from placecheck.engines.compat import make_subclass
from placecheck.run.session import StopRun

if TYPE_CHECKING:
    from placecheck.findings.finding import Finding
    from placecheck.run.lines import ScriptLines
    from placecheck.run.recorder import RunRecorder

_LIVE: list[_Session] = []
"""The simulation of this process (a run's parent, a child forked from it, or a spawned child's
bootstrap): what a :class:`ChildTarget` runs under. One at a time (the recorder is not reentrant)."""

COUNTS = ("optimizer_steps", "forward_passes", "device_ops")
"""The recorder's counts a child adds to the run's stats."""


@dataclass
class _Session:
    """The simulation a target runs under in this process, and where children write their results."""

    recorder: RunRecorder
    lines: ScriptLines | None
    directory: str
    engine: str = "tagged"
    pid: int = field(default_factory=os.getpid)
    counted: dict[str, int] = field(default_factory=dict)
    """The recorder's counts when this process's target began (a forked child inherits its parent's)."""


def _counts(recorder: RunRecorder) -> dict[str, int]:
    return {"optimizer_steps": recorder.steps, "forward_passes": recorder.forward_passes,
            "device_ops": recorder.device_ops}


class ChildTarget:
    """The script's target of a child process, run under the simulation of the child's process; what it
    found is written to the run's directory. Picklable when the target is (``spawn`` sends it)."""

    def __init__(self, target: Callable[..., Any], name: str, cuda_in_parent: bool = False) -> None:
        self.target = target
        self.name = name
        self.cuda_in_parent = cuda_in_parent
        """The parent had put tensors on the simulated GPU when it started the child (CUDA initialised)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not _LIVE:  # a grandchild of a child that started outside the simulation: run as it is
            return self.target(*args, **kwargs)
        session = _LIVE[-1]
        refusal: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if session.pid != os.getpid():  # forked: the parent's simulation, the child's own records
            _forget_parent(session)
            if session.engine == "fake" and self.cuda_in_parent:
                # CUDA refuses a process forked after its parent initialised it; the real-valued engine
                # raises so itself (placecheck.engines.cudaapi), the fake engine does not track it
                from placecheck.engines.dispatch import subscribed

                refusal = subscribed(_no_cuda_after_fork)
        ended = "end"
        error: BaseException | None = None
        try:
            with refusal:
                return self.target(*args, **kwargs)
        except StopRun as stop:  # --steps or --timeout in the child: stopping early is not an error
            ended = f"stopped {stop}"
            return None
        except SystemExit as exc:
            ended = "exit"
            if exc.code not in (None, 0):
                # mp.spawn's wrapper catches the target's exception and exits with status 1: the exception
                # it handled is the one to report
                handled = exc.__context__
                error = handled if isinstance(handled, Exception) else exc
            raise
        except BaseException as exc:
            ended, error = "error", exc
            raise
        finally:
            _write_result(session, self.name, ended, error)


def _no_cuda_after_fork(call: Any) -> Any:
    """A dispatcher handler: CUDA's error for the first call that makes a tensor on the GPU (a move there,
    a factory's ``device="cuda"``), where the real-valued engine raises it."""
    placement = call.placement
    if placement is not None and placement.to_cuda:
        from placecheck.engines.classify import FORKED_CUDA, ForkedCudaError

        raise ForkedCudaError(FORKED_CUDA)
    return call.run()


def _forget_parent(session: _Session) -> None:
    """In a forked child: what the parent recorded before the fork is the parent's report's."""
    import torch

    # the simulation runs the GPU's kernels on the CPU: a parent whose OpenMP thread pool ran (its own
    # CPU-run ops, or a test suite's) leaves a forked child that would hang in its first parallel op, where
    # the GPU job's child runs its kernels on the GPU; one thread has no pool to hang in
    torch.set_num_threads(1)
    recorder = session.recorder
    # forked inside Process.start, where the parent's pickling was quieted: the target is the script's
    recorder._quiet = 0
    recorder.found.clear()
    recorder.syncs.clear()
    recorder.copies.clear()
    recorder.notes.clear()
    if session.lines is not None:
        session.lines.executed.clear()
    session.counted = _counts(recorder)
    session.pid = os.getpid()


def _write_result(session: _Session, name: str, ended: str, error: BaseException | None) -> None:
    """The child's findings, counts, lines run and ending, as JSON in the run's directory."""
    from placecheck.basics.codes import Code
    from placecheck.engines import classify
    from placecheck.engines.sources import user_line
    from placecheck.run.script import exit_status, exited, raised

    recorder = session.recorder
    findings: list[Finding] = recorder.findings()
    unfinished = ""
    if isinstance(error, SystemExit):
        unfinished = exited(error.code, user_line(error))
        if exit_status(error.code) == 0:
            unfinished = ""
    elif error is not None:
        finding = recorder.error_finding(error)
        if finding is not None and finding.code == Code.PC207 and not classify.is_device_error(error):
            finding, unfinished = None, raised(error, user_line(error))
        if finding is not None:
            findings.append(finding)
        elif recorder.limit:
            unfinished = f"the simulation stopped at {user_line(error) or 'an unknown line'}"
    counts = {k: v - session.counted.get(k, 0) for k, v in _counts(recorder).items()}
    result = {"name": name, "pid": os.getpid(), "ended": ended, "unfinished": unfinished,
              "limit": recorder.limit, "findings": [f.to_dict() for f in findings],
              "notes": list(recorder.notes), "counts": counts,
              "lines": sorted(session.lines.executed) if session.lines is not None else []}
    path = os.path.join(session.directory, f"child-{os.getpid()}.json")
    with open(path + ".part", "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    os.replace(path + ".part", path)


# -- SimulatedTensor across a spawn ------------------------------------------------------------------------

def _reduce_simulated(t: Any) -> tuple[Any, ...]:
    """How ``multiprocessing`` sends a real-valued engine's tensor: its data as a plain CPU tensor (whose
    storage torch shares, as it shares any CPU tensor's), its simulated device and ``requires_grad``.

    Without this, pickling falls back to ``Tensor.__reduce_ex__``, whose rebuild is ``as_subclass`` of
    the plain tensor: an alias attached to autograd's graph, so a parameter that required grad arrives
    as a non-leaf tensor, and the child's optimizer refuses it ("can't optimize a non-leaf Tensor")."""
    import torch

    from placecheck.engines.compat import DisableTorchFunctionSubclass

    with DisableTorchFunctionSubclass():
        plain = t.as_subclass(torch.Tensor).detach()
        state = {k: v for k, v in t.__dict__.items() if k != "_pc_device"}
        return _rebuild_simulated, (plain, str(t._pc_device), t.requires_grad, state)


def _rebuild_simulated(plain: Any, device: str, requires_grad: bool, state: dict[str, Any]) -> Any:
    """The tensor :func:`_reduce_simulated` sent: a leaf on its simulated device, sharing the data."""
    import torch

    from placecheck.engines.tagged import SimulatedTensor

    t = make_subclass(SimulatedTensor, plain, requires_grad)
    t._pc_device = torch.device(device)
    for key, value in state.items():  # a parameter's mark (_is_param) among them
        setattr(t, key, value)
    return t


@contextlib.contextmanager
def _simulated_tensors_sent() -> Iterator[None]:
    from multiprocessing.reduction import ForkingPickler

    from placecheck.engines.tagged import SimulatedTensor

    reducers = ForkingPickler._extra_reducers  # type: ignore[attr-defined]
    before = reducers.get(SimulatedTensor)
    ForkingPickler.register(SimulatedTensor, _reduce_simulated)
    try:
        yield
    finally:
        if before is None:
            reducers.pop(SimulatedTensor, None)
        else:
            reducers[SimulatedTensor] = before


def _tensor_class() -> type:
    import torch

    return torch.Tensor


def _shared_on_device(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.share_memory_`` under the fake engine: a no-op for a tensor on a GPU, as CUDA's storage
    makes it (its memory is shared through CUDA's IPC when sent); the fake tensor's storage would refuse
    it as a CPU storage it is not."""
    def share_memory_(t: Any) -> Any:
        if t.device.type == "cuda":
            return t
        return original(t)
    return share_memory_


# -- the parent -------------------------------------------------------------------------------------------

class Children:
    """The script's child processes in one run: started under the simulation, their results read back."""

    def __init__(self, recorder: RunRecorder, lines: ScriptLines, gpus: int, steps: int) -> None:
        self.recorder = recorder
        self.lines = lines
        self.engine = "tagged"
        self.gpus = gpus
        self.steps = steps
        self.started: list[tuple[Any, str]] = []
        """(process, its target's name) of each child started."""
        self.directory = ""

    @contextlib.contextmanager
    def watching(self, engine: str) -> Iterator[Children]:
        """``Process.start`` patched for the run: each child runs its target under the simulation."""
        from multiprocessing import process, spawn

        from placecheck.run import scratch
        from placecheck.run.patches import patched

        self.engine = engine
        # under the run's scratch area: a rank killed at Ctrl-C leaves nothing behind in the temp folder
        with tempfile.TemporaryDirectory(prefix="placecheck-children-", dir=scratch.area()) as directory, \
                contextlib.ExitStack() as stack:
            self.directory = directory
            with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
                json.dump({"engine": engine, "gpus": self.gpus, "steps": self.steps,
                           "script": self.lines.filename, "directory": directory,
                           # placecheck run prints the script's output to stderr (stdout is the report's)
                           "stdout_to_stderr": sys.stdout is sys.stderr},
                          handle)
            # a spawned child protects the user's files as this process does
            os.environ.update(scratch.child_environment())
            stack.enter_context(patched([
                (process.BaseProcess, "start", self._start),
                (spawn, "get_command_line", self._command_line),
            ]))
            if engine == "tagged":
                stack.enter_context(_simulated_tensors_sent())
            else:
                stack.enter_context(patched([(_tensor_class(), "share_memory_", _shared_on_device)]))
            _LIVE.append(_Session(self.recorder, self.lines, directory, engine))
            try:
                yield self
            finally:
                _LIVE.pop()
                self._read()

    def _start(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from multiprocessing import process

        children = self

        def start(proc: Any) -> None:
            method = getattr(proc, "_start_method", None) or multiprocessing.get_start_method()
            target = getattr(proc, "_target", None)
            name = _target_name(target, getattr(proc, "_args", ())) or type(proc).__name__
            if method == "forkserver" or (method == "spawn" and children.engine != "tagged"):
                from placecheck.engines.sources import here

                line = here()[0] or "an unknown line"
                why = ("the forkserver start method forks its children from a server started outside the "
                       "simulation" if method == "forkserver" else
                       "the fake engine's tensors hold no data a spawned child could receive; --engine "
                       "tagged (real values) runs it")
                children.recorder.limit = (f"run: stopped at {line}: the script starts a child process "
                                           f"({name}) with the {method} start method: {why}; a limit of "
                                           "placecheck's simulated GPU, not a bug of the code")
                raise StopRun(f"at a child process started with {method}")
            cuda = children.recorder.device_ops > 0
            if target is not None:
                proc._target = ChildTarget(target, name, cuda_in_parent=cuda)
            elif method == "fork" and type(proc).run is not process.BaseProcess.run:
                # a Process subclass's own run(): the forked child calls it through the instance
                proc.run = ChildTarget(proc.run, type(proc).__qualname__, cuda_in_parent=cuda)
            children.started.append((proc, name))
            with children.recorder.quiet():  # pickling the process's arguments is not the script's work
                original(proc)
        return start

    def _command_line(self, original: Callable[..., Any]) -> Callable[..., Any]:
        directory = self

        def get_command_line(**kwds: Any) -> list[str]:
            from multiprocessing import spawn, util

            config = os.path.join(directory.directory, "config.json")
            given = ", ".join(f"{k}={v!r}" for k, v in kwds.items())
            prog = (f"import sys; sys.path.insert(0, {_placecheck_path()!r}); "
                    f"from placecheck.run.children import spawned_main; spawned_main({config!r}, {given})")
            flags = util._args_from_interpreter_flags()  # type: ignore[attr-defined]
            return [spawn.get_executable(), *flags, "-c", prog,
                    "--multiprocessing-fork"]
        return get_command_line

    def _read(self) -> None:
        """The children's results, once the script has ended (it joins them; one still running is
        waited for a moment)."""
        self.results: list[dict[str, Any]] = []
        self.lost: list[str] = []
        for proc, name in self.started:
            daemon = bool(getattr(proc, "daemon", False))
            # Python joins a child at exit as well; a daemon (a DataLoader's worker) ends with its owner
            if not daemon:
                with contextlib.suppress(Exception):
                    proc.join(timeout=30)
            path = os.path.join(self.directory, f"child-{proc.pid}.json")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as handle:
                    self.results.append(json.load(handle))
                continue
            status = proc.exitcode
            if status is None and not daemon:
                self.lost.append(f"a child process ({name}, pid {proc.pid}) was still running at the "
                                 "script's end: its work is unchecked")
            elif status is not None and (status > 0 or (status < 0 and not daemon)):
                # (a daemon its owner terminated, as a DataLoader shuts its workers down, lost nothing)
                self.lost.append(f"a child process ({name}, pid {proc.pid}) ended without its report "
                                 f"(exit status {status}): its work is unchecked")

    # -- into the report ----------------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        from placecheck.findings.formats.json import finding_from_dict

        return [finding_from_dict(f) for r in getattr(self, "results", []) for f in r["findings"]]

    def add_to(self, stats: dict[str, int], notes: list[str]) -> str:
        """The children's counts added to ``stats``, their notes to ``notes`` and their lines to the
        script's; why the run is unfinished because of them ("" when it is not)."""
        results = getattr(self, "results", [])
        if self.started:
            stats["child_processes"] = len(self.started)
        reasons: list[str] = []
        for r in results:
            for key in COUNTS:
                stats[key] = stats.get(key, 0) + int(r["counts"].get(key, 0))
            self.lines.executed.update(r["lines"])
            who = f"child process {r['name']} (pid {r['pid']})"
            for note in r["notes"]:
                notes.append(f"{who}: {note}")
            if r["limit"]:
                notes.append(f"{who}: {r['limit']}")
            if r["unfinished"]:  # "the script raised KeyError at ...": the child's target did
                reasons.append(f"{who} {r['unfinished'].removeprefix('the script ')}")
        for text in self.lost:
            reasons.append(text)
        if self.started:
            steps = sum(int(r["counts"].get("optimizer_steps", 0)) for r in results)
            forwards = sum(int(r["counts"].get("forward_passes", 0)) for r in results)
            many = len(self.started)
            notes.append(f"run: {many} child process{'es' if many != 1 else ''} ran under the simulation "
                         f"(multiprocessing), with {steps} optimizer step{'s' if steps != 1 else ''} and "
                         f"{forwards} forward pass{'es' if forwards != 1 else ''} among them; their "
                         "findings, counts and lines are in this report")
        return "; ".join(reasons)


def _target_name(target: Any, args: Any) -> str:
    """How a child is named: its target's name, or for a library's wrapper of the script's function
    (``mp.spawn`` starts ``torch.multiprocessing``'s ``_wrap(fn, i, ...)``) that function's."""
    from placecheck.engines.sources import is_internal, library_package

    code = getattr(target, "__code__", None)
    if code is not None and (library_package(code) or is_internal(code)) and args and callable(args[0]):
        target = args[0]
    return str(getattr(target, "__qualname__", "") or "")


def _placecheck_path() -> str:
    """The directory placecheck is imported from, for a spawned child's ``sys.path``."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spawned_main(config_path: str, **kwds: Any) -> None:
    """A spawned child's bootstrap (its ``python -c``): the run's engine and a recorder installed, the
    user's files protected as in the parent, then multiprocessing's own ``spawn_main``."""
    from placecheck.run.fastforward import FastForward
    from placecheck.run.lines import ScriptLines
    from placecheck.run.recorder import RunRecorder

    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    recorder = RunRecorder(gpus=config["gpus"], steps=config["steps"])
    lines = ScriptLines(config["script"])
    if config["steps"] and config["script"]:
        # the script is imported as __mp_main__ unrewritten: its DataLoaders end the loop after the budget
        recorder.fastforward = FastForward(config["script"], lines=lines)
        # ... so none of its loops is one the fast-forward ends itself (multiprocessing imports the file)
        recorder.fastforward.sites = []
    code: Any = 0
    if config.get("stdout_to_stderr"):
        sys.stdout.flush()
        os.dup2(2, 1)
    with contextlib.ExitStack() as stack:
        try:
            from placecheck.run import scratch  # type: ignore[attr-defined]
        except ImportError:
            pass
        else:
            stack.enter_context(scratch.protect_from_environment())
        from placecheck.engines.tagged import tagged_cuda

        stack.enter_context(tagged_cuda(config["gpus"]))
        stack.enter_context(recorder.recording())
        stack.enter_context(lines.watching())
        stack.enter_context(_simulated_tensors_sent())
        _LIVE.append(_Session(recorder, lines, config["directory"]))
        try:
            from multiprocessing import spawn

            spawn.spawn_main(**kwds)
        except SystemExit as exc:
            code = exc.code
        if not os.path.exists(os.path.join(config["directory"], f"child-{os.getpid()}.json")):
            # no ChildTarget ran here (a Process subclass's own run()): what the recorder saw all the same
            _write_result(_LIVE[-1], "Process.run", "end", None)
    sys.exit(code)
