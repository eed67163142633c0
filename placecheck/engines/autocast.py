"""CUDA autocast on the real-valued engine: ``torch.autocast("cuda", dtype=...)`` casts as on a GPU.

The real-valued engine (:mod:`placecheck.engines.tagged`) computes on CPU tensors, which CUDA autocast
does not touch (its dispatch key is the CUDA one): a ``Linear`` under ``torch.autocast("cuda",
dtype=torch.float16)`` gave float32 where a GPU gives float16, and dtype-dependent code then ran unlike
the job. While the script is in a CUDA autocast region, :func:`simulated_autocast` enables CPU autocast
with the same dtype and enabled state, and replaces CPU autocast's per-op kernels with CUDA's policies
(CPU's op lists differ: ``softmax``, ``sum``, ``exp``, ``layer_norm`` run in float32 on a GPU and in the
lower precision on a CPU), each a Python kernel registered for the ``AutocastCPU`` key for the session:

- the ops in :data:`LOWER_PRECISION` (``linear``, ``matmul``, convolutions...) cast their floating
  arguments to the autocast dtype; :data:`FP32` ones to float32; :data:`FP32_SET_OPT_DTYPE` ones get
  ``dtype=torch.float32`` when none is given; ``norm`` is called with ``dtype=torch.float32``;
  :data:`PROMOTE` ones cast to the widest floating type among their arguments;
  ``binary_cross_entropy`` raises CUDA autocast's own error;
- every other op CPU autocast lists falls through, as CUDA autocast lets it (``cross_entropy`` then
  reaches ``log_softmax`` and ``nll_loss``, float32).

The lists are PyTorch's (``ATen/autocast_mode.h``, ``AT_FORALL_LOWER_PRECISION_FP`` and the others:
the ops ``_C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")`` names);
``tests/test_autocast.py`` holds them to that registry. Checked on an H200 (torch 2.11): under float16
and bfloat16, ``linear``, ``@``, ``bmm``, ``sigmoid`` and ``mean`` of a lower-precision input give the
lower precision; ``softmax``, ``log_softmax``, ``sum``, ``cumsum``, ``mse_loss``, ``cross_entropy``,
``nll_loss``, ``cat`` of mixed inputs and ``x + float32`` give float32.

Not simulated: other libraries' own CUDA autocast kernels (torchvision's ``roi_align``...), the
cuDNN-only kernels (``_cudnn_rnn``: an ``nn.LSTM`` under CUDA autocast gives float16 on a GPU, its CPU
kernel here float32), and the cache of cast weights (the values are the same).
A tensor is cast only while its op runs on the simulated GPU (:func:`on_gpu` marks it): CUDA autocast
leaves CPU tensors alone. Not reentrant: one session at a time per process.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from placecheck.engines.compat import autocast_cpu_key, dispatch_key_excluded, dispatch_key_registrations

aten = torch.ops.aten

LOWER_PRECISION = ("_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
                   "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
                   "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
                   "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
                   "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
                   "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
                   "scaled_dot_product_attention", "cudnn_convolution", "cudnn_convolution_transpose",
                   "_cudnn_rnn")
"""CUDA autocast's ``lower_precision_fp`` ops (``AT_FORALL_LOWER_PRECISION_FP`` and the cuDNN ones)."""

FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
        "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
        "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm",
        "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
        "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
        "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
        "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
        "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
        "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d",
        "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
        "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa", "linalg_matrix_sqrth")
"""CUDA autocast's ``fp32`` ops (``AT_FORALL_FP32``)."""

FP32_SET_OPT_DTYPE = ("prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
                      "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
                      "sum.dim_IntList")
"""CUDA autocast's ``fp32_set_opt_dtype`` ops: ``dtype=torch.float32`` when none is given."""

NAMED_SET_OPT_DTYPE = ("softmax.Dimname", "log_softmax.Dimname", "prod.dim_Dimname", "cumprod.dimname",
                       "cumsum.dimname", "sum.dim_DimnameList")
"""The named-dimension overloads of :data:`FP32_SET_OPT_DTYPE`'s ops, which CUDA autocast lists in some
torch releases (2.10) and not in others (2.14): given that policy only where this torch registers them."""

NAMED_FP32 = ("norm.names_ScalarOpt_dim",)
"""``fp32_append_dtype`` where listed (its ``_dtype`` twin is gone from newer torch): float32 too."""

FP32_APPEND_DTYPE = {"norm.Scalar": aten.norm.ScalarOpt_dtype,
                     "norm.ScalarOpt_dim": aten.norm.ScalarOpt_dim_dtype}
"""CUDA autocast's ``fp32_append_dtype`` ops: called as their overload taking a dtype, float32."""

PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "tensordot", "scatter_add")
"""CUDA autocast's ``promote`` ops: run in the widest floating type among their arguments."""

