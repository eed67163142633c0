"""Simulated CUDA, end to end: code written for a GPU machine must audit as it would run on one.

Models under ``tests/fixtures/simulation/``: CUDA tensors created in
``__init__``, recurrent layers (cuDNN's path on a GPU), and the
``torch.cuda`` runtime API (streams, events, RNG, properties, memory,
autocast). Everything here runs without a GPU and on the CPU-only torch
build too (no torchvision).
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import torch
import torch.nn as nn
from cli_runner import CliRunner
from conftest import TESTS, load_file
from forward_helpers import ungrouped  # noqa: F401 (the fixture)

import placecheck
from placecheck.cli import app
from placecheck.engines.engine import SIMULATED_CUDA, SIMULATED_GPU_NAME, simulated_cuda

pytestmark = [pytest.mark.usefixtures("ungrouped"), pytest.mark.cpu_build, pytest.mark.compat]

FIXTURES = TESTS / "fixtures" / "simulation"
CUDA_IN_INIT = FIXTURES / "cuda_in_init.py"
RECURRENT = FIXTURES / "recurrent.py"
CUDA_API = FIXTURES / "cuda_api.py"
CPU_ONLY_BUILD = torch.version.cuda is None

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU is present")


def rows(report: placecheck.Report) -> list[tuple[str, str, str]]:
    return sorted((f.code, f.where, f.source.rsplit("/", 1)[-1]) for f in report.findings)


# -- 1. CUDA tensors created in __init__ -----------------------------------------------------------

# (attribute, expected (code, where, source file:line)): tensors created on CUDA are fine; the
# stray CPU tensor beside them is not, and using it in forward is a mismatch.
CUDA_IN_INIT_CASES = {
    "DeviceKeyword": [],
    "BufferOnCuda": [("PC101", "stray", "cuda_in_init.py:30")],
    "CudaCall": [("PC101", "stray", "cuda_in_init.py:42")],
    "IsAvailable": [("PC101", "stray", "cuda_in_init.py:56"), ("PC201", "", "cuda_in_init.py:59")],
    "moved_by_factory": [("PC101", "mask", "cuda_in_init.py:66")],
}


@no_gpu
@pytest.mark.parametrize("name", sorted(CUDA_IN_INIT_CASES))
@pytest.mark.parametrize("engine", ["auto", "tagged"])
def test_cuda_tensors_created_in_init(name: str, engine: str) -> None:
    report = placecheck.audit(load_file(CUDA_IN_INIT, name), "cuda", engine=engine, inputs=["float32[3,2]"])
    assert rows(report) == CUDA_IN_INIT_CASES[name]
    if engine == "auto":  # the fake engine ran it: no fallback was needed
        assert report.engine == SIMULATED_CUDA and not any("fell back" in n for n in report.notes)


@no_gpu
@pytest.mark.parametrize("name", sorted(CUDA_IN_INIT_CASES))
def test_cuda_tensors_created_in_init_built_on_meta(name: str) -> None:
    report = placecheck.audit(load_file(CUDA_IN_INIT, name), "cuda", init="meta", inputs=["float32[3,2]"])
    assert rows(report) == CUDA_IN_INIT_CASES[name] and report.engine == SIMULATED_CUDA


@no_gpu
@pytest.mark.parametrize("name", sorted(CUDA_IN_INIT_CASES))
def test_cuda_tensors_created_in_init_from_the_cli(name: str) -> None:
    result = CliRunner().invoke(app, ["audit", f"{CUDA_IN_INIT}:{name}", "--no-forward", "--format", "json"])
    walk_rows = [r for r in CUDA_IN_INIT_CASES[name] if r[0].startswith("PC1")]
    assert result.exit_code == (1 if walk_rows else 0), result.stderr
    report = json.loads(result.stdout)
    assert report["engine"] == SIMULATED_CUDA
    found = sorted((f["code"], f["where"], f["source"].rsplit("/", 1)[-1]) for f in report["findings"])
    assert found == walk_rows


@no_gpu
def test_cuda_tensor_in_init_stays_on_its_gpu_and_follows_nothing() -> None:
    """A tensor made on cuda:0 in ``__init__`` is not moved by ``.to("cuda:1")``: PC101 on cuda:0."""

    class PinnedToGpu0(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.table = torch.ones(2, device="cuda:0")

    report = placecheck.audit(PinnedToGpu0, "cuda:1", gpus=2, forward=False)
    (finding,) = report.findings
    assert (finding.code, finding.where, finding.device, finding.expected) == ("PC101", "table", "cuda:0",
                                                                               "cuda:1")


# -- 3. recurrent layers ----------------------------------------------------------------------------

RECURRENT_INPUTS = {
    "LSTMTagger": "int64[2,5]:0..100",
    "ProjectedLSTM": "float32[2,5,4]",
    "GRUAndRNN": "float32[2,5,4]",
}


@no_gpu
@pytest.mark.parametrize("name", sorted(RECURRENT_INPUTS))
@pytest.mark.parametrize("options", [{"engine": "fake"}, {"engine": "tagged"}, {"engine": "auto"},
                                     {"engine": "auto", "train": True}],
                         ids=["fake", "tagged", "auto", "train"])
def test_recurrent_models_audit_clean(name: str, options: dict[str, Any]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = placecheck.audit(load_file(RECURRENT, name), "cuda", inputs=[RECURRENT_INPUTS[name]],
                                  **options)
    assert report.findings == (), [f.message for f in report.findings]
    assert not any("fell back" in note for note in report.notes)
    # cuDNN's flatten_parameters read fake data pointers; oneDNN warned about proj_size on the CPU
    noise = [str(w.message) for w in caught if "data pointer" in str(w.message) or "oneDNN" in str(w.message)]
    assert noise == []


def test_cudnn_is_restored_after_a_session() -> None:
    before = torch.backends.cudnn.enabled
    with simulated_cuda():
        assert not torch.backends.cudnn.enabled
    assert torch.backends.cudnn.enabled == before


# -- 4. the torch.cuda runtime API ------------------------------------------------------------------

@no_gpu
@pytest.mark.parametrize("name", ["StreamsAndEvents", "Autocast", "PinnedCopy"])
@pytest.mark.parametrize("engine", ["fake", "tagged"])
def test_cuda_runtime_api_is_simulated(name: str, engine: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = placecheck.audit(load_file(CUDA_API, name), "cuda", engine=engine, inputs=["float32[2,4]"])
    # correct code: at most info (PinnedCopy's host table is copied each call, and .to() leaves it behind)
    loud = [f.message for f in report.findings if f.severity.value != "info"]
    assert loud == []
    expected = [("PC101", "table")] if name == "PinnedCopy" else []
    assert [(f.code, f.where) for f in report.findings] == expected
    assert not any("stopped" in note or "fell back" in note for note in report.notes), report.notes
    assert not [w for w in caught if "autocast" in str(w.message).lower()]


@no_gpu
def test_simulated_device_says_it_is_simulated() -> None:
    with simulated_cuda(2):
        assert torch.cuda.get_device_name(1) == SIMULATED_GPU_NAME
        assert "simulated" in torch.cuda.get_device_properties(0).name
        assert torch.cuda.get_device_capability() == (9, 0)
        assert torch.cuda.memory_allocated() == 0 and torch.cuda.memory_stats() == {}
        assert torch.cuda.current_stream().query() and torch.cuda.Event().query()
        assert isinstance(torch.cuda.default_stream(), torch.cuda.Stream)
        assert isinstance(torch.cuda.Event(enable_timing=True), torch.cuda.Event)
        with torch.cuda.device(1), torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.synchronize()


@no_gpu
@pytest.mark.parametrize(("device", "index"),
                         [(None, 0), (1, 1), ("cuda:1", 1), (torch.device("cuda", 1), 1)])
def test_a_simulated_stream_is_on_the_gpu_it_was_given(device: object, index: int) -> None:
    # as CUDA's: Stream(device=1) is on cuda:1 (an int was once read as a device text, and gave cuda:0)
    with simulated_cuda(2):
        stream = torch.cuda.Stream() if device is None else torch.cuda.Stream(device=device)
        assert stream.device == torch.device("cuda", index)


@no_gpu
@pytest.mark.skipif(CPU_ONLY_BUILD, reason="a CPU-only build aborts on autocast('cuda'); it stays off there")
def test_autocast_cuda_applies_to_fake_cuda_tensors() -> None:
    with simulated_cuda():
        lin = nn.Linear(4, 4).to("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            out = lin(torch.ones(2, 4, device="cuda"))
    assert out.dtype == torch.float16 and out.device.type == "cuda"
