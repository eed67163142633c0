"""PC306: a checkpoint whose pickle would run code is never loaded without --trust.

The hostile checkpoint below creates a marker file when unpickled by
``torch.load(weights_only=False)``. The tests prove the marker does not
appear under ``placecheck checkpoint`` or ``placecheck audit --checkpoint``
without ``--trust``, and that it does with ``--trust`` (all in ``tmp_path``).
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from cli_runner import CliRunner
from conftest import unwrapped

from placecheck.basics.values import Device
from placecheck.checkpoint import CheckpointFormat, check_checkpoint, load_into_model, read_checkpoint
from placecheck.checkpoint.safety import unsafe_globals
from placecheck.cli import app
from placecheck.engines.engine import choose_engine

MODEL_SOURCE = '''
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
'''


class Hostile:
    """Unpickling this runs ``exec``, which creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "pwned"
    path = tmp_path / "hostile.pt"
    state = {"fc.weight": torch.zeros(3, 4), "fc.bias": torch.zeros(3)}
    torch.save({"model": state, "payload": Hostile(marker)}, path)
    assert not marker.exists()
    return path, marker


@pytest.fixture
def net_target(tmp_path: Path) -> str:
    path = tmp_path / "net.py"
    path.write_text(MODEL_SOURCE, encoding="utf-8")
    return f"{path}:Net"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_hostile_checkpoint_is_not_executed_without_trust(hostile: tuple[Path, Path]) -> None:
    path, marker = hostile
    code, out, err = run("checkpoint", str(path))
    assert code == 2
    assert not marker.exists()
    assert "PC306" in out and "builtins.exec" in out
    assert unwrapped(err).count("\n") == 1 and "--trust" in unwrapped(err)


def test_hostile_checkpoint_is_not_executed_by_audit_without_trust(
        hostile: tuple[Path, Path], net_target: str) -> None:
    path, marker = hostile
    code, _, err = run("audit", net_target, "--checkpoint", str(path))
    assert code == 2
    assert not marker.exists()
    assert unwrapped(err).count("\n") == 1
    assert "builtins.exec" in unwrapped(err) and "--trust" in unwrapped(err)


def test_reading_metadata_of_a_hostile_file_runs_nothing(hostile: tuple[Path, Path]) -> None:
    path, marker = hostile
    meta = read_checkpoint(path)
    assert meta.unsafe_globals == ("builtins.exec",)
    assert meta.needs_code_execution
    assert not marker.exists()


def test_with_trust_the_file_is_loaded_and_its_code_runs(hostile: tuple[Path, Path]) -> None:
    path, marker = hostile
    code, out, _ = run("checkpoint", str(path), "--trust", "--format", "json")
    assert marker.exists()
    assert code == 1  # PC306 stays as an error finding: the file runs code
    assert '"code": "PC306"' in out


def test_audit_with_trust_loads_and_audits(hostile: tuple[Path, Path], net_target: str) -> None:
    path, marker = hostile
    code, out, err = run("audit", net_target, "--checkpoint", str(path), "--trust", "--format", "json")
    assert code == 1, err
    assert marker.exists()
    assert '"code": "PC306"' in out


def test_a_full_pickled_module_needs_trust(tmp_path: Path) -> None:
    path = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    meta = read_checkpoint(path)
    assert "torch.nn.modules.linear.Linear" in meta.unsafe_globals
    code, _, _ = run("checkpoint", str(path))
    assert code == 2
    code, out, _ = run("checkpoint", str(path), "--trust", "--format", "json")
    assert code == 1 and '"state_dict: 2 tensors at the top level' in out


def test_the_scan_sees_stack_global_at_protocol_4(tmp_path: Path) -> None:
    """A hand-made data.pkl at protocol 4 names its globals with STACK_GLOBAL."""
    payload = pickle.dumps(Hostile(tmp_path / "never"), protocol=4)
    assert b"\x93" in payload  # STACK_GLOBAL, not GLOBAL
    path = tmp_path / "p4.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("p4/data.pkl", payload)
        zf.writestr("p4/version", "3\n")
    assert read_checkpoint(path).unsafe_globals == ("builtins.exec",)
    assert not (tmp_path / "never").exists()


