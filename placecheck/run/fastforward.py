"""Fast-forward after the ``--steps`` budget: the rest of the training loop is skipped, not the rest of the
script, so validation, a test pass, exports, metric reductions and saves run and are checked.

The script's own loops are rewritten before it runs (its AST, compiled with its own file name and line
numbers, :func:`compile_script`): the iterable of every ``for`` statement is wrapped in
``__placecheck_loop__(iterable, site)``, a ``while`` statement's test in
``__placecheck_again__(loop, test)`` (``loop`` made by ``__placecheck_while__(site)`` just before it).
While the budget lasts they only watch: each loop boundary (the next item, the next test) notes whether
the iteration that just ended did heavy work (an optimizer step, a DataLoader batch, a forward of a
top-level module; :attr:`FastForward.activity`). Once the budget is spent (:meth:`FastForward.begin`,
from the optimizer step that spends it), loops end at a boundary, so every loop ends as it ends
normally (a ``for``'s iterator is exhausted, a ``while``'s test is false, their ``else`` runs) and the
variables the loop sets stay set:

- the innermost loop around the step (the batch loop, found on the stack) ends after the current
  iteration;
- the loops around it (the epoch loop) end at their next boundary, unless their own body (the lines
  of the loops that step excepted) has statements that never ran: then they go on, for at most
  :data:`MAX_EXTRA_ITERATIONS` more iterations, to reach them once (validation ``if epoch % 2 == 1``);
- a loop that starts later runs its first iteration; a heavy one (batches, forwards) at most
  :data:`MAX_BATCHES` iterations, one that steps the optimizer only the first;
- light loops (over parameters, a config's keys, ``range(num_layers)``) are never cut;
- nor is a loop that yields (a generator's: an ``IterableDataset``'s stream): its consumer decides how
  many items it takes, and is cut itself (a DataLoader's batches stay whole).

Loops the script does not own (a library's: Lightning's fit loop, a helper module's) are ended through
their DataLoaders (:mod:`placecheck.run.loaders`): an iterator that yielded batches before the budget was
spent ends, and every later pass (a new iterator) still yields at least one batch, as a library expects
of a loader (an epoch-end handler reads the last batch, a metric needs an example): one of the training
DataLoader's, at most :data:`MAX_BATCHES` of another's. A loop that ends on its own after a number of
steps or epochs then ends; one that does not (Lightning's ``max_steps`` without ``max_epochs``) is
stopped (``StopRun``, an ordinary early end) once it steps the optimizer :data:`MAX_STEPS_AFTER` times
past the budget, or once one DataLoader began :data:`MAX_PASSES_AFTER` passes in a row after the
budget without a line of the script running for the first time (:meth:`FastForward.pass_began`).
Beyond that the :class:`~placecheck.run.script.Watchdog`, armed when the budget is spent, stops a run
that makes no progress at all (a script spinning, or blocked, after its training).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import io
import operator
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any, Protocol

from placecheck.engines.sources import display_path
from placecheck.run.coverage import runs_code
from placecheck.run.lines import ScriptLines

MAX_BATCHES = 2
"""Iterations of a heavy loop (or batches of a DataLoader iterator) started after the budget."""
MAX_EXTRA_ITERATIONS = 3
"""More iterations an outer loop (the epoch loop) may run after the budget to reach its unrun lines."""
MAX_STEPS_AFTER = 8
"""Optimizer steps after the budget before the run is stopped (a loop no rewrite or DataLoader ends)."""
MAX_PASSES_AFTER = 8
"""Passes over one DataLoader in a row after the budget, each running no line of the script for the first
time, before the run is stopped (a library's loop that keeps iterating it: nothing more is checked)."""

LOOP = "__placecheck_loop__"
WHILE = "__placecheck_while__"
AGAIN = "__placecheck_again__"


class Alarm(Protocol):
    """What the fast-forward needs of the run's watchdog (:class:`placecheck.run.script.Watchdog`)."""

    enforced: bool

    def arm(self) -> None:
        """From now on a run without progress is stopped."""


@dataclass
class LoopStatement:
    """One ``for``/``while`` statement of the script."""

    index: int
    kind: str
    """``for`` or ``while``."""
    first: int
    last: int
    header: str
    """The statement's first line, as written (shortened)."""
    scope: int
    """The first line of the function that holds it (its first decorator's), 0 at module level."""
    lines: frozenset[int]
    """The first lines of every statement in its body (else included), nested loops' too."""
    inner: tuple[int, ...] = ()
    """The sites of the loops directly inside it."""
    heavy: bool = False
    """An iteration did heavy work: an optimizer step, a DataLoader batch, a top-level forward."""
    stepping: bool = False
    """An iteration stepped the optimizer."""
    cut: int = 0
    """Times fast-forward ended it early."""
    skipped: int = 0
    """Iterations those cuts left out, where the iterable's length tells."""
    extra: int = 0
    """Iterations run after the budget to reach its unrun lines."""
    target: str | None = None
    """The loop variable, where a ``for`` binds one name (``for epoch in range(...)``)."""
    guards: tuple[Guard, ...] = ()
    """The ``if`` tests of its body (nested loops' excepted) that :func:`_pure` can evaluate ahead."""
    passed: int = 0
    """Iterations passed over to reach the one whose guard holds (:meth:`FastForward._jump`)."""
    reached: tuple[str, ...] = ()
    """The tests of the guards so reached, as written, in the order reached."""
    yields: bool = False
    """Its body yields (nested functions' excepted): a generator's loop, never cut."""


@dataclass(frozen=True)
class Guard:
    """An ``if`` of a loop's body: its test (:func:`_evaluate` reads it ahead), as written, and the first
    lines of its statements."""

    test: ast.expr
    lines: frozenset[int]
    text: str


@dataclass
class _Loop:
    """One running of a loop site."""

    site: LoopStatement
    frame: int
    """id of the frame that runs it."""
    before: bool
    """Started before the budget was spent."""
    activity: int
    steps: int
    length: int | None = None
    items: int = 0
    items_after: int = 0
    """Iterations begun after the budget was spent."""
    extra: int = 0
    done: bool = False
    frame_ref: FrameType | None = None
    """The frame that runs it, while a guard may be evaluated ahead in it (:meth:`FastForward._jump`)."""


class _Rewriter(ast.NodeTransformer):
    """Wraps each ``for``'s iterable and each ``while``'s test; records the sites."""

    def __init__(self, text: list[str]) -> None:
        self.text = text
        self.sites: list[LoopStatement] = []
        self._scopes: list[int] = [0]
        self._loops: list[list[int]] = [[]]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        return self._scope(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> Any:
        return self._scope(node)

    def _scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> Any:
        self._scopes.append(min([node.lineno, *(d.lineno for d in node.decorator_list)]))
        try:
            return self.generic_visit(node)
        finally:
            self._scopes.pop()

    def _site(self, node: ast.For | ast.While, kind: str) -> LoopStatement:
        text = self.text[node.lineno - 1].strip() if node.lineno <= len(self.text) else ""
        lines = _statement_lines(node.body, node.orelse)
        site = LoopStatement(index=len(self.sites), kind=kind, first=node.lineno,
                             last=node.end_lineno or node.lineno, header=_shorten(text),
                             scope=self._scopes[-1], lines=lines, yields=_yields(node))
        self.sites.append(site)
        self._loops[-1].append(site.index)
        self._loops.append([])
        return site

    def _inner(self, site: LoopStatement) -> None:
        site.inner = tuple(self._loops.pop())

    def visit_For(self, node: ast.For) -> Any:
        site = self._site(node, "for")
        if isinstance(node.target, ast.Name):
            site.target = node.target.id
            site.guards = tuple(self._guards(node.body))
        self.generic_visit(node)
        self._inner(site)
        call = ast.Call(func=ast.Name(LOOP, ast.Load()), args=[node.iter, ast.Constant(site.index)],
                        keywords=[])
        node.iter = ast.copy_location(call, node.iter)
        return node

    def _guards(self, body: list[ast.stmt]) -> Iterator[Guard]:
        """The ``if`` statements of ``body`` (nested ones too, not those inside nested loops or functions)
        whose test :func:`_pure` allows, read before the rewrite touches their bodies."""
        todo = list(body)
        while todo:
            stmt = todo.pop()
            if isinstance(stmt, ast.For | ast.AsyncFor | ast.While | ast.FunctionDef | ast.AsyncFunctionDef
                          | ast.ClassDef):
                continue
            if isinstance(stmt, ast.If) and _pure(stmt.test):
                yield Guard(stmt.test, _statement_lines(stmt.body, stmt.orelse),
                            _shorten(ast.unparse(stmt.test)))
            for name in ("body", "orelse", "finalbody"):
                todo.extend(getattr(stmt, name, ()))
            for handler in getattr(stmt, "handlers", ()):
                todo.extend(handler.body)

    def visit_While(self, node: ast.While) -> Any:
        site = self._site(node, "while")
        self.generic_visit(node)
        self._inner(site)
        name = f"__placecheck_while_{site.index}__"
        make = ast.Assign(targets=[ast.Name(name, ast.Store())],
                          value=ast.Call(func=ast.Name(WHILE, ast.Load()), args=[ast.Constant(site.index)],
                                         keywords=[]))
        node.test = ast.copy_location(
            ast.Call(func=ast.Name(AGAIN, ast.Load()), args=[ast.Name(name, ast.Load()), node.test],
                     keywords=[]), node.test)
        return [ast.copy_location(make, node), node]


def _yields(node: ast.For | ast.While) -> bool:
    """``node``'s body or ``else`` yields, not inside a nested function, class or lambda."""
    todo: list[ast.AST] = [*node.body, *node.orelse]
    while todo:
        child = todo.pop()
        if isinstance(child, ast.Yield | ast.YieldFrom):
            return True
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(child))
    return False


_PURE = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Slice, ast.BinOp, ast.UnaryOp, ast.BoolOp,
         ast.Compare, ast.Tuple, ast.List, ast.Load, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)


