"""The layers of docs/architecture.md: no import cycles among placecheck modules; lower never imports higher.

Imports are read with ``ast`` from every module, inside functions too (a lazy
import is still a dependency) and inside ``if TYPE_CHECKING:`` blocks (a type
the module names is a dependency of its design, even if it never runs: a room
that names its caller's class knows its caller). Only for the torch-free layer's
"never imports torch" are ``TYPE_CHECKING`` imports of other packages skipped,
since they never run. ``from placecheck.x import y`` counts as an import of
``placecheck.x.y`` when that is a module, else of ``placecheck.x``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "placecheck"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name == "TYPE_CHECKING":
                skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(placecheck modules ``module`` imports, other top-level packages it imports)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    ours: set[str] = set()
    theirs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "placecheck":
                    ours.add(alias.name)
                elif id(node) not in skipped:
                    theirs.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "placecheck":
                if id(node) not in skipped:
                    theirs.add(source.split(".")[0])
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                ours.add(submodule if submodule in MODULES else source)
    return {m for m in ours if m in MODULES and m != module}, theirs


GRAPH = {module: _imports(module)[0] for module in MODULES}


def _cycles() -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read() -> None:
    # a reader that found nothing would pass the tests below vacuously
    assert "placecheck.commands.api" in GRAPH["placecheck.cli.audit"]
    assert "placecheck.commands.runner" in GRAPH["placecheck.cli.ci"]  # a lazy import inside a function
    assert "placecheck.cli.audit" in GRAPH["placecheck.cli"]
    assert "placecheck.run.session" in GRAPH["placecheck.run.moves"]  # under TYPE_CHECKING


def test_no_import_cycles() -> None:
    assert _cycles() == []


# ---- layers, bottom to top ------------------------------------------------------------------------

TORCH_FREE = ("basics", "findings")
"""What the CLI's --help, `rules`, a config check and a report rendering use: never imports torch."""
TOP = {"commands.api": 1, "fix": 2, "commands.runner": 2, "commands.worker": 2,
       "pytest_plugin": 3, "cli": 4, "__main__": 5}
"""The layers above the engine's (which is 0: engines, checks, model, run, checkpoint, placement; the
torch-free layer below it is -1)."""


def _layer(module: str) -> int:
    rest = module.partition(".")[2]
    if rest.split(".")[0] in TORCH_FREE:
        return -1
    return next((layer for prefix, layer in TOP.items()
                 if rest == prefix or rest.startswith(prefix + ".")), 0)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m) == -1))
def test_the_torch_free_layer_stays_torch_free(module: str) -> None:
    ours, theirs = _imports(module)
    assert "torch" not in theirs
    # the package root imports nothing heavy at import time (audit is a lazy attribute)
    assert {m for m in ours if m != "placecheck" and _layer(m) != -1} == set()


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "placecheck"))
def test_a_lower_layer_never_imports_a_higher_one(module: str) -> None:
    higher = {m for m in GRAPH[module] if m != "placecheck" and _layer(m) > _layer(module)}
    assert higher == set()


PACKAGE_ORDER = ["examples", "basics", "findings", "engines", "checks", "model", "placement", "checkpoint",
                 "run", "commands", "fix", "", "pytest_plugin", "cli", "__main__"]
"""The packages bottom to top: each imports only packages before it, counting lazy and ``TYPE_CHECKING``
imports (issue 41: the folders show the layers). ``examples`` are the bundled models, importing no
placecheck module; "" is the package root, the public API's surface."""


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _package_edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for module, imported in GRAPH.items():
        for other in imported:
            if _package(module) != _package(other):
                edges.setdefault((_package(module), _package(other)), []).append(f"{module} -> {other}")
    return edges


def test_every_package_is_in_the_order() -> None:
    assert {_package(m) for m in MODULES} == set(PACKAGE_ORDER)


def test_no_package_imports_a_package_that_imports_it() -> None:
    edges = _package_edges()
    assert ("cli", "commands") in edges  # the reader sees the packages' imports
    assert sorted(pair for pair in edges if pair[::-1] in edges) == []


def test_a_package_imports_only_the_packages_below_it() -> None:
    upward = {pair: found for pair, found in _package_edges().items()
              if PACKAGE_ORDER.index(pair[1]) > PACKAGE_ORDER.index(pair[0])}
    assert upward == {}


