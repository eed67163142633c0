"""A pytest plugin (entry point ``pytest11``): assert in a test that a model's placement is clean.

    from placecheck.pytest_plugin import assert_placement

    def test_model_moves_to_cuda():
        assert_placement(MyNet(), "float32[2,3,32,32]")          # device="cuda" by default

    def test_with_the_fixture(assert_placement):                 # the same function, as a fixture
        assert_placement(MyNet(), torch.randn(2, 3, 32, 32), device="cuda:1")

``inputs`` is an input spec string (as ``--input``), a list of them, or the
example inputs themselves, read as an ``--example-inputs`` value is (a tensor,
a tuple of positional arguments, a dict of keyword arguments, ``(args,
kwargs)``, or a list as one argument). The audit simulates CUDA when no GPU is present.
A finding at or above ``fail_on`` fails the test with the table as its
message. Importing the plugin does not import torch (pytest loads it in every
run of a project that installs placecheck).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from placecheck.findings.report import Report, exit_code


def assert_placement(model: Any, inputs: Any = None, device: str = "cuda", *, fail_on: str = "warning",
                     **audit_options: Any) -> Report:
    """Audit ``model`` on ``device`` with ``inputs``; fail the test when it finds a problem.

    Returns the report when the model is clean. Extra keyword arguments go to
    :func:`placecheck.audit` (``select``, ``ignore``, ``train``, ``engine``...).
    """
    __tracebackhide__ = True
    from placecheck.commands.api import audit
    from placecheck.findings.formats.table import TableFormatter

    given = {} if inputs is None else {"inputs": inputs}  # AuditOptions tells specs from objects
    report = audit(model, device, **given, **audit_options)
    if exit_code([report], fail_on):
        pytest.fail(TableFormatter().format(report.grouped()), pytrace=False)  # as the CLI shows it
    return report


@pytest.fixture(name="assert_placement")
def assert_placement_fixture() -> Callable[..., Report]:
    """The :func:`assert_placement` function, for tests that prefer a fixture to an import."""
    return assert_placement
