"""What PyTorch itself raises on a GPU when an op mixes devices, per op family: the text a PC201 finding
quotes, so that a user who searches a GPU job's log for it finds it (issue 42 item 9).

Only the text shown to the user comes from here. Whether an op mixes devices is decided from the devices
of its arguments (:func:`placecheck.engines.classify.mixes_devices`), never from a message.

Each family's text is PyTorch's own first line, with the devices filled in where the op's family
decides them and ``…`` where only the op's ATen arguments do (which argument ATen names first, the
wrapper's name): a quote is a pattern every first line of the family matches, modulo device indices
(:func:`matches`). ``tests/test_gpu_errors.py`` holds each quote to the first line a GPU gave for every
row of ``tests/data/mix-table.json`` that raised there.

The families, with PyTorch's first line for a CPU tensor meeting CUDA ones (as the GPU gave it):

- recurrent (``torch.lstm``, ``torch.gru``, ``torch.rnn_tanh``, ``torch.rnn_relu``): "Input and hidden
  tensors are not at the same device, found input tensor at cuda:0 and hidden tensor at cpu"
  (``parameter`` for the input against a weight: ATen's ``RNN.cpp``, ``check_attributes``);
- convolution (``torch.conv1d`` ... ``torch.conv_transpose3d``, ``torch.convolution``), its weight or
  bias: "Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same"
  (``bias type``); a CPU input gets the generic text below;
- masked_fill (``Tensor.masked_fill(_)``, ``torch.masked_fill``): "expected self and mask to be on the
  same device, but got mask on cpu and self on cuda:0"; ``masked_fill_`` of a CPU self given a device
  value: "masked_fill_: Expected inputs to be on same device" (a CPU self given a device mask gets the
  first text on a GPU, which this quote does not tell apart: the arguments' devices are not all known
  here);
- take_along_dim: "Expected tensor to have cuda:0 Device, but got tensor with cpu Device (while
  checking arguments for torch.take_along_dim():)";
- multi_dot (``torch.linalg.multi_dot``, ``torch.chain_matmul``): "multi_dot(): all tensors must be on
  the same device but tensor 0 is on cuda:0 and tensor 1 on cpu";
- indexing a CPU tensor with device indices: "indices should be either on cpu or on the same device as
  the indexed tensor (cpu)"; ``index_put_``'s values: "expected device cuda:0 but got device cpu for
  value tensor" (``accumulate=True``) or the generic text; ``lerp``'s ``end``: the generic text, or for
  a 0-dim CPU one "iter.device(arg).is_cuda() INTERNAL ASSERT FAILED"; a ``_foreach_*`` op: the generic
  text, or "scalar tensor is expected to be on cpu but is on cuda:0" (CPU lists, a device scalar);
- every other op: "Expected all tensors to be on the same device, but found at least two devices,
  cuda:0 and cpu!" (an elementwise op's TensorIterator) or "..., but got mat2 is on cpu, different from
  other tensors on cuda:0 (when checking argument in method wrapper_CUDA_mm)" (an op's own check).

Torch-free: a finding's rule (:mod:`placecheck.findings.rules`) calls :func:`gpu_error` with the op's
name and devices as strings.
"""

from __future__ import annotations

import re

from placecheck.basics.values import Device

ANY = "…"
"""What a quote shows where only the op's ATen arguments decide the text; :func:`matches` takes any text."""

OR = "' or '"
"""Between two texts the op raises depending on what is not known here (a quote shows them as ``'A' or
'B'``); :func:`matches` takes either."""

SAME_DEVICE = "Expected all tensors to be on the same device"
"""Every op with no family of its own: the TensorIterator's text (elementwise ops: "..., but found at least
two devices, cuda:0 and cpu!") and the device check ATen generates for an op's arguments ("..., but got
mat2 is on cpu, different from other tensors on cuda:0 (when checking argument in method
wrapper_CUDA_mm)") both begin with it."""

_RECURRENT = frozenset({"torch.lstm", "torch.gru", "torch.rnn_tanh", "torch.rnn_relu"})
_CONVOLUTIONS = frozenset({f"torch.{name}" for name in (
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution",
    "_convolution", "conv_tbc")} | {f"F.{name}" for name in (
        "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")})
_MASKED_FILL = frozenset({"Tensor.masked_fill", "Tensor.masked_fill_", "torch.masked_fill"})
_TAKE_ALONG_DIM = frozenset({"torch.take_along_dim", "Tensor.take_along_dim"})
_MULTI_DOT = frozenset({"torch.linalg.multi_dot", "torch.linalg_multi_dot", "torch.chain_matmul"})
_LERP = frozenset({"torch.lerp", "Tensor.lerp", "Tensor.lerp_"})

_LEGACY_TYPES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                 "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
                 "bool": "Bool"}
"""dtype -> the name of its legacy tensor type (``torch.FloatTensor``), which convolutions quote."""


