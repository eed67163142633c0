"""Results the fake engine makes from its inputs' metadata where torch's own fake-tensor path is slow.

Fake tensors run an op through its meta kernel; for some ops that kernel is a
Python decomposition executed op by op on fake tensors, and each call of a new
shape misses the fake mode's cache. Eval-mode batch norm is the one that
matters: about 4 ms per call, most of a DenseNet's forward (201 batch norms of
as many shapes), and a large part of every convnet's. A shortcut here gives
exactly the tensors torch's path gives (shape, strides, dtype, device:
``tests/test_shortcuts.py`` compares them over a grid of ranks, memory
formats and dtypes) and is taken only where that is known: any other call, a
mixed-device one included, returns None and takes torch's path, which raises
its device mismatch as before. The data-dependent mode
(:mod:`placecheck.engines.datadep`), which sees every op first, asks :func:`shortcut`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

aten = torch.ops.aten


def fake_tensor(fake_mode: Any, shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """A fake tensor of ``fake_mode`` with this shape, strides and dtype, on ``device``, with no data."""
    from placecheck.engines.compat import unset_fake_temporarily

    with unset_fake_temporarily():
        meta = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device="meta")
    fake: torch.Tensor = fake_mode.fake_tensor_converter.from_meta_and_device(fake_mode, meta, device)
    return fake


def _dense(t: torch.Tensor) -> bool:
    """Contiguous in one of the memory formats: an elementwise result then has ``t``'s own strides."""
    return (t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))
            or (t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d)))


def _eval_batch_norm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``native_batch_norm``, ``_native_batch_norm_legit_no_training`` and ``cudnn_batch_norm`` in eval
    mode (running statistics given, not updated), as torch's decompositions give them on a GPU.

    The output is shaped and laid out as the input, in its dtype. ``save_mean`` and ``save_invstd``
    are the running statistics and their inverse square root, one per channel, in the computation
    dtype (float32 for half precision); cudnn's variant gives empty ones and an empty reserve.
    """
    from placecheck.engines.compat import FakeTensor

    if func is aten._native_batch_norm_legit_no_training.default:
        if kwargs or len(args) != 7:
            return None
    elif kwargs or len(args) != 8 or args[5] is not False:
        return None  # training: the running statistics are written, which torch's path does
    x, weight, bias, mean, var = args[:5]
    if func is aten.cudnn_batch_norm.default and weight is None:
        return None
    if not isinstance(x, FakeTensor) or x.device.type == "cpu" or x.dim() < 2 or not _dense(x):
        return None
    if not x.is_floating_point() or mean is None or var is None:
        return None
    stats = [t for t in (weight, bias, mean, var) if t is not None]
    channels = x.shape[1]
    if any(not isinstance(t, FakeTensor) or t.device != x.device or t.dim() != 1 or t.shape[0] != channels
           or not t.is_floating_point() for t in stats):
        return None  # a mixed-device call (torch's path raises the mismatch) or anything unusual
    mode, device = x.fake_mode, x.device
    out = fake_tensor(mode, x.shape, x.stride(), x.dtype, device)
    if func is aten.cudnn_batch_norm.default:
        empty_stats = [fake_tensor(mode, (0,), (1,), weight.dtype, device) for _ in range(2)]
        return (out, *empty_stats, fake_tensor(mode, (0,), (1,), torch.uint8, device))
    computation = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    return (out, fake_tensor(mode, (channels,), (1,), computation, device),
            fake_tensor(mode, (channels,), (1,), computation, device))


_BATCH_NORMS = frozenset({aten.native_batch_norm.default, aten._native_batch_norm_legit_no_training.default,
                          aten.cudnn_batch_norm.default})


def shortcut(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The result of ``func(*args, **kwargs)`` made from metadata, or None where torch's path must run."""
    return _eval_batch_norm(func, args, kwargs) if func in _BATCH_NORMS else None