def _pure(test: ast.expr) -> bool:
    """A test made of names, constants, attributes, subscripts and operators only (``epoch % 10 == 9``,
    ``epoch == args.epochs - 1``): no call, so evaluating it ahead, for a later value of the loop
    variable, runs none of the script's code but what an attribute or an operator does."""
    return all(isinstance(node, _PURE) for node in ast.walk(test))


class _NotTold(Exception):
    """A guard's test :func:`_evaluate` cannot read ahead."""


_PLAIN = (int, float, str, bool, type(None))
_CONTAINERS = (dict, list, tuple, str)
_BINARY: dict[type[ast.operator], Any] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_COMPARE: dict[type[ast.cmpop], Any] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def _plain(value: Any) -> Any:
    """``value`` where an operator may take it: a number, a string, a bool, None, a tuple of them."""
    if isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)):
        return value
    raise _NotTold


def _evaluate(node: ast.expr, scope: dict[str, Any]) -> Any:
    """A :func:`_pure` test's value, computed on plain Python values only: a name or an attribute may be any
    object (``args.val_every``), a subscript's base only a dict, list, tuple or str, and every operand of an
    operator a plain value, so no tensor (whose comparison would be a torch op, a host sync at the guard's
    line) is ever touched; :class:`_NotTold` otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in scope:
            raise _NotTold
        return scope[node.id]
    if isinstance(node, ast.Attribute):
        value = inspect.getattr_static(_evaluate(node.value, scope), node.attr, _NotTold)
        if value is _NotTold or hasattr(type(value), "__get__"):
            raise _NotTold  # missing, or a property, a method, a tensor's shape: code would run
        return value
    if isinstance(node, ast.Subscript):
        base = _evaluate(node.value, scope)
        if not isinstance(base, _CONTAINERS):
            raise _NotTold
        try:
            return base[_plain(_evaluate(node.slice, scope))]
        except Exception:
            raise _NotTold from None
    if isinstance(node, ast.Tuple):
        return tuple(_evaluate(e, scope) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        value = _plain(_evaluate(node.operand, scope))
        if isinstance(node.op, ast.Not):
            return not value
        if isinstance(node.op, ast.USub | ast.UAdd) and isinstance(value, int | float):
            return -value if isinstance(node.op, ast.USub) else value
        raise _NotTold
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        try:
            return _BINARY[type(node.op)](_plain(_evaluate(node.left, scope)),
                                          _plain(_evaluate(node.right, scope)))
        except _NotTold:
            raise
        except Exception:  # 1 % 0, "a" - 1
            raise _NotTold from None
    if isinstance(node, ast.BoolOp):
        values = (_plain(_evaluate(v, scope)) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _plain(_evaluate(node.left, scope))
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _evaluate(right_node, scope)
            if not isinstance(op, ast.In | ast.NotIn):
                right = _plain(right)
            elif not isinstance(right, _CONTAINERS | set | frozenset):
                raise _NotTold
            try:
                if not _COMPARE[type(op)](left, right):
                    return False
            except Exception:
                raise _NotTold from None
            left = right
        return True
    raise _NotTold


_LOOKAHEAD = 100_000
"""The most later items of a loop's sequence :meth:`FastForward._jump` tries a guard on."""


