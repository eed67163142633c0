"""The real-code gate (issue 33): ``make test-corpus``, run by ``.ci/run`` after ``make test``.

``../shared/corpus`` (beside the clone, read-only; ``--corpus`` or ``PLACECHECK_CORPUS`` name
another) holds correct training programs from public projects and, in its README, the exact
``placecheck run`` command of each. The gate:

1. copies the corpus to a temporary directory and makes its data there (``make_data.py``,
   ``time_sequence_prediction/generate_sine_wave_small.py``), as the README says;
2. runs every program of the README's table under ``placecheck run --steps 2 --format json``, once
   per engine (``--engine tagged`` and ``--engine fake``; :data:`ENGINE_OPTIONS` adds an option for a
   program under one engine, with why; a program placecheck refuses under an engine is **skipped**
   there, with placecheck's words): a
   program is **clean** when it exits 0 with no finding at ``error`` or ``warning`` (``info`` is
   fair). A program whose script raises ``ModuleNotFoundError`` (a package this machine lacks:
   matplotlib) is **skipped**, with the reason; any other failure is a failure. The lines of the
   corpus's files this run executed are recorded (a line tracer of the gate's own, in the process
   that runs the script; a program run in ranks, in processes of their own, records none: then
   every site counts);
3. generates mutants from each program's files with the transforms below (libcst: each edit keeps
   every line where it was), at every applicable site whose effect the clean run reached (the
   statement ran, and a later line naming what it binds ran too: :func:`reached`), or a
   deterministic sample of ``--per-transform`` of them (spread evenly over the sites, in file
   order), and runs each mutant with the program's command, in a copy of the program's folder, under
   one engine: the program's engines in turn (the other where the turn's clean run did not reach the
   site), compared with that engine's clean run (``--mutant-engines all``: under each);
4. prints ``engine E: programs clean N/N, mutants found M/M`` per engine, then the totals
   ``programs clean N/N, mutants found M/M``, and exits 1 on any miss (0 otherwise; 0 with a
   ``SKIPPED`` line when there is no corpus).

A mutant is **found** when its run reports a finding at ``error`` or ``warning`` that the clean run
of its program did not report (compared by code and ``file:line``), whose ``source`` or ``origin``
is in the mutated file at

- a line of the mutated statement (all its lines, for a statement written over several), or
- a line that names what the mutated statement binds (the assignment's targets, read later:
  ``model(data)`` after ``data = data.to(device)`` lost its move), or what its mutated expression
  reads (the receiver of the removed move: the loader line ``for data, target in loader`` where
  the batch element that reached the op came from), names compared as dotted text (``self.model``).

The transforms (each a function from a libcst module to its sites):

- ``drop-move``: a ``.to(...)``/``.cuda(...)`` of a name, attribute or subscript whose result is used
  (``x = x.to(device)``, ``return data.to(device)``) becomes the receiver alone;
- ``drop-device``: ``device=`` removed from a ``torch`` factory call (``torch.randn(..., device=d)``);
- ``plain-buffer``: ``self.register_buffer("name", value)`` becomes ``self.name = value``;
- ``cpu-loss-weight``: a CPU ``weight=torch.ones(...)`` given to a loss: ``nn.BCELoss()`` (not moved
  with ``.to()``) gets ``weight=torch.ones(1)``; ``F.nll_loss(out, y)`` / ``F.cross_entropy``
  ``weight=torch.ones(out.size(1))``, ``F.binary_cross_entropy`` ``weight=torch.ones(1)``;
- ``stale-optimizer``: after ``opt = optim.X(model.parameters(), ...)``, on the same line, the
  model is re-created by its own earlier statement in the same block (``; model = Net().to(device)``).

Under 5 minutes on 2 cores: the runs go to ``--workers`` processes (2), ``--steps 2``, each mutant under
one engine (both engines for every mutant took about twice the mutants' time).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "corpus"
ENV = "PLACECHECK_CORPUS"
FAILING = ("error", "warning")
STEPS = 2

OUTPUT_FOLDERS = {"vae": ("results",)}
"""Folders a program writes into without creating them (vae saves its images to ``results/``, which
its upstream checkout is run beside); made in the copy before the programs run."""

EQUIVALENT: dict[tuple[str, str, int, str], str] = {
    ("imagenet", "main.py", 332, "drop-move"):
        "the model is nn.DataParallel(model).cuda(): DataParallel scatters a CPU input to its GPUs itself, "
        "so the program without this move is correct on a GPU too",
}
"""Mutants that are no bug (equivalent mutants), by (program folder, file, first line, transform): each
must stay clean, with no new error or warning, as its reason says."""

ENGINES = ("tagged", "fake")
"""``placecheck run``'s engines the gate runs every program under (``--engines`` names fewer)."""

