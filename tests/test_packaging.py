"""What a user installs: open torch ranges, every import declared, the example config shipped.

Building and installing the wheel itself is ``make wheel-check`` (about half a minute).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from cli_runner import CliRunner

from placecheck.basics.config import tomllib  # tomli on Python 3.10
from placecheck.cli import app

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
# import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml", "libcst": "libcst", "tomli": "tomli"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere in placecheck/ (inside functions too) -> files."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "placecheck").rglob("*.py"):
        if "examples" in path.parts:  # example models, not placecheck's own code
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top != "placecheck" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def test_published_torch_ranges_are_open() -> None:
    deps = PYPROJECT["project"]["dependencies"]
    torch_deps = [d for d in deps if d.startswith(("torch>", "torch=", "torch<", "torchvision"))]
    # the floor placecheck.engines.compat states (measured: its docstring), no upper bound, no torchvision
    from placecheck.engines.compat import FLOOR

    assert sorted(torch_deps) == [f"torch>={FLOOR}"]


USER_STACKS = {
    # what a user already has, which `pip install placecheck[...]` must keep
    "a GPU image (issue 22)": {"torch": "2.11.0+cu130", "transformers": "5.17.0", "typer": "0.27.2",
                               "safetensors": "0.7.0", "torchvision": "0.26.0+cu130"},
    "this project's machines": {"torch": "2.14.1", "transformers": "4.57.6", "typer": "0.29.2",
                                "torchvision": "0.29.1"},
    "the newest releases": {"torch": "2.15.0", "transformers": "5.17.0", "typer": "0.29.2"},
    "typer's floor": {"typer": "0.15.4"},
}


def test_installing_placecheck_keeps_a_users_torch_and_transformers() -> None:
    from packaging.requirements import Requirement
    from packaging.version import Version

    project = PYPROJECT["project"]
    hard = [Requirement(r) for r in project["dependencies"]]
    # each torchvision release requires one torch; safetensors and transformers only serve extras
    assert not {r.name for r in hard} & {"torchvision", "safetensors", "transformers"}
    extras = {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}
    assert [str(r) for r in extras["vision"]] == ["torchvision>=0.19"]
    assert [str(r) for r in extras["safetensors"]] == ["safetensors>=0.4"]
    checked = 0
    for group, reqs in {"dependencies": hard, **extras}.items():
        for req in reqs:
            assert not any(s.operator in ("==", "===") for s in req.specifier), (group, str(req))
            for stack, versions in USER_STACKS.items():
                if req.name in versions:
                    checked += 1
                    assert req.specifier.contains(Version(versions[req.name]), prereleases=True), (
                        f"{group}: {req} would replace {stack}'s {req.name} {versions[req.name]}")
    assert checked >= 10


def test_an_example_without_torchvision_says_which_extra() -> None:
    example = REPO / "placecheck" / "examples" / "train_buggy.py"
    code = ("import runpy, sys\nsys.modules['torchvision'] = None\n"
            f"runpy.run_path({str(example)!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == "this example needs torchvision: pip install 'placecheck[vision]'"


def test_every_import_is_declared() -> None:
    project = PYPROJECT["project"]
    declared = _names(project["dependencies"])
    extras = {name for reqs in project["optional-dependencies"].values() for name in _names(reqs)}
    for module, files in sorted(_third_party_imports().items()):
        name = DISTRIBUTION.get(module, module).lower()
        # an optional import (extras, or guarded by try/except ImportError in the code) may live in an extra
        assert name in declared or name in extras, f"{module} is imported by {sorted(files)} but not declared"
    assert "rich" in declared  # the --config progress bar imports it directly


def test_the_project_machines_pin_torch_with_a_constraints_file() -> None:
    pins = [line for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines()
            if line and not line.startswith("#")]
    assert pins == ["torch==2.14.1", "torchvision==0.29.1", "transformers==4.57.6"]
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^TORCH\s*\?=\s*-c constraints\.txt$", makefile, re.M)
    install = makefile.split("$(STAMP): ", 1)[1].split("\n\n", 1)[0]
    assert install.count("pip install") == install.count("pip install --quiet $(TORCH)") == 2
    # the examples' extras: torchvision and safetensors are no longer installed with placecheck itself
    assert "vision" in install and "safetensors" in install
    # the CPU-build venv keeps its own torch 2.13.0: the constraint's torch must not reach it
    cpu = makefile.split("$(CPU_STAMP): ", 1)[1].split("\n\n", 1)[0]
    assert "constraints" not in cpu and "$(TORCH)" not in cpu


def test_the_example_config_ships_in_the_package_and_help_names_its_command() -> None:
    assert "configs/*.toml" in PYPROJECT["tool"]["setuptools"]["package-data"]["placecheck"]
    packaged = REPO / "placecheck" / "configs" / "example.toml"
    assert (REPO / "configs" / "example.toml").resolve() == packaged.resolve()
    runner = CliRunner()
    printed = runner.invoke(app, ["example-config"])
    assert printed.exit_code == 0 and printed.stdout == packaged.read_text(encoding="utf-8")
    help_text = " ".join(runner.invoke(app, ["audit", "--help"]).stdout.split())
    assert "placecheck example-config" in help_text and "configs/example.toml" not in help_text
