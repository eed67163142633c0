"""The proof of ``placecheck fix``: the same audit again, in a child process, on the edited sources.

The child is forked from the process that ran the first audit, so it starts
with torch and placecheck already imported (a fresh interpreter would pay
seconds of ``import torch`` per proof). PyTorch refuses some work in a forked
child: CUDA once the parent initialised it (a real GPU), and a backward once
the parent started autograd's device threads (a backward on CUDA, real or
simulated). Then the proof runs in a child forked from a warm proof server
(a :class:`placecheck.basics.forkserver.ForkServer` started once per process, which
imports torch and placecheck but runs no torch op), or where there is no
fork, in a fresh interpreter; the audit is handed over pickled. It writes nothing to the user's
files: the edited texts lie in a temporary directory, and inside the child
Python's source loader (and :func:`io.open_code`, through which ``runpy``
reads a script) reads them in place of the originals (same module
names, same ``__file__``, so findings point at the user's paths), with
bytecode caching off so no ``.pyc`` of the edited text is left behind. The
user's modules imported by the first audit are dropped first, so the
target is imported again from the edited text.
"""

from __future__ import annotations

import atexit
import gc
import io
import linecache
import multiprocessing
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder, SourceFileLoader
from importlib.util import spec_from_file_location
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from placecheck.basics.errors import one_line
from placecheck.findings.finding import Finding
from placecheck.fix.plan import is_installed
from placecheck.model.load import forget_imported_files


@dataclass(frozen=True)
class ProofOutcome:
    """What the re-audit reported: every finding (all codes), or why it did not finish."""

    findings: tuple[Finding, ...] = ()
    error: str = ""
    report: Any = None
    """The whole Report (notes, stats) when the audit finished."""


class _EditedFinder(MetaPathFinder):
    """Finds an edited module where the path finder would, and loads it with the source loader."""

    def __init__(self, edited: dict[str, str]) -> None:
        self.edited = edited

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> ModuleSpec | None:
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or os.path.abspath(spec.origin) not in self.edited:
            return None
        return spec_from_file_location(fullname, spec.origin, loader=SourceFileLoader(fullname, spec.origin),
                                       submodule_search_locations=spec.submodule_search_locations)


def _serve_edited(edited: dict[str, str]) -> None:
    """Make this process import ``edited`` (original path -> path of the edited copy) instead."""
    sys.dont_write_bytecode = True
    real_get_data = SourceFileLoader.get_data
    real_path_stats = SourceFileLoader.path_stats

    def get_data(self: SourceFileLoader, path: str) -> bytes:
        return real_get_data(self, edited.get(os.path.abspath(path), path))

    def path_stats(self: SourceFileLoader, path: str) -> Any:
        # the copy's mtime and size: a .pyc of the original no longer matches and is not used
        return real_path_stats(self, edited.get(os.path.abspath(path), path))

    SourceFileLoader.get_data = get_data  # type: ignore[method-assign,assignment]
    SourceFileLoader.path_stats = path_stats  # type: ignore[method-assign,assignment]
    real_open_code = io.open_code

    def open_code(path: str) -> IO[bytes]:  # runpy reads a script (placecheck run's) through it
        return real_open_code(edited.get(os.path.abspath(path), path))

    io.open_code = open_code
    # ahead of other import hooks (pytest's assertion rewriter reads the original file itself)
    sys.meta_path.insert(0, _EditedFinder(edited))
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or name in ("__main__", "__mp_main__"):
            continue  # torch.ops and torch.classes name no file
        path = os.path.abspath(file)
        own = name == "placecheck" or name.startswith("placecheck.")
        if path not in edited and (own or is_installed(path)):
            continue  # thousands of torch modules: string tests first, no stat() of each
        if os.path.isfile(path):
            del sys.modules[name]
    forget_imported_files()
    for key in list(linecache.cache):
        if os.path.abspath(key) in edited:
            del linecache.cache[key]
    for original, copy in edited.items():
        lines = Path(copy).read_text(encoding="utf-8").splitlines(keepends=True)
        linecache.cache[original] = (sum(map(len, lines)), None, lines, original)


