"""The pytest plugin: ``assert_placement`` fails a test with the table, and passes clean models."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]

MODELS = '''
import torch
import torch.nn as nn


class Clean(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


class Stray(Clean):
    def __init__(self):
        super().__init__()
        self.scale = torch.ones(4)   # not registered: .to() leaves it on the CPU

    def forward(self, x):
        return self.fc(x * self.scale)
'''

TESTS = '''
import torch
from models import Clean, Stray
from placecheck.pytest_plugin import assert_placement as imported


def test_clean_with_a_spec():
    report = imported(Clean(), "float32[2,4]")
    assert report.ok


def test_clean_with_a_tensor_via_the_fixture(assert_placement):
    assert assert_placement(Clean(), torch.randn(2, 4), device="cuda").findings == ()


def test_stray_fails(assert_placement):
    assert_placement(Stray(), torch.randn(2, 4))
'''


def test_the_plugin_is_registered_as_an_entry_point() -> None:
    assert [e.value for e in entry_points(group="pytest11") if e.name == "placecheck"] == [
        "placecheck.pytest_plugin"]


def test_assert_placement(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(models=MODELS, test_models=TESTS)
    # a subprocess: the audit imports torch and patches torch.cuda for the model's code
    result = pytester.runpytest_subprocess("-q")  # the plugin loads through its entry point
    result.assert_outcomes(passed=2, failed=1)
    # the failure message is the table as the CLI shows it: header, the PC101 problem naming the stray
    # tensor with the mismatch as its evidence (grouped), the CLI's count of problems and instances
    result.stdout.fnmatch_lines(["*placecheck: Stray on cuda:0*",
                                 "*note: forward: inputs given in Python: float32?2,4?*",
                                 "*PC101*scale*",
                                 "*-> crashes on a GPU at line 20 in <root>: Tensor.mul mixed cpu*",
                                 "1 problem (2 instances) in 1 module: 1 error; 16 B not on cuda:0"])
    assert "Traceback" not in result.stdout.str()
    # the tensor reached the audit as an object, not through a module planted in sys.modules
    assert "_placecheck_pytest" not in result.stdout.str()
