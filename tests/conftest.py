"""Shared fixtures and options for the test suite.

``pytest --update-golden`` rewrites the golden files under ``tests/golden/``
from the current output instead of comparing against them; review the diff
before committing it. The report's ``torch: <version>`` note is written
``torch: TORCH_VERSION`` there, so that any torch of the matrix gives the same text.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # started with Ctrl-C ignored (a background job of a shell without job control, ``(cmd &)``): the
    # Ctrl-C tests need it delivered, to this process and to the placecheck processes it starts, which
    # inherit an ignored signal but not a handler
    signal.signal(signal.SIGINT, signal.default_int_handler)

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
EXAMPLES = REPO / "placecheck" / "examples"
BUGGY = f"{EXAMPLES / 'buggy.py'}:BuggyNet"
CLEAN = f"{EXAMPLES / 'clean.py'}:CleanNet"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker runs torch with its share of the cores, as placecheck's own
    parallel audits do (:func:`placecheck.commands.runner.child_threads`), and so do the processes the tests
    start (``OMP_NUM_THREADS``): every worker spinning a thread per core on the same cores slows the
    suite's CPU work many times over. An ``OMP_NUM_THREADS`` already set is left to torch."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1 and not os.environ.get("OMP_NUM_THREADS", "").strip():
        from placecheck.commands.runner import child_threads

        share = child_threads(workers)
        os.environ["OMP_NUM_THREADS"] = str(share)
        import torch

        torch.set_num_threads(share)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", default=False,
        help="rewrite tests/golden/* from the current output instead of comparing",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True under ``pytest --update-golden``."""
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def golden(update_golden: bool) -> Callable[[str, str], None]:
    """``golden(name, text)``: compare ``text`` with ``tests/golden/<name>`` exactly (or rewrite it)."""

    def check(name: str, text: str) -> None:
        path = TESTS / "golden" / name
        torch = sys.modules.get("torch")
        if torch is not None:  # every report names the torch in use: the goldens name none
            text = text.replace(f"torch: {torch.__version__}", "torch: TORCH_VERSION")
        if update_golden:
            path.write_text(text, encoding="utf-8")
            return
        assert path.is_file(), f"{path} is missing: run pytest --update-golden to create it"
        assert text == path.read_text(encoding="utf-8"), (
            f"output differs from {path}; if the change is intended, run pytest --update-golden"
        )

    return check


def load_file(path: Path, attr: str = "Model") -> Any:
    """Import a fixture file under a unique module name and return ``attr`` from it."""
    name = f"_pc_fixture_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return getattr(module, attr)


def read_expected(path: Path) -> list[tuple[str, str]]:
    """``CODE where`` lines of an ``.expected`` file, sorted; ``#`` comments and blanks skipped."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        code, _, where = line.partition(" ")
        rows.append((code, where.strip()))
    return sorted(rows)


def read_expected_lines(path: Path) -> list[tuple[str, str, str]]:
    """``(code, where, line)`` rows of an ``.expected`` file, sorted (``<root>`` is "", ``-``: no line);
    ``#`` comments and blanks skipped."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            code, where, lineno = line.split()
            rows.append((code, "" if where == "<root>" else where, lineno))
    return sorted(rows)


def unwrapped(err: str) -> str:
    """stderr's lines as written before they were fitted to the terminal's width: each continuation
    (indented two spaces, :func:`placecheck.findings.output.stderr_text`) joined to its line."""
    lines: list[str] = []
    for line in err.splitlines():
        if line.startswith("  ") and lines and lines[-1].startswith("placecheck:") \
                and not line.startswith("   "):
            lines[-1] += " " + line[2:]
        else:
            lines.append(line)
    return "\n".join(lines) + ("\n" if err.endswith("\n") else "")