def _fork_refused() -> bool:
    """In a forked child: whether PyTorch refuses what an audit runs here (a backward, CUDA).

    A child forked after the parent started autograd's device threads (a
    backward on CUDA, real or simulated) cannot run a backward; one forked
    after CUDA was initialised cannot use CUDA. The first is tried on a tiny
    tensor (PyTorch refuses it before running anything); the second is known
    from the parent.
    """
    import torch

    try:
        probe = torch.ones(1, requires_grad=True)
        probe.sum().backward()  # type: ignore[no-untyped-call]
    except RuntimeError:
        return True
    return False


def _child(conn: Connection, audit_once: Callable[[], Any], edited: dict[str, str]) -> None:
    try:
        # GNU OpenMP's thread pool does not survive fork: a parallel op in the child waits forever
        # for the parent's workers (PyTorch's DataLoader workers do the same)
        import torch

        torch.set_num_threads(1)
        if _fork_refused():
            conn.send(_FORK_REFUSED)
            return
        _serve_edited(edited)
        report = audit_once()
        conn.send(ProofOutcome(tuple(report.findings), report=report))
    except BaseException as exc:  # anything the edited model raises is the proof's answer, not a crash
        conn.send(ProofOutcome(error=one_line(exc)))
    finally:
        conn.close()


_FORK_REFUSED = ProofOutcome(error="a forked child of this process cannot run the audit (CUDA or autograd's "
                              "threads started here)")


def _edited_copies(texts: dict[str, str], folder: str) -> dict[str, str]:
    edited: dict[str, str] = {}
    for index, (path, text) in enumerate(sorted(texts.items())):
        copy = Path(folder) / f"{index}_{Path(path).name}"
        copy.write_text(text, encoding="utf-8", newline="")
        edited[os.path.abspath(path)] = str(copy)
    return edited


def reaudit(audit_once: Callable[[], Any], texts: dict[str, str]) -> ProofOutcome:
    """Run ``audit_once`` (returns a Report) in a child process that sees ``texts`` as the files' sources.

    ``texts`` maps a file path to its edited text. The child is forked from
    this warm process when PyTorch allows it here; otherwise (CUDA initialised
    or autograd's device threads started in this process, or no fork on this
    platform) it is a fresh interpreter, and ``audit_once`` must be picklable.
    """
    with tempfile.TemporaryDirectory(prefix="placecheck-fix-") as folder:
        edited = _edited_copies(texts, folder)
        outcome = _FORK_REFUSED
        if _may_fork():
            outcome = _reaudit_forked(audit_once, edited)
        if outcome == _FORK_REFUSED:
            outcome = _reaudit_fresh(audit_once, edited, folder)
    return outcome


def _may_fork() -> bool:
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


def _reaudit_forked(audit_once: Callable[[], Any], edited: dict[str, str]) -> ProofOutcome:
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(sender, audit_once, edited), daemon=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # the parent's objects out of the collector's reach in the child: a collection there would write
    # to (and so copy) every page of the parent's heap
    gc.freeze()
    try:
        child.start()
    finally:
        gc.unfreeze()
    sender.close()
    try:
        outcome: ProofOutcome = receiver.recv()
    except EOFError:
        outcome = ProofOutcome(error=f"the re-audit's process ended without an answer (exit code "
                                f"{child.exitcode})")
    child.join()
    receiver.close()
    return outcome


