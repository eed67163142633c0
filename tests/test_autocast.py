"""CUDA autocast under both simulating engines (issue 42 item 10).

``torch.autocast("cuda", dtype=...)`` gives what a GPU gives: the dtypes below are an NVIDIA H200's
(torch 2.11.0+cu130, 2026-11-27) for each op under float16 and bfloat16, of a Linear's output ``y``
(lower precision) and a float32 ``x``. The fake engine's fake CUDA tensors go through CUDA autocast's own
kernels; the real-valued engine computes on the CPU under CPU autocast with CUDA's policies
(:mod:`placecheck.engines.autocast`). A correct AMP training script (GradScaler, dtype asserts) runs clean
under both engines with either dtype; its twin with CPU targets is found at its line.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from placecheck.basics.values import Device
from placecheck.engines import autocast
from placecheck.engines.engine import Engine
from placecheck.findings.finding import Severity
from placecheck.run import run

pytestmark = [pytest.mark.compat]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "amp"
ENGINES = ("tagged", "fake")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
LOWER = "lower"

ON_THE_GPU: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], str]] = {
    "linear": (lambda y, x: y, LOWER),
    "softmax": (lambda y, x: torch.softmax(y, -1), "float32"),
    "log_softmax": (lambda y, x: torch.log_softmax(y, -1), "float32"),
    "y + x": (lambda y, x: y + x, "float32"),
    "sum": (lambda y, x: y.sum(), "float32"),
    "mean": (lambda y, x: y.mean(), LOWER),
    "cumsum": (lambda y, x: torch.cumsum(y, 0), "float32"),
    "sigmoid": (lambda y, x: torch.sigmoid(y), LOWER),
    "mse_loss": (lambda y, x: F.mse_loss(y, x), "float32"),
    "x @ x.T": (lambda y, x: x @ x.t(), LOWER),
    "bmm": (lambda y, x: torch.bmm(x[None], x.t()[None]), LOWER),
    "cross_entropy": (lambda y, x: F.cross_entropy(y, torch.tensor([0, 1], device=y.device)), "float32"),
    "nll_loss": (lambda y, x: F.nll_loss(torch.log_softmax(y, -1), torch.tensor([0, 1], device=y.device)),
                 "float32"),
    "cat": (lambda y, x: torch.cat([y, x]), "float32"),
}
"""op -> (how it is called, the dtype the H200 gave: ``lower`` is autocast's own)."""


def _session(engine: str) -> typing.ContextManager[object]:
    tagged = engine == "tagged"
    return Engine(name=engine, device=Device("cuda", 0), simulated=True, gpus=1, real_values=tagged).session()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ops_under_cuda_autocast_give_the_gpus_dtypes(engine: str, dtype: str) -> None:
    lower = DTYPES[dtype]
    with _session(engine):
        linear = nn.Linear(4, 4).to("cuda")
        x = torch.randn(2, 4, device="cuda")
        with torch.autocast("cuda", dtype=lower):
            y = linear(x)
            got = {name: op(y, x) for name, (op, _) in ON_THE_GPU.items()}
            with torch.autocast("cuda", enabled=False):
                off = linear(x)
        after = linear(x)
    want = {name: lower if expected == LOWER else torch.float32 for name, (_, expected) in ON_THE_GPU.items()}
    assert {name: t.dtype for name, t in got.items()} == want
    assert {t.device.type for t in got.values()} == {"cuda"}
    assert (off.dtype, after.dtype) == (torch.float32, torch.float32)


def test_cuda_autocast_leaves_cpu_tensors_alone_on_the_real_valued_engine() -> None:
    with _session("tagged"), torch.autocast("cuda", dtype=torch.float16):
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float32  # a CPU op: not CUDA autocast's


def test_binary_cross_entropy_is_refused_as_cuda_autocast_refuses_it() -> None:
    with _session("tagged"), torch.autocast("cuda", dtype=torch.float16):
        p = torch.rand(4, device="cuda")
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, p)


def test_cpu_autocast_is_torchs_own_again_after_the_session() -> None:
    with _session("tagged"):
        pass
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # CPU autocast runs softmax in the lower precision, where CUDA's (simulated above) runs float32
        assert torch.softmax(torch.ones(2, dtype=torch.bfloat16), 0).dtype == torch.bfloat16


def test_the_policies_cover_every_op_cuda_autocast_registers() -> None:
    # (aten's: a library's own ops, torchvision's roi_align among them, keep their CPU autocast kernels)
    registered = {name.removeprefix("aten::")
                  for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")
                  if name.startswith("aten::")}
    listed = {name for name, policy in autocast.policies().items() if policy != "none"}
    assert registered <= listed, "ops CUDA autocast casts that the simulation does not know"
    known_elsewhere = {"rms_norm", "nuclear_norm", "nuclear_norm.dim"} | set(autocast.LOWER_PRECISION)

    def exists(name: str) -> bool:  # an op of a newer torch (linalg_matrix_sqrth) is not one of this torch's
        try:
            autocast._overload(name)
        except AttributeError:
            return False
        return True

    assert {name for name in listed - registered if exists(name)} <= known_elsewhere


# -- a training script ---------------------------------------------------------------------------------

def _expected(name: str) -> set[tuple[str, str]]:
    path = os.path.relpath(FIXTURES / name)
    return {(code, f"{path}:{number}")
            for number, text in enumerate((FIXTURES / name).read_text().splitlines(), 1)
            for code in re.findall(r"# expect (PC\d{3})", text)}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_correct_amp_script_is_clean(engine: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMP_DTYPE", dtype)
    report = run(os.path.relpath(FIXTURES / "amp_fixed.py"), engine=engine, steps=3)
    assert report.unfinished == "", report.notes  # its dtype asserts held: it ran through
    assert {f.code for f in report.findings if f.severity.rank >= Severity.WARNING.rank} == set()
    assert dict(report.stats)["optimizer_steps"] == 3


@pytest.mark.parametrize("engine", ENGINES)
def test_an_amp_script_with_cpu_targets_is_found_at_its_line(engine: str) -> None:
    report = run(os.path.relpath(FIXTURES / "amp_buggy.py"), engine=engine, steps=3)
    serious = {(f.code, f.source) for f in report.findings if f.severity.rank >= Severity.WARNING.rank}
    assert serious == _expected("amp_buggy.py")
