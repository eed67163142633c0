"""Sparse tensors on the fake engine's simulated GPU.

Fake tensors run a sparse op (``to_sparse()``, ``.to("cuda")`` of a COO or CSR tensor, ``torch.sparse.mm``,
``adj @ x``, ``coalesce``) through no meta kernel: torch's fake mode falls back to the real CUDA kernel,
which needs a driver ("Found no NVIDIA driver"), so a GCN's ``features.to_sparse().to(device)`` stopped
the simulation. :func:`on_fake_cuda` runs such an op on fake *CPU* twins of its fake CUDA tensors (the
same shapes, dtypes and layouts; fake CPU sparse ops run torch's CPU kernels on no data) and makes each
result a fake tensor on the GPU again. The devices are checked first, from the arguments alone, as a
GPU's sparse kernels check them: every tensor of a sparse op on one device (a real GPU raises for a CPU
adjacency beside a CUDA dense operand, and for a CUDA one beside a CPU operand, COO and CSR alike, with
``torch.sparse.mm``, ``torch.spmm``, ``torch.mm`` and ``@``: checked on an H200, torch 2.11); a 0-dim CPU
scalar is the only CPU tensor taken (``adj * torch.tensor(2.)``).

The data-dependent mode (:mod:`placecheck.engines.datadep`), which sees every aten op first, asks
:func:`on_fake_cuda`. Values are not kept for sparse results (a fake tensor has none): the number of
stored elements of a converted tensor is what the CPU kernel gives for no data.
"""

from __future__ import annotations

from typing import Any

import torch

from placecheck.engines.classify import DeviceMismatchError
from placecheck.engines.compat import tree_flatten, tree_map

aten = torch.ops.aten
_CPU = torch.device("cpu")

_MAKERS = frozenset({aten._to_sparse.default, aten._to_sparse.sparse_dim, aten._to_sparse_csr.default,
                     aten._to_sparse_csc.default, aten._to_sparse_bsr.default, aten._to_sparse_bsc.default})
"""Ops that make a sparse tensor of a dense one (``to_sparse()``, ``to_sparse_csr()`` ...)."""

_COMPRESSED = {torch.sparse_csr: (aten.crow_indices.default, aten.col_indices.default),
               torch.sparse_bsr: (aten.crow_indices.default, aten.col_indices.default),
               torch.sparse_csc: (aten.ccol_indices.default, aten.row_indices.default),
               torch.sparse_bsc: (aten.ccol_indices.default, aten.row_indices.default)}
"""A compressed layout's two index tensors (compressed, plain)."""


_UNCHECKED = {
    aten.sparse_compressed_tensor.comp_plain_value_size: aten._sparse_compressed_tensor_unsafe.default}
"""Factories whose check of the indices reads values a fake tensor lacks (and refuses fake CPU tensors
on their own): made without it, as the values are not there to check."""


class SparseDeviceMismatchError(DeviceMismatchError):
    """A sparse op mixed devices on the fake engine (as a GPU's sparse kernel refuses it)."""


def _sparse(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.layout != torch.strided


def _involved(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``func`` takes or makes a sparse tensor (checked on the top-level arguments: aten's sparse ops take
    their tensors directly)."""
    return func in _MAKERS or any(_sparse(a) for a in args) or any(_sparse(v) for v in kwargs.values()) \
        or kwargs.get("layout") not in (None, torch.strided)


def _twin(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``: a fake tensor of its shape, dtype and layout (a sparse one rebuilt from its
    indices and values, each moved: moving a sparse fake tensor is what needs the driver)."""
    if t.device == device:
        return t
    if t.layout == torch.strided:
        moved: torch.Tensor = aten._to_copy.default(t, device=device)
        return moved
    if t.layout == torch.sparse_coo:
        indices = aten._to_copy.default(aten._indices.default(t), device=device)
        values = aten._to_copy.default(aten._values.default(t), device=device)
        made: torch.Tensor = aten._sparse_coo_tensor_with_dims_and_tensors.default(
            t.sparse_dim(), t.dense_dim(), list(t.shape), indices, values, dtype=t.dtype, layout=t.layout,
            device=device, is_coalesced=t.is_coalesced())
        return made
    compressed, plain = _COMPRESSED[t.layout]
    made = aten._sparse_compressed_tensor_unsafe.default(
        aten._to_copy.default(compressed(t), device=device), aten._to_copy.default(plain(t), device=device),
        aten._to_copy.default(aten.values.default(t), device=device), list(t.shape), dtype=t.dtype,
        layout=t.layout, device=device)
    return made


def _devices(tensors: list[torch.Tensor]) -> list[torch.device]:
    """The devices an op's tensors must share: a 0-dim dense CPU tensor is a scalar any device takes."""
    return [t.device for t in tensors
            if not (t.device.type == "cpu" and t.dim() == 0 and t.layout == torch.strided)]


def on_fake_cuda(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """``(True, result)`` for a sparse op on the simulated GPU, run on fake CPU twins; ``(False, None)``
    for any other call (a sparse op all on the CPU runs as torch runs it)."""
    if not _involved(func, args, kwargs):
        return False, None
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    wanted = kwargs.get("device")
    on_gpu = next((t.device for t in tensors if t.device.type == "cuda"), None)
    target = torch.device(wanted) if wanted is not None else on_gpu
    if target is None or (target.type != "cuda" and on_gpu is None):
        # all on the CPU: torch's CPU kernels run on fake tensors
        return (True, _UNCHECKED[func](*args, **kwargs)) if func in _UNCHECKED else (False, None)
    func = _UNCHECKED.get(func, func)
    devices = _devices(tensors)
    if func is not aten._to_copy.default and len(set(devices)) > 1:
        other = next(d for d in devices if d != target)
        raise SparseDeviceMismatchError(
            f"Expected all tensors to be on the same device, but found at least two devices, {target} and "
            f"{other}! (when checking argument for {func.overloadpacket.__name__})")
    on_host = tree_map(lambda a: _twin(a, _CPU) if isinstance(a, torch.Tensor) else a, (args, kwargs))
    host_args, host_kwargs = on_host
    if wanted is not None:
        host_kwargs = {**host_kwargs, "device": _CPU}
    out = func(*host_args, **host_kwargs)
    if func._schema.is_mutable and args and isinstance(args[0], torch.Tensor):
        return True, args[0]  # in place (``adj.mul_(2)``): the tensor itself, its metadata unchanged
    return True, tree_map(lambda o: _twin(o, target) if isinstance(o, torch.Tensor) else o, out)
