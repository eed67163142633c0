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
from cli_runner import CliRunner
from conftest import unwrapped
from safetensors.torch import save_file

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


def _safetensors(tmp: Path, name: str, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path = tmp / f"{name}.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def _f32(shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


def _safetensors_gap(tmp: Path) -> Path:
    return _safetensors(tmp, "gap", {"a": _f32([1], 0, 4), "b": _f32([1], 8, 12)}, b"\0" * 12)


def _safetensors_trailing(tmp: Path) -> Path:
    return _safetensors(tmp, "trailing", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                        b"\0" * 8)


def _safetensors_overlap(tmp: Path) -> Path:
    return _safetensors(tmp, "overlap", {"a": _f32([2], 0, 8), "b": _f32([1], 4, 8)}, b"\0" * 8)


def _safetensors_metadata_list(tmp: Path) -> Path:
    return _safetensors(tmp, "metalist", {"__metadata__": [1, 2, 3], "a": _f32([1], 0, 4)}, b"\0" * 4)


def _safetensors_float_shape(tmp: Path) -> Path:
    return _safetensors(tmp, "floatshape", {"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}},
                        b"\0" * 4)


def _pt2_bad_dtype(tmp: Path) -> Path:
    good = tmp / "good.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),)), str(good))
    path = tmp / "dtype.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("model_weights_config.json"):
                config = json.loads(data)
                next(iter(config["config"].values()))["tensor_meta"]["dtype"] = "x"
                data = json.dumps(config).encode()
            dst.writestr(item, data)
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
    (_safetensors_gap, "leaves a gap or an overlap after 'a'"),
    (_safetensors_trailing, "covers 4 bytes of a 8-byte data section"),
    (_safetensors_overlap, "leaves a gap or an overlap after 'a'"),
    (_safetensors_metadata_list, "__metadata__ that is not an object of strings"),
    (_safetensors_float_shape, "not non-negative integers"),
    (_pt2_bad_dtype, "the unknown dtype 'x'"),
])
def test_bad_file_is_exit_2_and_one_line(tmp_path: Path, make: Callable[[Path], Path], expected: str) -> None:
    path = make(tmp_path)
    code, out, err = run("checkpoint", str(path))
    assert code == 2
    assert out == ""
    assert unwrapped(err).count("\n") == 1, err
    assert unwrapped(err).startswith("placecheck: error: ")
    assert expected in unwrapped(err)
    assert "Traceback" not in unwrapped(err)


@pytest.mark.parametrize("make", [_safetensors_gap, _safetensors_trailing, _safetensors_overlap,
                                  _safetensors_metadata_list, _safetensors_float_shape])
def test_the_safetensors_library_refuses_what_placecheck_refuses(tmp_path: Path,
                                                                 make: Callable[[Path], Path]) -> None:
    from safetensors.torch import load_file

    with pytest.raises(Exception):  # noqa: B017 - the library's own error types differ per check
        load_file(str(make(tmp_path)))


@pytest.mark.parametrize(("make", "expected"), [
    (_random_bytes, "is not a checkpoint"),
    (_empty, "is empty (0 bytes)"),
    (_truncated_zip, "truncated or corrupt zip archive"),
    (_directory, "is a directory"),
    (_missing, "no such file"),
    (_zip_not_checkpoint, "not a PyTorch checkpoint"),
    (_safetensors_metadata_list, "__metadata__"),
    (_pt2_bad_dtype, "the unknown dtype 'x'"),
])
def test_bad_file_under_audit_is_exit_2_too(tmp_path: Path, make: Callable[[Path], Path],
                                            expected: str) -> None:
    code, out, err = run("audit", "placecheck.examples.clean:CleanNet", "--checkpoint", str(make(tmp_path)),
                         "--no-forward")
    assert code == 2 and out == ""
    assert unwrapped(err).count("\n") == 1, err
    assert expected in unwrapped(err) and "unexpected" not in unwrapped(err)


def test_a_corrupt_pt2_is_one_line_under_audit(tmp_path: Path) -> None:
    """A weight file shorter than its config says: torch's loader would log; placecheck says one line."""
    good = tmp_path / "good.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),)), str(good))
    path = tmp_path / "short.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(item, data[:5] if item.filename.endswith("weights/weight_0") else data)
    model = tmp_path / "lin.py"
    model.write_text("import torch.nn as nn\nNet = lambda: nn.Linear(4, 3)\n", encoding="utf-8")
    code, out, err = run("audit", f"{model}:Net", "--checkpoint", str(path), "--no-forward")
    assert code == 2 and out == ""
    assert unwrapped(err).count("\n") == 1, err
    assert "weight_0 has 5 bytes but 'weight' (float32[3, 4]) needs 48" in unwrapped(err)


def test_missing_key_lists_the_keys_that_exist(tmp_path: Path) -> None:
    path = tmp_path / "train.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "epoch": 3, "optimizer": {"state": {}}}, path)
    code, _, err = run("checkpoint", str(path), "--key", "ema")
    assert code == 2
    assert unwrapped(err) == ("placecheck: error: --key 'ema': 'ema' not found; keys there: epoch, model, "
                              "optimizer\n")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    code, _, err = run("checkpoint", str(_empty(tmp_path)), "--debug")
    assert code == 2 and "Traceback" in unwrapped(err)


def _digest(path: Path) -> tuple[int, str]:
    return path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("trust", [[], ["--trust"]])
@pytest.mark.parametrize("fmt", ["zip", "legacy", "safetensors", "torchscript", "pt2", "module"])
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")
def test_the_file_is_never_modified(tmp_path: Path, fmt: str, trust: list[str]) -> None:
    model_file = tmp_path / "net.py"
    model_file.write_text("import torch.nn as nn\nNet = lambda: nn.Linear(4, 3)\n", encoding="utf-8")
    linear = torch.nn.Linear(4, 3)
    state = dict(linear.state_dict())
    path = tmp_path / f"ckpt.{fmt}"
    if fmt == "safetensors":
        save_file(state, str(path))
    elif fmt == "torchscript":
        torch.jit.save(torch.jit.trace(linear, torch.randn(2, 4)), str(path))
    elif fmt == "pt2":
        torch.export.save(torch.export.export(linear, (torch.randn(2, 4),)), str(path))
    elif fmt == "module":  # a whole pickled nn.Module: refused (2) without --trust, loaded with it
        torch.save(linear, path)
    else:
        torch.save(state, path, _use_new_zipfile_serialization=fmt == "zip")
    before = _digest(path)
    expected = (2 if fmt == "module" and not trust else 1 if fmt == "module" else 0)
    assert run("checkpoint", str(path), "--model", f"{model_file}:Net", *trust)[0] == expected
    assert run("audit", f"{model_file}:Net", "--checkpoint", str(path), *trust)[0] == expected
    assert _digest(path) == before
