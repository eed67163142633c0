"""``audit TARGET --checkpoint FILE``: the checkpoint is loaded into the model, then the full audit runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from checkpoint_writer import save_with_locations
from cli_runner import CliRunner
from conftest import unwrapped
from safetensors.torch import save_file

from placecheck import audit
from placecheck.basics.values import Device
from placecheck.checkpoint import check_checkpoint, load_into_model, read_checkpoint
from placecheck.checkpoint.preflight import UnsafeCheckpointError
from placecheck.cli import app
from placecheck.engines.engine import choose_engine
from placecheck.examples.buggy import BuggyNet

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))


def _trained() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    state = Small().state_dict()
    state["steps"] = torch.tensor(7)
    return state


def test_load_into_model_loads_the_values_with_map_location_cpu_under_simulation(tmp_path: Path) -> None:
    state = _trained()
    path = save_with_locations(state, tmp_path / "gpu1.pt", default="cuda:1")
    model = Small()
    engine = choose_engine(Device("cuda", 0), gpus=1)
    assert engine.simulated or torch.cuda.is_available()
    loaded = load_into_model(model, str(path), device=Device("cuda", 0), engine=engine)
    if engine.simulated:
        assert "map_location='cpu'" in loaded.notes[0]
    assert torch.equal(model.fc.weight.cpu(), state["fc.weight"])
    assert int(model.steps) == 7
    assert [f.code for f in loaded.findings] == ["PC301"]  # cuda:1 on a one-GPU target


def test_a_ddp_checkpoint_loads_after_the_prefix_fix(tmp_path: Path) -> None:
    state = {"module." + k: v for k, v in _trained().items()}
    path = tmp_path / "ddp.pt"
    torch.save({"model": state, "epoch": 3}, path)
    model = Small()
    loaded = load_into_model(model, str(path), device=Device("cpu"), engine=choose_engine(Device("cpu")))
    assert [(f.code, f.where) for f in loaded.findings] == [("PC302", "<prefix module.>")]
    assert torch.equal(model.fc.bias, state["module.fc.bias"])
    assert "3 of 3 tensors loaded from 'model'" in loaded.notes[0]
    # the lenient load is placecheck's: a training script's strict load raises, and the note says so
    assert "as a training script would" not in loaded.notes[0]
    assert ("load_state_dict(state) (strict=True, the default) raises: every key is missing and "
            "unexpected (prefix 'module.')") in loaded.notes[0]


def test_the_load_note_says_a_strict_load_accepts_a_matching_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    torch.save(_trained(), path)
    loaded = load_into_model(Small(), str(path), device=Device("cpu"), engine=choose_engine(Device("cpu")))
    assert loaded.notes[0].endswith("a strict load_state_dict (the default) accepts it as it is")


def test_shape_mismatch_is_reported_and_the_rest_still_loads(tmp_path: Path) -> None:
    state = _trained()
    state["fc.weight"] = torch.zeros(5, 4)
    path = tmp_path / "bad_shape.safetensors"
    save_file(state, str(path))
    model = Small()
    loaded = load_into_model(model, str(path), device=Device("cpu"), engine=choose_engine(Device("cpu")))
    assert [(f.code, f.where) for f in loaded.findings] == [("PC304", "fc.weight")]
    assert torch.equal(model.fc.bias, state["fc.bias"])


def test_unsafe_checkpoint_raises_without_trust(tmp_path: Path) -> None:
    path = tmp_path / "module.pt"
    torch.save(Small(), path)
    with pytest.raises(UnsafeCheckpointError, match="--trust"):
        load_into_model(Small(), str(path), device=Device("cpu"), engine=choose_engine(Device("cpu")))


def test_audit_reports_checkpoint_and_walk_findings_together(tmp_path: Path) -> None:
    path = save_with_locations(BuggyNet().state_dict(), tmp_path / "buggy.pt", default="cuda:3")
    report = audit(BuggyNet, "cuda", gpus=1, checkpoint=str(path))
    found = {f.code for f in report.findings}
    assert {"PC301", "PC101", "PC102", "PC103"} <= found
    assert any("loaded into the model" in n for n in report.notes)


def test_audit_with_meta_init_loads_with_map_location_meta(tmp_path: Path) -> None:
    path = tmp_path / "small.pt"
    torch.save(_trained(), path)
    report = audit(Small, "cuda", init="meta", checkpoint=str(path))
    assert report.findings == ()
    assert any("map_location='meta'" in n for n in report.notes)


def test_cli_audit_checkpoint_with_key_and_select(tmp_path: Path) -> None:
    path = save_with_locations({"ema": BuggyNet().state_dict()}, tmp_path / "ema.pt", default="cuda:3")
    result = CliRunner().invoke(app, ["audit", "placecheck.examples.buggy:BuggyNet", "--checkpoint",
                                      str(path), "--key", "ema", "--select", "PC3", "--format", "json"])
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)
    assert [f["code"] for f in report["findings"]] == ["PC301"]
    bad = CliRunner().invoke(app, ["audit", "placecheck.examples.buggy:BuggyNet", "--checkpoint",
                                   str(path), "--key", "model"])
    assert bad.exit_code == 2
    assert "keys there: ema" in bad.stderr


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_on_a_real_gpu_the_pc301_prediction_matches_torch_load(tmp_path: Path) -> None:
    count = torch.cuda.device_count()
    path = save_with_locations(_trained(), tmp_path / "beyond.pt", default=f"cuda:{count}")
    (finding,) = check_checkpoint(str(path), device="cuda", engine="real").report.findings
    assert finding.code == "PC301" and f"device_count() is {count}" in finding.message
    with pytest.raises(RuntimeError, match=f"CUDA device {count} but torch.cuda.device_count"):
        torch.load(path, weights_only=True)
    state = torch.load(path, map_location="cuda:0", weights_only=True)  # the hint's fix
    assert state["fc.weight"].device == torch.device("cuda:0")


@pytest.mark.gpu
@needs_cuda
def test_audit_checkpoint_on_a_real_gpu_maps_to_the_target(tmp_path: Path) -> None:
    path = tmp_path / "small.pt"
    torch.save(_trained(), path)
    report = audit(Small, "cuda", engine="real", checkpoint=str(path))
    assert report.findings == ()
    assert any("map_location='cuda:0'" in n for n in report.notes)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")
def test_audit_loads_a_torchscript_archive_with_constants(tmp_path: Path) -> None:
    class WithConstant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.table = torch.randn(3)  # a plain attribute: tracing saves it as a constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) + self.table

    torch.manual_seed(1)
    source = WithConstant()
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.trace(source, torch.randn(2, 4)), str(path))
    meta = read_checkpoint(path)
    assert "<constants>" in meta.root  # the case this test is about
    assert {s.key for s in meta.storages} == {"0", "1", "constants/0"}
    model = WithConstant()
    loaded = load_into_model(model, str(path), device=Device("cpu"), engine=choose_engine(Device("cpu")))
    assert loaded.findings == ()
    assert torch.equal(model.fc.weight, source.fc.weight)


class _Tower(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(4)])


def test_a_checkpoint_of_a_differently_sized_model_is_one_shape_problem(tmp_path: Path) -> None:
    path = tmp_path / "wide.pt"
    torch.save(_Tower(8).state_dict(), path)
    (problem,) = check_checkpoint(str(path), model=_Tower(4), device="cpu").report.findings
    assert problem.code == "PC304" and len(problem.instances) == 8  # 4 weights and 4 biases
    assert problem.instances[:2] == ("layers.0.bias", "layers.0.weight")
    ungrouped = check_checkpoint(str(path), model=_Tower(4), device="cpu", group=False).report.findings
    assert [f.code for f in ungrouped] == ["PC304"] * 8


def test_without_safetensors_a_safetensors_load_says_which_extra(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # safetensors is the extra placecheck[safetensors]: only loading the tensors needs it
    path = tmp_path / "small.safetensors"
    save_file(_trained(), str(path))
    for name in ("safetensors", "safetensors.torch"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError
    checked = check_checkpoint(str(path), device="cuda")  # the header alone: no safetensors needed
    assert [f.code for f in checked.report.findings] == []
    model = tmp_path / "small.py"
    model.write_text("import torch, torch.nn as nn\n\nclass Small(nn.Module):\n"
                     "    def __init__(self):\n        super().__init__()\n"
                     "        self.fc = nn.Linear(4, 3)\n"
                     "        self.register_buffer('steps', torch.zeros((), dtype=torch.int64))\n")
    result = CliRunner().invoke(app, ["audit", f"{model}:Small", "--checkpoint", str(path),
                                      "--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert unwrapped(result.stderr).strip() == (f"placecheck: error: loading the tensors of {str(path)!r} "
                                                "needs safetensors: pip install 'placecheck[safetensors]'")