ENGINE_OPTIONS: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("regression", "fake"): (
        ("--timeout", "10"),
        "its loop ends when `loss = output.item()` falls below 1e-3; the fake engine's weights hold no "
        "values, so the loss read is assumed 1.0 each time and the loop would never end: stopped after 10 s "
        "(not an error; the note names the lines after it as unchecked)"),
}
"""``placecheck run``'s options for a program under one engine, by (program folder, engine), each with why:
the gate prints the reason beside the program's state."""

REFUSED = "cannot be combined yet"
"""What placecheck says when it refuses an engine for a program's options (``--engine fake`` with
``--nproc-per-node``): that program is SKIPPED under that engine, with placecheck's own words."""


# -- the programs: the README's table ----------------------------------------------------------------

@dataclass(frozen=True)
class Program:
    """One row of the corpus README's table: ``placecheck run`` of a script in a folder."""

    name: str
    folder: str
    script: str
    options: tuple[str, ...] = ()
    """``placecheck run``'s own options the README gives (``--nproc-per-node 2``)."""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def command(self, steps: int = STEPS, engine: str = "") -> list[str]:
        """``placecheck run``'s arguments, with ``--steps``, JSON output and ``--engine`` when given (with
        the options :data:`ENGINE_OPTIONS` gives the program under it)."""
        given = ENGINE_OPTIONS.get((self.folder, engine), ((), ""))[0]
        chosen = ["--engine", engine, *given] if engine else []
        return ["run", "--steps", str(steps), "--format", "json", *chosen, *self.options, self.script, "--",
                *self.args]


_ROW = re.compile(r"^\| *([^|]+?) *\| *`([^`]+)` *\|$", re.M)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def parse_readme(text: str) -> list[Program]:
    """The programs of the README's table: ``| dcgan | `placecheck run main.py -- ...` |``; the folder
    is the name's first word (``word_language_model (LSTM)``)."""
    programs = []
    for name, command in _ROW.findall(text):
        words = shlex.split(command)
        env = []
        while words and _ASSIGNMENT.match(words[0]):
            key, _, value = words.pop(0).partition("=")
            env.append((key, value))
        if words[:2] != ["placecheck", "run"]:
            continue
        words = words[2:]
        options: list[str] = []
        while words and not words[0].endswith(".py"):
            options.append(words.pop(0))
        if not words:
            raise ValueError(f"corpus README: no script in {command!r}")
        script = words.pop(0)
        args = words[1:] if words[:1] == ["--"] else words
        programs.append(Program(name, name.split()[0], script, tuple(options), tuple(args), tuple(env)))
    return programs


# -- the transforms ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mutant:
    """One edit of one file: its code, where it is, and what it names."""

    transform: str
    line: int
    """The first line of the mutated statement."""
    last: int
    """Its last line (the same for a one-line statement)."""
    code: str
    """The whole mutated file."""
    names: frozenset[str] = frozenset()
    """Dotted names the statement binds or its mutated expression reads: lines naming them count too."""
    said: str = ""
    """The edit, for a reader (``data.to(device) -> data``)."""


def _dotted(node: Any) -> str:
    """``self.model`` for a libcst Name/Attribute chain, "" for anything else."""
    import libcst as cst

    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr.value}" if inner else ""
    if isinstance(node, cst.Subscript):
        return _dotted(node.value)
    return ""