def test_one_class_per_name() -> None:
    # issue 41 item 6: three classes were called Site and two Placement; a reader (and a grep) should
    # find one class behind a name. The bundled examples are user models, named as users name them.
    homes: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if module.startswith("placecheck.examples"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                homes.setdefault(node.name, []).append(module)
    assert "Site" in homes and "EventSite" in homes  # the reader sees the classes
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}


def test_typer_lives_only_in_the_cli() -> None:
    # the command line's machinery (typer, click, exits) stays in cli/: a Python caller of audit(), run(),
    # fix() or check_checkpoint() gets a report or an exception, never a SystemExit
    assert "typer" in _imports("placecheck.cli.app")[1]  # the reader sees it
    below = sorted(m for m in MODULES if m.split(".")[1:2] != ["cli"]
                   and {"typer", "click"} & _imports(m)[1])
    assert below == []


# ---- interception: where torch function modes may be defined ---------------------------------------

FUNCTION_MODE_MODULES = {
    "placecheck.engines.dispatch": "the one dispatcher: every torch call read once, for every check",
    "placecheck.engines.tagged": "the real-valued engine (tags CUDA placements)",
    "placecheck.engines.engine": "the fake engine (moves on a CPU-only build and of model.to(), the current "
                                 "device, a script's backward, printing and deep copies)",
}
"""The modules that define a ``TorchFunctionMode`` (issue 34: one dispatcher and the engines, at most one
mode each); a new mode elsewhere is a new interception layer, and fails here until it is justified."""


def _function_modes(module: str) -> list[str]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any((b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")) == "TorchFunctionMode"
                    for b in node.bases)]


def test_torch_function_modes_are_defined_only_in_the_allowed_modules() -> None:
    defined = {m: _function_modes(m) for m in MODULES}
    assert defined["placecheck.engines.tagged"] == ["_TaggingMode"]  # the reader sees them
    assert defined["placecheck.engines.dispatch"] == ["Dispatcher"]
    outside = {m: names for m, names in defined.items() if names and m not in FUNCTION_MODE_MODULES}
    assert outside == {}
    assert all(len(defined[m]) <= 1 for m in FUNCTION_MODE_MODULES), defined


# ---- the folders show the layers -------------------------------------------------------------------

OVER_800: set[str] = set()
"""Files still over 800 lines, each to be split (issue 34: rules per family, as ruff keeps a rule per
file); the set may only shrink."""


def test_the_top_of_the_package_holds_at_most_15_modules() -> None:
    top = sorted(p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists())
    assert len(top) <= 15, top


def test_no_file_grows_over_800_lines() -> None:
    long = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
            if len(p.read_text(encoding="utf-8").splitlines()) > 800}
    assert long <= OVER_800


# ---- values typed once: a device string is read by basics.values.Device, never split by hand ----------

COLON_SPLITS = {
    "basics/values.py": "Device and Site themselves",
    "model/load.py": "a target, module:attr",
    "findings/formats/location.py": "a target, module:attr",
    "findings/formats/table.py": "a finding's source, path:line",
    "run/ranks.py": "a process group's backend, cpu:gloo,cuda:nccl",
    "commands/worker.py": "an entry point, module:function",
    "commands/runner.py": "a target, module:attr",
}
"""The modules that split a string at ':' and what they split: none of them a device."""


def test_no_device_string_is_split_by_hand() -> None:
    splitting = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if re.search(r"""(split|partition)\(["']:["']""", p.read_text(encoding="utf-8"))}
    assert splitting <= set(COLON_SPLITS), sorted(splitting - set(COLON_SPLITS))


DEVICE_FIELDS = ("device", "devices", "src", "dst", "route", "moved_to")
"""The fields of an event that hold where a tensor was (``expected`` is a label: ``cuda:0 or cuda:1``)."""


def test_every_device_an_event_records_is_a_device_value() -> None:
    # issue 41 item 6: values stay typed from the edge to the report; an event's device is a
    # basics.values.Device (normalised once), never a str read again by each rule
    import dataclasses
    import typing

    from placecheck.findings import events

    classes = [c for c in vars(events).values() if isinstance(c, type) and dataclasses.is_dataclass(c)
               and c.__module__ == events.__name__]
    typed = {f"{c.__name__}.{name}": hint for c in classes
             for name, hint in typing.get_type_hints(c).items() if name in DEVICE_FIELDS}
    assert len(typed) >= 12 and "Mismatch.devices" in typed  # the reader sees the fields
    loose = {field: hint for field, hint in typed.items() if "Device" not in repr(hint)}
    assert loose == {}
    assert events.EventSite.__annotations__["source"] in ("Site", events.Site)
