"""Running the user's program as ``python SCRIPT.py ARGS`` (or ``python -m MODULE ARGS``) would.

The script runs as ``__main__`` through :mod:`runpy`: ``sys.argv`` is
``[script, *args]``, the script's directory (the working directory for
``-m``) is first on ``sys.path``, the working directory is left as it is.
What ends it: its own end, ``sys.exit``, an exception, or a
:class:`~placecheck.run.session.StopRun` raised into it (enough optimizer
steps, or ``--timeout`` or the :class:`Watchdog` by ``SIGALRM``). Everything
is restored afterwards.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import CodeType, FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from placecheck.basics.errors import LoadError
from placecheck.engines.sources import display_path, is_internal, library_package, user_line
from placecheck.run.session import StopRun

if TYPE_CHECKING:
    from placecheck.findings.report import Report


@dataclass(frozen=True)
class Program:
    """What ``placecheck run`` runs: a script path, a module name (``-m``), or a Python callable."""

    target: str | Callable[[], Any]
    args: tuple[str, ...] = ()
    module: bool = False

    @property
    def name(self) -> str:
        """How the report names it."""
        if callable(self.target):
            return getattr(self.target, "__qualname__", repr(self.target))
        return f"-m {self.target}" if self.module else self.target

    @property
    def filename(self) -> str | None:
        """The file of the script's own code (a module's source for ``-m``); None for a callable."""
        if callable(self.target):
            return None
        if not self.module:
            return self.target
        sys.path.insert(0, os.getcwd())
        try:
            spec = importlib.util.find_spec(self.target)
        except (ImportError, ValueError):
            return None
        finally:
            sys.path.remove(os.getcwd())
        if spec is not None and spec.submodule_search_locations is not None:  # a package: its __main__
            spec = importlib.util.find_spec(f"{self.target}.__main__")
        return spec.origin if spec is not None and spec.has_location else None

    def check(self) -> None:
        """Refuse what cannot run, with one line: a missing script or module, a syntax error."""
        if callable(self.target):
            return
        if self.module:
            sys.path.insert(0, os.getcwd())  # as python -m searches it
            try:
                spec = importlib.util.find_spec(self.target)
            except (ImportError, ValueError) as exc:
                raise LoadError(f"cannot find module {self.target!r}: {exc}") from None
            finally:
                sys.path.remove(os.getcwd())
            if spec is None:
                raise LoadError(f"no module named {self.target!r} (on sys.path from {os.getcwd()})")
            return
        if not os.path.isfile(self.target):
            raise LoadError(f"no such script: {self.target!r}")
        try:
            with open(self.target, "rb") as handle:
                compile(handle.read(), self.target, "exec")
        except SyntaxError as exc:
            if exc.lineno is None or not str(self.target).endswith(".py"):  # null bytes, not text: a binary
                raise LoadError(f"{self.target} is not a Python script: {exc.msg}; give a .py file, or "
                                "-m MODULE") from None
            raise LoadError(f"{self.target}:{exc.lineno}: syntax error: {exc.msg}") from None
        except (OSError, ValueError) as exc:
            raise LoadError(f"cannot read script {self.target!r}: {exc}") from None


@dataclass(frozen=True)
class Outcome:
    """How the program ended."""

    kind: str
    """``end`` (it finished), ``exit`` (sys.exit), ``stopped`` (steps or timeout), ``error``,
    ``interrupted`` (Ctrl-C: a KeyboardInterrupt raised in the program)."""
    line: str = ""
    """The user's line where it stopped or raised ("" when unknown)."""
    reason: str = ""
    exit_code: object = None
    """What the script passed to ``sys.exit`` (None for ``sys.exit()``)."""
    error: BaseException | None = None
    stack: tuple[tuple[CodeType, int], ...] = ()
    """Where a stop found the program: each frame's code and line, outermost first."""
    unfinished: bool = False
    """A stop that means the script did not run through (the :class:`Watchdog`'s, Ctrl-C's)."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the report of what the run found until then (marked unfinished), which
    ``placecheck run`` prints before it exits 130; a caller that does not look at it sees the
    KeyboardInterrupt it always saw."""

    def __init__(self, report: Report) -> None:
        super().__init__()
        self.report = report


