"""The one table of host syncs: every call that makes the host wait for the device.

What ``torch.cuda.set_sync_debug_mode("warn")`` reports on a real GPU
(PLACEMENT.md lists it, tests/test_host_syncs.py checks each entry on both
engines). ``audit``'s tracer (:mod:`placecheck.checks.trace`) and ``placecheck run``'s
recorder (:mod:`placecheck.run.recorder`) both look calls up here: one table,
so a sync one of them reports the other reports too.

Each entry maps a torch function to its name as a finding says it (``.item()``,
``boolean-mask indexing``) and a probe that returns the device tensor the call
waits on, or None when this call does not sync (``torch.where`` with three
arguments, ``x[mask]`` with a CPU mask, ``.to()`` to another device).

Not ``.numpy()``: on a CUDA tensor it raises TypeError (the crash a GPU gives,
reported as PC207); ``.cpu().numpy()`` syncs at ``.cpu()``.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import torch

from placecheck.engines import classify
from placecheck.engines.compat import foreach_copy

SyncProbe = Callable[[tuple[Any, ...], dict[str, Any]], "torch.Tensor | None"]


def on_device(value: Any) -> torch.Tensor | None:
    """``value`` when it is a tensor on an accelerator (not the CPU, not meta), else None."""
    if isinstance(value, torch.Tensor) and value.device.type not in ("cpu", "meta"):
        return value
    return None


def _subject(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    return on_device(args[0]) if args else None


def _any_argument(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    return next((t for _, t in classify.tensor_arguments(args, kwargs) if on_device(t) is not None), None)


def _device_masks(self: torch.Tensor, index: Any) -> list[torch.Tensor]:
    """The boolean (or uint8) masks on ``self``'s device among the tensor indices of ``index``."""
    return [t for _, t in classify.tensor_arguments((index,), {})
            if t.dtype in (torch.bool, torch.uint8) and on_device(t) is not None and t.device == self.device]


def _boolean_mask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The boolean mask on the device a read ``x[mask]`` selects with: finding the selected elements is
    a ``nonzero`` of it whose size the host must read."""
    if len(args) < 2 or on_device(args[0]) is None:
        return None
    masks = _device_masks(args[0], args[1])
    return masks[0] if masks else None  # the host waits for the mask's nonzero


def _tensor_indices(index: Any) -> list[Any]:
    """The tensor (and list) indices of a ``__setitem__`` index or an ``index_put_`` indices tuple:
    the indices ATen's advanced indexing receives (ints, slices, None and ``...`` are applied before)."""
    items = index if isinstance(index, tuple) else (index,)
    return [i for i in items if isinstance(i, torch.Tensor | list)]


def _device_index_into_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """A write into a CPU tensor through indices on a device (``x_cpu[mask_cuda] = 0.0``,
    ``x_cpu.index_put_((i_cuda,), v)``): ATen copies the indices to the host first, and the host waits for
    them (the H200's rows ``grown index setitem bool scalar`` / ``cpu: x`` and its siblings)."""
    if len(args) < 2 or not isinstance(args[0], torch.Tensor) or args[0].device.type != "cpu":
        return None
    return next((t for _, t in classify.tensor_arguments((args[1],), {}) if on_device(t) is not None), None)


