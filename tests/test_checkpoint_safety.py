"""PC306: a checkpoint whose pickle would run code is never loaded without --trust.

The hostile checkpoint below creates a marker file when unpickled by
``torch.load(weights_only=False)``. The tests prove the marker does not
appear under ``placecheck checkpoint`` or ``placecheck audit --checkpoint``
without ``--trust``, and that it does with ``--trust`` (all in ``tmp_path``).
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from placecheck.checkpoint import read_checkpoint
from placecheck.checkpoint.safety import unsafe_globals
from placecheck.cli import app

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
    assert err.count("\n") == 1 and "--trust" in err


def test_hostile_checkpoint_is_not_executed_by_audit_without_trust(
        hostile: tuple[Path, Path], net_target: str) -> None:
    path, marker = hostile
    code, _, err = run("audit", net_target, "--checkpoint", str(path))
    assert code == 2
    assert not marker.exists()
    assert err.count("\n") == 1
    assert "builtins.exec" in err and "--trust" in err


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
