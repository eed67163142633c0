"""placecheck.engines.shortcuts: a result made from metadata must be exactly the one torch's fake path
gives, and be made only where that is known (a mixed-device call still raises torch's mismatch)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

import placecheck
from placecheck.engines.shortcuts import shortcut

aten = torch.ops.aten
BATCH_NORMS = (aten.native_batch_norm.default, aten._native_batch_norm_legit_no_training.default,
               aten.cudnn_batch_norm.default)


def _meta(outputs: Any) -> list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, str]]:
    return [(tuple(t.shape), t.stride(), t.dtype, str(t.device)) for t in outputs]


def _input(rank: int, layout: str, dtype: torch.dtype, channels: int) -> torch.Tensor:
    """A fake CUDA input made by a factory (a CPU-only build of torch cannot move or view one)."""
    shape = (2, channels, 5, 6, 7)[:rank]
    if layout == "channels_last" and rank in (4, 5):
        fmt = torch.channels_last if rank == 4 else torch.channels_last_3d
        return torch.empty(shape, device="cuda", dtype=dtype, memory_format=fmt)
    if layout == "permuted" and rank >= 3:  # dense in no memory format: torch's path only
        order = [rank - 1, *range(1, rank - 1), 0]  # the first and last dimensions swapped in memory
        strides = [0] * rank
        step = 1
        for dim in reversed(order):
            strides[dim] = step
            step *= shape[dim]
        return torch.empty_strided(shape, strides, device="cuda", dtype=dtype)
    return torch.empty(shape, device="cuda", dtype=dtype)


def _args(op: Any, x: torch.Tensor, stats: tuple[Any, ...], training: bool = False) -> tuple[Any, ...]:
    if op is aten._native_batch_norm_legit_no_training.default:
        return (x, *stats, 0.1, 1e-5)
    return (x, *stats, training, 0.1, 1e-5)


@pytest.mark.cpu_build
def test_eval_batch_norm_is_exactly_torchs_result_where_it_is_made() -> None:
    made = 0
    for op, rank, layout, dtype, stats_dtype, affine in itertools.product(
            BATCH_NORMS, (2, 3, 4, 5), ("contiguous", "channels_last", "permuted"),
            (torch.float32, torch.float16, torch.bfloat16, torch.float64), ("same", torch.float32),
            (True, False)):
        if op is aten.cudnn_batch_norm.default and not affine:
            continue  # cudnn's takes a weight
        with FakeTensorMode(allow_non_fake_inputs=True):
            x = _input(rank, layout, dtype, channels=3)
            sdt = dtype if stats_dtype == "same" else stats_dtype
            weight, bias = (torch.empty(3, device="cuda", dtype=sdt) for _ in range(2))
            mean, var = (torch.empty(3, device="cuda", dtype=sdt) for _ in range(2))
            args = _args(op, x, (weight if affine else None, bias if affine else None, mean, var))
            try:
                expected: Any = _meta(op(*args))
            except Exception as exc:  # a combination torch itself refuses is refused here too
                expected = type(exc)
            got = shortcut(op, args, {})
            if got is None:
                assert layout == "permuted" and rank >= 3, (op, rank, layout, dtype)
                continue
            made += 1
            assert _meta(got) == expected, (op, rank, layout, dtype, stats_dtype, affine)
    assert made > 300


@pytest.mark.cpu_build
@pytest.mark.parametrize("op", BATCH_NORMS)
def test_what_the_shortcut_does_not_make_takes_torchs_path(op: Any) -> None:
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, 3, 4, 4, device="cuda")
        on_gpu = torch.empty(3, device="cuda")
        on_cpu = torch.empty(3)
        on_other_gpu = torch.empty(3, device="cuda:1")
        for stats in ((on_cpu, on_gpu, on_gpu, on_gpu), (on_gpu, on_gpu, on_other_gpu, on_gpu)):
            args = _args(op, x, stats)
            assert shortcut(op, args, {}) is None  # mixed devices: torch's path raises the mismatch
            with pytest.raises(RuntimeError, match="same device"):
                op(*args)
        if op is not aten._native_batch_norm_legit_no_training.default:
            training = _args(op, x, (on_gpu,) * 4, training=True)
            assert shortcut(op, training, {}) is None  # training writes the running statistics


@pytest.mark.cpu_build
def test_a_convnet_audits_alike_with_and_without_the_shortcut(monkeypatch: pytest.MonkeyPatch) -> None:
    """Findings, and the shapes the forward ran with, are those of torch's own path; a CPU running
    statistic after .to() is still found where the batch norm meets it."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16), nn.AdaptiveAvgPool2d(1))
            self.norm = nn.BatchNorm1d(16)
            self.stale = torch.zeros(16)  # a plain attribute: .to() leaves it on the CPU

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.norm(self.body(x).flatten(1))
            return nn.functional.batch_norm(y, self.stale, self.stale + 1)  # running stats on the CPU

    def rows(report: Any) -> list[tuple[str, str, str]]:
        return sorted((f.code, f.where, f.source.rpartition("/")[2]) for f in report.findings)

    made: list[Any] = []

    def counted(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = shortcut(func, args, kwargs)
        if out is not None:
            made.append(func)
        return out

    monkeypatch.setattr("placecheck.engines.datadep.shortcut", counted)
    with_shortcut = placecheck.audit(Net, "cuda", engine="fake", inputs=["float32[2,3,16,16]"])
    assert len(made) >= 3  # the three batch norms on the GPU (the mixed-device one takes torch's path)
    monkeypatch.setattr("placecheck.engines.datadep.shortcut", lambda func, args, kwargs: None)
    without = placecheck.audit(Net, "cuda", engine="fake", inputs=["float32[2,3,16,16]"])
    assert rows(with_shortcut) == rows(without)
    assert {"PC101", "PC201"} <= {code for code, _, _ in rows(with_shortcut)}
    assert with_shortcut.summary_line() == without.summary_line()