def assert_usage_error(code: int, out: str, err: str, *needles: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr (no traceback, fitted to the width) containing each
    needle."""
    assert code == 2, err
    assert out == ""
    assert all(len(line) <= 80 or " " not in line.strip() for line in err.splitlines()), err
    lines = unwrapped(err).strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("placecheck: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


def walk_findings(model_or_factory: Any, device: str = "cuda", **kwargs: Any) -> list[tuple[str, str]]:
    """``(code, where)`` of every walk finding (PC1xx) of a simulated-CUDA audit, sorted."""
    import placecheck

    engine = "fake" if device.startswith("cuda") else "auto"
    report = placecheck.audit(model_or_factory, device=device, engine=engine, select=["PC1"], **kwargs)
    return sorted((f.code, f.where) for f in report.findings)


def fixture_cases(directory: Path) -> list[Any]:
    """One pytest param ``(NAME.py, NAME.expected)`` per ``*.py`` fixture in ``directory``.

    A fixture missing its ``.expected`` is still collected, so that the test fails on it.
    """
    cases = []
    for py in sorted(directory.glob("*.py")):
        expected = py.with_suffix(".expected")
        cases.append(pytest.param(py, expected, id=py.stem))
    return cases


# Known gaps on transformers 5 (make test-compat's transformers-5 leg), each a strict xfail there: the
# test fails the leg as soon as the gap closes, so this list cannot go stale. Nothing here is skipped
# on transformers 4.57, the pinned version.
TRANSFORMERS_5_GAPS: dict[str, str] = {
    "test_datadep.py::test_tiny_configs_run_on_the_fake_engine_with_the_real_valued_engines_findings[mixtral]":
        "transformers 5 MoE experts call torch._grouped_mm, whose fake kernel refuses the tiny config's "
        "dtypes ('Expected mat_a to be BFloat16'): a PC207 on correct code, fake engine only",
    "test_datadep.py::test_tiny_configs_run_on_the_fake_engine_with_the_real_valued_engines_findings[qwen2_moe]":
        "as mixtral: torch._grouped_mm in transformers 5's MoE experts under fake tensors",
    "test_library_zoo.py::test_transformers_tiny_config_has_no_warning[mixtral]":
        "as mixtral above: torch._grouped_mm under fake tensors",
    "test_library_zoo.py::test_transformers_tiny_config_has_no_warning[qwen2_moe]":
        "as mixtral above: torch._grouped_mm under fake tensors",
    "test_library_zoo.py::test_gptj_scalar_attribute_is_reported_as_info":
        "transformers 5's GPT-J no longer keeps the scalar attribute the test looks for",
    "test_device_map.py::test_the_8b_map_equals_what_transformers_and_accelerate_compute":
        "the test calls transformers' private _get_device_map with its 4.57 signature",
    "test_device_map.py::test_other_computed_maps_equal_transformers[balanced_low_0]":
        "the test calls transformers' private _get_device_map with its 4.57 signature",
    "test_device_map.py::test_other_computed_maps_equal_transformers[sequential]":
        "the test calls transformers' private _get_device_map with its 4.57 signature",
    "test_device_map.py::test_the_printed_8b_map_is_accelerates":
        "the test compares with transformers' private _get_device_map (4.57 signature)",
    "test_transformers_examples.py::test_shared_embedding_of_t5_moves_under_simulation":
        "transformers 5's T5 ties its shared embedding differently; the test's expectation is 4.57's",
    "test_transformers_examples.py::test_bert_with_sdpa_attention_syncs_with_the_host_inside_transformers[False]":
        "transformers 5 skips its value-reading mask checks under fake tensors (is_tracing): "
        "docs/simulation-limits.md",
    "test_transformers_examples.py::test_bert_with_sdpa_attention_syncs_with_the_host_inside_transformers[True]":
        "as [False]: transformers 5's is_tracing() under fake tensors",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import importlib.metadata

        major = int(importlib.metadata.version("transformers").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return
    if major < 5:
        return
    for item in items:
        reason = TRANSFORMERS_5_GAPS.get(item.nodeid.removeprefix("tests/"))
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=f"transformers {major}: {reason}", strict=True))
