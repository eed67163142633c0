"""Errors a GPU raises, raised by the simulation at the user's line (issue 23 item 4).

A device index the machine lacks (``--gpus``), ``pin_memory`` of device tensors through a
``DataLoader(pin_memory=True)``, CUDA used in a forked ``DataLoader`` worker, a CPU
``torch.Generator`` for device random numbers and ``pack_padded_sequence`` lengths on the device:
each at its line, with a message that says what is wrong (decided from the arguments, never from
PyTorch's messages).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn
from forward_helpers import marked_source
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, TensorDataset

import placecheck
from placecheck.engines.classify import FORKED_CUDA, ForkedCudaError, InvalidDeviceError, simulation_limit
from placecheck.engines.cudaapi import cuda_queries_simulated

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

HERE = __file__
ENGINES = ("fake", "tagged")


class _ToAThirdGpu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).to("cuda:2")  # MARK third-gpu


@pytest.mark.parametrize("engine", ENGINES)
def test_a_device_index_beyond_gpus_raises_invalid_device_ordinal_at_its_line(engine: str) -> None:
    report = placecheck.audit(_ToAThirdGpu(), device="cuda", engine=engine, gpus=2, select=["PC2"])
    (finding,) = report.findings
    assert finding.code == "PC207" and "invalid device ordinal" in finding.message
    assert finding.source.endswith(marked_source(HERE, "MARK third-gpu"))
    # with as many GPUs as it names, the same model is audited (a hard-coded device: PC202, PC206)
    enough = placecheck.audit(_ToAThirdGpu(), device="cuda", engine=engine, gpus=3, select=["PC2"])
    assert {f.code for f in enough.findings} == {"PC202", "PC206"}
    # without --gpus the machine's count is unknown: no error is invented
    unknown = placecheck.audit(_ToAThirdGpu(), device="cuda", engine=engine, select=["PC2"])
    assert {f.code for f in unknown.findings} == {"PC202", "PC206"}


def test_a_missing_gpu_is_the_models_error_not_the_simulations_limit() -> None:
    error = InvalidDeviceError("cuda:3", 2)
    assert "CUDA error: invalid device ordinal" in str(error)
    assert simulation_limit(error) == ""
    assert simulation_limit(RuntimeError("CUDA error: an illegal memory access")) != ""
    with cuda_queries_simulated(2), pytest.raises(InvalidDeviceError):
        torch.cuda.set_device(3)


class _PinsADeviceDataset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        loader = DataLoader(TensorDataset(x.detach().repeat(4, 1)), batch_size=2, pin_memory=True)
        (batch,) = next(iter(loader))  # MARK pinned-loader
        return self.proj(batch)


class _PinsAHostDataset(_PinsADeviceDataset):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        loader = DataLoader(TensorDataset(torch.ones(8, 4)), batch_size=2, pin_memory=True)
        (batch,) = next(iter(loader))
        return self.proj(batch.to(x.device, non_blocking=True))


@pytest.mark.parametrize("engine", ["tagged", "auto"])
def test_a_pinning_dataloader_over_a_device_dataset_raises_at_the_users_line(engine: str) -> None:
    report = placecheck.audit(_PinsADeviceDataset(), device="cuda", engine=engine, inputs=["float32[2,4]"],
                              select=["PC2"])
    (finding,) = report.findings
    assert finding.code == "PC207" and "pin" in finding.message, report.notes
    assert finding.source.endswith(marked_source(HERE, "MARK pinned-loader"))
    # a host dataset pins, as on a GPU machine: no error
    clean = placecheck.audit(_PinsAHostDataset(), device="cuda", engine=engine, inputs=["float32[2,4]"],
                             select=["PC2"])
    assert "PC207" not in {f.code for f in clean.findings}, [f.message for f in clean.findings]


class _CpuGenerator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x + torch.randn(x.shape, device=x.device, generator=self.generator))


class _LengthsOnTheDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(4, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lengths = torch.tensor([3, 2], device=x.device)
        out, _ = self.rnn(pack_padded_sequence(x, lengths, batch_first=True))
        return out.data


@pytest.mark.parametrize("engine", ENGINES)
def test_pc201_of_a_generator_says_it_is_the_generators_device(engine: str) -> None:
    report = placecheck.audit(_CpuGenerator(), device="cuda", engine=engine, select=["PC201"])
    (finding,) = report.findings
    assert "torch.Generator on cpu" in finding.message
    assert "Expected a 'cuda' device type for generator" in finding.message
    assert "same device" not in finding.message
    assert "torch.Generator(device='cuda:0')" in finding.hint
    assert dict(finding.details)["argument"] == "generator"


@pytest.mark.parametrize("engine", ENGINES)
def test_pc201_of_device_lengths_says_they_must_be_on_the_cpu(engine: str) -> None:
    report = placecheck.audit(_LengthsOnTheDevice(), device="cuda", engine=engine, select=["PC201"],
                              inputs=["float32[2,3,4]"])
    (finding,) = report.findings
    assert "lengths argument" in finding.message and "on the CPU" in finding.message
    assert "same device" not in finding.message
    assert (finding.device, finding.expected) == ("cuda:0", "cpu")
    assert "lengths.cpu()" in finding.hint


_WORKERS_SCRIPT = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class OnTheGpu(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.randn(4, device="cuda"), torch.tensor(i % 2, device="cuda")


if __name__ == "__main__":
    model = nn.Linear(4, 2).to("cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(OnTheGpu(), batch_size=8, num_workers=WORKERS):  # MARK loader-loop
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="the fork start method needs os.fork")
def test_cuda_in_a_forked_dataloader_worker_raises_as_cuda_does_at_the_loop(tmp_path: Any) -> None:
    buggy = tmp_path / "workers_buggy.py"
    buggy.write_text(_WORKERS_SCRIPT.replace("WORKERS", "2"))
    report = placecheck.run(str(buggy), steps=2)
    errors = [f for f in report.findings if f.code == "PC207"]
    assert len(errors) == 1 and "ForkedCudaError" in errors[0].message, report.findings
    line = next(i + 1 for i, s in enumerate(_WORKERS_SCRIPT.splitlines()) if "MARK loader-loop" in s)
    assert errors[0].source.endswith(f"workers_buggy.py:{line}")
    # in the main process (no workers) the same dataset is fine
    fixed = tmp_path / "workers_fixed.py"
    fixed.write_text(_WORKERS_SCRIPT.replace("WORKERS", "0"))
    assert placecheck.run(str(fixed), steps=2).findings == ()


def test_the_forked_cuda_error_is_the_scripts_not_the_simulations() -> None:
    error = ForkedCudaError(FORKED_CUDA)
    assert simulation_limit(error) == ""
    reraised = RuntimeError(f"Caught ForkedCudaError in DataLoader worker process 0.\n{FORKED_CUDA}")
    assert simulation_limit(reraised) == ""
