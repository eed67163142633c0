"""placecheck.engines.compat: the one module that names torch's private API, and what it decides from
evidence."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import placecheck
from placecheck.basics.errors import UsageError
from placecheck.engines import compat
from placecheck.engines.classify import is_engine_mismatch

pytestmark = pytest.mark.compat

PACKAGE = Path(placecheck.__file__).resolve().parent


def _private(dotted: str) -> bool:
    """A dotted torch name with a private part (``torch._C``, ``torch.utils._pytree``); dunders are not."""
    parts = dotted.split(".")
    return parts[0] == "torch" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _attribute_chain(node: ast.AST) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def private_torch_names(source: str) -> list[str]:
    """The private torch names ``source`` imports or reaches as ``torch._x`` attributes."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _private(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [f"{node.module}.{a.name}" for a in node.names if _private(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            chain = _attribute_chain(node)
            if _private(chain):
                found.append(chain)
    return found


def test_the_reader_sees_every_kind_of_private_name() -> None:
    # a reader that found nothing would let the test below pass vacuously
    source = ("import torch._dynamo\nfrom torch.utils._pytree import tree_map\nfrom torch import _C\n"
              "def f():\n    return torch._C._nn._parse_to(1)\n")
    found = private_torch_names(source)
    assert "torch._dynamo" in found and "torch.utils._pytree.tree_map" in found and "torch._C" in found
    assert any(name.startswith("torch._C._nn._parse_to") for name in found)
    assert private_torch_names("import torch\nx = torch.nn.Linear\ny = torch.Tensor.__add__\n") == []


def test_only_compat_names_torchs_private_api() -> None:
    offenders = {str(path.relative_to(PACKAGE.parent)): names for path in sorted(PACKAGE.rglob("*.py"))
                 if path != PACKAGE / "engines" / "compat.py"
                 if (names := private_torch_names(path.read_text(encoding="utf-8")))}
    assert offenders == {}
    # it does name them
    assert private_torch_names((PACKAGE / "engines" / "compat.py").read_text(encoding="utf-8"))


def _fake_mismatch() -> RuntimeError:
    mode = compat.FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        cpu = torch.empty(2, 3)
        meta_device = torch.empty(2, 3, device="meta")
        try:
            cpu + meta_device
        except RuntimeError as exc:
            return exc
    raise AssertionError("fake tensors accepted tensors on two devices")


def test_a_fake_tensor_device_mismatch_is_recognised_on_every_torch() -> None:
    exc = _fake_mismatch()
    assert compat.is_fake_device_mismatch(exc)
    assert is_engine_mismatch(exc)
    wrapped = RuntimeError("while running the model")
    wrapped.__cause__ = exc
    assert is_engine_mismatch(wrapped)


def test_the_same_words_without_the_evidence_are_not_a_mismatch() -> None:
    # neither fake tensors' old text nor their new one makes an error a device mismatch: only the check does
    texts = ["Unhandled FakeTensor Device Propagation for aten.add.Tensor, found two different devices cpu, "
             "cuda:0", "Expected all tensors to be on the same device, but found at least two devices"]
    for text in texts:
        try:
            raise RuntimeError(text)
        except RuntimeError as exc:
            assert not compat.is_fake_device_mismatch(exc)
    with compat.FakeTensorMode(allow_non_fake_inputs=True):
        try:
            torch.empty(2, 3) @ torch.empty(2, 3)  # a shape error raised under fake tensors
        except RuntimeError as exc:
            assert not compat.is_fake_device_mismatch(exc)
        else:
            raise AssertionError("the shape error was not raised")


def test_moved_parameters_are_fake_and_on_the_target_on_every_torch() -> None:
    mode = compat.FakeTensorMode(allow_non_fake_inputs=True)
    model = torch.nn.Linear(2, 2)
    with compat.fake_moves_replace_parameters():
        model._apply(mode.from_tensor)
    assert all(isinstance(p, compat.FakeTensor) and p.device.type == "cpu" for p in model.parameters())


def test_release_numbers() -> None:
    assert compat._release("2.11.0+cu130") == (2, 11, 0)
    assert compat._release("2.15.0a0+git1234") == (2, 15, 0)
    assert compat._release("2.6") == (2, 6)
    assert compat.torch_at_least(compat.FLOOR)


def test_a_feature_newer_than_this_torch_is_refused_in_one_line() -> None:
    compat.require_torch(compat.FLOOR, "--wrap fsdp")
    expected = rf"^--wrap fsdp needs torch>=99\.0; this is {re.escape(torch.__version__)}$"
    with pytest.raises(UsageError, match=expected):
        compat.require_torch("99.0", "--wrap fsdp")


def test_version_names_placecheck_and_torch() -> None:
    out = subprocess.run([sys.executable, "-m", "placecheck", "--version"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == [f"placecheck {placecheck.__version__}", f"torch {torch.__version__}"]


def test_every_report_names_the_torch_in_use() -> None:
    report = placecheck.audit(torch.nn.Linear(2, 2), device="cuda", engine="fake", inputs=["float32[1,2]"])
    assert f"torch: {torch.__version__}" in report.notes
