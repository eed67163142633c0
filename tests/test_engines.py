"""The engines: choice, the real-valued simulation's device rules, several simulated GPUs.

Everything here runs without a GPU and without torchvision (the CPU-only
torch build's CI job runs it too).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from conftest import unwrapped
from forward_helpers import ungrouped  # noqa: F401 (the fixture)

import placecheck
from placecheck.basics.errors import UsageError
from placecheck.basics.values import Device
from placecheck.engines.engine import (
    SIMULATED_CUDA,
    SIMULATED_CUDA_VALUES,
    EngineChoice,
    choose_engine,
    fallback_engine,
    move_model,
)
from placecheck.engines.tagged import SimulatedDeviceMismatchError, SimulatedTensor, tagged_cuda

pytestmark = [pytest.mark.usefixtures("ungrouped"), pytest.mark.cpu_build, pytest.mark.compat]

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU is present")


@no_gpu
def test_auto_chooses_fake_tensors_and_real_values_for_training() -> None:
    assert choose_engine(Device("cuda", 0)).name == SIMULATED_CUDA
    trained = choose_engine(Device("cuda", 0), train=True)
    assert trained.name == SIMULATED_CUDA_VALUES and trained.real_values and "--train" in trained.reason
    assert choose_engine(Device("cuda", 0), EngineChoice.TAGGED).real_values
    cpu = Device("cpu")
    assert choose_engine(cpu).name == "cpu" and not choose_engine(cpu, train=True).simulated


def test_engine_choices_that_cannot_work_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="fake engine cannot run"):
        choose_engine(Device("cuda", 0), EngineChoice.FAKE, train=True)
    with pytest.raises(UsageError, match="simulates CUDA only"):
        choose_engine(Device("cpu"), EngineChoice.TAGGED)


def test_fallback_engine_says_why() -> None:
    chosen = choose_engine(Device("cuda", 2), EngineChoice.FAKE)
    eng = fallback_engine(chosen, "it reads tensor values at m.py:3")
    assert eng.real_values and eng.gpus == 3 and eng.device == "cuda:2"
    assert "fell back from fake tensors" in eng.reason and "m.py:3" in eng.reason


def test_tagged_tensors_follow_pytorch_device_rules() -> None:
    with tagged_cuda(2):
        x = torch.randn(3, 4).to("cuda")
        assert isinstance(x, SimulatedTensor) and x.device == torch.device("cuda:0") and x.is_cuda
        assert (x * 2).device == x.device and torch.zeros_like(x).device == x.device
        assert torch.ones(2, device="cuda:1").device == torch.device("cuda:1")
        assert x.new_zeros(2).device == x.device
        # legal mixes: 0-dim CPU scalars and CPU index tensors
        assert (x + torch.tensor(1.0)).device == x.device
        assert x[torch.tensor([0, 2])].shape == (2, 4)
        # values are real: .item(), boolean masks and data-dependent shapes run
        assert x[x > 0].numel() == int((x > 0).sum().item())
        with pytest.raises(SimulatedDeviceMismatchError, match="Expected all tensors to be on the same"):
            x + torch.ones(3, 4)
        with pytest.raises(SimulatedDeviceMismatchError, match=r"cuda:1 and cuda:0|cuda:0 and cuda:1"):
            x[:2, :2] + torch.ones(2, 2, device="cuda:1")
        back = x.cpu()
        assert type(back) is torch.Tensor and back.device.type == "cpu"
        assert torch.equal(back, x.as_subclass(torch.Tensor))
        with pytest.raises(TypeError, match=r"Use Tensor\.cpu"):
            x.numpy()
        assert x.to("cuda:0") is x and x.to(torch.float16).device == x.device
    assert not torch.cuda.is_available() or torch.cuda.device_count() >= 1


def test_tagged_move_keeps_parameters_registered_and_trainable() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    eng = choose_engine(Device("cuda", 1), EngineChoice.TAGGED, gpus=2)
    with eng.session():
        moved = move_model(model, eng)
        assert all(p.device == torch.device("cuda:1") and isinstance(p, nn.Parameter)
                   for p in moved.parameters())
        assert all(b.device == torch.device("cuda:1") for b in moved.buffers())
        out = moved.train()(torch.randn(8, 4).to("cuda:1"))
        out.sum().backward()
        assert all(p.grad is not None and p.grad.device == torch.device("cuda:1") for p in moved.parameters())
    assert not torch.__future__.get_overwrite_module_params_on_conversion()  # restored


@pytest.mark.parametrize("engine", ["fake", "tagged"])
def test_second_of_several_simulated_gpus(engine: str) -> None:
    class OnGpu1(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            ok = torch.ones(4, device=x.device)
            wrong = torch.ones(4, device="cuda:0")  # another GPU
            return self.proj(x) + ok + wrong

    report = placecheck.audit(OnGpu1, "cuda:1", engine=engine, gpus=4, inputs=["float32[2,4]"])
    assert "4 GPUs" in report.notes[0]
    assert sorted(f.code for f in report.findings) == ["PC201", "PC202"]
    mismatch = next(f for f in report.findings if f.code == "PC201")
    assert mismatch.device == "cuda:0" and mismatch.expected == "cuda:1"
    assert dict(mismatch.details)["devices"] == "cuda:0, cuda:1"


def test_fake_and_real_valued_engines_agree_on_a_model_both_can_run() -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.bias = torch.ones(4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.proj(x) + self.bias, torch.arange(3)

    rows = {}
    for engine in ("fake", "tagged"):
        report = placecheck.audit(Mixed, "cuda", engine=engine, inputs=["float32[2,4]"])
        rows[engine] = [(f.code, f.where, f.source, f.origin, f.message) for f in report.findings]
    assert rows["fake"] == rows["tagged"] and len(rows["fake"]) == 4  # PC101, PC201, PC202, PC206


def test_gpus_fewer_than_the_device_index_needs_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"--device cuda:3 needs at least 4 GPUs; --gpus 1 was given"):
        choose_engine(Device("cuda", 3), gpus=1)
    with pytest.raises(UsageError, match="needs at least 2 GPUs"):
        placecheck.audit(nn.Linear(2, 2), "cuda:1", gpus=1)
    assert choose_engine(Device("cuda", 3), EngineChoice.FAKE, gpus=4).gpus == 4
    assert choose_engine(Device("cuda", 3), EngineChoice.FAKE).gpus == 4  # no --gpus: enough for the index


def test_gpus_fewer_than_the_device_index_needs_from_the_cli() -> None:
    from cli_runner import CliRunner

    from placecheck.cli import app

    result = CliRunner().invoke(app, ["audit", "torch.nn:Identity", "--gpus", "1", "--device", "cuda:3"])
    assert result.exit_code == 2 and result.stdout == ""
    assert unwrapped(result.stderr).strip().splitlines() == [
        "placecheck: error: --device cuda:3 needs at least 4 GPUs; --gpus 1 was given: "
        "use --gpus 4 or a lower device index"]


def test_one_fake_mode_per_engine_shared_by_its_sessions() -> None:
    """A model built in one session (CUDA tensors in __init__) moves and runs in the next."""
    eng = choose_engine(Device("cuda", 0), EngineChoice.FAKE)
    with eng.session() as first:
        model = nn.Sequential(nn.Linear(2, 2).cuda(), nn.Linear(2, 2))
        alias = model[1].weight
    # no_grad, as the audit's fake forward: autograd on fake CUDA aborts a CPU-only build of torch
    with eng.session() as second, torch.no_grad():
        assert first is second is eng.fake_mode
        moved = move_model(model, eng)
        out = moved(torch.ones(3, 2, device="cuda"))
    assert out.device == torch.device("cuda:0")
    assert alias is moved[1].weight and alias.device == torch.device("cuda:0")  # kept, as on a GPU
    assert choose_engine(Device("cuda", 0), EngineChoice.FAKE).fake_mode is not eng.fake_mode


def test_fake_limit_recognises_fake_tensor_limits_only() -> None:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    from placecheck.engines.classify import fake_limit

    assert "reads tensor values" in fake_limit(DataDependentOutputException(torch.ops.aten.nonzero.default))
    assert "output shape depends" in fake_limit(DynamicOutputShapeException(torch.ops.aten.nonzero.default))
    assert "not implemented for fake" in fake_limit(AssertionError("NYI: aten._pin_memory.default"))
    not_linked = RuntimeError("PyTorch is not linked with support for cuda devices")
    assert "no CUDA support" in fake_limit(not_linked)
    wrapped = RuntimeError("while running the head")
    wrapped.__cause__ = DataDependentOutputException(torch.ops.aten.item.default)
    assert fake_limit(wrapped)
    # the model's own errors, even when they mention fakes
    assert fake_limit(ValueError("fake news detector: expected 3 labels")) == ""
    # the same error after ops that ran on assumed values is the simulation's limit
    assert "after ops that ran on assumed values" in fake_limit(ValueError("expected 3 labels"), assumed=True)
    assert fake_limit(RuntimeError("mat1 and mat2 shapes cannot be multiplied (fake_batch)")) == ""


def test_an_error_mentioning_fake_is_the_models_own_pc207_not_a_fallback() -> None:
    class FakeNewsHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("fake news head: expected 3 labels")

    report = placecheck.audit(FakeNewsHead, "cuda", inputs=["float32[2,4]"])
    assert [f.code for f in report.findings] == ["PC207"]
    assert not any("fell back" in n or "fake tensors stopped" in n for n in report.notes)


def test_is_simulation_limit_names_driver_errors_only() -> None:
    from placecheck.engines.classify import simulation_limit as is_simulation_limit

    note = is_simulation_limit(RuntimeError("Found no NVIDIA driver on your system."))
    assert "needs a real CUDA driver" in note and "Found no NVIDIA driver" in note
    assert is_simulation_limit(RuntimeError("CUDA driver version is insufficient for CUDA runtime version"))
    assert is_simulation_limit(RuntimeError("Expected all tensors to be on the same device")) == ""
    assert is_simulation_limit(ValueError("mat1 and mat2 shapes cannot be multiplied")) == ""


@no_gpu
def test_lazy_batchnorm_buffers_move_under_fake_tensors() -> None:
    eng = choose_engine(Device("cuda", 0), EngineChoice.FAKE)
    model = nn.Sequential(nn.LazyLinear(4), nn.LazyBatchNorm1d())
    with eng.session():
        moved = move_model(model, eng)
        assert {str(b.device) for b in moved.buffers()} == {"cuda:0"}
        assert {str(p.device) for p in moved.parameters()} == {"cuda:0"}


def test_indexing_fake_cuda_tensors_runs_on_every_build() -> None:
    """The CPU-only build refuses ``x[0]`` on a fake CUDA tensor unless placecheck computes it on meta."""

    class Indexing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(4, 8, proj_size=2, batch_first=True)
            self.table = torch.ones(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, (h, _) = self.lstm(x)
            y = out[:, -1] + h[-1]
            y[0] = 0.0
            return y[torch.tensor([0, 1])] * self.table[:1]

    report = placecheck.audit(Indexing, "cuda", engine="fake", inputs=["float32[2,5,4]"])
    assert sorted(f.code for f in report.findings) == ["PC101", "PC201", "PC202", "PC205"]
    assert not any("fake tensors stopped" in note for note in report.notes)
    (mismatch,) = [f for f in report.findings if f.code == "PC201"]
    assert mismatch.origin == "table"
