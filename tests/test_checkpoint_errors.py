"""Bad input to ``placecheck checkpoint``: exit 2 and one line, and the file is never modified."""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from placecheck.cli import app


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _missing(tmp: Path) -> Path:
    return tmp / "nope.pt"


def _directory(tmp: Path) -> Path:
    (tmp / "ckpts").mkdir()
    return tmp / "ckpts"


def _empty(tmp: Path) -> Path:
    (tmp / "empty.pt").write_bytes(b"")
    return tmp / "empty.pt"


def _truncated_zip(tmp: Path) -> Path:
    full = tmp / "full.pt"
    torch.save({"w": torch.zeros(1000)}, full)
    data = full.read_bytes()
    (tmp / "cut.pt").write_bytes(data[: len(data) // 2])
    return tmp / "cut.pt"


def _random_bytes(tmp: Path) -> Path:
    (tmp / "noise.pt").write_bytes(bytes(range(256)) * 8)
    return tmp / "noise.pt"


def _zip_not_checkpoint(tmp: Path) -> Path:
    with zipfile.ZipFile(tmp / "docs.zip", "w") as zf:
        zf.writestr("readme.txt", "hello")
    return tmp / "docs.zip"


def _safetensors_length_lies(tmp: Path) -> Path:
    path = tmp / "len.safetensors"
    save_file({"w": torch.zeros(4)}, str(path))
    data = bytearray(path.read_bytes())
    data[:8] = struct.pack("<Q", 10**6)
    path.write_bytes(bytes(data))
    return path


def _safetensors_offsets_lie(tmp: Path) -> Path:
    header = json.dumps({"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode()
    path = tmp / "offsets.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    return path


def _safetensors_shape_lies(tmp: Path) -> Path:
    header = json.dumps({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 4]}}).encode()
    path = tmp / "shape.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    return path


def _pickle_not_torch(tmp: Path) -> Path:
    import pickle

    (tmp / "plain.pkl").write_bytes(pickle.dumps({"a": 1}, protocol=2))
    return tmp / "plain.pkl"


@pytest.mark.parametrize(("make", "expected"), [
    (_missing, "no such file"),
    (_directory, "is a directory"),
    (_empty, "is empty (0 bytes)"),
    (_truncated_zip, "truncated or corrupt zip archive"),
    (_random_bytes, "is not a checkpoint placecheck can read"),
    (_zip_not_checkpoint, "is a zip archive but not a PyTorch checkpoint"),
    (_safetensors_length_lies, "safetensors header claims 1000000 bytes"),
    (_safetensors_offsets_lie, "ends at byte 4000 but the data section has 16 bytes"),
    (_safetensors_shape_lies, "spans 4 bytes"),
    (_pickle_not_torch, "not a torch.save file"),
])
def test_bad_file_is_exit_2_and_one_line(tmp_path: Path, make: Callable[[Path], Path], expected: str) -> None:
    path = make(tmp_path)
    code, out, err = run("checkpoint", str(path))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("placecheck: error: ")
    assert expected in err
    assert "Traceback" not in err


def test_bad_file_under_audit_is_exit_2_too(tmp_path: Path) -> None:
    code, _, err = run("audit", "placecheck.examples.clean:CleanNet", "--checkpoint",
                       str(_random_bytes(tmp_path)))
    assert code == 2 and err.count("\n") == 1 and "is not a checkpoint" in err


def test_missing_key_lists_the_keys_that_exist(tmp_path: Path) -> None:
    path = tmp_path / "train.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "epoch": 3, "optimizer": {"state": {}}}, path)
    code, _, err = run("checkpoint", str(path), "--key", "ema")
    assert code == 2
    assert err == "placecheck: error: --key 'ema': 'ema' not found; keys there: epoch, model, optimizer\n"


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    code, _, err = run("checkpoint", str(_empty(tmp_path)), "--debug")
    assert code == 2 and "Traceback" in err


def _digest(path: Path) -> tuple[int, str]:
    return path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("fmt", ["zip", "legacy", "safetensors"])
def test_the_file_is_never_modified(tmp_path: Path, fmt: str) -> None:
    model_file = tmp_path / "net.py"
    model_file.write_text("import torch.nn as nn\nNet = lambda: nn.Linear(4, 3)\n", encoding="utf-8")
    state = {"weight": torch.zeros(3, 4), "bias": torch.zeros(3)}
    path = tmp_path / f"ckpt.{fmt}"
    if fmt == "safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path, _use_new_zipfile_serialization=fmt == "zip")
    before = _digest(path)
    assert run("checkpoint", str(path), "--model", f"{model_file}:Net")[0] == 0
    assert run("audit", f"{model_file}:Net", "--checkpoint", str(path))[0] == 0
    assert _digest(path) == before