def _targets(statement: Any) -> set[str]:
    """The dotted names a statement assigns (``a, b = ...``, ``x: T = ...``, ``x += ...``)."""
    import libcst as cst

    names: set[str] = set()

    def add(target: Any) -> None:
        if isinstance(target, cst.Tuple | cst.List):
            for element in target.elements:
                add(element.value)
        elif _dotted(target):
            names.add(_dotted(target))

    for small in getattr(statement, "body", ()):
        if isinstance(small, cst.Assign):
            for t in small.targets:
                add(t.target)
        elif isinstance(small, cst.AnnAssign | cst.AugAssign):
            add(small.target)
    return names


class _Sites:
    """Walk a module keeping the innermost statement and the parent of every node: the transforms'
    common ground."""

    def __init__(self, source: str) -> None:
        import libcst as cst
        from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

        self.wrapper = MetadataWrapper(cst.parse_module(source))
        self.module = self.wrapper.module
        self.positions = self.wrapper.resolve(PositionProvider)
        self.parents = self.wrapper.resolve(ParentNodeProvider)

    def nodes(self) -> Iterable[Any]:
        """Every node, in source order."""
        import libcst as cst

        found: list[Any] = []

        class Collect(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                found.append(node)
                return True

        self.module.visit(Collect())
        return found

    def statement(self, node: Any) -> Any:
        """The innermost statement (a simple statement line, or a compound statement) holding ``node``."""
        import libcst as cst

        while node is not None and not isinstance(node, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            node = self.parents.get(node)
        return node

    def mutant(self, transform: str, old: Any, new: Any, names: Iterable[str] = (), said: str = "",
               anchor: Any = None) -> Mutant:
        """The module with ``old`` replaced by ``new``; its place is that of ``anchor``'s (default:
        ``old``'s) statement."""
        statement = self.statement(anchor if anchor is not None else old)
        span = self.positions[statement]
        code = self.module.deep_replace(old, new).code
        return Mutant(transform, span.start.line, span.end.line, code, frozenset(n for n in names if n), said)

    def text(self, node: Any) -> str:
        return self.module.code_for_node(node)


_MOVES = ("to", "cuda")


def drop_move(source: str) -> list[Mutant]:
    """``x.to(device)`` / ``x.cuda()`` whose result is used (not a statement of its own, which moves a
    module in place) becomes ``x``: a tensor, or a module assigned from its move, left on the CPU."""
    import libcst as cst

    sites = _Sites(source)
    out = []
    for node in sites.nodes():
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in _MOVES):
            continue
        receiver = node.func.value
        if not isinstance(receiver, cst.Name | cst.Attribute | cst.Subscript):
            continue
        if isinstance(sites.parents.get(node), cst.Expr):
            continue  # model.to(device) on its own: an in-place module move, not a value that is used
        names = {_dotted(receiver), *_targets(sites.statement(node))}
        out.append(sites.mutant("drop-move", node, receiver, names,
                                f"{sites.text(node)} -> {sites.text(receiver)}"))
    return out


_FACTORIES = frozenset({"arange", "empty", "eye", "full", "linspace", "ones", "rand", "randint", "randn",
                        "randperm", "tensor", "zeros", "as_tensor", "logspace"})


def drop_device(source: str) -> list[Mutant]:
    """``device=`` removed from a ``torch.<factory>(...)`` call: the tensor is made on the CPU."""
    import libcst as cst

    sites = _Sites(source)
    out = []
    for node in sites.nodes():
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and _dotted(node.func.value) == "torch" and node.func.attr.value in _FACTORIES):
            continue
        kept = [a for a in node.args if not (a.keyword is not None and a.keyword.value == "device")]
        if len(kept) == len(node.args):
            continue
        comma = kept[-1].comma if kept else None
        if isinstance(comma, cst.Comma) and not isinstance(comma.whitespace_after,
                                                           cst.ParenthesizedWhitespace):
            # the argument before a removed last one keeps no trailing comma, unless a line ends there
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        new = node.with_changes(args=kept)
        out.append(sites.mutant("drop-device", node, new, _targets(sites.statement(node)),
                                f"{sites.text(node)} -> {sites.text(new)}"))
    return out


