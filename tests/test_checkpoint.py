"""``placecheck checkpoint``: formats, saved devices (PC301), the state_dict search, output and exit codes.

Every checkpoint is made by the test in ``tmp_path``; ``cuda``-tagged ones with
:func:`checkpoint_writer.save_with_locations`, no GPU needed.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from checkpoint_writer import save_with_locations
from cli_runner import CliRunner
from conftest import unwrapped
from safetensors.torch import save_file

from placecheck.checkpoint import CheckpointFormat, check_checkpoint, read_checkpoint
from placecheck.checkpoint.metadata import find_state_dict
from placecheck.cli import app

pytestmark = pytest.mark.compat

NET_SOURCE = '''
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("cache", torch.zeros(3), persistent=False)

    def forward(self, x):
        return self.norm(self.fc(x)) * self.scale
'''


class Net(nn.Module):
    """The same model as NET_SOURCE, for checkpoints made in the test process."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("cache", torch.zeros(3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc(x)) * self.scale


EXPECTED_KEYS = ["fc.weight", "fc.bias", "norm.weight", "norm.bias", "norm.running_mean",
                 "norm.running_var", "norm.num_batches_tracked", "scale"]


@pytest.fixture
def net_target(tmp_path: Path) -> str:
    path = tmp_path / "net.py"
    path.write_text(NET_SOURCE, encoding="utf-8")
    return f"{path}:Net"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def run_json(*args: str) -> tuple[int, dict]:
    code, out, err = run(*args, "--format", "json")
    assert code in (0, 1), err
    return code, json.loads(out)


def codes(report: dict) -> list[tuple[str, str]]:
    return [(f["code"], f["where"]) for f in report["findings"]]


# --- formats ---------------------------------------------------------------------------------------

def _zip(path: Path, sd: dict) -> None:
    torch.save(sd, path)


def _legacy(path: Path, sd: dict) -> None:
    torch.save(sd, path, _use_new_zipfile_serialization=False)


def _safetensors(path: Path, sd: dict) -> None:
    save_file(sd, str(path))


def _torchscript(path: Path, sd: dict) -> None:
    net = Net().eval()
    net.load_state_dict(sd)
    torch.jit.save(torch.jit.trace(net, torch.randn(2, 4)), str(path))


def _pt2(path: Path, sd: dict) -> None:
    net = Net().eval()
    net.load_state_dict(sd)
    torch.export.save(torch.export.export(net, (torch.randn(2, 4),)), str(path))


@pytest.mark.parametrize(("writer", "fmt"), [
    (_zip, CheckpointFormat.TORCH_ZIP),
    (_legacy, CheckpointFormat.TORCH_LEGACY),
    (_safetensors, CheckpointFormat.SAFETENSORS),
    (_torchscript, CheckpointFormat.TORCHSCRIPT),
    (_pt2, CheckpointFormat.TORCH_EXPORT),
])
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")
def test_every_format_gives_keys_shapes_and_dtypes(tmp_path: Path, writer, fmt) -> None:
    sd = Net().state_dict()
    path = tmp_path / "ckpt.bin"
    writer(path, sd)
    meta = read_checkpoint(path)
    assert meta.format is fmt
    found = find_state_dict(meta)
    assert found is not None
    _, tensors = found
    # Every key, no filter: what torch's own loader returns for this format is the truth (a .pt2's
    # state_dict leaves out its constants; a TorchScript module's keeps the non-persistent buffer).
    truth = _loaded_by_torch(path, fmt)
    got = {k: (t.shape, t.dtype) for k, t in tensors.items()}
    assert got == {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in truth.items()}
    extra = ["cache"] if fmt is CheckpointFormat.TORCHSCRIPT else []
    assert sorted(got) == sorted(EXPECTED_KEYS + extra)
    assert not meta.unsafe_globals


def _loaded_by_torch(path: Path, fmt: CheckpointFormat) -> dict[str, torch.Tensor]:
    if fmt is CheckpointFormat.SAFETENSORS:
        from safetensors.torch import load_file

        return load_file(str(path))
    if fmt is CheckpointFormat.TORCHSCRIPT:
        return dict(torch.jit.load(str(path)).state_dict())
    if fmt is CheckpointFormat.TORCH_EXPORT:
        return dict(torch.export.load(str(path)).state_dict)
    return torch.load(path, weights_only=True)


