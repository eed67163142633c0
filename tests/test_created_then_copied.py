"""Created on the CPU in forward, then copied to the device: PC202, a warning at the creating line.

Correct results, but every forward allocates on the host and pays a blocking
host-to-device copy; PyTorch's performance tuning guide says to create tensors
on the target directly. One case per spelling of the copy, on both simulating
engines. A tensor created on the CPU only for CPU-side work, never copied to
the device, is not a finding.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from forward_helpers import ungrouped  # noqa: F401 (the fixture)

import placecheck
from placecheck.findings.finding import Severity

pytestmark = [pytest.mark.usefixtures("ungrouped"), pytest.mark.cpu_build]

HERE = Path(__file__).name

Case = Callable[[torch.Tensor], torch.Tensor]


def _to_device_variable(x: torch.Tensor) -> torch.Tensor:
    device = x.device
    return x + torch.arange(8).to(device)  # MARK make MARK copy


def _to_input_device(x: torch.Tensor) -> torch.Tensor:
    steps = torch.arange(8)  # MARK make
    return x + steps.to(x.device)  # MARK copy


def _cuda(x: torch.Tensor) -> torch.Tensor:
    return x + torch.ones(8).cuda()  # MARK make MARK copy


def _type_as(x: torch.Tensor) -> torch.Tensor:
    return x * torch.linspace(0, 1, 8).type_as(x)  # MARK make MARK copy


def _to_tensor(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rand(8).to(x)  # MARK make MARK copy


def _to_device_keyword(x: torch.Tensor) -> torch.Tensor:
    freqs = torch.exp(-torch.arange(0, 8, dtype=torch.float32))  # MARK make
    return x * freqs.to(device=x.device)  # MARK copy


def _as_tensor(x: torch.Tensor) -> torch.Tensor:
    table = torch.full((8,), 2.0)  # MARK make
    return x * torch.as_tensor(table, device=x.device)  # MARK copy


def _from_numpy_cuda(x: torch.Tensor) -> torch.Tensor:
    return x @ torch.from_numpy(np.eye(8, dtype=np.float32)).cuda()  # MARK make MARK copy


def _meshgrid_type_as(x: torch.Tensor) -> torch.Tensor:
    ys, xs = torch.meshgrid(torch.arange(2), torch.arange(8), indexing="ij")  # MARK make
    return x + (ys + xs).type_as(x)  # MARK copy


CASES: list[Case] = [_to_device_variable, _to_input_device, _cuda, _type_as, _to_tensor, _to_device_keyword,
                     _as_tensor, _from_numpy_cuda, _meshgrid_type_as]


class _Host(nn.Module):
    def __init__(self, case: Case) -> None:
        super().__init__()
        self.case = case
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.case(self.lin(x))


def _line(case: Case, mark: str) -> str:
    lines, first = inspect.getsourcelines(case)
    offset = next(i for i, line in enumerate(lines) if f"MARK {mark}" in line)
    return f"{HERE}:{first + offset}"


@pytest.mark.parametrize("engine", ["fake", "tagged"])
@pytest.mark.parametrize("case", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_created_then_copied_is_a_pc202_warning_at_the_creating_line(case: Case, engine: str) -> None:
    report = placecheck.audit(lambda: _Host(case), "cuda", engine=engine, inputs=["float32[2,8]"])
    created = [f for f in report.findings if f.code == "PC202"]
    assert [f.source.rpartition("/")[2] for f in created] == [_line(case, "make")], report.findings
    (finding,) = created
    assert finding.severity is Severity.WARNING
    assert f"then copies it to cuda:0 at {_line(case, 'copy')}" in finding.message.replace(
        finding.source.rpartition("/")[0] + "/", "")
    assert "device=x.device" in finding.hint and "register_buffer" in finding.hint
    assert finding.origin == finding.source  # the creating line: what a problem groups by
    assert not [f for f in report.findings if f.code == "PC201"]


class _CpuSideWork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sizes = torch.tensor([2, 3, 3])  # host-side bookkeeping, never copied to the device
        split = sizes.cumsum(0).tolist()
        return self.lin(x) * len(split) * float(torch.arange(4).sum())


@pytest.mark.parametrize("engine", ["fake", "tagged"])
def test_cpu_side_work_never_copied_is_not_a_finding(engine: str) -> None:
    report = placecheck.audit(_CpuSideWork, "cuda", engine=engine, inputs=["float32[2,8]"])
    assert [f for f in report.findings if f.code.startswith("PC2")] == []
