"""PC210: a non-blocking device-to-host copy read on the host before any synchronize (issue 23 item 4).

The fixtures (tests/fixtures/forward/pc210_*, clean_nonblocking_*) hold the
patterns a user writes; these tests hold what decides them, case by case, on
both simulating engines: which calls are copies (decided from the arguments),
which are reads, and which calls synchronise (the host syncs of PC204 too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
from forward_helpers import marked_source

import placecheck

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

HERE = __file__
ENGINES = ("fake", "tagged")


class _Step(nn.Module):
    def __init__(self, body: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        self.body(y.detach())
        return y


def _audit(body: Callable[[torch.Tensor], Any], engine: str) -> placecheck.Report:
    return placecheck.audit(_Step(body), device="cuda", engine=engine, select=["PC2"])


def _read_after_to(y: torch.Tensor) -> Any:
    host = y.to("cpu", non_blocking=True)
    return str(host)  # MARK to-read


def _read_positional_flag(y: torch.Tensor) -> Any:
    host = y.to("cpu", torch.float64, True)
    return host.numpy()  # MARK positional-read


def _read_a_view(y: torch.Tensor) -> Any:
    host = y.to(torch.device("cpu"), non_blocking=True)
    row = host[1]
    return row.view(2, 2).sum()  # MARK view-read


def _python_arithmetic(y: torch.Tensor) -> Any:
    host = torch.empty_like(y, device="cpu")
    host.copy_(y, non_blocking=True)
    return bool(host.abs().max() > 1)  # MARK copy-read


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("body, mark", [(_read_after_to, "to-read"),
                                        (_read_positional_flag, "positional-read"),
                                        (_read_a_view, "view-read"), (_python_arithmetic, "copy-read")])
def test_a_read_before_any_synchronize_is_pc210_at_the_read(body: Callable[[torch.Tensor], Any], mark: str,
                                                            engine: str) -> None:
    report = _audit(body, engine)
    found = [(f.code, f.severity.value) for f in report.findings]
    assert found == [("PC210", "error")], report.notes
    assert report.findings[0].source.endswith(marked_source(HERE, "MARK " + mark))
    finding = report.findings[0]
    assert (finding.device, finding.expected) == ("cuda:0", "cpu")
    assert "non_blocking=True at" in finding.message and "synchronize" in finding.hint


def _item_of_a_device_tensor_syncs(y: torch.Tensor) -> Any:
    host = y.to("cpu", non_blocking=True)
    y.sum().item()  # waits for the stream, the copy included
    return host.tolist()


def _blocking_copy_syncs(y: torch.Tensor) -> Any:
    host = y.to("cpu", non_blocking=True)
    y.cpu()
    return host.tolist()


def _metadata_is_no_read(y: torch.Tensor) -> Any:
    host = y.to("cpu", non_blocking=True)
    return host.shape, host.dtype, host.size(0), host.dim()


def _sent_back_to_the_device(y: torch.Tensor) -> Any:
    host = y.to("cpu", non_blocking=True)
    return host.to(y.device) + y


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("body", [_item_of_a_device_tensor_syncs, _blocking_copy_syncs, _metadata_is_no_read,
                                  _sent_back_to_the_device])
def test_what_waits_for_the_stream_or_reads_nothing_is_no_pc210(body: Callable[[torch.Tensor], Any],
                                                                 engine: str) -> None:
    report = _audit(body, engine)
    assert "PC210" not in {f.code for f in report.findings}, [f.message for f in report.findings]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_non_blocking_copy_to_the_host_is_no_host_sync(engine: str) -> None:
    # the GPU's sync debug mode reports none for it (tests/data/mix-table.json: "to cpu non_blocking");
    # the blocking one is PC204
    def copies(y: torch.Tensor) -> Any:
        kept = y.to("cpu", non_blocking=True)
        return kept, y.to("cpu")  # MARK blocking

    report = _audit(copies, engine)
    assert [f.code for f in report.findings] == ["PC204"]
    assert report.findings[0].source.endswith(marked_source(HERE, "MARK blocking"))