def plain_buffer(source: str) -> list[Mutant]:
    """``self.register_buffer("name", value, ...)`` (a statement) becomes ``self.name = value``: a plain
    tensor attribute, which ``.to()`` does not move."""
    import libcst as cst

    sites = _Sites(source)
    out = []
    for node in sites.nodes():
        if not (isinstance(node, cst.Expr) and isinstance(node.value, cst.Call)):
            continue
        call = node.value
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "register_buffer"
                and len(call.args) >= 2 and isinstance(call.args[0].value, cst.SimpleString)):
            continue
        owner = call.func.value
        name = call.args[0].value.evaluated_value
        if not isinstance(name, str) or not name.isidentifier():
            continue
        target = cst.Attribute(value=owner, attr=cst.Name(name))
        new = cst.Assign(targets=[cst.AssignTarget(target=target)], value=call.args[1].value)
        out.append(sites.mutant("plain-buffer", node, new, {_dotted(target)},
                                f"{sites.text(node)} -> {sites.module.code_for_node(new)}"))
    return out


_MODULE_LOSSES = {"BCELoss": "torch.ones(1)"}
"""Loss modules taking ``weight=`` whose every shape a 1-element weight fits (it broadcasts)."""
_FUNCTIONAL_LOSSES = {"nll_loss": "torch.ones({input}.size(1))",
                      "cross_entropy": "torch.ones({input}.size(1))",
                      "binary_cross_entropy": "torch.ones(1)"}
"""Functional losses taking ``weight=``: the CPU weight each gets (per class, or one that broadcasts)."""


def cpu_loss_weight(source: str) -> list[Mutant]:
    """A loss given a CPU ``weight=torch.ones(...)``: a loss module built without one and not moved
    (``criterion = nn.BCELoss()``), or a functional loss whose input is a name (``F.nll_loss(out, y)``).
    Only in files where ``import torch`` (or ``import torch.nn``) binds the name ``torch``."""
    import libcst as cst

    imports = [a for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import) for a in node.names]
    if not any(a.name.split(".")[0] == "torch" and a.asname is None for a in imports):
        return []
    sites = _Sites(source)
    out = []
    for node in sites.nodes():
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute | cst.Name)):
            continue
        name = node.func.attr.value if isinstance(node.func, cst.Attribute) else node.func.value
        if any(a.keyword is not None and a.keyword.value == "weight" for a in node.args):
            continue
        parent = sites.parents.get(node)
        if name in _MODULE_LOSSES and not node.args:
            if isinstance(parent, cst.Attribute) and parent.attr.value in _MOVES:
                continue  # nn.CrossEntropyLoss().to(device): its weight buffer moves with it
            weight = _MODULE_LOSSES[name]
        elif name in _FUNCTIONAL_LOSSES and len(node.args) >= 2 and node.args[0].keyword is None \
                and isinstance(node.args[0].value, cst.Name):
            weight = _FUNCTIONAL_LOSSES[name].format(input=node.args[0].value.value)
        else:
            continue
        argument = cst.Arg(keyword=cst.Name("weight"), value=cst.parse_expression(weight),
                           equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                 whitespace_after=cst.SimpleWhitespace("")))
        args = list(node.args)
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        new = node.with_changes(args=[*args, argument])
        out.append(sites.mutant("cpu-loss-weight", node, new, _targets(sites.statement(node)),
                                f"{sites.text(node)} -> {sites.text(new)}"))
    return out