def _reaudit_fresh(audit_once: Callable[[], Any], edited: dict[str, str], folder: str) -> ProofOutcome:
    """The proof in a process that has run no torch work: ``audit_once`` goes pickled.

    Where fork is safe, a child forked from this process's warm proof server (:func:`_server`: torch
    and placecheck imported once, by the first proof that needs it); else, or when the server is gone,
    a new interpreter (``import torch`` paid again).
    """
    try:
        job = pickle.dumps((audit_once, edited))
    except Exception as exc:  # a closure or a lambda: only a forked child could run it
        return ProofOutcome(error=f"the re-audit cannot run in a fresh process ({one_line(exc)}) and this "
                             "process cannot fork one")
    answer = Path(folder) / "outcome.pickle"
    paths = [p for p in sys.path if isinstance(p, str)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in paths)}
    sys.stdout.flush()
    sys.stderr.flush()
    said = _from_server(Path(folder), pickle.dumps((paths, os.getcwd(), env)) + job, env)
    if said is None:
        done = subprocess.run(  # this interpreter, running placecheck's own entry point
            [sys.executable, "-c", "from placecheck.fix.proof import fresh_child; fresh_child()",
             str(answer)],
            input=pickle.dumps(paths) + job, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
            check=False)
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        said = (done.returncode, lines[-1] if lines else "")
    if not answer.is_file():
        status, last = said
        return ProofOutcome(error=f"the re-audit's process ended without an answer (exit code {status}"
                             + (f": {last}" if last else "") + ")")
    with answer.open("rb") as handle:
        outcome: ProofOutcome = pickle.load(handle)  # written by our own child just now
    return outcome


_SERVER: list[Any] = []
"""This process's warm proof server (a :class:`placecheck.basics.forkserver.ForkServer`), once started."""

_SERVER_LOCK = threading.Lock()


def _server(env: dict[str, str]) -> Any:
    """This process's warm proof server, started on first use and stopped at exit."""
    from placecheck.basics.forkserver import ForkServer

    if _SERVER and _SERVER[0].process.poll() is None:
        return _SERVER[0]
    server = ForkServer(["placecheck.fix.proof", "placecheck.run"], workdir=None, env=env)
    _SERVER[:] = [server]
    atexit.register(server.close)
    return server


def _from_server(folder: Path, job: bytes, env: dict[str, str]) -> tuple[int | None, str] | None:
    """Run the pickled ``job`` in a child of the warm proof server; (exit status, its stderr's last line),
    or None where there is no safe fork or the server is gone (the caller starts an interpreter)."""
    from placecheck.basics.forkserver import NO_TIMEOUT, JobFiles, ServerGone, fork_available

    if not fork_available():
        return None
    files = JobFiles(folder / "job.pickle", folder / "outcome.pickle", folder / "stderr.txt")
    files.spec.write_bytes(job)
    with _SERVER_LOCK:  # one request at a time on the server's line protocol
        try:
            status = _server(env).run(files, NO_TIMEOUT, entry="placecheck.fix.proof:fresh_job")
        except ServerGone:
            _SERVER.pop().close()
            return None
    lines = files.stderr.read_text(errors="replace").strip().splitlines() if files.stderr.is_file() else []
    return status, lines[-1] if lines else ""


def _run_job(stream: IO[bytes], answer_path: str) -> None:
    """Run the pickled ``(audit_once, edited)`` from ``stream``; pickle its outcome to ``answer_path``."""
    try:
        audit_once, edited = pickle.load(stream)
        _serve_edited(edited)
        report = audit_once()
        outcome = ProofOutcome(tuple(report.findings), report=report)
    except BaseException as exc:  # anything the edited model raises is the proof's answer, not a crash
        outcome = ProofOutcome(error=one_line(exc))
    with open(answer_path, "wb") as handle:
        pickle.dump(outcome, handle)


def fresh_child() -> None:
    """Entry point of a fresh proof process: the job on stdin, the ProofOutcome pickled to ``argv[1]``."""
    stdin = sys.stdin.buffer
    sys.path[:0] = [p for p in pickle.load(stdin) if p not in sys.path]
    _run_job(stdin, sys.argv[1])


def fresh_job(job_path: str, answer_path: str) -> int:
    """Entry point of a proof forked from the warm proof server (:mod:`placecheck.commands.worker`): the
    job in ``job_path``, run with the asking process's ``sys.path``, working directory and environment."""
    with open(job_path, "rb") as handle:
        paths, cwd, env = pickle.load(handle)
        sys.path[:0] = [p for p in paths if p not in sys.path]
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        _run_job(handle, answer_path)
    return 0
