"""Which of the script's statements ran: the report's coverage (``checked 61 of 64 lines of train.py``),
and the blocks that never ran, with why when the script's code says it (a branch never taken, an
``except`` that never caught, a function never called).

A statement counts by its first line, as coverage tools count it; docstrings and ``global`` /
``nonlocal`` declarations run no code and do not count. The lines come from
:class:`placecheck.run.lines.ScriptLines`.
"""

from __future__ import annotations

import ast
import io
from collections.abc import Iterator

from placecheck.engines.sources import display_path
from placecheck.findings.report import Coverage

_MAX_BLOCKS = 8
_MAX_TEXT = 48


def statement_lines(tree: ast.Module) -> set[int]:
    """The first line of every statement that runs code."""
    return {n.lineno for n in ast.walk(tree) if isinstance(n, ast.stmt) and runs_code(n)}


def runs_code(stmt: ast.stmt) -> bool:
    """False for a docstring (or a bare string) and ``global`` / ``nonlocal``: statements with no code."""
    if isinstance(stmt, ast.Global | ast.Nonlocal):
        return False
    return not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str))  # a docstring (or a bare string: no code either)


def coverage_of(filename: str, executed: set[int]) -> Coverage | None:
    """The coverage of ``filename`` given the lines that ran; None when it cannot be read."""
    try:
        with io.open_code(filename) as handle:  # as runpy reads it (placecheck fix's proof edits it there)
            source = handle.read().decode("utf-8")
        tree = ast.parse(source, filename)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    lines = statement_lines(tree)
    ran = lines & executed
    not_run = tuple(sorted(lines - ran))
    text = source.splitlines()
    blocks = [_describe(first, last, why, text)
              for first, last, why in _blocks(tree.body, None, "", executed)]
    if len(blocks) > _MAX_BLOCKS:
        blocks = [*blocks[:_MAX_BLOCKS], f"{len(blocks) - _MAX_BLOCKS} more"]
    return Coverage(display_path(filename), len(lines), len(ran), not_run, tuple(blocks))


def _ran(stmt: ast.stmt, executed: set[int]) -> bool:
    """Some statement of ``stmt`` (itself or one inside) ran."""
    return any(n.lineno in executed for n in ast.walk(stmt) if isinstance(n, ast.stmt) and runs_code(n))


def _blocks(body: list[ast.stmt], parent: ast.AST | None, part: str,
            executed: set[int]) -> Iterator[tuple[int, int, str]]:
    """``(first, last, why)`` of each maximal run of statements of ``body`` none of whose lines ran."""
    start: ast.stmt | None = None
    end = 0
    for stmt in body:
        if not runs_code(stmt):
            continue
        if not _ran(stmt, executed):
            if start is None:
                start = stmt
            end = stmt.end_lineno or stmt.lineno
            continue
        if start is not None:
            yield start.lineno, end, _why(parent, part, start)
            start = None
        for inner, field_name, owner in _inner(stmt):
            yield from _blocks(inner, owner, field_name, executed)
    if start is not None:
        yield start.lineno, end, _why(parent, part, start)


def _inner(stmt: ast.stmt) -> Iterator[tuple[list[ast.stmt], str, ast.AST]]:
    for field_name in ("body", "orelse", "finalbody"):
        inner = getattr(stmt, field_name, None)
        if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
            yield inner, field_name, stmt
    for handler in getattr(stmt, "handlers", ()):
        yield handler.body, "handler", handler
    for case in getattr(stmt, "cases", ()):
        yield case.body, "case", case


def _header(node: ast.AST) -> str:
    text = ast.unparse(node).splitlines()[0] if not isinstance(node, ast.ExceptHandler) else ""
    if isinstance(node, ast.ExceptHandler):
        text = f"except {ast.unparse(node.type)}:" if node.type is not None else "except:"
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT - 3] + "..."


def _why(parent: ast.AST | None, part: str, first: ast.stmt) -> str:
    """Why a block never ran, when its parent says it ("" otherwise: after where the script ended)."""
    if isinstance(parent, ast.If):
        test = ast.unparse(parent.test)
        test = test if len(test) <= _MAX_TEXT else test[:_MAX_TEXT - 3] + "..."
        return f"`if {test}` never true" if part == "body" else f"`if {test}` never false"
    if isinstance(parent, ast.ExceptHandler):
        return f"`{_header(parent)}` never caught"
    if isinstance(parent, ast.For | ast.AsyncFor | ast.While):
        kind = "while" if isinstance(parent, ast.While) else "for"
        return f"a `{kind}` loop with no iteration" if part == "body" else f"the `{kind}` loop's `else`"
    if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
        return f"{parent.name}() never called"
    if isinstance(parent, ast.match_case):
        return "a `case` never matched"
    if isinstance(parent, ast.Try) and part == "orelse":
        return "a `try`'s `else`: the `try` raised"
    return ""


def _describe(first: int, last: int, why: str, text: list[str]) -> str:
    span = f"line {first}" if first == last else f"lines {first}-{last}"
    if why:
        return f"{span} ({why})"
    shown = text[first - 1].strip() if 0 < first <= len(text) else ""
    shown = shown if len(shown) <= _MAX_TEXT else shown[:_MAX_TEXT - 3] + "..."
    return f"{span} (`{shown}`)" if shown else span