def _boolean_mask_write(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The boolean mask on the device a write ``x[mask] = v`` (``x.index_put_((mask,), v)``) selects with,
    when the write makes the host wait.

    ATen's ``_index_put_impl_`` (aten/src/ATen/native/TensorAdvancedIndexing.cpp) first asks
    ``canDispatchToMaskedFill``: without ``accumulate``, a value of one element on the CPU (a Python
    number: ``Tensor.__setitem__`` makes it a CPU scalar for a CUDA tensor) and a single index that is
    a bool/uint8 mask on the tensor's device run as ``masked_fill_(mask, value.item())``: no sync (the
    value is read on the host, where it is). Otherwise the mask goes through ``nonzero`` (advanced
    indexing's ``expandTensors``), and the host waits for it."""
    if len(args) < 2 or on_device(args[0]) is None:
        return None
    self = typing.cast(torch.Tensor, args[0])
    masks = _device_masks(self, args[1])
    if not masks:
        return None
    value = args[2] if len(args) > 2 else kwargs.get("values", kwargs.get("value"))
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    one_host_value = isinstance(value, int | float | bool | complex) or (
        isinstance(value, torch.Tensor) and value.numel() == 1 and value.device.type == "cpu")
    if not accumulate and one_host_value and len(_tensor_indices(args[1])) == 1:
        return None  # masked_fill_: the minGPT/top-k idiom logits[logits < v[:, [-1]]] = -inf
    return masks[0]  # the host waits for the mask's nonzero


def _repeats_on_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``repeat_interleave`` with a tensor of repeats and no ``output_size``: the host reads their sum."""
    if kwargs.get("output_size") is not None or len(args) > 3:
        return None
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if args else None)
    return on_device(repeats)


def _condition_only(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``torch.where(condition)`` with one argument is ``nonzero(as_tuple=True)``."""
    return on_device(args[0]) if len(args) == 1 and not kwargs else None


def _device_scalar_index(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """Indexing a device tensor with a 0-dim integer tensor on the device (``x[i]``): the host reads
    the index's value."""
    if len(args) < 2 or on_device(args[0]) is None:
        return None
    index = args[1]
    if isinstance(index, torch.Tensor) and index.dim() == 0 and not index.is_floating_point() \
            and index.dtype != torch.bool:
        return on_device(index)
    return None


def _device_scalar_value(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``masked_fill(mask, value)`` with a 0-dim device tensor ``value``: the kernel reads it on the host."""
    value = args[2] if len(args) > 2 else kwargs.get("value")
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        return on_device(value)
    return None


def _host_device_copy(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``dst.copy_(src)`` between the host and a device, blocking: the host waits for the copy."""
    if len(args) < 2 or not isinstance(args[1], torch.Tensor) or not isinstance(args[0], torch.Tensor):
        return None
    blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    if blocking and (args[0].device.type == "cpu") != (args[1].device.type == "cpu"):
        return on_device(args[0]) if on_device(args[0]) is not None else on_device(args[1])
    return None


def _foreach_host_device_copy(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``torch._foreach_copy_(dsts, srcs)`` with a pair between the host and a device, blocking: the host
    waits for that copy, as for ``copy_`` (the H200's row ``grown foreach copy_`` / ``cpu: v``)."""
    if len(args) < 2 or not isinstance(args[0], list | tuple) or not isinstance(args[1], list | tuple):
        return None
    blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    for dst, src in zip(args[0], args[1], strict=False):
        if blocking and isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor) \
                and (dst.device.type == "cpu") != (src.device.type == "cpu"):
            return on_device(dst) if on_device(dst) is not None else on_device(src)
    return None


def _fill_from_another_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``x.fill_(value)`` with a 0-dim ``value`` on a device and ``x`` elsewhere: ATen's ``Fill.cpp``
    reads it with ``value.item()`` (the H200's row ``grown in-place fill_ into 0-dim self`` / ``cpu: x``)."""
    value = args[1] if len(args) > 1 else kwargs.get("value")
    if not args or not isinstance(args[0], torch.Tensor) or not isinstance(value, torch.Tensor):
        return None
    return on_device(value) if value.device != args[0].device else None


def _tensor_std(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``torch.normal(mean, std)`` with a tensor ``std`` on a device: ATen checks on the host that it has
    no NaN and no negative entry ("normal expects all elements of std >= 0.0"; two syncs in the H200's
    rows ``grown generator normal tensors``)."""
    std = args[1] if len(args) > 1 else kwargs.get("std")
    return on_device(std)


def _variance_on_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``F.gaussian_nll_loss(input, target, var)``: ``torch.any(var < 0)`` decides a Python ``if`` in
    torch/nn/functional.py (a sync the tracer cannot see: nested in a traced call)."""
    var = args[2] if len(args) > 2 else kwargs.get("var")
    return on_device(var)


def _device_tensors_in_data(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``torch.tensor([t1, t2])`` of device tensors: each element is read on the host."""
    data = args[0] if args else kwargs.get("data")
    if isinstance(data, list | tuple):
        return next((t for _, t in classify.tensor_arguments((data,), {}) if on_device(t) is not None), None)
    return None


def _host_syncs() -> dict[Any, tuple[str, SyncProbe]]:
    T = torch.Tensor
    table: dict[Any, tuple[str, SyncProbe]] = {
        T.item: (".item()", _subject), T.tolist: (".tolist()", _subject), T.cpu: (".cpu()", _subject),
        T.__bool__: ("bool()", _subject), T.__int__: ("int()", _subject), T.__float__: ("float()", _subject),
        T.__index__: ("an index", _subject), T.__contains__: ("`in` (Tensor.__contains__)", _subject),
        T.__repr__: ("printing", _subject), T.__format__: ("formatting", _subject),
        T.nonzero: (".nonzero()", _subject), torch.nonzero: ("torch.nonzero", _subject),
        T.argwhere: (".argwhere()", _subject), torch.argwhere: ("torch.argwhere", _subject),
        T.masked_select: (".masked_select()", _any_argument),
        torch.masked_select: ("torch.masked_select", _any_argument),
        T.unique: (".unique()", _subject), torch.unique: ("torch.unique", _subject),
        T.unique_consecutive: (".unique_consecutive()", _subject),
        torch.unique_consecutive: ("torch.unique_consecutive", _subject),
        T.equal: (".equal()", _any_argument), torch.equal: ("torch.equal", _any_argument),
        T.allclose: (".allclose()", _any_argument), torch.allclose: ("torch.allclose", _any_argument),
        torch.is_nonzero: ("torch.is_nonzero", _subject),
        T.repeat_interleave: (".repeat_interleave() without output_size", _repeats_on_device),
        torch.repeat_interleave: ("torch.repeat_interleave without output_size", _repeats_on_device),
        torch.where: ("torch.where(condition)", _condition_only),
        T.bincount: (".bincount()", _subject), torch.bincount: ("torch.bincount", _subject),
        T.histc: (".histc()", _subject), torch.histc: ("torch.histc", _subject),
        torch.nn.functional.ctc_loss: ("F.ctc_loss (reads the lengths on the host)", _any_argument),
        torch.nn.functional.gaussian_nll_loss: ("F.gaussian_nll_loss (checks var on the host)",
                                                _variance_on_device),
        torch.normal: ("torch.normal with a tensor std (checks it on the host)", _tensor_std),
        T.fill_: (".fill_() with a 0-dim value on another device", _fill_from_another_device),
        foreach_copy(): ("torch._foreach_copy_ between host and device", _foreach_host_device_copy),
        T.masked_fill: (".masked_fill() with a 0-dim device value", _device_scalar_value),
        T.masked_fill_: (".masked_fill_() with a 0-dim device value", _device_scalar_value),
        torch.masked_fill: ("torch.masked_fill with a 0-dim device value", _device_scalar_value),
        T.copy_: (".copy_() between host and device", _host_device_copy),
        torch.tensor: ("torch.tensor of device tensors", _device_tensors_in_data),
    }
    for indexing in classify.index_ops():
        reads = indexing is T.__getitem__
        table[indexing] = ("boolean-mask indexing", _boolean_mask) if reads else \
            ("boolean-mask assignment (index_put_ with a mask)", _boolean_mask_write)
    # torch.linalg's own documentation (torch 2.14.1): "When inputs are on a CUDA device, this function
    # synchronizes that device with the CPU" (it checks the LAPACK info on the host; the *_ex variants
    # do not unless check_errors=True). The H200's row ``grown matmul linalg.solve``.
    for name in ("cholesky", "eig", "eigh", "eigvals", "eigvalsh", "inv", "ldl_factor", "lu_factor",
                 "matrix_rank", "pinv", "solve", "svdvals"):
        table[getattr(torch.linalg, name)] = (f"torch.linalg.{name} (checks its result on the host)",
                                              _any_argument)
    return table


HOST_SYNCS: dict[Any, tuple[str, SyncProbe]] = _host_syncs()
"""torch function -> (its name in a finding, the probe returning the device tensor it waits on)."""

_SCALAR_INDEXING: dict[Any, tuple[str, SyncProbe]] = {
    indexing: ("indexing with a 0-dim device tensor", _device_scalar_index)
    for indexing in (torch.Tensor.__getitem__, torch.Tensor.__setitem__)}
"""Indexing that reads its index on the host (the same calls as boolean-mask indexing, another probe)."""


_HOST_INDEX_WRITES: dict[Any, tuple[str, SyncProbe]] = {
    indexing: ("writing into a CPU tensor through device indices", _device_index_into_host)
    for indexing in classify.index_ops() if indexing is not torch.Tensor.__getitem__}
"""Index writes into a CPU tensor with indices on a device (the same calls, another probe); reading
``x_cpu[i_cuda]`` raises instead (a mismatch)."""


def host_sync(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, torch.Tensor] | None:
    """``(name, device tensor waited on)`` when this call makes the host wait for the device, else None."""
    for table in (HOST_SYNCS, _SCALAR_INDEXING, _HOST_INDEX_WRITES):
        entry = table.get(func)
        if entry is not None:
            waited_on = entry[1](args, kwargs)
            if waited_on is not None:
                return entry[0], waited_on
    return None
