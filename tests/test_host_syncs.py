"""Every host sync a GPU reports is PC204 with the user's line, on both simulating engines (issue 10 item 3).

The reference is what ``torch.cuda.set_sync_debug_mode("warn")`` reports on a
real GPU (docs/contract.md, "What PyTorch does", lists it). One case per sync source; each runs on the
fake engine (which records the sync before it stops at a data-dependent op)
and on the real-valued one. ``.numpy()`` of a device tensor is not here: a GPU
raises TypeError there (the crash, PC207; see test_trace), and
``.cpu().numpy()`` syncs at ``.cpu()``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

import placecheck

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

HERE = Path(__file__).name

Case = Callable[[torch.Tensor], Any]


def _bool(h: torch.Tensor) -> Any:
    if h.sum() > 0:  # MARK sync
        return h
    return -h


def _contains(h: torch.Tensor) -> Any:
    mask = (h > 0).long()
    return h * 2 if 0 in mask else h  # MARK sync


def _int(h: torch.Tensor) -> Any:
    return h[:, : int(h.argmax())]  # MARK sync


def _float(h: torch.Tensor) -> Any:
    return h * float(h.max())  # MARK sync


def _index(h: torch.Tensor) -> Any:
    return [1, 2, 3][h.argmax().clamp(0, 2)]  # MARK sync


def _item(h: torch.Tensor) -> Any:
    return h / h.abs().max().item()  # MARK sync


def _tolist(h: torch.Tensor) -> Any:
    return h * len(h.sum(1).tolist())  # MARK sync


def _cpu(h: torch.Tensor) -> Any:
    host = h.cpu()  # MARK sync
    return h + host.sum().item()


def _to_cpu(h: torch.Tensor) -> Any:
    host = h.to("cpu")  # MARK sync
    return h + float(host.sum())


def _nonzero(h: torch.Tensor) -> Any:
    return h.nonzero()  # MARK sync


def _torch_nonzero(h: torch.Tensor) -> Any:
    return torch.nonzero(h > 0)  # MARK sync


def _argwhere(h: torch.Tensor) -> Any:
    return torch.argwhere(h > 0)  # MARK sync


def _boolean_mask(h: torch.Tensor) -> Any:
    return h[h > 0]  # MARK sync


def _boolean_mask_assignment(h: torch.Tensor) -> Any:
    h = h.clone()
    h[h < 0] = torch.zeros((), device=h.device)  # MARK sync
    return h


def _boolean_mask_put(h: torch.Tensor) -> Any:
    return h.clone().index_put_((h < 0,), torch.ones((), device=h.device), accumulate=True)  # MARK sync


def _masked_select(h: torch.Tensor) -> Any:
    return torch.masked_select(h, h > 0)  # MARK sync


def _unique(h: torch.Tensor) -> Any:
    return torch.unique(h.round())  # MARK sync


def _tensor_unique(h: torch.Tensor) -> Any:
    return h.round().unique()  # MARK sync


def _repeat_interleave(h: torch.Tensor) -> Any:
    repeats = torch.ones(2, dtype=torch.long, device=h.device)
    return h.repeat_interleave(repeats, dim=0)  # MARK sync


def _print(h: torch.Tensor) -> Any:
    print(h)  # MARK sync
    return h


def _format(h: torch.Tensor) -> Any:
    _ = f"{h.sum()}"  # MARK sync
    return h


def _equal(h: torch.Tensor) -> Any:
    return h if torch.equal(h, h * 1) else -h  # MARK sync


def _allclose(h: torch.Tensor) -> Any:
    return h if torch.allclose(h, h + 0) else -h  # MARK sync


def _where_condition_only(h: torch.Tensor) -> Any:
    return torch.where(h > 0)[0]  # MARK sync


CASES: list[tuple[Case, str]] = [
    (_bool, "bool()"), (_contains, "`in`"), (_int, "int()"), (_float, "float()"), (_index, "an index"),
    (_item, ".item()"), (_tolist, ".tolist()"), (_cpu, ".cpu()"), (_to_cpu, ".to()"),
    (_nonzero, ".nonzero()"), (_torch_nonzero, "torch.nonzero"), (_argwhere, "torch.argwhere"),
    (_boolean_mask, "boolean-mask indexing"), (_boolean_mask_assignment, "boolean-mask assignment"),
    (_boolean_mask_put, "boolean-mask assignment"),
    (_masked_select, "torch.masked_select"), (_unique, "torch.unique"), (_tensor_unique, ".unique()"),
    (_repeat_interleave, ".repeat_interleave() without output_size"), (_print, "printing"),
    (_format, "formatting"), (_equal, "torch.equal"), (_allclose, "torch.allclose"),
    (_where_condition_only, "torch.where(condition)"),
]


class _Host(nn.Module):
    def __init__(self, case: Case) -> None:
        super().__init__()
        self.case = case
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> Any:
        return self.case(self.lin(x))


def _sync_line(case: Case) -> str:
    lines, first = inspect.getsourcelines(case)
    offset = next(i for i, line in enumerate(lines) if "# MARK sync" in line)
    return f"{HERE}:{first + offset}"


def _host_syncs(report: placecheck.Report) -> list[tuple[str, str]]:
    """``(file:line, message)`` of every PC204, those kept as evidence of another problem too."""
    rows = [(f.source, f.message) for f in report.findings if f.code == "PC204"]
    rows += [(e.source, e.message) for f in report.findings for e in getattr(f, "evidence", ())
             if e.code == "PC204"]
    return [(source.rpartition("/")[2], message) for source, message in rows]


@pytest.mark.parametrize("engine", ["fake", "tagged"])
@pytest.mark.parametrize("case, name", CASES, ids=[c[0].__name__.strip("_") for c in CASES])
def test_every_host_sync_is_pc204_at_the_users_line(case: Case, name: str, engine: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    report = placecheck.audit(lambda: _Host(case), "cuda", engine=engine, inputs=["float32[2,8]"])
    syncs = _host_syncs(report)
    line = _sync_line(case)
    if engine == "fake" and case is _tolist:
        name = ".item()"  # a fake tensor's tolist() is Python calling .item() per element: the same line
    assert any(source == line and name in message for source, message in syncs), (syncs, report.notes)
    assert all(f.code != "PC207" for f in report.findings), report.findings


class _CpuOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> Any:
        steps = torch.arange(4)  # host work that never meets the device
        n = int(steps.sum()) + len(steps.nonzero()) + len(steps[steps > 1])
        return self.lin(x) * n


def _masked_fill_scalar(h: torch.Tensor) -> Any:
    h = h.clone()
    h[h < 0] = -float("inf")  # minGPT's top-k: a masked_fill_, no sync
    return h


def _masked_fill_topk(h: torch.Tensor) -> Any:
    v, _ = torch.topk(h, 2)
    h = h.clone()
    h[h < v[:, [-1]]] = -float("Inf")  # minGPT's generate(), as written there
    return h


def _masked_fill_host_tensor(h: torch.Tensor) -> Any:
    h = h.clone()
    h[:, h[0] > 0] = torch.tensor(0.5)  # a one-element CPU value, one mask: masked_fill_
    return h


def _index_put_scalar(h: torch.Tensor) -> Any:
    return h.clone().index_put_((h > 0,), torch.tensor(1.0))  # no accumulate: masked_fill_


NO_SYNCS: list[Case] = [_masked_fill_scalar, _masked_fill_topk, _masked_fill_host_tensor, _index_put_scalar]


@pytest.mark.parametrize("engine", ["fake", "tagged"])
@pytest.mark.parametrize("case", NO_SYNCS, ids=[c.__name__.strip("_") for c in NO_SYNCS])
def test_a_boolean_mask_write_of_one_host_value_is_no_sync(case: Case, engine: str) -> None:
    """ATen runs it as ``masked_fill_`` (``canDispatchToMaskedFill`` in ``_index_put_impl_``): no
    ``nonzero``, no sync. Its twins with a device value or ``accumulate`` are in CASES."""
    report = placecheck.audit(lambda: _Host(case), "cuda", engine=engine, inputs=["float32[2,8]"])
    assert _host_syncs(report) == []
    assert all(f.code != "PC207" for f in report.findings), report.findings


@pytest.mark.parametrize("engine", ["fake", "tagged"])
def test_host_work_on_cpu_tensors_is_no_sync(engine: str) -> None:
    report = placecheck.audit(_CpuOnly, "cuda", engine=engine, inputs=["float32[2,8]"])
    assert _host_syncs(report) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case, name", CASES, ids=[c[0].__name__.strip("_") for c in CASES])
def test_a_real_gpu_reports_each_case_as_a_sync(case: Case, name: str) -> None:
    """The reference: with ``set_sync_debug_mode("error")`` a GPU raises at every sync this file lists."""
    x = torch.randn(2, 8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            case(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", NO_SYNCS, ids=[c.__name__.strip("_") for c in NO_SYNCS])
def test_a_real_gpu_runs_each_boolean_mask_write_of_a_host_value_without_a_sync(case: Case) -> None:
    """The reference: with ``set_sync_debug_mode("error")`` these run on a GPU without raising."""
    x = torch.randn(2, 8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        case(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