def _statement_lines(*parts: list[ast.stmt]) -> frozenset[int]:
    """The first line of every statement in ``parts`` (nested ones too) that runs code."""
    return frozenset(n.lineno for part in parts for top in part for n in ast.walk(top)
                     if isinstance(n, ast.stmt) and runs_code(n))


def _shorten(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def compile_script(filename: str) -> tuple[CodeType, list[LoopStatement]] | None:
    """The script's code with its loops rewritten, and its loop sites; None when it cannot be read (the
    script then runs as it is, and only its DataLoaders fast-forward)."""
    try:
        with io.open_code(filename) as handle:  # as runpy reads it (placecheck fix's proof edits it there)
            source = handle.read()
        tree = ast.parse(source, filename)
        rewriter = _Rewriter(source.decode("utf-8", "replace").splitlines())
        tree = ast.fix_missing_locations(rewriter.visit(tree))
        return compile(tree, filename, "exec", dont_inherit=True), rewriter.sites
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
        return None


@dataclass
class FastForward:
    """The fast-forward of one run: its loop sites, the work counters, and whether the budget is spent.

    ``lines`` watches which of the script's lines ran (:class:`placecheck.run.lines.ScriptLines`); when it
    could not (another tracer in the way), no loop runs on to reach unrun lines.
    Not reentrant: one per run.
    """

    filename: str | None
    lines: ScriptLines | None = None
    on: bool = False
    """The budget is spent: loops end early."""
    activity: int = 0
    """Optimizer steps, DataLoader batches and top-level forwards so far (the recorder counts them)."""
    steps: int = 0
    """Optimizer steps so far."""
    sites: list[LoopStatement] = field(default_factory=list)
    code: CodeType | None = None
    """The rewritten script (None: it runs as it is)."""
    began_at: str = ""
    """The line of the step that spent the budget."""
    budget: int = 0
    """The optimizer steps before the fast-forward (``--steps``)."""
    through_loaders: bool = False
    """No loop of the script held the step that spent the budget (a library's fit loop), or the step
    was in a helper module of the user's: the DataLoaders end the loops the script does not own
    (:meth:`batch_allowed`)."""
    training_loader: int | None = None
    """id of the DataLoader whose batch the step that spent the budget trained on."""
    loader_cuts: dict[str, int] = field(default_factory=dict)
    """The line that iterated a DataLoader -> batches fast-forward left out of its iterators, where known."""
    watchdog: Alarm | None = None
    """The run's watchdog, armed when the budget is spent (:meth:`begin`); None when
    ``PLACECHECK_WATCHDOG`` is 0."""
    _roles: dict[tuple[int, int], str] = field(default_factory=dict)
    _passes: dict[int, tuple[int, int]] = field(default_factory=dict)
    """id of a DataLoader -> (the lines of the script that had run when its latest pass after the budget
    began, the passes in a row since then that ran no new line)."""

    def __post_init__(self) -> None:
        if self.filename is not None:
            compiled = compile_script(self.filename)
            if compiled is not None:
                self.code, self.sites = compiled

    def progress(self) -> tuple[int, int]:
        """What grows while the run makes progress: optimizer steps, top-level forwards and DataLoader
        batches (:attr:`activity`), and the lines of the script that ran."""
        return self.activity, self._lines_run()

    def _lines_run(self) -> int:
        return len(self.lines.executed) if self.lines is not None else 0

    def script_globals(self) -> dict[str, Any]:
        """What the rewritten script's module needs: the three helpers its loops call."""
        return {LOOP: self.loop, WHILE: self.while_loop, AGAIN: self.again}

    # -- the helpers the rewritten script calls ---------------------------------------------------------
    def loop(self, iterable: Iterable[Any], site: int) -> Iterator[Any]:
        """``for x in __placecheck_loop__(iterable, site)``: the iterable's items until the fast-forward
        ends it."""
        iterator = iter(iterable)
        frame = sys._getframe(1)
        state = _Loop(self.sites[site], id(frame), not self.on, self.activity, self.steps)
        if state.site.guards and isinstance(iterable, range | list | tuple):
            state.frame_ref = frame
        if self.on:
            state.length = _length(iterable)
        return self._items(iterator, iterable, state)

    def _items(self, iterator: Iterator[Any], iterable: Iterable[Any], state: _Loop) -> Iterator[Any]:
        try:
            for item in iterator:
                state.items += 1
                if self.on:
                    state.items_after += 1
                yield item
                extra = state.extra
                if not self._again(state):
                    if state.length is None and state.before:
                        state.length = _length(iterable)
                    self._cut(state)
                    return
                if state.extra != extra:  # going on to reach unrun lines: straight to where a guard holds
                    self._jump(iterator, iterable, state)
        finally:
            state.frame_ref = None

    def _jump(self, iterator: Iterator[Any], iterable: Iterable[Any], state: _Loop) -> None:
        """Move the loop's iterator on to the first later item for which a guard of the unrun lines
        (``if epoch % 10 == 9:``) holds, evaluated in the loop's frame with the loop variable set to the
        item; leave it where it is when no later item makes one hold, or none can be told."""
        site, frame = state.site, state.frame_ref
        if frame is None or site.target is None or not isinstance(iterable, range | list | tuple):
            return
        unrun = self._unrun(site)
        guards = [g for g in site.guards if g.lines & unrun]
        if not guards:
            return
        later = iterable[state.items:state.items + _LOOKAHEAD]
        scope = {**vars(builtins), **frame.f_globals, **frame.f_locals}
        for index, value in enumerate(later):
            scope[site.target] = value
            for guard in guards:
                try:
                    holds = bool(_plain(_evaluate(guard.test, scope)))
                except _NotTold:  # a name the body sets later, a tensor: not told ahead
                    continue
                if holds:
                    for _ in range(index):
                        next(iterator, None)
                    state.items += index
                    site.passed += index
                    site.skipped += index
                    if guard.text not in site.reached:
                        site.reached += (guard.text,)
                    return

    def while_loop(self, site: int) -> _Loop:
        """``__placecheck_while_N__ = __placecheck_while__(site)``, just before ``while``."""
        return _Loop(self.sites[site], id(sys._getframe(1)), not self.on, self.activity, self.steps)

    def again(self, state: _Loop, test: Any) -> bool:
        """``while __placecheck_again__(loop, test):``: the test's truth (read once, as ``while`` reads it: a
        tensor's is one host sync), or False when the fast-forward ends the loop."""
        if not test:
            return False
        if state.items and not self._again(state):
            self._cut(state)
            return False
        state.items += 1
        if self.on:
            state.items_after += 1
        return True

    # -- decisions --------------------------------------------------------------------------------------
    def _again(self, state: _Loop) -> bool:
        """At a loop boundary (an iteration ended): may it run another?"""
        site = state.site
        if self.activity != state.activity:
            site.heavy = True
            state.activity = self.activity
        if self.steps != state.steps:
            site.stepping = True
            state.steps = self.steps
        if not self.on or site.yields:
            return True
        if state.before:
            role = self._roles.get((state.frame, site.index), "outer")
            if role == "innermost":
                return False
            if not site.heavy:
                return True
            if state.extra >= MAX_EXTRA_ITERATIONS or not self._unrun(site):
                return False
            state.extra += 1
            site.extra += 1
            return True
        if not site.heavy:
            return True
        return state.items_after < (1 if site.stepping else MAX_BATCHES)

    def _unrun(self, site: LoopStatement) -> set[int]:
        """The statements of ``site``'s body that never ran, the bodies of the loops in it that step
        excepted (their lines are the training the budget skips)."""
        lines = set(site.lines)
        todo = list(site.inner)
        while todo:
            inner = self.sites[todo.pop()]
            if inner.stepping:
                lines -= inner.lines
            else:
                todo.extend(inner.inner)
        if self.lines is None or not self.lines.measured:
            return set()
        return lines - self.lines.executed

    def _cut(self, state: _Loop) -> None:
        if state.done:
            return
        state.done = True
        site = state.site
        site.cut += 1
        if state.length is not None:
            site.skipped += max(0, state.length - state.items)

    def begin(self, at: str, frame: FrameType | None) -> None:
        """The optimizer step at ``at`` spent the budget: from now on loops end early. ``frame``: where it
        was called; the script's loops around it, innermost first, get their roles."""
        if self.on:
            return
        self.on = True
        self.began_at = at
        self.budget = self.steps
        if self.watchdog is not None:
            self.watchdog.arm()
        innermost = True
        # a step in a helper module of the user's (its loops run as they are): its DataLoaders end them
        elsewhere = frame is not None and frame.f_code.co_filename != self.filename
        while frame is not None:
            if self.filename is not None and frame.f_code.co_filename == self.filename:
                scope = 0 if frame.f_code.co_name == "<module>" else frame.f_code.co_firstlineno
                line = frame.f_lineno
                around = sorted((s for s in self.sites if s.scope == scope and s.first <= line <= s.last),
                                key=lambda s: -s.first)
                for site in around:
                    self._roles[(id(frame), site.index)] = "innermost" if innermost else "outer"
                    innermost = False
            frame = frame.f_back
        self.through_loaders = innermost or elsewhere

    def batch_allowed(self, started_before: bool, yielded: int, yielded_after: int, loader: int) -> bool:
        """May a DataLoader iterator (of the loader whose id is ``loader``) yield another batch? Always,
        but in a fast-forward through the DataLoaders: then an iterator that yielded batches before the
        budget was spent ends (the training loop's), a later one of the training DataLoader (the one the
        last batch before the budget came from) yields one (its epoch is one step long: a library still
        sees a batch in each epoch, its epoch-end code and metrics have one), another at most
        :data:`MAX_BATCHES`."""
        if not (self.on and self.through_loaders):
            return True
        if started_before and yielded:
            return False
        return yielded_after < (1 if loader == self.training_loader else MAX_BATCHES)

    def pass_began(self, loader: int, line: str) -> str:
        """A new iterator of the DataLoader whose id is ``loader`` (iterated at ``line``): after the
        budget, why the run stops here (the caller raises ``StopRun``) when it is the
        :data:`MAX_PASSES_AFTER`-th pass over it in a row whose previous pass ran no line of the script for
        the first time (a loop that does not end when its loader's passes are short: nothing more would
        be checked); "" otherwise."""
        if not self.on:
            return ""
        lines = self._lines_run()
        before = self._passes.get(loader)
        stale = before[1] + 1 if before is not None and before[0] == lines else 0
        self._passes[loader] = (lines, stale)
        if stale < MAX_PASSES_AFTER:
            return ""
        where = f" iterated at {line}" if line else ""
        return (f"after {stale} passes in a row over the DataLoader{where} after the budget (--steps "
                f"{self.budget}) that ran no new line of the script: the loop iterating it did not end")
    # -- what it did ------------------------------------------------------------------------------------
    def notes(self, budget: str) -> list[str]:
        """One note per loop fast-forward ended early or ran on, with its lines."""
        if not self.on:
            return []
        out = []
        name = display_path(self.filename) if self.filename is not None else ""
        for site in self.sites:
            span = f"{name}:{site.first}-{site.last}" if site.last != site.first else f"{name}:{site.first}"
            if site.cut:
                times = "" if site.cut == 1 else f" ({site.cut} times)"
                skipped = f": {site.skipped} iteration{'s' if site.skipped != 1 else ''} skipped" \
                    if site.skipped else ""
                out.append(f"run: fast-forward after {budget}: the loop at {span} (`{site.header}`) ended "
                           f"early{times}{skipped}, unchecked{self._passed(site)}")
            elif site.extra:
                out.append(f"run: fast-forward after {budget}: the loop at {span} (`{site.header}`) ran "
                           f"{site.extra} more iteration{'s' if site.extra != 1 else ''} to reach the lines "
                           f"of its body that had not run{self._passed(site)}")
        for line, batches in self.loader_cuts.items():
            left = f": {batches} batch{'es' if batches != 1 else ''} skipped" if batches else ""
            out.append(f"run: fast-forward after {budget}: the iterators of the DataLoader iterated at "
                       f"{line} ended early{left}, unchecked")
        if self.watchdog is not None and not self.watchdog.enforced:
            out.append("run: the watchdog is not enforced here (it needs SIGALRM in the main thread, and the "
                       "script's own SIGALRM handler takes precedence): a run that stalls after the budget "
                       "goes on until it ends")
        return out

    @staticmethod
    def _passed(site: LoopStatement) -> str:
        """What a note says of the iterations passed over to reach a guard's (:meth:`_jump`)."""
        if not site.passed:
            return ""
        plural = "s" if site.passed != 1 else ""
        reached = " and ".join(f"`if {text}`" for text in site.reached)
        return f" ({site.passed} iteration{plural} passed over to reach {reached})"


def _length(iterable: Any) -> int | None:
    """The iterable's length when it tells one (a range, a list, a DataLoader), else None."""
    try:
        hint = operator.length_hint(iterable, -1)
    except Exception:  # a user's __len__ may raise anything
        return None
    return hint if hint >= 0 else None
