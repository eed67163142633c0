"""Running the user's program as ``python SCRIPT.py ARGS`` (or ``python -m MODULE ARGS``) would.

The script runs as ``__main__`` through :mod:`runpy`: ``sys.argv`` is
``[script, *args]``, the script's directory (the working directory for
``-m``) is first on ``sys.path``, the working directory is left as it is.
What ends it: its own end, ``sys.exit``, an exception, or a
:class:`~placecheck.run.session.StopRun` raised into it (enough optimizer
steps, or ``--timeout`` by ``SIGALRM``). Everything is restored afterwards.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import runpy
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import CodeType, FrameType, TracebackType
from typing import Any

from placecheck.basics.errors import LoadError
from placecheck.checks.sources import display_path, is_internal, library_package, user_line
from placecheck.run.session import StopRun


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
    """``end`` (it finished), ``exit`` (sys.exit), ``stopped`` (steps or timeout), ``error``."""
    line: str = ""
    """The user's line where it stopped or raised ("" when unknown)."""
    reason: str = ""
    exit_code: object = None
    """What the script passed to ``sys.exit`` (None for ``sys.exit()``)."""
    error: BaseException | None = None
    stack: tuple[tuple[CodeType, int], ...] = ()
    """Where a stop found the program: each frame's code and line, outermost first."""


@contextlib.contextmanager
def _as_main(program: Program) -> Iterator[None]:
    """``sys.argv`` and ``sys.path`` as Python sets them for the program; restored afterwards."""
    argv, path = sys.argv[:], sys.path[:]
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


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[bool]:
    """Raise :class:`StopRun` into the program after ``seconds``; yields False when it cannot (not the
    main thread, or no SIGALRM on this platform)."""
    usable = (seconds is not None and seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield seconds is None
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise StopRun(f"at --timeout {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, float(seconds or 0))
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def execute(program: Program, timeout: float | None = None, notes: list[str] | None = None,
            code: tuple[CodeType, dict[str, Any]] | None = None) -> Outcome:
    """Run ``program`` to its end or until it is stopped; never raises what the program raises.

    ``code``: the script's code to run instead of its file's, compiled from it with its own name and
    lines (the fast-forward's rewrite, :mod:`placecheck.run.fastforward`), and the globals it needs."""
    with _as_main(program), _deadline(timeout) as armed:
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
            return Outcome("stopped", user_line(stop), stop.reason, stack=_stack(stop.__traceback__))
        except SystemExit as exc:
            return Outcome("exit", user_line(exc), exit_code=exc.code)
        except BaseException as exc:  # the program's own failure is reported, not raised
            if isinstance(exc, KeyboardInterrupt):
                raise
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