def test_nested_checkpoint_finds_the_state_dict_by_itself(tmp_path: Path, net_target: str) -> None:
    net = Net()
    optimizer = torch.optim.Adam(net.parameters())
    path = tmp_path / "train.pt"
    torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}, path)
    code, report = run_json("checkpoint", str(path), "--model", net_target)
    assert code == 0, report
    assert report["findings"] == []
    assert any("under 'model'" in n for n in report["notes"])


def test_key_picks_a_nested_state_dict_and_a_wrong_key_lists_what_exists(tmp_path: Path) -> None:
    sd = Net().state_dict()
    ema = {k: v.clone() for k, v in sd.items()}
    ema["fc.weight"] = torch.zeros(5, 4)  # distinguishable from the plain model weights
    path = tmp_path / "ema.pt"
    torch.save({"model": {"ema": ema, "online": sd}, "epoch": 3}, path)
    meta = read_checkpoint(path)
    chosen = find_state_dict(meta, "model.ema")
    assert chosen is not None and chosen[1]["fc.weight"].shape == (5, 4)

    code, _, err = run("checkpoint", str(path), "--key", "model.emma")
    assert code == 2
    assert unwrapped(err).count("\n") == 1
    assert "'emma' not found under 'model'; keys there: ema, online" in unwrapped(err)
    code, _, err = run("checkpoint", str(path), "--key", "epoch")
    assert code == 2 and "not a state_dict" in unwrapped(err)


# --- saved devices: PC301 ----------------------------------------------------------------------------

def test_cuda3_on_a_one_gpu_target_is_pc301_with_the_map_location_fix(tmp_path: Path) -> None:
    sd = Net().state_dict()
    path = save_with_locations(sd, tmp_path / "gpu3.pt", default="cuda:3")
    code, report = run_json("checkpoint", str(path), "--device", "cuda", "--gpus", "1")
    assert code == 1
    (finding,) = report["findings"]
    assert finding["code"] == "PC301" and finding["device"] == "cuda:3"
    assert finding["expected"] == "cuda:0"
    assert finding["count"] == len(sd)
    assert finding["where"] == f"<{len(sd)} tensors on cuda:3>"  # what it covers, not its first key
    assert "device_count() is 1" in finding["message"]
    assert 'map_location="cuda:0"' in finding["hint"]
    stats = report["stats"]
    assert stats["tensors@cuda:3"] == len(sd)
    assert stats["bytes@cuda:3"] == sum(t.untyped_storage().nbytes() for t in sd.values())


def test_cuda3_is_fine_when_the_target_has_four_gpus(tmp_path: Path) -> None:
    path = save_with_locations(Net().state_dict(), tmp_path / "gpu3.pt", default="cuda:3")
    code, report = run_json("checkpoint", str(path), "--device", "cuda", "--gpus", "4")
    assert (code, report["findings"]) == (0, [])


def test_cuda_checkpoint_on_a_cpu_target_is_pc301(tmp_path: Path) -> None:
    path = save_with_locations(Net().state_dict(), tmp_path / "gpu0.pt", default="cuda:0")
    _, report = run_json("checkpoint", str(path), "--device", "cpu")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: cuda:0 exists")
    (finding,) = report["findings"]
    assert finding["code"] == "PC301" and "is_available() is False" in finding["message"]
    assert 'map_location="cpu"' in finding["hint"]


def test_mixed_devices_are_one_pc301(tmp_path: Path) -> None:
    sd = Net().state_dict()
    path = save_with_locations(sd, tmp_path / "mixed.pt", {"fc.weight": "cuda:0", "fc.bias": "cuda:0"})
    _, report = run_json("checkpoint", str(path), "--device", "cuda")
    (finding,) = report["findings"]
    assert finding["code"] == "PC301"
    assert finding["device"] == "cpu, cuda:0"
    assert finding["where"] == "<8 tensors on 2 devices>"
    assert "2 devices (cpu: 6, cuda:0: 2)" in finding["message"]


def test_device_table_lists_each_device_and_the_total(tmp_path: Path) -> None:
    sd = {"a": torch.zeros(256), "b": torch.zeros(128), "c": torch.zeros(64, dtype=torch.float16)}
    path = save_with_locations(sd, tmp_path / "t.pt", {"a": "cuda:1"})
    code, out, _ = run("checkpoint", str(path), "--gpus", "2")
    assert code == 1  # mixed devices
    single = save_with_locations({"a": torch.zeros(2)}, tmp_path / "one.pt", {"a": "cuda:3"})
    assert check_checkpoint(str(single), device="cuda", gpus=1).report.findings[0].where == "a"
    table = out[out.index("saved devices"):]
    rows = [line.split() for line in table.splitlines()[3:6]]
    assert rows == [["cpu", "2", "2", "640", "B"], ["cuda:1", "1", "1", "1.0", "KiB"],
                    ["total", "3", "3", "1.6", "KiB"]]