def stale_optimizer(source: str) -> list[Mutant]:
    """``opt = X(model.parameters(), ...)`` followed, on its own line, by the model's re-creation with
    the statement that created it earlier in the same block (``; model = Net().to(device)``): the
    optimizer holds the parameters of a model nobody uses."""
    import libcst as cst

    sites = _Sites(source)
    out = []
    for node in sites.nodes():
        body = getattr(node, "body", None)
        if not isinstance(body, Sequence) or not body or not isinstance(node, cst.Module | cst.IndentedBlock):
            continue
        made: dict[str, Any] = {}
        for line in body:
            if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
                continue
            small = line.body[0]
            if not isinstance(small, cst.Assign) or len(small.targets) != 1:
                continue
            value = small.value
            model = ""
            if isinstance(value, cst.Call) and value.args and isinstance(value.args[0].value, cst.Call):
                first = value.args[0].value
                if isinstance(first.func, cst.Attribute) and first.func.attr.value == "parameters" \
                        and not first.args:
                    model = _dotted(first.func.value)
            if model and model in made:
                new = line.with_changes(body=[small.with_changes(semicolon=cst.Semicolon(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" "))),
                    made[model]])
                out.append(sites.mutant("stale-optimizer", line, new, (),
                                        f"{sites.text(line).strip()} -> {sites.text(new).strip()}"))
            target = _dotted(small.targets[0].target)
            if target and isinstance(small.targets[0].target, cst.Name):
                made[target] = small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
    return out


TRANSFORMS: dict[str, Callable[[str], list[Mutant]]] = {
    "drop-move": drop_move,
    "drop-device": drop_device,
    "plain-buffer": plain_buffer,
    "cpu-loss-weight": cpu_loss_weight,
    "stale-optimizer": stale_optimizer,
}


def sample(items: Sequence[Any], count: int) -> list[Any]:
    """``count`` of ``items`` spread evenly (the first and the last among them), in order; all of them
    when there are no more (``count`` 0: all)."""
    if count <= 0 or len(items) <= count:
        return list(items)
    if count == 1:
        return [items[0]]
    step = (len(items) - 1) / (count - 1)
    return [items[round(i * step)] for i in range(count)]


def reached(mutant: Mutant, original: str, executed: set[int]) -> bool:
    """Whether the clean run reached what the mutant changes: its statement ran, and when the statement
    binds names, a later line naming them ran too (``fixed_noise = torch.randn(..., device=d)`` made at
    the start but used only after the ``--steps`` stop changes nothing the run sees)."""
    if mutant.line not in executed:
        return False
    later = {n for n in named_lines(original, mutant.names) if n > mutant.last}
    return not later or bool(later & executed)


def named_lines(source: str, names: Iterable[str]) -> set[int]:
    """The lines of ``source`` that name one of ``names`` (dotted text: ``data``, ``self.model``)."""
    wanted = set(names)
    if not wanted:
        return set()
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name | ast.Attribute) and ast.unparse(node) in wanted:
            lines.add(node.lineno)
    return lines


# -- running -----------------------------------------------------------------------------------------

@dataclass
class Run:
    """One ``placecheck run``: its exit code, its JSON report, and what it took."""

    code: int
    report: dict[str, Any] | None
    stderr: str
    seconds: float
    executed: set[tuple[str, int]] = field(default_factory=set)
    """``(file name, line)`` of the corpus's files that ran (empty: not recorded)."""

    def failing(self) -> list[dict[str, Any]]:
        return [f for f in (self.report or {}).get("findings", []) if f.get("severity") in FAILING]

    def missing_module(self) -> str:
        """The module the script could not import (this machine lacks it), or ""."""
        unfinished = (self.report or {}).get("summary", {}).get("unfinished", "")
        match = re.search(r"raised ModuleNotFoundError at .*: No module named '([^']+)'", unfinished)
        return match.group(1) if match else ""

    def refused(self) -> str:
        """placecheck's own words when it refused the engine for the program's options (exit 2, no
        report), or ""."""
        if self.code != 2 or self.report is not None:
            return ""
        said = [line for line in self.stderr.splitlines() if REFUSED in line]
        return said[0].removeprefix("placecheck: error: ") if said else ""


def _where(value: str) -> tuple[str, int] | None:
    """``main.py:42`` (any directory) as ``("main.py", 42)``."""
    path, _, line = value.rpartition(":")
    return (os.path.basename(path), int(line)) if path and line.isdigit() else None


