"""Every device mismatch is PC201, whatever PyTorch's message says (issue 10 item 2).

Each case hands one op a CPU tensor at one argument while the rest is on the
(simulated) GPU. PyTorch words these errors differently ("Input and hidden
tensors are not at the same device", "expected to be in the same device",
"Input type ... and weight type ... should be the same"); placecheck decides
from the devices of the op's arguments, on both simulating engines, and never
calls them a forward error (PC207).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import placecheck

# runs on the CPU-only torch build too (Makefile: test-cpu-build)
pytestmark = [pytest.mark.cpu_build, pytest.mark.compat]

HERE = Path(__file__).name

Case = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def _lstm_h0(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    h0 = torch.zeros(1, 2, 8)
    return m.lstm(h.unsqueeze(1), (h0, torch.zeros(1, 2, 8)))[0]  # MARK op


def _gru_h0(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return m.gru(h.unsqueeze(1), torch.zeros(1, 2, 8))[0]  # MARK op


def _index_add_on_cpu_buffer(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return m.cpu_buffer.index_add_(0, torch.tensor([0, 1], device=h.device), h)  # MARK op


def _conv_cpu_input(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return m.conv(torch.randn(1, 3, 8, 8))  # MARK op


def _scatter_cpu_index(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return torch.zeros(4, 8, device=h.device).scatter(0, torch.zeros(2, 8, dtype=torch.long), h)  # MARK op


def _embedding_cpu_ids(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return m.emb(torch.tensor([[1, 2]]))  # MARK op


def _gather_cpu_index(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return h.gather(1, torch.zeros(2, 3, dtype=torch.long))  # MARK op


def _cross_entropy_cpu_weight(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(h, torch.tensor([1, 2], device=h.device), weight=torch.ones(8))  # MARK op


def _grid_sample_cpu_grid(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return F.grid_sample(h.reshape(1, 1, 2, 8), torch.zeros(1, 2, 2, 2), align_corners=False)  # MARK op


def _where_cpu_branch(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return torch.where(h > 0, h, torch.zeros(2, 8))  # MARK op


def _where_cpu_condition(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.ones(2, 8, dtype=torch.bool), h, h)  # MARK op


def _matmul_cpu_operand(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return h @ torch.ones(8, 8)  # MARK op


def _cat_cpu_member(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return torch.cat([h, torch.ones(2, 8)])  # MARK op


def _layer_norm_cpu_weight(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(h, (8,), weight=torch.ones(8))  # MARK op


def _bmm_cpu_operand(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return torch.bmm(h.unsqueeze(0), torch.ones(1, 8, 8))  # MARK op


def _linear_cpu_weight(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return F.linear(h, torch.ones(8, 8))  # MARK op


def _index_select_on_cpu(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return m.cpu_buffer.index_select(0, torch.tensor([0], device=h.device))  # MARK op


def _masked_fill_cpu_mask(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return h.masked_fill(torch.ones(2, 8, dtype=torch.bool), 0.0)  # MARK op


def _batch_norm_cpu_stats(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(h, torch.zeros(8), torch.ones(8))  # MARK op


def _einsum_cpu_operand(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return torch.einsum("bi,ij->bj", h, torch.ones(8, 8))  # MARK op


# (case, the argument that is on the CPU)
CASES: list[tuple[Case, str]] = [
    (_lstm_h0, "nn.LSTM hx[0]"),
    (_gru_h0, "nn.GRU hx"),
    (_index_add_on_cpu_buffer, "Tensor.index_add_ self"),
    (_conv_cpu_input, "Conv2d input"),
    (_scatter_cpu_index, "Tensor.scatter index"),
    (_embedding_cpu_ids, "Embedding input"),
    (_gather_cpu_index, "Tensor.gather index"),
    (_cross_entropy_cpu_weight, "F.cross_entropy weight="),
    (_grid_sample_cpu_grid, "F.grid_sample grid"),
    (_where_cpu_branch, "torch.where other"),
    (_where_cpu_condition, "torch.where condition"),
    (_matmul_cpu_operand, "Tensor.matmul other"),
    (_cat_cpu_member, "torch.cat tensors[1]"),
    (_layer_norm_cpu_weight, "F.layer_norm weight="),
    (_bmm_cpu_operand, "torch.bmm mat2"),
    (_linear_cpu_weight, "F.linear weight"),
    (_index_select_on_cpu, "Tensor.index_select self"),
    (_masked_fill_cpu_mask, "Tensor.masked_fill mask"),
    (_batch_norm_cpu_stats, "F.batch_norm running_mean"),
    (_einsum_cpu_operand, "torch.einsum operands[1]"),
]


class _Host(nn.Module):
    def __init__(self, case: Case) -> None:
        super().__init__()
        self.case = case
        self.lin = nn.Linear(8, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.conv = nn.Conv2d(3, 4, 3)
        self.emb = nn.Embedding(10, 8)
        self.cpu_buffer = torch.zeros(4, 8)  # plain attribute: .to() leaves it on the CPU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.case(self, self.lin(x))


def _op_line(case: Case) -> str:
    import inspect

    lines, first = inspect.getsourcelines(case)
    offset = next(i for i, line in enumerate(lines) if "# MARK op" in line)
    return f"{HERE}:{first + offset}"


def _forward_findings(report: placecheck.Report) -> list[tuple[str, str]]:
    """``(code, file:line)`` of every forward finding, those kept as evidence of a problem too."""
    rows = []
    for f in report.findings:
        rows.append((f.code, f.source.rpartition("/")[2]))
        rows.extend((e.code, e.source.rpartition("/")[2]) for e in getattr(f, "evidence", ()))
    return [r for r in rows if r[0].startswith("PC2")]


@pytest.mark.parametrize("engine", ["fake", "tagged"])
@pytest.mark.parametrize("case, argument", CASES, ids=[c[1] for c in CASES])
def test_every_device_mismatch_is_pc201(case: Case, argument: str, engine: str) -> None:
    if torch.version.cuda is None and engine == "fake" and argument == "Conv2d input":
        pytest.skip("the CPU-only torch build runs a fake-CUDA convolution on its meta stand-in, which "
                    "does not see the CPU input (known limit of that build; the tagged engine finds it)")
    report = placecheck.audit(lambda: _Host(case), "cuda", engine=engine, inputs=["float32[2,8]"])
    found = _forward_findings(report)
    assert ("PC201", _op_line(case)) in found, (argument, found, report.notes)
    assert not any(code == "PC207" for code, _ in found), (argument, found)


def test_the_decision_is_from_devices_not_from_the_message() -> None:
    from placecheck.engines import classify

    cuda = torch.empty(2, device="meta")  # stands for any second device
    cpu = torch.ones(2)
    scalar = torch.tensor(1.0)
    assert classify.mixes_devices(torch.add, [(0, cuda), (1, cpu)])
    assert not classify.mixes_devices(torch.add, [(0, cuda), (1, scalar)])  # a 0-dim CPU scalar is legal
    assert not classify.mixes_devices(torch.Tensor.__getitem__, [(0, cuda), (1, cpu)])  # a CPU index too
    assert classify.mixes_devices(torch.Tensor.__getitem__, [(0, cpu), (1, cuda)])
    assert not classify.mixes_devices(torch.add, [(0, cpu), (1, cpu)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case, argument", CASES, ids=[c[1] for c in CASES])
def test_a_real_gpu_raises_at_each_case(case: Case, argument: str) -> None:
    """The reference: each case really crashes on a GPU, whatever its message says."""
    model = _Host(case).cuda().eval()
    with pytest.raises(RuntimeError), torch.no_grad():
        model(torch.randn(2, 8, device="cuda"))