BANNED = {"binary_cross_entropy": (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")}
"""Ops CUDA autocast refuses, with its message."""

_KEY = autocast_cpu_key()
_GPU_DEPTH = 0
"""How many ops on the simulated GPU are running (:func:`on_gpu`): their tensors are autocast's."""


@contextlib.contextmanager
def on_gpu() -> Iterator[None]:
    """An op of the simulated GPU runs: autocast may cast its floating tensors (not a CPU op's)."""
    global _GPU_DEPTH
    _GPU_DEPTH += 1
    try:
        yield
    finally:
        _GPU_DEPTH -= 1


def _eligible(value: Any) -> bool:
    return (isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64
            and _GPU_DEPTH > 0)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if _eligible(value):
        return value if value.dtype == dtype else value.to(dtype)
    if isinstance(value, list | tuple) and any(_eligible(v) for v in value):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _widest(args: tuple[Any, ...], kwargs: dict[str, Any], lower: torch.dtype) -> torch.dtype:
    found = [v for v in (*args, *kwargs.values()) if _eligible(v)]
    return torch.float32 if any(v.dtype == torch.float32 for v in found) else lower


def _kernel(op: Any, policy: str) -> Callable[..., Any]:
    """The ``AutocastCPU`` kernel of ``op`` under CUDA's ``policy``."""
    schema = op._schema
    dtype_at = next((i for i, a in enumerate(schema.arguments) if a.name == "dtype"), None)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with dispatch_key_excluded(_KEY):
            if _GPU_DEPTH == 0:
                return op(*args, **kwargs)
            if policy == "banned":
                raise RuntimeError(BANNED[schema.name.removeprefix("aten::")])
            first = args[0] if args else None
            if policy == "lower":
                lower = torch.get_autocast_dtype("cpu")
                return op(*_cast(args, lower), **{k: _cast(v, lower) for k, v in kwargs.items()})
            if policy == "fp32":
                to = torch.float32
                return op(*_cast(args, to), **{k: _cast(v, to) for k, v in kwargs.items()})
            if policy == "promote":
                to = _widest(args, kwargs, torch.get_autocast_dtype("cpu"))
                return op(*_cast(args, to), **{k: _cast(v, to) for k, v in kwargs.items()})
            if not _eligible(first):
                return op(*args, **kwargs)
            if policy == "append":
                return FP32_APPEND_DTYPE[_name(op)](*args, **kwargs, dtype=torch.float32)
            # set_opt_dtype: float32 unless the call gives a dtype
            if dtype_at is not None and dtype_at < len(args):
                if args[dtype_at] is None:
                    args = (*args[:dtype_at], torch.float32, *args[dtype_at + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)
    return kernel


def _name(op: Any) -> str:
    """``aten.pow.Tensor_Scalar`` -> ``pow.Tensor_Scalar``; a default overload -> its op's name."""
    name = str(op._schema.name).removeprefix("aten::")
    return f"{name}.{op._overloadname}" if op._overloadname != "default" else name


def _overload(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet), overload or "default")


def policies() -> dict[str, str]:
    """Every op CPU or CUDA autocast handles -> the policy it gets here (CUDA's; ``none`` for an op only
    CPU autocast lists)."""
    table = {name: "lower" for name in LOWER_PRECISION}
    table.update({name: "fp32" for name in FP32})
    table.update({name: "set_opt_dtype" for name in FP32_SET_OPT_DTYPE})
    table.update({name: "append" for name in FP32_APPEND_DTYPE})
    table.update({name: "promote" for name in PROMOTE})
    table.update({name: "banned" for name in BANNED})
    try:
        cuda = {r.removeprefix("aten::") for r in dispatch_key_registrations("AutocastCUDA")}
    except RuntimeError:  # a build without that dispatch key
        cuda = set()
    table.update({name: "set_opt_dtype" for name in NAMED_SET_OPT_DTYPE if name in cuda})
    table.update({name: "fp32" for name in NAMED_FP32 if name in cuda})
    for registered in dispatch_key_registrations("AutocastCPU"):
        table.setdefault(registered.removeprefix("aten::"), "none")
    return table


@contextlib.contextmanager
def _cuda_policies() -> Iterator[None]:
    """CPU autocast's kernels replaced by CUDA's policies for the block (restored when it ends)."""
    library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]  # for aten's own ops
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": that is the point
            for name, policy in policies().items():
                try:
                    op = _overload(name)
                except AttributeError:
                    continue  # an op this torch does not have
                # an op CUDA autocast does not list falls through (its decomposition's ops are autocast's)
                kernel = torch.library.fallthrough_kernel if policy == "none" else _kernel(op, policy)
                library.impl(name, kernel, "AutocastCPU")  # type: ignore[no-untyped-call]
        yield
    finally:
        library._destroy()  # type: ignore[no-untyped-call]


def _enter(original: Callable[..., Any]) -> Callable[..., Any]:
    def enter(self: Any) -> Any:
        out = original(self)
        if self.device == "cuda":
            # the CPU's autocast state follows the simulated GPU's: its dtype, on or off
            self._pc_cpu = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
            torch.set_autocast_enabled("cpu", bool(self._enabled))
            torch.set_autocast_dtype("cpu", self.fast_dtype)
        return out
    return enter


def _exit(original: Callable[..., Any]) -> Callable[..., Any]:
    def exit_(self: Any, *args: Any) -> Any:
        saved = getattr(self, "_pc_cpu", None)
        if saved is not None:
            torch.set_autocast_enabled("cpu", saved[0])
            torch.set_autocast_dtype("cpu", saved[1])
            del self._pc_cpu
        return original(self, *args)
    return exit_


@contextlib.contextmanager
def simulated_autocast() -> Iterator[None]:
    """CUDA autocast regions of the session cast the simulated GPU's tensors as CUDA autocast does."""
    from torch.amp import autocast_mode

    from placecheck.basics.patching import patch

    cls = autocast_mode.autocast
    why = "CUDA autocast does not cast the CPU tensors the real-valued engine computes on: CPU autocast does"
    with _cuda_policies(), patch(cls, "__enter__", _enter(cls.__enter__), why), \
            patch(cls, "__exit__", _exit(cls.__exit__), why):
        yield