def _legacy_type(device: str, dtype: str) -> str:
    """``torch.cuda.FloatTensor`` for a float32 tensor on ``cuda:0``; ``…`` where the dtype is unknown."""
    name = _LEGACY_TYPES.get(dtype.removeprefix("torch."))
    if name is None:
        return ANY
    kind = Device.of(device).type
    return f"torch.{name}Tensor" if kind == "cpu" else f"torch.{kind}.{name}Tensor"


def gpu_error(op: str, device: str, other: str, *, argument: int | None = None, dtype: str = "") -> str:
    """PyTorch's first line when ``op`` (a finding's name for it: ``torch.lstm``, ``Tensor.add``) gets a
    tensor on ``device`` beside tensors on ``other``: the tensor at position ``argument`` of the call
    (None: unknown), of ``dtype`` (``float32``; "": unknown). ``…`` stands where the text depends on what
    is not known here."""
    if op in _RECURRENT:
        if argument == 1:  # the hidden state (h0, or (h0, c0))
            return (f"Input and hidden tensors are not at the same device, found input tensor at {other} and "
                    f"hidden tensor at {device}")
        if argument == 0:  # the input: ATen checks the parameters first
            return (f"Input and parameter tensors are not at the same device, found input tensor at {device} "
                    f"and parameter tensor at {other}")
        if argument == 2:  # a weight
            return (f"Input and parameter tensors are not at the same device, found input tensor at {other} "
                    f"and parameter tensor at {device}")
        return f"Input and {ANY} tensors are not at the same device, found input tensor at {ANY}"
    if op in _CONVOLUTIONS:
        if argument in (1, 2):  # the weight or the bias, beside the input
            what = "weight" if argument == 1 else "bias"
            return (f"Input type ({_legacy_type(other, dtype)}) and {what} type "
                    f"({_legacy_type(device, dtype)}) should be the same")
        if argument == 0:  # a CPU input meets the device weight in ATen's own device check
            return SAME_DEVICE
        return f"Input type ({ANY}) and {ANY} type ({ANY}) should be the same"
    if op == "Tensor.masked_fill_" and argument == 0:  # a CPU self: given a device value, or a device mask
        return ("masked_fill_: Expected inputs to be on same device" + OR + "expected self and mask to be on "
                f"the same device, but got mask on {other} and self on {device}")
    if op in _MASKED_FILL and argument in (0, 1):
        mask, self = (device, other) if argument == 1 else (other, device)
        return f"expected self and mask to be on the same device, but got mask on {mask} and self on {self}"
    if op in _TAKE_ALONG_DIM:
        expected, got = (device, other) if argument == 0 else (other, device)
        if argument is None:
            expected, got = ANY, ANY
        return (f"Expected tensor to have {expected} Device, but got tensor with {got} Device (while "
                "checking arguments for torch.take_along_dim():)")
    if op in _MULTI_DOT:
        return f"multi_dot(): all tensors must be on the same device but tensor 0 is on {ANY}"
    if op == "Tensor.__getitem__" and argument == 0:  # a CPU tensor indexed with device indices
        return f"indices should be either on cpu or on the same device as the indexed tensor ({device})"
    if op in ("Tensor.index_put_", "Tensor.index_put", "torch.index_put") and argument == 2:
        # the values: accumulate=True checks them itself; otherwise the TensorIterator does
        return f"expected device {other} but got device {device} for value tensor" + OR + SAME_DEVICE
    if op in _LERP and argument == 1:  # a 0-dim CPU end reaches the CUDA kernel, which asserts
        return SAME_DEVICE + OR + "iter.device(arg).is_cuda() INTERNAL ASSERT FAILED"
    if op.startswith("torch._foreach_"):  # lists on the CPU given a device scalar tensor
        return SAME_DEVICE + OR + f"scalar tensor is expected to be on cpu but is on {other}"
    return SAME_DEVICE


_INDEX = re.compile(r"\b(cuda|xpu|mps|hpu):\d+")


def _normal(text: str) -> str:
    """``text`` with every device index dropped (``cuda:1`` -> ``cuda:N``): a quote names the devices of the
    audit, a GPU's log those of its job."""
    return _INDEX.sub(r"\1:N", text)


def matches(quote: str, first_line: str) -> bool:
    """True when a GPU's ``first_line`` is what ``quote`` says, modulo device indices: the text of one of
    its alternatives (:data:`OR`) between its ``…`` appears in that order, the first part at the start (a
    quote may stop before the end of the line)."""
    return any(_matches_one(alternative, first_line) for alternative in quote.split(OR))


def _matches_one(quote: str, first_line: str) -> bool:
    parts = _normal(quote).split(ANY)
    line = _normal(first_line)
    if not line.startswith(parts[0]):
        return False
    at = len(parts[0])
    for part in parts[1:]:
        found = line.find(part, at)
        if found < 0:
            return False
        at = found + len(part)
    return True
