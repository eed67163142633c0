"""The forward-pass core's layers: a lower module never imports a higher one, not even inside a function.

Bottom to top: compat (torch's private API) < callbacks (the script's code autograd calls back,
run under the session's modes) < sources (user lines) < classify (what an error means) < host_syncs
(the calls that make the host wait) < calls (the one reading of a placement call) < cudaapi (the
simulated torch.cuda API) < dispatch (the one torch function mode, each call a typed Call to its
subscribers) < autocast (CUDA autocast's policies on the CPU) < tagged (the real-valued engine)
< shortcuts (ops made from metadata where torch's fake path is slow) < sparse (sparse ops on the fake
engine's GPU) < datadep (fake tensors' data-dependent ops) < reuse (identical module calls run once)
< engine < provenance < hostcopies (non-blocking host copies) < trace. Each module may import only
modules below it (and placecheck's torch-free basics: a finding, the events a recorder records and the
rules that judge them); zoo imports no placecheck module, so inputs can import it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

PACKAGE = Path(__file__).parents[1] / "placecheck"
ORDER = ["compat", "callbacks", "sources", "classify", "repair", "host_syncs", "calls", "cudaapi", "dispatch",
         "autocast", "tagged",
         "shortcuts", "sparse",
         "datadep", "reuse", "engine", "provenance", "hostcopies", "trace"]
BASICS = {"errors", "values", "patching", "finding", "events", "codes", "rules", "devices", "walk", "options",
          "expected", "flows"}
"""Modules any layer may use: torch-free basics (a finding, its code and rule), the walk's result the
tracer starts from, and ``--device keep``'s ``expected`` (each module's expected device, the walk's too)
and ``flows`` (the flows of a forward across devices, whose copies are events)."""


LAYER_PACKAGES = {"basics", "findings", "engines", "checks", "model", "commands"}
"""The packages that group modules by layer: a module in one is named by its own name here."""


def _path(module: str) -> Path:
    [path] = [p for p in PACKAGE.glob(f"*/{module}.py") if p.parent.name in LAYER_PACKAGES]
    return path


def _name(dotted: str) -> str:
    """``placecheck.checks.trace`` -> ``trace``; ``placecheck.checks.expected`` -> ``placement``."""
    parts = dotted.split(".")[1:]
    return parts[1] if parts[0] in LAYER_PACKAGES and len(parts) > 1 else parts[0]


def _imports(module: str) -> set[str]:
    """Every placecheck module ``module`` imports, at module level or inside functions."""
    tree = ast.parse(_path(module).read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("placecheck"):
            if node.module == "placecheck" or node.module.partition(".")[2] in LAYER_PACKAGES:
                found.update(alias.name for alias in node.names)
            else:
                found.add(_name(node.module))
        elif isinstance(node, ast.Import):
            found.update(_name(a.name) for a in node.names if a.name.startswith("placecheck."))
    return found


@pytest.mark.parametrize("module", ORDER)
def test_a_layer_imports_only_layers_below_it(module: str) -> None:
    below = set(ORDER[:ORDER.index(module)])
    assert _imports(module) - below - BASICS == set()


def test_zoo_imports_no_placecheck_module() -> None:
    assert _imports("zoo") == set()
