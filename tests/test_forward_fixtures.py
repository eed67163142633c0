"""One fixture model per forward-pass code, beside its expected findings, collected automatically.

Each ``tests/fixtures/forward/NAME.py`` defines ``Model`` (built with no
arguments; its input is inferred from its first layer unless the file names
``--input`` specs in a module-level ``INPUTS`` list). ``NAME.expected``
lists the forward findings (PC2xx) the audit must produce, one
``CODE WHERE LINE`` per line: ``WHERE`` is the module whose forward ran the
line (``<root>`` for the model itself) and ``LINE`` the line in the fixture
file that ``source`` must point to. Stray tensors the walk reports (PC101)
are listed too, as ``PC101 ATTRIBUTE -``: the forward decides whether they
stay reported (one it replaces, or only uses in CPU computations, is not). The audit runs for ``cuda`` under
simulated CUDA (``auto``: fake tensors, falling back to real values), so this
runs the same on a machine without a GPU. With a GPU, the same fixtures run on
the real CUDA engine and must give the same codes and locations.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import TESTS, fixture_cases, load_file, read_expected_lines
from forward_helpers import ungrouped  # noqa: F401 (the fixture)

import placecheck

FIXTURES = TESTS / "fixtures" / "forward"
CASES = fixture_cases(FIXTURES)
FORWARD_CODES = ["PC101", "PC2"]

pytestmark = [pytest.mark.usefixtures("ungrouped"), pytest.mark.cpu_build]


def forward_rows(source: Path, report: placecheck.Report) -> list[tuple[str, str, str]]:
    rows = []
    for f in report.findings:
        if f.code == "PC101":
            rows.append((f.code, f.where, "-"))
            continue
        path, _, lineno = f.source.rpartition(":")
        assert Path(path).name == source.name, f"{f.code} points outside the fixture: {f.source}"
        rows.append((f.code, f.where, lineno))
    return sorted(rows)


def fixture_inputs(source: Path) -> list[str]:
    """The ``--input`` specs a fixture names in a module-level ``INPUTS`` (none: the input is inferred)."""
    inputs: list[str] = getattr(sys.modules[f"_pc_fixture_{source.parent.name}_{source.stem}"], "INPUTS", [])
    return inputs


def test_fixture_directory_has_every_forward_code() -> None:
    codes = {row[0] for _, expected in (c.values for c in CASES) for row in read_expected_lines(expected)}
    assert codes == {"PC101", "PC201", "PC202", "PC203", "PC204", "PC205", "PC206", "PC207", "PC210"}


@pytest.mark.parametrize("source, expected", CASES)
def test_forward_fixture(source: Path, expected: Path) -> None:
    assert expected.is_file(), f"{source.name} has no {expected.name} beside it"
    model = load_file(source)
    report = placecheck.audit(model, device="cuda", select=FORWARD_CODES, inputs=fixture_inputs(source))
    assert report.engine.startswith("simulated cuda")
    assert forward_rows(source, report) == read_expected_lines(expected), report.notes


@pytest.mark.parametrize("source, expected", CASES)
def test_forward_fixture_on_a_second_simulated_gpu_with_real_values(source: Path, expected: Path) -> None:
    # cuda:1 of two simulated GPUs, on the real-valued engine: the same codes and locations
    model = load_file(source)
    report = placecheck.audit(model, device="cuda:1", engine="tagged", select=FORWARD_CODES,
                              inputs=fixture_inputs(source))
    assert forward_rows(source, report) == read_expected_lines(expected), report.notes
    # a device-to-host copy that forward returns (PC204 tied to its PC206), or a non-blocking one read too
    # early (PC210), is expected on the host
    assert all(f.expected == ("cpu" if (f.code == "PC204" and f.origin) or f.code == "PC210" else "cuda:1")
               for f in report.findings)
    assert all(f.device == "cuda:1" for f in report.findings if f.code == "PC210")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("source, expected", CASES)
def test_forward_fixture_on_a_real_gpu_matches_the_simulation(source: Path, expected: Path) -> None:
    model = load_file(source)
    real = placecheck.audit(model, device="cuda", engine="real", select=FORWARD_CODES,
                            inputs=fixture_inputs(source))
    simulated = placecheck.audit(model, device="cuda", engine="tagged", select=FORWARD_CODES,
                                 inputs=fixture_inputs(source))
    assert real.engine == "cuda"
    assert forward_rows(source, real) == forward_rows(source, simulated) == read_expected_lines(expected)