@pytest.fixture
def tag_every_storage_as():
    """Make torch.save itself record a chosen location tag (its own tagger registry), then undo it."""
    from torch import serialization

    added = []

    def install(location: str) -> None:
        entry = (-1, lambda storage: location, lambda storage, loc: None)
        serialization._package_registry.insert(0, entry)
        added.append(entry)

    yield install
    for entry in added:
        serialization._package_registry.remove(entry)


def test_legacy_format_keeps_cuda_tags_too(tmp_path: Path, tag_every_storage_as) -> None:
    sd = Net().state_dict()
    tag_every_storage_as("cuda:2")
    path = tmp_path / "legacy.pt"
    torch.save(sd, path, _use_new_zipfile_serialization=False)
    meta = read_checkpoint(path)
    assert meta.format is CheckpointFormat.TORCH_LEGACY
    assert {s.location for s in meta.storages} == {"cuda:2"}
    report = check_checkpoint(str(path), device="cuda", gpus=2).report
    assert [(f.code, f.device, f.count) for f in report.findings] == [("PC301", "cuda:2", len(sd))]


def test_inspection_reads_no_tensor_data(tmp_path: Path) -> None:
    """The data records are garbage of the wrong size: the index alone must answer."""
    sd = Net().state_dict()
    good = save_with_locations(sd, tmp_path / "good.pt", default="cuda:2")
    bad = tmp_path / "nodata.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, b"x" if "/data/" in item.filename else src.read(item))
    meta = read_checkpoint(bad)
    assert {s.location for s in meta.storages} == {"cuda:2"}
    assert sum(s.nbytes for s in meta.storages) == sum(t.untyped_storage().nbytes() for t in sd.values())
    with pytest.raises(RuntimeError):  # torch itself would need the data
        torch.load(bad, map_location="cpu", weights_only=True)


# --- output and exit codes ----------------------------------------------------------------------------

def test_clean_checkpoint_exits_0_with_table_output(tmp_path: Path, net_target: str) -> None:
    path = tmp_path / "clean.pt"
    torch.save(Net().state_dict(), path)
    code, out, _ = run("checkpoint", str(path), "--model", net_target)
    assert code == 0
    # the TARGET whole on the first line, the rest wrapped to 80 columns after it
    words = " ".join(out.split())
    assert words.startswith(f"placecheck: {path} on cuda:0, simulated (fake tensors, no data) ")
    assert out.splitlines()[0].startswith(f"placecheck: {path}")
    assert "no placement problems found" in out


def test_warning_only_respects_fail_on(tmp_path: Path, net_target: str) -> None:
    path = tmp_path / "bf16.pt"
    torch.save(Net().to(torch.bfloat16).state_dict(), path)
    code, report = run_json("checkpoint", str(path), "--model", net_target)
    assert code == 1
    assert {f["code"] for f in report["findings"]} == {"PC305"}
    assert run("checkpoint", str(path), "--model", net_target, "--fail-on", "error")[0] == 0


def test_api_report_is_a_report_with_the_file_as_target(tmp_path: Path) -> None:
    path = save_with_locations(Net().state_dict(), tmp_path / "gpu3.pt", default="cuda:3")
    result = check_checkpoint(str(path), device="cuda", gpus=1, ignore=["PC301"])
    assert result.report.target == str(path)
    assert result.report.device == "cuda:0"
    assert result.report.findings == ()
    assert not result.refused


# --- review fixes: .pt2 constants, cycles, optimizer state, texts ---------------------------------

