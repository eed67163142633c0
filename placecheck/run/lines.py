"""Which lines of the script itself ran: what a ``--steps`` or ``--timeout`` stop left unrun.

Only the script's own file is watched, each line once: on Python 3.12 and later through
:mod:`sys.monitoring` (a line event that disables itself after its first call, so a loop costs
nothing after its first pass, and every other file's lines are disabled at their first event); before
3.12 through :func:`sys.settrace`, whose global function returns a line tracer for the script's frames
only. A debugger or coverage tool that already traces the process is left alone: then nothing is
measured, and the report says only where the run stopped.

The code a stop left unrun is, in every frame of the script the stop went through, the statements
after the line it stopped at none of whose lines ran (an evaluation loop, a final ``torch.save``),
and the functions of the script they call that never ran.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from types import CodeType, FrameType
from typing import Any

from placecheck.engines.sources import display_path

_MAX_RANGES = 5
_MAX_TEXT = 48


class ScriptLines:
    """The lines of one script file that ran during :meth:`watching`."""

    def __init__(self, filename: str | None) -> None:
        self.filename = os.path.abspath(filename) if filename else None
        self.executed: set[int] = set()
        self.measured = False
        """True when the lines were watched (a script file, no other tracer in the way)."""
        self._same: dict[str, bool] = {}

    def _is_script(self, filename: str) -> bool:
        same = self._same.get(filename)
        if same is None:
            same = self._same[filename] = os.path.abspath(filename) == self.filename
        return same

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Record the script's lines as they first run."""
        if self.filename is None:
            yield
            return
        watch = self._monitoring if sys.version_info >= (3, 12) else self._tracing
        with watch():
            yield

    @contextlib.contextmanager
    def _monitoring(self) -> Iterator[None]:
        monitoring: Any = getattr(sys, "monitoring")  # noqa: B009  # Python 3.12+ (mypy checks for 3.11)
        tool = next((i for i in range(6) if monitoring.get_tool(i) is None), None)
        if tool is None:
            yield
            return
        monitoring.use_tool_id(tool, "placecheck run")
        line_event = monitoring.events.LINE

        def on_line(code: CodeType, line: int) -> Any:
            if self._is_script(code.co_filename):
                self.executed.add(line)
            return monitoring.DISABLE

        monitoring.register_callback(tool, line_event, on_line)
        monitoring.set_events(tool, line_event)
        self.measured = True
        try:
            yield
        finally:
            monitoring.set_events(tool, 0)
            monitoring.register_callback(tool, line_event, None)
            monitoring.free_tool_id(tool)

    @contextlib.contextmanager
    def _tracing(self) -> Iterator[None]:
        if sys.gettrace() is not None:  # a debugger or a coverage tool: not ours to replace
            yield
            return
        executed = self.executed

        def lines(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line":
                executed.add(frame.f_lineno)
            return lines

        def calls(frame: FrameType, event: str, arg: Any) -> Any:
            # asked of every Python call: the module's __file__ first, since reading f_code is an audit
            # event (3.11+), and run's scratch area keeps an audit hook (2 million calls for a resnet50 run)
            file = frame.f_globals.get("__file__")
            if not isinstance(file, str) or not self._is_script(file):
                return None
            return lines if self._is_script(frame.f_code.co_filename) else None

        sys.settrace(calls)
        self.measured = True
        try:
            yield
        finally:
            sys.settrace(None)

    def unrun_after_stop(self, stack: Sequence[tuple[CodeType, int]]) -> str:
        """The script's code a stop at ``stack`` (its frames, outermost first, as ``(code, line)``) left
        unrun: ``train.py lines 23-24 (`model.eval()`), 25-28 (`with torch.no_grad():`); evaluate()
        (lines 5-9)``; "" when nothing (or nothing was measured).

        In each of the script's frames, the statements after the one it stopped in (and after the stop
        inside the statements that hold it: an epoch loop's validation) none of whose lines ran, a run
        of simple statements together; then the script's functions they call that never ran.
        """
        if not self.measured or self.filename is None:
            return ""
        try:
            with open(self.filename, encoding="utf-8") as handle:
                source = handle.read()
            tree = ast.parse(source, self.filename)
            compiled = compile(tree, self.filename, "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            return ""
        text = source.splitlines()
        codes = {(c.co_name, c.co_firstlineno): c for c in _code_objects(compiled)}
        bodies = _bodies(tree)
        unrun: list[tuple[int, int]] = []
        for code, stopped_at in stack:
            if not self._is_script(code.co_filename):
                continue
            own = codes.get((code.co_name, code.co_firstlineno))
            body = bodies.get(code.co_firstlineno if code.co_name != "<module>" else 0)
            if own is None or body is None:
                continue
            lines = _lines_of(own)
            for first, last in _after(body, stopped_at):
                here = {n for n in lines if first <= n <= last}
                if here and not here & self.executed:
                    unrun.append((first, last))
        if not unrun:
            return ""
        called = "\n".join(text[n - 1] for first, last in unrun for n in range(first, last + 1)
                           if 0 < n <= len(text))
        functions = []
        for c in codes.values():
            body = bodies.get(c.co_firstlineno)
            if c.co_name.startswith("<") or body is None \
                    or not re.search(rf"\b{re.escape(c.co_name)}\s*\(", called):
                continue
            inside = {n for n in _lines_of(c) if n >= body[0].lineno}  # not the def line, which ran
            if inside and not inside & self.executed:
                functions.append((c.co_name, min(inside), max(inside)))
        parts = [_describe(first, last, text) for first, last in unrun[:_MAX_RANGES]]
        if len(unrun) > _MAX_RANGES:
            parts.append(f"{len(unrun) - _MAX_RANGES} more")
        described = f"{display_path(self.filename)} lines {', '.join(parts)}"
        for name, first, last in functions:
            span = f"line {first}" if first == last else f"lines {first}-{last}"
            described += f"; {name}() ({span})"
        return described


_Body = list[ast.stmt]
_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match,
             ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _bodies(tree: ast.Module) -> dict[int, _Body]:
    """The statements of the module (key 0) and of each function (key: its code's first line, the first
    decorator's when it has one)."""
    out: dict[int, _Body] = {0: tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out[first] = node.body
    return out


def _after(body: _Body, stop: int) -> Iterator[tuple[int, int]]:
    """``(first, last)`` line spans of the statements of ``body`` after line ``stop``, into the statements
    that hold it; consecutive simple statements in one span."""
    simple: tuple[int, int] | None = None
    for stmt in body:
        end = stmt.end_lineno or stmt.lineno
        if end < stop:
            continue
        if stmt.lineno <= stop:
            for inner in _inner_bodies(stmt):
                yield from _after(inner, stop)
            continue
        if isinstance(stmt, _COMPOUND):
            if simple is not None:
                yield simple
                simple = None
            yield (stmt.lineno, end)
        else:
            simple = (simple[0], end) if simple is not None else (stmt.lineno, end)
    if simple is not None:
        yield simple


def _inner_bodies(stmt: ast.stmt) -> Iterator[_Body]:
    for field in ("body", "orelse", "finalbody"):
        inner = getattr(stmt, field, None)
        if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
            yield inner
    for handler in getattr(stmt, "handlers", ()):
        yield handler.body
    for case in getattr(stmt, "cases", ()):
        yield case.body


def _code_objects(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _code_objects(const)


def _lines_of(code: CodeType) -> set[int]:
    """The lines of ``code``'s own statements (not of the functions and classes it defines)."""
    return {line for _, _, line in code.co_lines() if line is not None and line > 0}


def _describe(first: int, last: int, text: list[str]) -> str:
    shown = text[first - 1].strip() if 0 < first <= len(text) else ""
    if len(shown) > _MAX_TEXT:
        shown = shown[:_MAX_TEXT - 3] + "..."
    span = f"{first}-{last}" if last != first else str(first)
    return f"{span} (`{shown}`)" if shown else span