@contextlib.contextmanager
def _as_main(program: Program) -> Iterator[None]:
    """``sys.argv`` and ``sys.path`` as Python sets them for the program; restored afterwards, with
    the SIGINT handler and ``multiprocessing``'s start method (a script's
    ``set_start_method("spawn", force=True)`` is its own: a later run in this process, or the caller's
    own DataLoader workers, start as before)."""
    import multiprocessing

    argv, path = sys.argv[:], sys.path[:]
    start_method = multiprocessing.get_start_method(allow_none=True)
    # Ctrl-C's handler too: a framework may leave SIGINT ignored (Lightning does in its interrupt
    # handling), which would lose the caller's next Ctrl-C; signals are the main thread's to set
    main = threading.current_thread() is threading.main_thread()
    sigint = signal.getsignal(signal.SIGINT) if main else None
    target = program.target
    if isinstance(target, str):
        first = os.getcwd() if program.module else os.path.dirname(os.path.abspath(target))
        sys.argv = [target, *program.args]
        sys.path.insert(0, first)
    try:
        yield
    finally:
        sys.argv[:] = argv
        sys.path[:] = path
        if multiprocessing.get_start_method(allow_none=True) != start_method:
            multiprocessing.set_start_method(start_method, force=True)
        if main and sigint is not None and signal.getsignal(signal.SIGINT) is not sigint:
            signal.signal(signal.SIGINT, sigint)


WATCHDOG_SECONDS = 60.0
"""How long a run may go without progress after the ``--steps`` budget before the :class:`Watchdog`
stops it."""
WATCHDOG_ENV = "PLACECHECK_WATCHDOG"
"""Sets :data:`WATCHDOG_SECONDS` for a run (a number of seconds; 0 turns the watchdog off)."""


def watchdog_seconds() -> float:
    """The watchdog's time: ``PLACECHECK_WATCHDOG`` when it holds a number >= 0, else
    :data:`WATCHDOG_SECONDS`."""
    try:
        seconds = float(os.environ.get(WATCHDOG_ENV, WATCHDOG_SECONDS))
    except ValueError:
        return WATCHDOG_SECONDS
    return seconds if seconds >= 0 else WATCHDOG_SECONDS


@dataclass
class Watchdog:
    """Stops a run that makes no progress for :attr:`seconds` once :meth:`arm` was called (the
    fast-forward arms it when the ``--steps`` budget is spent): :attr:`progress` answers a value that
    changes with every optimizer step, top-level forward, DataLoader batch and new line of the script.

    Checked by the same ``SIGALRM`` as ``--timeout`` (:func:`_alarm`), about four times per
    :attr:`seconds` (at most once a second), so it stops a script blocked in C too (``time.sleep``, a
    queue's ``get``: Python runs the handler when the call returns with EINTR). The signal is Python's to
    handle in the main thread only: a run started in another thread has no watchdog (the fast-forward's
    notes say so), and a script's own thread that spins goes on after the main thread is stopped.
    """

    seconds: float
    progress: Callable[[], object]
    armed: bool = False
    enforced: bool = True
    """False when the run could not use SIGALRM (not the main thread, no ``setitimer``)."""
    _last: object = None
    _since: float = 0.0
    _wake: Callable[[], None] | None = None

    @property
    def tick(self) -> float:
        """Seconds between two checks."""
        return max(0.01, min(1.0, self.seconds / 4))

    def arm(self) -> None:
        """From now on, a stretch of :attr:`seconds` without progress stops the run."""
        if self.armed or self.seconds <= 0:
            return
        self.armed = True
        self._last, self._since = self.progress(), time.monotonic()
        if self._wake is not None:
            self._wake()

    def check(self, now: float) -> None:
        """Raise the watchdog's :class:`StopRun` when nothing progressed for :attr:`seconds` by ``now``."""
        if not self.armed:
            return
        value = self.progress()
        if value != self._last:
            self._last, self._since = value, now
        elif now - self._since >= self.seconds:
            self.armed = False
            raise StopRun(f"by the watchdog: no progress for {self.seconds:g} s after the --steps budget (no "
                          "optimizer step, forward, DataLoader batch or new line of the script; "
                          f"{WATCHDOG_ENV} sets the time, 0 turns it off)", unfinished=True)