def _pt2_net(path: Path, device_tag: str | None = None) -> Path:
    _pt2(path, Net().state_dict())
    if device_tag is None:
        return path
    rewritten = path.with_name("tagged.pt2")  # the device in a .pt2 is a field of its JSON configs
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(rewritten, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("model_weights_config.json"):
                kind, _, index = device_tag.partition(":")
                config = json.loads(data)
                for entry in config["config"].values():
                    entry["tensor_meta"]["device"] = {"type": kind, "index": int(index)}
                data = json.dumps(config).encode()
            dst.writestr(item, data)
    return rewritten


def test_pt2_constants_are_placed_but_not_in_the_state_dict(tmp_path: Path, net_target: str) -> None:
    """Net's non-persistent 'cache' buffer is a constant of the program, not a state_dict key."""
    path = _pt2_net(tmp_path / "prog.pt2")
    meta = read_checkpoint(path)
    assert set(meta.constants) == {"cache"}
    code, report = run_json("checkpoint", str(path), "--model", net_target)
    assert code == 0 and report["findings"] == []  # no PC303 for 'cache'
    table = next(n for n in report["notes"] if n.startswith("saved devices"))
    assert "total             9" in table  # 8 weights and the constant
    assert any("not in ExportedProgram.state_dict" in n for n in report["notes"])


def test_pt2_pc301_names_torch_export_load(tmp_path: Path) -> None:
    path = _pt2_net(tmp_path / "prog.pt2", "cuda:3")
    (finding,) = check_checkpoint(str(path), device="cuda", gpus=1).report.findings
    assert finding.code == "PC301" and finding.device == "cuda:3"
    assert "torch.export.load puts each tensor back on cuda:3" in finding.message
    assert "torch.load" not in finding.message.replace("torch.export.load", "")


def test_a_cyclic_pickle_is_read_without_recursion_error(tmp_path: Path, net_target: str) -> None:
    state: dict = {"fc.weight": torch.zeros(3, 4)}
    config: dict = {"parent": state}
    state["cfg"] = config
    path = tmp_path / "cyclic.pt"
    torch.save({"model": Net().state_dict(), "extra": state}, path)
    assert torch.load(path, weights_only=True)["extra"]["cfg"]["parent"]["fc.weight"].shape == (3, 4)
    code, report = run_json("checkpoint", str(path), "--model", net_target)
    assert code == 0, report
    assert any("under 'model'" in n for n in report["notes"])
    assert report["stats"]["tensors"] == 9  # 8 in the model, 1 in the cycle, each once


def test_optimizer_state_is_not_a_state_dict_candidate(tmp_path: Path, net_target: str) -> None:
    net = Net()
    optimizer = torch.optim.Adam(net.parameters())
    net(torch.randn(2, 4)).sum().backward()
    optimizer.step()  # Adam now holds exp_avg/exp_avg_sq per parameter: optimizer.state.0 ...
    path = tmp_path / "train.pt"
    torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict()}, path)
    _, report = run_json("checkpoint", str(path), "--model", net_target)
    line = next(n for n in report["notes"] if n.startswith("state_dict:"))
    assert "under 'model'" in line and "also found" not in line, line


def test_trusted_load_says_so_in_the_notes(tmp_path: Path) -> None:
    path = tmp_path / "module.pt"
    torch.save(Net(), path)
    _, out, _ = run("checkpoint", str(path), "--trust", "--format", "json")
    notes = json.loads(out)["notes"]
    assert "loaded with torch.load(weights_only=False) because --trust was given" in notes[0]
    assert "no tensor data was loaded" not in notes[0]


def test_an_empty_state_dict_says_so(tmp_path: Path, net_target: str) -> None:
    path = tmp_path / "empty_sd.pt"
    torch.save({}, path)
    code, _, err = run("checkpoint", str(path), "--model", net_target)
    assert code == 2 and unwrapped(err).count("\n") == 1
    assert "holds no tensors at all (an empty state_dict?)" in unwrapped(err)
    code, report = run_json("checkpoint", str(path))  # without --model: a note, not an error
    assert code == 0 and any("holds no tensors at all" in n for n in report["notes"])


def test_python2_global_names_are_shown_as_torch_names_them(tmp_path: Path) -> None:
    import collections

    path = tmp_path / "dd.pt"
    torch.save({"w": torch.zeros(1), "counts": collections.defaultdict(int)}, path)
    meta = read_checkpoint(path)
    # Protocol 2 writes builtins.int as __builtin__.long; torch (and pickle) read it back as builtins.int.
    assert sorted(meta.unsafe_globals) == sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    assert "builtins.int" in meta.unsafe_globals


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")
def test_audit_checkpoint_prints_no_torch_warnings(tmp_path: Path, net_target: str) -> None:
    """torch.jit.load warns and torch's loaders log: under the CLI none of that reaches stderr."""
    path = tmp_path / "scripted.pt"
    _torchscript(path, Net().state_dict())
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "placecheck", "audit", net_target, "--checkpoint", str(path),
                           "--no-forward", "--format", "json"], capture_output=True, text=True, check=False,
                          env={**__import__("os").environ, "PYTHONWARNINGS": "default"})
    assert done.returncode in (0, 1), done.stderr
    assert done.stderr == ""