def test_torch_rebuild_functions_are_safe(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    torch.save({"w": torch.nn.Parameter(torch.zeros(2)), "epoch": 3}, path)
    meta = read_checkpoint(path)
    assert "torch._utils._rebuild_tensor_v2" in meta.globals
    assert "torch._utils._rebuild_parameter" in meta.globals
    assert unsafe_globals(list(meta.globals)) == []
    assert not meta.needs_code_execution


# --- every format's hidden pickles -----------------------------------------------------------------

def _export(path: Path) -> Path:
    torch.manual_seed(0)
    torch.export.save(torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),)), str(path))
    return path


def _rewrite_zip(src: Path, dst: Path, replace: dict[str, bytes],
                 add: dict[str, bytes] | None = None) -> Path:
    """Copy a zip, replacing the members whose names end with a key of ``replace``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            for suffix, new in replace.items():
                if item.filename.endswith(suffix):
                    data = new
            zout.writestr(item, data)
        prefix = zin.namelist()[0].partition("/")[0]
        for name, data in (add or {}).items():
            zout.writestr(f"{prefix}/{name}", data)
    return dst


def _saved(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _hostile_pt2_sample_inputs(tmp: Path, marker: Path) -> Path:
    """torch.export.load tries weights_only=True, then unpickles the sample inputs with weights_only=False."""
    return _rewrite_zip(_export(tmp / "good.pt2"), tmp / "hostile.pt2",
                        {"data/sample_inputs/model.pt": _saved(Hostile(marker))})


def _hostile_pt2_pickled_weight(tmp: Path, marker: Path) -> Path:
    """A weight flagged use_pickle (a tensor subclass) is torch.load-ed with weights_only=False."""
    good = _export(tmp / "good.pt2")
    with zipfile.ZipFile(good) as zf:
        config_name = next(n for n in zf.namelist() if n.endswith("model_weights_config.json"))
        config = json.loads(zf.read(config_name))
    entry = config["config"]["weight"]
    entry["use_pickle"] = True
    return _rewrite_zip(good, tmp / "hostile.pt2", {
        "model_weights_config.json": json.dumps(config).encode(),
        f"data/weights/{entry['path_name']}": _saved(Hostile(marker))})


def _hostile_pt2_legacy_weights(tmp: Path, marker: Path) -> Path:
    """A legacy data/weights/model.pt (no weights config): torch.export.load unpickles it."""
    good = _export(tmp / "good.pt2")
    hostile = tmp / "hostile.pt2"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(hostile, "w") as zout:
        prefix = zin.namelist()[0].partition("/")[0]
        for item in zin.infolist():
            if "data/weights/" not in item.filename:
                zout.writestr(item, zin.read(item))
        zout.writestr(f"{prefix}/data/weights/model.pt",
                      _saved({"weight": torch.zeros(3, 4), "bias": torch.zeros(3), "x": Hostile(marker)}))
    return hostile


@pytest.mark.parametrize("make", [_hostile_pt2_sample_inputs, _hostile_pt2_pickled_weight,
                                  _hostile_pt2_legacy_weights])
def test_a_hostile_pt2_is_not_executed(tmp_path: Path, net_target: str, make) -> None:
    marker = tmp_path / "pwned"
    path = make(tmp_path, marker)
    code, out, err = run("checkpoint", str(path))
    assert not marker.exists()
    assert code == 2 and "PC306" in out
    said = unwrapped(err)
    assert said.count("\n") == 1 and "builtins.exec" in said and "--trust" in said
    code, out, err = run("audit", net_target, "--checkpoint", str(path), "--no-forward")
    assert not marker.exists()
    assert code == 2
    assert "PC306" in out  # the report first, in the chosen format
    said = unwrapped(err)
    assert said.count("\n") == 1 and "builtins.exec" in said and "--trust" in said


def test_the_hostile_pt2_payload_is_live(tmp_path: Path) -> None:
    """The fixture is real: torch.export.load itself runs it (so the tests above can fail)."""
    marker = tmp_path / "pwned"
    path = _hostile_pt2_sample_inputs(tmp_path, marker)
    with contextlib.suppress(Exception):
        torch.export.load(str(path))
    assert marker.exists()


def test_a_safe_pt2_loads_without_torch_export_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _export(tmp_path / "prog.pt2")
    expected = torch.export.load(str(path)).state_dict

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.export.load was called")

    monkeypatch.setattr(torch.export, "load", refuse)
    model = torch.nn.Linear(4, 3)
    load_into_model(model, str(path), device=Device("cpu"), engine=choose_engine(Device("cpu")))
    assert torch.equal(model.weight, expected["weight"]) and torch.equal(model.bias, expected["bias"])


def test_a_hostile_legacy_file_is_not_executed(tmp_path: Path, net_target: str) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "legacy.pt"
    torch.save({"model": {"fc.weight": torch.zeros(3, 4)}, "x": Hostile(marker)}, path,
               _use_new_zipfile_serialization=False)
    assert read_checkpoint(path).format is CheckpointFormat.TORCH_LEGACY
    for args in (["checkpoint", str(path)], ["audit", net_target, "--checkpoint", str(path), "--no-forward"]):
        code, out, err = run(*args)
        said = unwrapped(err)
        assert code == 2 and "PC306" in out and said.count("\n") == 1 and "builtins.exec" in said
    assert not marker.exists()


@pytest.mark.parametrize("extra", [{"code/__torch__.py": b""},
                                   {"code/__torch__.py": b"", "constants.pkl": pickle.dumps((), protocol=2)}])
def test_a_fake_torchscript_archive_still_gets_pc306(hostile: tuple[Path, Path], net_target: str,
                                                      extra: dict[str, bytes]) -> None:
    """A code/ folder (or even a constants.pkl) added to a hostile torch.save file hides nothing."""
    path, marker = hostile
    fake = _rewrite_zip(path, path.with_name("fake_ts.pt"), {}, extra)
    meta = read_checkpoint(fake)
    expected_format = CheckpointFormat.TORCHSCRIPT if "constants.pkl" in extra else CheckpointFormat.TORCH_ZIP
    assert meta.format is expected_format  # torch's own test: constants.pkl
    assert meta.unsafe_globals == ("builtins.exec",) and meta.needs_code_execution
    for args in (["checkpoint", str(fake)], ["audit", net_target, "--checkpoint", str(fake), "--no-forward"]):
        code, _, err = run(*args)
        assert code == 2 and "builtins.exec" in unwrapped(err)
    assert not marker.exists()


_LOADERS = [("torch", "load"), ("torch.serialization", "load"), ("torch.jit", "load"),
            ("torch.export", "load"), ("safetensors.torch", "load_file"), ("safetensors.torch", "load"),
            ("pickle", "load"), ("pickle", "loads")]


@pytest.mark.parametrize("fmt", ["zip", "legacy", "safetensors", "torchscript", "pt2", "module", "hostile"])
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")
def test_check_checkpoint_calls_no_loader_without_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        fmt: str) -> None:
    import importlib

    linear = torch.nn.Linear(4, 3)
    path = tmp_path / f"ckpt.{fmt}"
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(dict(linear.state_dict()), str(path))
    elif fmt == "torchscript":
        torch.jit.save(torch.jit.trace(linear, torch.randn(2, 4)), str(path))
    elif fmt == "pt2":
        _export(path)
    elif fmt == "module":
        torch.save(linear, path)
    elif fmt == "hostile":
        torch.save({"model": linear.state_dict(), "x": Hostile(tmp_path / "pwned")}, path)
    else:
        torch.save(dict(linear.state_dict()), path, _use_new_zipfile_serialization=fmt == "zip")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a loader was called")

    for module, name in _LOADERS:
        monkeypatch.setattr(importlib.import_module(module), name, refuse)
    result = check_checkpoint(str(path), model=torch.nn.Linear(4, 3), device="cpu")
    assert result.refused == (fmt in ("module", "hostile"))
    assert {f.code for f in result.report.findings} <= {"PC306"}
    assert not (tmp_path / "pwned").exists()