@contextlib.contextmanager
def _alarm(seconds: float | None, watchdog: Watchdog | None = None) -> Iterator[bool]:
    """Raise :class:`StopRun` into the program after ``seconds`` (``--timeout``), or when ``watchdog``
    finds it stalled; yields False when ``seconds`` cannot be enforced (not the main thread, or no
    SIGALRM on this platform). One ``ITIMER_REAL``, re-armed by its handler for the nearer of the two."""
    timed = seconds is not None and seconds > 0
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if watchdog is not None and not usable:
        watchdog.enforced = False
    if not usable or not (timed or watchdog is not None):
        yield seconds is None
        return
    deadline = time.monotonic() + float(seconds) if timed and seconds is not None else None

    def schedule() -> None:
        if signal.getsignal(signal.SIGALRM) is not expire:  # the script's own SIGALRM handler: its alarms
            if watchdog is not None:
                watchdog.enforced = False
            return
        waits = [] if deadline is None else [deadline - time.monotonic()]
        if watchdog is not None and watchdog.armed:
            waits.append(watchdog.tick)
        if waits:
            signal.setitimer(signal.ITIMER_REAL, max(min(waits), 0.001))

    def expire(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if deadline is not None and now >= deadline - 0.005:
            raise StopRun(f"at --timeout {seconds:g} s")
        if watchdog is not None:
            watchdog.check(now)
        schedule()

    previous = signal.signal(signal.SIGALRM, expire)
    if watchdog is not None:
        watchdog._wake = schedule  # arm() may come from any thread: the timer is the process's
    schedule()
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if watchdog is not None:
            watchdog._wake = None


def execute(program: Program, timeout: float | None = None, notes: list[str] | None = None,
            code: tuple[CodeType, dict[str, Any]] | None = None, watchdog: Watchdog | None = None) -> Outcome:
    """Run ``program`` to its end or until it is stopped; never raises what the program raises.

    ``code``: the script's code to run instead of its file's, compiled from it with its own name and
    lines (the fast-forward's rewrite, :mod:`placecheck.run.fastforward`), and the globals it needs.
    ``watchdog``: stops the program when it stalls once armed (:class:`Watchdog`)."""
    with _as_main(program), _alarm(timeout, watchdog) as armed:
        if not armed and notes is not None:
            notes.append("run: --timeout is not enforced here (it needs SIGALRM in the main thread)")
        try:
            target = program.target
            if callable(target):
                target()
            elif program.module and code is not None:
                # what runpy.run_module(alter_sys=True) does, with this code
                _, spec, _ = runpy._get_module_details(target)  # type: ignore[attr-defined]
                runpy._run_module_code(code[0], code[1], "__main__", spec)  # type: ignore[attr-defined]
            elif program.module:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            elif code is not None:
                # what runpy.run_path does for a source file, with this code
                runpy._run_module_code(code[0], code[1], "__main__", pkg_name="",  # type: ignore[attr-defined]
                                       script_name=target)
            else:
                runpy.run_path(target, run_name="__main__")
        except StopRun as stop:
            return Outcome("stopped", user_line(stop), stop.reason, stack=_stack(stop.__traceback__),
                           unfinished=stop.unfinished)
        except SystemExit as exc:
            return Outcome("exit", user_line(exc), exit_code=exc.code)
        except KeyboardInterrupt as exc:
            # Ctrl-C ends the run as a stop does: what was found so far is reported (the caller raises
            # RunInterrupted with that report, so Ctrl-C still interrupts whoever called the run)
            return Outcome("interrupted", user_line(exc), "by Ctrl-C", stack=_stack(exc.__traceback__),
                           unfinished=True)
        except BaseException as exc:  # the program's own failure is reported, not raised
            return Outcome("error", user_line(exc), error=exc)
    return Outcome("end")


def _stack(tb: TracebackType | None) -> tuple[tuple[CodeType, int], ...]:
    out = []
    while tb is not None:
        out.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    return tuple(out)


def exit_status(code: object) -> int:
    """The status ``python`` exits with after ``sys.exit(code)``: 0 for None, the integer, else 1 (the
    message is printed)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def raised(error: BaseException, line: str) -> str:
    """One line for an exception the script raised itself (not a device error): ``the script raised
    KeyError at train.py:5: 'learning_rate'``."""
    at = f" at {line}" if line else ""
    text = str(error).strip().splitlines()
    said = f": {text[0]}" if text else ""
    return f"the script raised {type(error).__name__}{at}{said}"


def exited(code: object, line: str) -> str:
    """One line for a non-zero ``sys.exit(code)`` of the script: ``the script exited with status 1 at
    train.py:9``, with what Python prints for a message (``sys.exit("no config")``)."""
    at = f" at {line}" if line else ""
    said = "" if code is None or isinstance(code, int) else f": {code}"
    return f"the script exited with status {exit_status(code)}{at}{said}"


def user_traceback(error: BaseException) -> tuple[str, ...]:
    """The script's own frames of ``error``'s traceback, outermost first, as Python prints them (``File
    "train.py", line 5, in <module>`` and the line's code): torch's, placecheck's, the standard
    library's and installed packages' frames left out; empty when it has none."""
    import linecache

    lines: list[str] = []
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if not is_internal(code) and not library_package(code):
            lines.append(f'  File "{display_path(code.co_filename)}", line {tb.tb_lineno}, in {code.co_name}')
            text = linecache.getline(code.co_filename, tb.tb_lineno).strip()
            if text:
                lines.append(f"    {text}")
        tb = tb.tb_next
    return tuple(lines)


def script_args(args: Sequence[str]) -> tuple[str, ...]:
    """The program's arguments, a leading ``--`` separator dropped."""
    items = list(args)
    return tuple(items[1:] if items and items[0] == "--" else items)