def run_placecheck(program: Program, folder: Path, timeout: float, trace: Path | None = None,
                   engine: str = "") -> Run:
    """``placecheck run`` of ``program`` in ``folder`` (under ``engine``, when given); with ``trace``, the
    lines of the files under ``trace`` that ran are recorded (this module's own tracer,
    :func:`_traced_main`)."""
    env = {**os.environ, **dict(program.env), "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    lines_file = None
    if trace is not None:
        handle, lines_file = tempfile.mkstemp(suffix=".json")
        os.close(handle)
        command = [sys.executable, __file__, "--trace-lines", str(trace), lines_file, "--",
                   *program.command(engine=engine)]
    else:
        command = [sys.executable, "-m", "placecheck", *program.command(engine=engine)]
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        code, out, err = -1, "", f"timed out after {timeout:g} s\n{expired.stderr or ''}"
    seconds = time.monotonic() - start
    try:
        report = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        report = None
    executed: set[tuple[str, int]] = set()
    if lines_file is not None:
        try:
            executed = {(name, line) for name, line in json.loads(Path(lines_file).read_text() or "[]")}
        except (OSError, json.JSONDecodeError):
            executed = set()
        os.unlink(lines_file)
    return Run(code, report, err if isinstance(err, str) else "", seconds, executed)


def _traced_main(prefix: str, out: str, argv: list[str]) -> None:
    """``placecheck ARGV`` in this process with a line tracer on the files under ``prefix``: which of the
    corpus's lines ran, written to ``out`` as JSON (``[[absolute file, line], ...]``)."""
    root = os.path.abspath(prefix) + os.sep
    executed: set[tuple[str, int]] = set()

    @functools.cache
    def ours(name: str) -> bool:
        return not name.startswith("<") and os.path.abspath(name).startswith(root)

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            executed.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        if ours(frame.f_code.co_filename):
            executed.add((frame.f_code.co_filename, frame.f_lineno))
            return local
        return None

    sys.argv = ["placecheck", *argv]
    from placecheck.cli import entrypoint

    sys.settrace(on_call)
    threading.settrace(on_call)
    try:
        entrypoint()
    finally:
        sys.settrace(None)
        Path(out).write_text(json.dumps(sorted([os.path.abspath(f), n] for f, n in executed)))


# -- the gate ----------------------------------------------------------------------------------------

@dataclass
class Outcome:
    program: Program
    clean: Run
    skipped: str = ""
    problems: list[str] = field(default_factory=list)
    engine: str = ""


def check_clean(program: Program, run: Run) -> tuple[str, list[str]]:
    """``(skipped reason, problems)`` of a program's clean run: clean is exit 0, no error or warning."""
    missing = run.missing_module()
    if missing:
        return f"needs {missing}, which is not installed here", []
    if run.refused():
        return f"placecheck refuses it: {run.refused()}", []
    summary, stats = (run.report or {}).get("summary", {}), (run.report or {}).get("stats", {})
    if run.code == 2 and str(summary.get("unfinished", "")).endswith(": nothing was checked") \
            and not stats.get("device_ops") and not stats.get("modules_moved"):
        # decided from the report: the program put nothing on the GPU (it runs on the CPU by design)
        return ("it runs on the CPU by design (no op on a simulated GPU): placecheck run checked nothing and "
                "exits 2, as it must (issue 40)"), []
    problems = [f"{f['severity']} {f['code']} at {f.get('source', '')}: {f.get('message', '')}"
                for f in run.failing()]
    if run.report is None:
        problems.append(f"no report (exit {run.code}): {run.stderr.strip().splitlines()[-1:] or ''}")
    elif run.code != 0 and not problems:
        unfinished = run.report.get("summary", {}).get("unfinished", "")
        problems.append(f"exit {run.code}: {unfinished or run.stderr.strip()[-300:]}")
    return "", problems


def new_failing(clean: Run, run: Run) -> list[dict[str, Any]]:
    """The errors and warnings of ``run`` that the clean run did not report (by code and line)."""
    before = {(f["code"], _where(f.get("source", ""))) for f in clean.failing()}
    return [f for f in run.failing() if (f["code"], _where(f.get("source", ""))) not in before]


def found(mutant: Mutant, filename: str, original: str, clean: Run, run: Run) -> bool:
    """The mutant's run reports a new error or warning at the mutated statement, or at a line that
    names what it binds or reads (see the module's docstring)."""
    before = {(f["code"], _where(f.get("source", ""))) for f in clean.failing()}
    accepted = set(range(mutant.line, mutant.last + 1)) | named_lines(original, mutant.names)
    base = os.path.basename(filename)
    for f in run.failing():
        if (f["code"], _where(f.get("source", ""))) in before:
            continue
        for place in (f.get("source", ""), f.get("origin", "")):
            where = _where(place or "")
            if where is not None and where[0] == base and where[1] in accepted:
                return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--corpus", default=os.environ.get(ENV, str(DEFAULT_CORPUS)))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--per-transform", type=int, default=2,
                        help="mutants per program, file and transform: a deterministic sample (0: all)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per placecheck run")
    parser.add_argument("--only", action="append", default=[], help="programs whose name starts so")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"placecheck run's engines every program runs under (of {', '.join(ENGINES)})")
    parser.add_argument("--mutant-engines", choices=("split", "all"), default="split",
                        help="split: each mutant under one engine, the engines in turn (the default: under "
                             "5 minutes); all: each mutant under every engine")
    args = parser.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(ENGINES):
        parser.error(f"--engines {args.engines!r}: expected some of {', '.join(ENGINES)}")
    corpus = Path(args.corpus)
    readme = corpus / "README.md"
    if not readme.is_file():
        print(f"test-corpus: SKIPPED: no corpus at {corpus} (its README.md is missing); "
              f"--corpus or {ENV} names another")
        return 0
    import libcst  # noqa: F401  # the transforms need it (the fix extra): fail here, before any run

    started = time.monotonic()
    programs = [p for p in parse_readme(readme.read_text(encoding="utf-8"))
                if not args.only or p.name.startswith(tuple(args.only))]
    work = Path(tempfile.mkdtemp(prefix="placecheck-corpus-"))
    root = work / "corpus"
    shutil.copytree(corpus, root)
    for path in root.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)
    setup = [(root, "make_data.py"), (root / "time_sequence_prediction", "generate_sine_wave_small.py")]
    for folder, script in setup:
        if (folder / script).is_file():
            subprocess.run([sys.executable, script], cwd=folder, check=True, capture_output=True)
    for program_folder, names in OUTPUT_FOLDERS.items():
        for name in names:
            if (root / program_folder).is_dir():
                (root / program_folder / name).mkdir(exist_ok=True)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.workers))
    jobs: list[tuple[Outcome, Path, str, Mutant]] = []
    results: list[tuple[Run, bool]] = []
    outcomes: list[Outcome] = []
    try:
        # 1. every program under every engine, its lines recorded
        pairs = [(p, e) for p in programs for e in engines]
        clean_runs = list(pool.map(lambda pair: run_placecheck(
            pair[0], root / pair[0].folder, args.timeout, trace=root, engine=pair[1]), pairs))
        for (program, engine), run in zip(pairs, clean_runs, strict=True):
            skipped, problems = check_clean(program, run)
            outcomes.append(Outcome(program, run, skipped, problems, engine))
            state = f"SKIPPED ({skipped})" if skipped else "clean" if not problems else "NOT CLEAN"
            given, why = ENGINE_OPTIONS.get((program.folder, engine), ((), ""))
            print(f"program {program.name} [{engine}]: {state} ({run.seconds:.0f} s)"
                  + (f"; {' '.join(given)}: {why}" if why else ""))
            for problem in problems:
                print(f"    {problem}")
        # 2. the mutants of every program that ran, each under one engine (--mutant-engines all: each)
        for program in programs:
            ran = [o for o in outcomes if o.program is program and not o.skipped]
            if not ran:
                continue
            folder = root / program.folder
            lines = {o.engine: {(os.path.basename(f), n) for f, n in o.clean.executed
                                if os.path.dirname(f) == str(folder)} for o in ran}
            count = 0
            for path in sorted(folder.glob("*.py")):
                original = path.read_text(encoding="utf-8")
                # a line tracer saw the run (its lines recorded): only sites whose effect it reached
                in_file = {o.engine: {n for f, n in lines[o.engine] if f == path.name} if lines[o.engine]
                           else None for o in ran}
                for transform in TRANSFORMS.values():
                    sites = [(m, [o for o in ran if in_file[o.engine] is None
                                  or reached(m, original, in_file[o.engine] or set())])
                             for m in transform(original)]
                    for mutant, under in sample([(m, u) for m, u in sites if u], args.per_transform):
                        if args.mutant_engines == "split":  # in turn, where the turn's engine reached it
                            turn = ran[count % len(ran)]
                            under = [turn] if turn in under else under[:1]
                        jobs.extend((o, path, original, mutant) for o in under)
                        count += 1

        def run_mutant(job: tuple[Outcome, Path, str, Mutant], index: int) -> tuple[Run, bool]:
            outcome, path, original, mutant = job
            folder = root / f"{outcome.program.folder}.mutant{index}"
            shutil.copytree(path.parent, folder)
            (folder / path.name).write_text(mutant.code, encoding="utf-8")
            try:
                run = run_placecheck(outcome.program, folder, args.timeout, engine=outcome.engine)
            finally:
                if not args.keep:
                    shutil.rmtree(folder, ignore_errors=True)
            if (outcome.program.folder, path.name, mutant.line, mutant.transform) in EQUIVALENT:
                return run, run.code == 0 and not new_failing(outcome.clean, run)
            return run, found(mutant, path.name, original, outcome.clean, run)

        results = list(pool.map(run_mutant, jobs, range(len(jobs))))
        for (outcome, path, _, mutant), (run, hit) in zip(jobs, results, strict=True):
            equivalent = EQUIVALENT.get((outcome.program.folder, path.name, mutant.line, mutant.transform))
            what = f"{outcome.program.name} [{outcome.engine}] {path.name}:{mutant.line} {mutant.transform}"
            if hit and equivalent:
                print(f"equivalent {what}: clean, as it should be: {equivalent} ({run.seconds:.0f} s)")
                continue
            if hit:
                print(f"found {what} ({run.seconds:.0f} s)")
                continue
            label = "NOT CLEAN (an equivalent mutant)" if equivalent else "MISSED"
            print(f"{label} {what}: {mutant.said} (exit {run.code}, {run.seconds:.0f} s)")
            for f in (run.report or {}).get("findings", []):
                origin = f.get("origin") or "-"
                print(f"    {f['severity']} {f['code']} at {f.get('source')} (origin {origin}): "
                      f"{f.get('message', '')[:160]}")
            if run.report is None:
                print(f"    no report: {run.stderr.strip()[-300:]}")
    finally:
        pool.shutdown()
        if args.keep:
            print(f"test-corpus: the copy is kept at {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    for o in outcomes:
        if o.skipped:
            print(f"test-corpus: SKIPPED program {o.program.name} [{o.engine}]: {o.skipped}")
    failed = False
    totals = [0, 0, 0, 0]
    for engine in engines:
        counted = [o for o in outcomes if o.engine == engine and not o.skipped]
        clean = sum(1 for o in counted if not o.problems)
        hits = [hit for (o, *_), (_, hit) in zip(jobs, results, strict=True) if o.engine == engine]
        print(f"engine {engine}: programs clean {clean}/{len(counted)}, "
              f"mutants found {sum(hits)}/{len(hits)}")
        failed = failed or clean < len(counted) or not all(hits)
        totals = [a + b for a, b in zip(totals, (clean, len(counted), sum(hits), len(hits)), strict=True)]
    times = os.times()
    split = "each mutant under one engine, in turn" if args.mutant_engines == "split" \
        else "each mutant under every engine"
    print(f"programs clean {totals[0]}/{totals[1]}, mutants found {totals[2]}/{totals[3]} "
          f"({len(engines)} engines, {split}; {time.monotonic() - started:.0f} s, "
          f"{times.children_user + times.children_system:.0f} s of CPU; {args.workers} workers, "
          f"--steps {STEPS})")
    return 1 if failed else 0

if __name__ == "__main__":
    if len(sys.argv) > 4 and sys.argv[1] == "--trace-lines" and sys.argv[4] == "--":
        _traced_main(sys.argv[2], sys.argv[3], sys.argv[5:])
    else:
        sys.exit(main())
