"""benchmarks/bench_suite.py reads pytest's own summary lines of a CI log: the parts it reports must be
the runs' real times and counts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench_suite() -> Any:
    sys.path.insert(0, str(BENCHMARKS))  # it imports benchmarks/machine.py as `machine`, as a script does
    try:
        spec = importlib.util.spec_from_file_location("_pc_bench_suite", BENCHMARKS / "bench_suite.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_each_pytest_summary_line_is_one_run_with_its_seconds_and_counts(bench_suite: Any) -> None:
    log = "\n".join([
        "........................................................................ [ 98%]",
        "SKIPPED [19] tests/test_forward_fixtures.py:79: needs a CUDA GPU",
        "=========== 1910 passed, 65 skipped, 7 warnings in 189.91s (0:03:09) ===========",
        "make[1]: Entering directory '/tmp/x'",
        "================= 747 passed, 96 skipped, 1 warning in 15.40s ==================",
        "=== 2 failed, 3 passed in 1.50s ===",
    ])
    assert bench_suite.pytest_runs(log) == [
        {"seconds": 189.91, "counts": {"passed": 1910, "skipped": 65, "warnings": 7}},
        {"seconds": 15.40, "counts": {"passed": 747, "skipped": 96, "warning": 1}},
        {"seconds": 1.50, "counts": {"failed": 2, "passed": 3}},
    ]
    assert bench_suite.pytest_runs("no summary here\n=== slowest 100 durations ===") == []


def test_each_step_ci_run_announces_lasts_until_the_next_one_or_the_end(bench_suite: Any) -> None:
    lines = [(0.5, "Cloning\n"), (1.0, "== .ci/run: make test\n"), (400.0, "=== 5 passed in 2.00s ===\n"),
             (410.0, "== .ci/run: make test-corpus\n"),
             (500.0, "== .ci/run: make test-compat COMPAT_KEEP=0 COMPAT_MAIN=0\n"), (900.0, "done\n")]
    assert bench_suite.step_times(lines, end=950.0) == {
        "make test": 409.0, "make test-corpus": 90.0, "make test-compat": 450.0}
    assert bench_suite.step_times([(1.0, "no step announced\n")], end=2.0) == {}


def test_the_targets_scale_with_the_machine_s_reference_workload(bench_suite: Any) -> None:
    at_reference = bench_suite.scaled_targets(bench_suite.REFERENCE_S)
    assert at_reference == {"make test": 300.0, ".ci/run": 900.0}
    three_times_slower = bench_suite.scaled_targets(3 * bench_suite.REFERENCE_S)
    assert three_times_slower == {"make test": 900.0, ".ci/run": 2700.0}
