"""PyTorch's own text per op family (placecheck.basics.gpu_errors, issue 42 item 9), held to the first
lines the GPU gave in tests/data/mix-table.json; the replay of every row (tests/test_mix_table.py) holds
each PC201's quote to its row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placecheck.basics.gpu_errors import ANY, OR, SAME_DEVICE, gpu_error, matches
from placecheck.findings import rules

TABLE = Path(__file__).resolve().parent / "data" / "mix-table.json"


def _gpu_says(case: str, variant: str) -> str:
    rows = json.loads(TABLE.read_text(encoding="utf-8"))["rows"]
    row = next(r for r in rows if r["case"] == case and r["variant"] == variant)
    assert row["outcome"] == "raises" and row["verified_on"]
    return str(row["message"])


@pytest.mark.parametrize("case, variant, op, argument, device, other", [
    ("grown layer lstm h0", "cpu: w", "torch.lstm", 1, "cpu", "cuda:0"),
    ("grown layer gru h0", "cpu: w", "torch.gru", 1, "cpu", "cuda:0"),
    ("conv2d weight", "cpu: w", "torch.conv2d", 1, "cpu", "cuda:0"),
    ("conv1d bias", "cpu: b", "torch.conv1d", 2, "cpu", "cuda:0"),
    ("masked_fill mask", "cpu: m", "Tensor.masked_fill", 1, "cpu", "cuda:0"),
    ("take_along_dim", "cpu: i", "torch.take_along_dim", 1, "cpu", "cuda:0"),
    ("grown matmul chain_matmul", "cpu: y", "torch.linalg_multi_dot", 1, "cpu", "cuda:0"),
    ("grown index getitem long", "cpu: x", "Tensor.__getitem__", 0, "cpu", "cuda:0"),
    ("grown index index_put accumulate", "cpu: v", "Tensor.index_put_", 2, "cpu", "cuda:0"),
    ("index_put cpu index", "cpu: v", "Tensor.index_put_", 2, "cpu", "cuda:0"),
    ("grown in-place lerp_ 0-dim other", "cpu: y", "Tensor.lerp_", 1, "cpu", "cuda:0"),
    ("lerp_ cpu shadow", "cpu: p", "Tensor.lerp_", 1, "cpu", "cuda:0"),
    ("grown foreach mul_ scalar tensor", "cpu: x, y, u, v", "torch._foreach_mul_", 0, "cpu", "cuda:0"),
    ("grown foreach mul_ scalar tensor", "cpu: y, v", "torch._foreach_mul_", 0, "cpu", "cuda:0"),
    ("grown in-place masked_fill_ into 0-dim self", "cpu: x", "Tensor.masked_fill_", 0, "cpu", "cuda:0"),
    ("add", "cpu: y", "Tensor.add", 1, "cpu", "cuda:0"),
    ("linear", "cpu: w", "F.linear", 1, "cpu", "cuda:0"),
])
def test_each_familys_quote_is_the_gpus_first_line(case: str, variant: str, op: str, argument: int,
                                                   device: str, other: str) -> None:
    quote = gpu_error(op, device, other, argument=argument, dtype="float32")
    assert matches(quote, _gpu_says(case, variant)), (quote, _gpu_says(case, variant))


def test_the_lstm_quote_is_pytorchs_whole_line_with_the_audits_devices() -> None:
    quote = gpu_error("torch.lstm", "cpu", "cuda:1", argument=1)
    assert quote == ("Input and hidden tensors are not at the same device, found input tensor at cuda:1 and "
                     "hidden tensor at cpu")
    assert matches(quote, _gpu_says("grown layer lstm h0", "cpu: b"))  # cuda:0 there: indices do not count
    assert not matches(gpu_error("torch.lstm", "cpu", "cuda:0", argument=0), _gpu_says("grown layer lstm h0",
                                                                                       "cpu: b"))


def test_matches_is_a_pattern_not_a_substring() -> None:
    line = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    assert matches(SAME_DEVICE, line)
    assert matches(f"Expected all tensors {ANY} devices, cuda:3 and cpu!", line)
    assert not matches(f"Expected all tensors {ANY} devices, cpu and cuda:0!", line)
    assert not matches("all tensors to be on the same device", line)  # from the start only
    assert not matches(SAME_DEVICE, _gpu_says("conv2d weight", "cpu: w"))
    assert matches(f"no such text{OR}{SAME_DEVICE}", line) and not matches(f"no such text{OR}nor this", line)


def test_a_pc201_message_quotes_its_ops_family() -> None:
    """The rule's message quotes the family's text, and the generic text stays for every other op."""
    message, _ = rules.device_mismatch("torch.gru", ["cpu", "cuda:0"], "cpu", "float32[1, 1, 4]", "",
                                       argument=1, dtype="float32")
    assert message.endswith("on a GPU this raises 'Input and hidden tensors are not at the same device, "
                            "found input tensor at cuda:0 and hidden tensor at cpu'")
    message, _ = rules.device_mismatch("Tensor.add", ["cpu", "cuda:0"], "cpu", "float32[4]", "")
    assert message.endswith(f"on a GPU this raises '{SAME_DEVICE}'")
    script = rules.script_device_mismatch("torch.conv2d", "cuda:0", "cpu", "a cpu tensor (3, 4, 3, 3)",
                                          where="w", line="train.py:9", dtype="float32", shape=(3, 4, 3, 3),
                                          nbytes=432, origin="", details=())
    assert f"raises 'Input type ({ANY}) and {ANY} type ({ANY}) should be the same'" in script.message
    assert (script.code, script.source, script.device, script.expected) == \
        ("PC201", "train.py:9", "cpu", "cuda:0")


# First lines from a device check of this branch on an NVIDIA H200 (torch 2.11.0+cu130, 2026-11-27) for
# the placements the truth table has no row for: (op, argument, offending device, the others' device,
# dtype) -> what the GPU raised.
H200_CHECKED = [
    ("torch.lstm", 0, "cpu", "cuda:0", "float32",
     "Input and parameter tensors are not at the same device, found input tensor at cpu and parameter tensor "
     "at cuda:0"),
    ("torch.gru", 2, "cpu", "cuda:0", "float32",
     "Input and parameter tensors are not at the same device, found input tensor at cuda:0 and parameter "
     "tensor at cpu"),
    ("torch.conv2d", 0, "cpu", "cuda:0", "float32",
     "Expected all tensors to be on the same device, but got weight is on cuda:0, different from other "
     "tensors on cpu (when checking argument in method wrapper_CUDA___slow_conv2d_forward)"),
    ("torch.conv2d", 2, "cpu", "cuda:0", "float32",
     "Input type (torch.cuda.FloatTensor) and bias type (torch.FloatTensor) should be the same"),
    ("torch.conv2d", 1, "cpu", "cuda:0", "float16",
     "Input type (torch.cuda.HalfTensor) and weight type (torch.HalfTensor) should be the same"),
    ("Tensor.masked_fill", 0, "cpu", "cuda:0", "float32",
     "expected self and mask to be on the same device, but got mask on cuda:0 and self on cpu"),
    ("Tensor.masked_fill_", 1, "cpu", "cuda:0", "float32",
     "expected self and mask to be on the same device, but got mask on cpu and self on cuda:0"),
    ("torch.take_along_dim", 0, "cpu", "cuda:0", "float32",
     "Expected tensor to have cpu Device, but got tensor with cuda:0 Device (while checking arguments for "
     "torch.take_along_dim():)"),
]


@pytest.mark.parametrize("op, argument, device, other, dtype, gpu", H200_CHECKED,
                         ids=[f"{c[0]}-{c[1]}" for c in H200_CHECKED])
def test_the_quotes_checked_on_the_h200_beyond_the_table(op: str, argument: int, device: str, other: str,
                                                         dtype: str, gpu: str) -> None:
    assert matches(gpu_error(op, device, other, argument=argument, dtype=dtype), gpu)
