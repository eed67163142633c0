"""The truth table: which ops accept which tensor argument on the CPU while the rest are on CUDA,
which raise, and which make the host wait, as a real GPU says; and its replay through placecheck's
simulated engines on the CPU.

Each case is an op with named tensor arguments and its variants: every variant runs it with all
arguments on CUDA except those it lists as on the CPU. On a CUDA machine :func:`main` runs every
variant and records PyTorch's verdict (``ok`` or ``raises`` with the exception's type and first
line) and how many host synchronisations ``torch.cuda.set_sync_debug_mode("warn")`` reported.

Two families of cases, kept apart in the table by each row's ``verified_on``:

- :data:`VERIFIED_CASES`, exactly the cases run on an NVIDIA H100 (torch 2.11.0+cu130,
  2026-11-25; ``verified_on`` names the GPU, torch and date). Do not edit one: its GPU verdict
  would no longer describe it. A changed case is a new case.
- :data:`GROWN_CASES`, generated to cover the aten ops the zoos and training loops call (losses,
  optimizers' foreach and fused steps, DataLoader pinning, generators, copies and non_blocking,
  indexing with CPU indices and masks, ops that need CPU arguments). Until a GPU has run them
  their rows have ``verified_on: null`` and no verdict; the replay test skips them.

    python benchmarks/mix_table.py                  # on a GPU: writes tests/data/mix-table.json
    MIX_DEVICE=cpu python benchmarks/mix_table.py   # a dry run of every case on the CPU, writes nothing
    python benchmarks/mix_table.py --replay         # the replay through the engines (CPU), a summary

Without a GPU (and without ``MIX_DEVICE=cpu``) it says so and exits 0: the committed table stands.
:func:`replay` runs one row through a simulated engine; ``tests/test_mix_table.py`` holds every
verified row to the GPU's verdict, and :data:`placecheck.limits.LIMITS` lists the rows that differ.
"""
# ruff: noqa: E501, E731, B023  (one case a line: the table reads as a table)

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "data" / "mix-table.json"
C = os.environ.get("MIX_DEVICE", "cuda")  # "cpu": a dry run of the table itself
DEBUG = C != "cpu"


def t(dev, *shape, kind="f", lo=0, hi=4):
    if kind == "f":
        return torch.randn(*shape, device=dev)
    if kind == "i":
        return torch.randint(lo, hi, shape, device=dev)
    if kind == "b":
        return torch.rand(*shape, device=dev) > 0.5
    raise ValueError(kind)


def scalar(dev, v=2.0):
    return torch.tensor(v, device=dev)


# -- the cases verified on the H100 (verbatim: their verdicts are in the table) -------------------

# name -> (function of a dict of arguments, {arg: builder(dev)}, [variants: tuple of args on cpu; "*0" suffix = 0-dim])
CASES = {
    "add": (lambda a: a["x"] + a["y"], {"x": lambda d: t(d, 4, 4), "y": lambda d: t(d, 4, 4)}, [("y",), ("x",)]),
    "add 0-dim cpu": (lambda a: a["x"] + a["y"], {"x": lambda d: t(d, 4, 4), "y": lambda d: scalar(d)}, [("y",)]),
    "add 1-elem 1-dim cpu": (lambda a: a["x"] + a["y"], {"x": lambda d: t(d, 4, 4), "y": lambda d: t(d, 1)}, [("y",)]),
    "mul_ into cuda": (lambda a: a["x"].mul_(a["y"]), {"x": lambda d: t(d, 4, 4), "y": lambda d: t(d, 4, 4)}, [("y",)]),
    "add_ into cpu accumulator": (lambda a: a["acc"].add_(a["v"]), {"acc": lambda d: t(d, 4), "v": lambda d: t(d, 4)}, [("acc",)]),
    "iadd 0-dim cpu accumulator": (lambda a: a["acc"].add_(a["v"]), {"acc": lambda d: scalar(d, 0.0), "v": lambda d: scalar(d, 1.0)}, [("acc",), ("v",)]),
    "linear": (lambda a: F.linear(a["x"], a["w"], a["b"]), {"x": lambda d: t(d, 2, 8), "w": lambda d: t(d, 4, 8), "b": lambda d: t(d, 4)}, [("x",), ("w",), ("b",)]),
    "matmul": (lambda a: a["x"] @ a["y"], {"x": lambda d: t(d, 4, 4), "y": lambda d: t(d, 4, 4)}, [("y",)]),
    "bmm": (lambda a: torch.bmm(a["x"], a["y"]), {"x": lambda d: t(d, 2, 4, 4), "y": lambda d: t(d, 2, 4, 4)}, [("y",)]),
    "addmm bias": (lambda a: torch.addmm(a["b"], a["x"], a["y"]), {"b": lambda d: t(d, 4), "x": lambda d: t(d, 4, 4), "y": lambda d: t(d, 4, 4)}, [("b",)]),
    "einsum": (lambda a: torch.einsum("ij,jk->ik", a["x"], a["y"]), {"x": lambda d: t(d, 4, 4), "y": lambda d: t(d, 4, 4)}, [("y",)]),
    "conv2d weight": (lambda a: F.conv2d(a["x"], a["w"]), {"x": lambda d: t(d, 1, 3, 8, 8), "w": lambda d: t(d, 4, 3, 3, 3)}, [("w",)]),
    "layer_norm weight": (lambda a: F.layer_norm(a["x"], (8,), a["w"]), {"x": lambda d: t(d, 2, 8), "w": lambda d: t(d, 8)}, [("w",)]),
    "cat": (lambda a: torch.cat([a["x"], a["y"]]), {"x": lambda d: t(d, 2, 4), "y": lambda d: t(d, 2, 4)}, [("y",)]),
    "stack": (lambda a: torch.stack([a["x"], a["y"]]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("y",)]),
    "where cond": (lambda a: torch.where(a["c"], a["x"], a["y"]), {"c": lambda d: t(d, 4, kind="b"), "x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("c",), ("y",)]),
    "where 0-dim cpu other": (lambda a: torch.where(a["c"], a["x"], a["y"]), {"c": lambda d: t(d, 4, kind="b"), "x": lambda d: t(d, 4), "y": lambda d: scalar(d)}, [("y",)]),
    "masked_fill mask": (lambda a: a["x"].masked_fill(a["m"], 0.0), {"x": lambda d: t(d, 4, 4), "m": lambda d: t(d, 4, 4, kind="b")}, [("m",)]),
    "masked_fill 0-dim value": (lambda a: a["x"].masked_fill(a["m"], a["v"]), {"x": lambda d: t(d, 4, 4), "m": lambda d: t(d, 4, 4, kind="b"), "v": lambda d: scalar(d)}, [("v",)]),
    "index with cpu long": (lambda a: a["x"][a["i"]], {"x": lambda d: t(d, 8, 4), "i": lambda d: t(d, 3, kind="i", hi=8)}, [("i",)]),
    "index with cpu bool mask": (lambda a: a["x"][a["m"]], {"x": lambda d: t(d, 8, 4), "m": lambda d: t(d, 8, kind="b")}, [("m",)]),
    "index_put cpu index": (lambda a: a["x"].index_put_((a["i"],), a["v"]), {"x": lambda d: t(d, 8), "i": lambda d: t(d, 3, kind="i", hi=8), "v": lambda d: t(d, 3)}, [("i",), ("v",)]),
    "setitem cpu value": (lambda a: a["x"].__setitem__(slice(0, 3), a["v"]), {"x": lambda d: t(d, 8), "v": lambda d: t(d, 3)}, [("v",)]),
    "index_select": (lambda a: a["x"].index_select(0, a["i"]), {"x": lambda d: t(d, 8, 4), "i": lambda d: t(d, 3, kind="i", hi=8)}, [("i",)]),
    "gather": (lambda a: a["x"].gather(1, a["i"]), {"x": lambda d: t(d, 4, 4), "i": lambda d: t(d, 4, 2, kind="i")}, [("i",)]),
    "scatter_": (lambda a: a["x"].scatter_(1, a["i"], a["s"]), {"x": lambda d: t(d, 4, 4), "i": lambda d: t(d, 4, 2, kind="i"), "s": lambda d: t(d, 4, 2)}, [("i",), ("s",)]),
    "index_add_": (lambda a: a["x"].index_add_(0, a["i"], a["s"]), {"x": lambda d: t(d, 8, 4), "i": lambda d: t(d, 3, kind="i", hi=8), "s": lambda d: t(d, 3, 4)}, [("i",), ("s",)]),
    "embedding indices": (lambda a: F.embedding(a["i"], a["w"]), {"i": lambda d: t(d, 2, 5, kind="i", hi=10), "w": lambda d: t(d, 10, 4)}, [("i",), ("w",)]),
    "embedding_bag offsets": (lambda a: F.embedding_bag(a["i"], a["w"], a["o"]), {"i": lambda d: t(d, 6, kind="i", hi=10), "w": lambda d: t(d, 10, 4), "o": lambda d: torch.tensor([0, 3], device=d)}, [("o",)]),
    "cross_entropy target": (lambda a: F.cross_entropy(a["x"], a["y"]), {"x": lambda d: t(d, 4, 3), "y": lambda d: t(d, 4, kind="i", hi=3)}, [("y",)]),
    "cross_entropy weight": (lambda a: F.cross_entropy(a["x"], a["y"], weight=a["w"]), {"x": lambda d: t(d, 4, 3), "y": lambda d: t(d, 4, kind="i", hi=3), "w": lambda d: torch.ones(3, device=d)}, [("w",)]),
    "nll_loss target": (lambda a: F.nll_loss(a["x"], a["y"]), {"x": lambda d: t(d, 4, 3), "y": lambda d: t(d, 4, kind="i", hi=3)}, [("y",)]),
    "bce_with_logits pos_weight": (lambda a: F.binary_cross_entropy_with_logits(a["x"], a["y"], pos_weight=a["p"]), {"x": lambda d: t(d, 4, 2), "y": lambda d: torch.rand(4, 2, device=d), "p": lambda d: torch.ones(2, device=d)}, [("p",), ("y",)]),
    "mse_loss target": (lambda a: F.mse_loss(a["x"], a["y"]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("y",)]),
    "ctc_loss cpu targets and lengths": (lambda a: F.ctc_loss(a["lp"], a["tg"], a["il"], a["tl"]), {"lp": lambda d: t(d, 10, 2, 5).log_softmax(2), "tg": lambda d: t(d, 2, 4, kind="i", lo=1, hi=5), "il": lambda d: torch.full((2,), 10, device=d), "tl": lambda d: torch.full((2,), 4, device=d)}, [("tg", "il", "tl"), ("il", "tl")]),
    "pack_padded lengths": (lambda a: pack_padded_sequence(a["x"], a["l"], batch_first=True, enforce_sorted=False), {"x": lambda d: t(d, 3, 5, 4), "l": lambda d: torch.tensor([5, 3, 2], device=d)}, [("l",)]),
    "bucketize boundaries": (lambda a: torch.bucketize(a["x"], a["b"]), {"x": lambda d: t(d, 8), "b": lambda d: torch.linspace(-1, 1, 5, device=d)}, [("b",)]),
    "searchsorted": (lambda a: torch.searchsorted(a["s"], a["x"]), {"s": lambda d: torch.linspace(-1, 1, 5, device=d), "x": lambda d: t(d, 8)}, [("s",), ("x",)]),
    "repeat_interleave repeats": (lambda a: torch.repeat_interleave(a["x"], a["r"], dim=0), {"x": lambda d: t(d, 3, 2), "r": lambda d: torch.tensor([1, 2, 3], device=d)}, [("r",)]),
    "bincount weights": (lambda a: torch.bincount(a["i"], weights=a["w"]), {"i": lambda d: t(d, 8, kind="i"), "w": lambda d: t(d, 8)}, [("w",)]),
    "lerp_ cpu shadow": (lambda a: a["s"].lerp_(a["p"], 0.1), {"s": lambda d: t(d, 4), "p": lambda d: t(d, 4)}, [("s",), ("p",)]),
    "clamp min 0-dim": (lambda a: torch.clamp(a["x"], min=a["m"]), {"x": lambda d: t(d, 4), "m": lambda d: scalar(d, 0.0)}, [("m",)]),
    "clamp min 1-dim": (lambda a: torch.clamp(a["x"], min=a["m"]), {"x": lambda d: t(d, 4), "m": lambda d: t(d, 4)}, [("m",)]),
    "eq shape-matched": (lambda a: a["x"] == a["y"], {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("y",)]),
    "cdist": (lambda a: torch.cdist(a["x"], a["y"]), {"x": lambda d: t(d, 4, 3), "y": lambda d: t(d, 5, 3)}, [("y",)]),
    "grid_sample grid": (lambda a: F.grid_sample(a["x"], a["g"], align_corners=False), {"x": lambda d: t(d, 1, 2, 4, 4), "g": lambda d: t(d, 1, 3, 3, 2).tanh()}, [("g",)]),
    "copy_ cpu into cuda": (lambda a: a["x"].copy_(a["y"]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("y",), ("x",)]),
    "type_as cpu": (lambda a: a["x"].type_as(a["y"]).device, {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("y",)]),
    "multinomial cpu generator": (lambda a: torch.multinomial(a["p"], 2, generator=torch.Generator().manual_seed(0)), {"p": lambda d: torch.rand(3, 5, device=d)}, [()]),
    "randn cuda cpu generator": (lambda a: torch.randn(4, device=C, generator=torch.Generator().manual_seed(0)), {}, [()]),
    "normal distribution mixed": (lambda a: torch.distributions.Normal(a["m"], a["s"]).rsample(), {"m": lambda d: t(d, 4), "s": lambda d: torch.ones(4, device=d)}, [("s",)]),
    "numpy of cuda": (lambda a: a["x"].numpy(), {"x": lambda d: t(d, 4)}, [()]),
    "tolist of cuda": (lambda a: a["x"].tolist(), {"x": lambda d: t(d, 4)}, [()]),
    "item of cuda": (lambda a: a["x"].sum().item(), {"x": lambda d: t(d, 4)}, [()]),
    "pin_memory of cuda": (lambda a: a["x"].pin_memory(), {"x": lambda d: t(d, 4)}, [()]),
    "nonzero of cuda": (lambda a: a["x"].nonzero(), {"x": lambda d: t(d, 4, kind="b")}, [()]),
    "bool of cuda": (lambda a: bool((a["x"] > 0).any()), {"x": lambda d: t(d, 4)}, [()]),
    "torch.tensor of cuda 0-dims": (lambda a: torch.tensor([a["x"], a["y"]]), {"x": lambda d: scalar(d), "y": lambda d: scalar(d)}, [()]),
    "to cpu non_blocking": (lambda a: a["x"].to("cpu", non_blocking=True), {"x": lambda d: t(d, 4)}, [()]),
}

# Families added in bulk: binary elementwise ops (a 4x4 and a 0-dim CPU partner), in-place
# variants, more losses, norms, matmul variants, indexing, optimizers' multi-tensor steps.
_BIN = {
    "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow, "maximum": torch.maximum,
    "minimum": torch.minimum, "atan2": torch.atan2, "fmod": torch.fmod, "remainder": torch.remainder,
    "hypot": torch.hypot, "copysign": torch.copysign, "ge": torch.ge, "logaddexp": torch.logaddexp,
    "xlogy": torch.xlogy, "floor_divide": torch.floor_divide,
}
for _n, _f in _BIN.items():
    CASES[f"{_n}"] = (lambda a, f=_f: f(a["x"], a["y"]), {"x": lambda d: t(d, 4, 4), "y": lambda d: t(d, 4, 4)}, [("y",)])
    CASES[f"{_n} 0-dim cpu"] = (lambda a, f=_f: f(a["x"], a["y"]), {"x": lambda d: t(d, 4, 4), "y": lambda d: scalar(d)}, [("y",)])
_INPLACE = {"add_": "add_", "sub_": "sub_", "div_": "div_", "copy_ (shape-matched)": "copy_", "lerp_ 0.5": None}
for _n in ["add_", "sub_", "div_", "mul_"]:
    CASES[f"{_n} 0-dim cpu other"] = (lambda a, m=_n: getattr(a["x"], m)(a["y"]), {"x": lambda d: t(d, 4), "y": lambda d: scalar(d)}, [("y",)])
    CASES[f"{_n} into 0-dim cpu self"] = (lambda a, m=_n: getattr(a["x"], m)(a["y"]), {"x": lambda d: scalar(d), "y": lambda d: scalar(d)}, [("x",)])
CASES.update({
    "logical_and bool": (lambda a: torch.logical_and(a["x"], a["y"]), {"x": lambda d: t(d, 4, kind="b"), "y": lambda d: t(d, 4, kind="b")}, [("y",)]),
    "bitwise_and int": (lambda a: a["x"] & a["y"], {"x": lambda d: t(d, 4, kind="i"), "y": lambda d: t(d, 4, kind="i")}, [("y",)]),
    "addcmul tensor2": (lambda a: torch.addcmul(a["x"], a["y"], a["z"]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4), "z": lambda d: t(d, 4)}, [("z",)]),
    "lerp weight 0-dim": (lambda a: torch.lerp(a["x"], a["y"], a["w"]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4), "w": lambda d: scalar(d, 0.5)}, [("w",)]),
    "mm": (lambda a: torch.mm(a["x"], a["y"]), {"x": lambda d: t(d, 4, 4), "y": lambda d: t(d, 4, 4)}, [("y",)]),
    "mv": (lambda a: torch.mv(a["x"], a["v"]), {"x": lambda d: t(d, 4, 4), "v": lambda d: t(d, 4)}, [("v",)]),
    "dot": (lambda a: torch.dot(a["x"], a["y"]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("y",)]),
    "outer": (lambda a: torch.outer(a["x"], a["y"]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("y",)]),
    "baddbmm": (lambda a: torch.baddbmm(a["b"], a["x"], a["y"]), {"b": lambda d: t(d, 2, 4, 4), "x": lambda d: t(d, 2, 4, 4), "y": lambda d: t(d, 2, 4, 4)}, [("b",)]),
    "tensordot": (lambda a: torch.tensordot(a["x"], a["y"], dims=1), {"x": lambda d: t(d, 4, 4), "y": lambda d: t(d, 4, 4)}, [("y",)]),
    "kron": (lambda a: torch.kron(a["x"], a["y"]), {"x": lambda d: t(d, 2, 2), "y": lambda d: t(d, 2, 2)}, [("y",)]),
    "matmul 1-dim cpu": (lambda a: a["x"] @ a["v"], {"x": lambda d: t(d, 4, 4), "v": lambda d: t(d, 4)}, [("v",)]),
    "sdpa mask": (lambda a: F.scaled_dot_product_attention(a["q"], a["q"], a["q"], attn_mask=a["m"]), {"q": lambda d: t(d, 1, 2, 4, 8), "m": lambda d: t(d, 4, 4, kind="b")}, [("m",)]),
    "sdpa 0-dim scale tensor": (lambda a: F.scaled_dot_product_attention(a["q"], a["q"], a["q"]) * a["s"], {"q": lambda d: t(d, 1, 2, 4, 8), "s": lambda d: scalar(d)}, [("s",)]),
    "batch_norm running stats": (lambda a: F.batch_norm(a["x"], a["rm"], a["rv"], training=True), {"x": lambda d: t(d, 4, 3), "rm": lambda d: torch.zeros(3, device=d), "rv": lambda d: torch.ones(3, device=d)}, [("rm", "rv")]),
    "batch_norm eval weight": (lambda a: F.batch_norm(a["x"], a["rm"], a["rv"], a["w"], training=False), {"x": lambda d: t(d, 4, 3), "rm": lambda d: torch.zeros(3, device=d), "rv": lambda d: torch.ones(3, device=d), "w": lambda d: torch.ones(3, device=d)}, [("w",), ("rm", "rv")]),
    "group_norm weight": (lambda a: F.group_norm(a["x"], 2, a["w"]), {"x": lambda d: t(d, 2, 4, 3), "w": lambda d: torch.ones(4, device=d)}, [("w",)]),
    "rms_norm weight": (lambda a: F.rms_norm(a["x"], (8,), a["w"]), {"x": lambda d: t(d, 2, 8), "w": lambda d: torch.ones(8, device=d)}, [("w",)]),
    "prelu weight": (lambda a: F.prelu(a["x"], a["w"]), {"x": lambda d: t(d, 2, 3), "w": lambda d: torch.full((1,), 0.25, device=d)}, [("w",)]),
    "conv1d bias": (lambda a: F.conv1d(a["x"], a["w"], a["b"]), {"x": lambda d: t(d, 1, 2, 8), "w": lambda d: t(d, 3, 2, 3), "b": lambda d: t(d, 3)}, [("b",)]),
    "conv_transpose2d weight": (lambda a: F.conv_transpose2d(a["x"], a["w"]), {"x": lambda d: t(d, 1, 2, 4, 4), "w": lambda d: t(d, 2, 3, 3, 3)}, [("w",)]),
    "l1_loss target": (lambda a: F.l1_loss(a["x"], a["y"]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("y",)]),
    "smooth_l1 target": (lambda a: F.smooth_l1_loss(a["x"], a["y"]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("y",)]),
    "kl_div target": (lambda a: F.kl_div(a["x"].log_softmax(-1), a["y"].softmax(-1), reduction="batchmean"), {"x": lambda d: t(d, 2, 4), "y": lambda d: t(d, 2, 4)}, [("y",)]),
    "bce target": (lambda a: F.binary_cross_entropy(a["x"].sigmoid(), a["y"]), {"x": lambda d: t(d, 4), "y": lambda d: torch.rand(4, device=d)}, [("y",)]),
    "bce weight": (lambda a: F.binary_cross_entropy(a["x"].sigmoid(), a["y"], weight=a["w"]), {"x": lambda d: t(d, 4), "y": lambda d: torch.rand(4, device=d), "w": lambda d: torch.ones(4, device=d)}, [("w",)]),
    "cross_entropy label_smoothing soft target": (lambda a: F.cross_entropy(a["x"], a["y"].softmax(-1)), {"x": lambda d: t(d, 4, 3), "y": lambda d: t(d, 4, 3)}, [("y",)]),
    "nll_loss2d target": (lambda a: F.nll_loss(a["x"], a["y"]), {"x": lambda d: t(d, 2, 3, 4, 4).log_softmax(1), "y": lambda d: t(d, 2, 4, 4, kind="i", hi=3)}, [("y",)]),
    "margin_ranking target": (lambda a: F.margin_ranking_loss(a["x"], a["y"], a["z"]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4), "z": lambda d: torch.ones(4, device=d)}, [("z",)]),
    "cosine_embedding target": (lambda a: F.cosine_embedding_loss(a["x"], a["y"], a["z"]), {"x": lambda d: t(d, 4, 3), "y": lambda d: t(d, 4, 3), "z": lambda d: torch.ones(4, device=d)}, [("z",)]),
    "masked_select mask": (lambda a: torch.masked_select(a["x"], a["m"]), {"x": lambda d: t(d, 4), "m": lambda d: t(d, 4, kind="b")}, [("m",)]),
    "masked_scatter_ source": (lambda a: a["x"].masked_scatter_(a["m"], a["s"]), {"x": lambda d: t(d, 4), "m": lambda d: t(d, 4, kind="b"), "s": lambda d: t(d, 4)}, [("m",), ("s",)]),
    "index_fill_ cpu index": (lambda a: a["x"].index_fill_(0, a["i"], 0.0), {"x": lambda d: t(d, 8), "i": lambda d: t(d, 3, kind="i", hi=8)}, [("i",)]),
    "index_copy_": (lambda a: a["x"].index_copy_(0, a["i"], a["s"]), {"x": lambda d: t(d, 8), "i": lambda d: torch.tensor([0, 2, 5], device=d), "s": lambda d: t(d, 3)}, [("i",), ("s",)]),
    "put_": (lambda a: a["x"].put_(a["i"], a["s"]), {"x": lambda d: t(d, 8), "i": lambda d: torch.tensor([0, 2, 5], device=d), "s": lambda d: t(d, 3)}, [("i",), ("s",)]),
    "take_along_dim": (lambda a: torch.take_along_dim(a["x"], a["i"], dim=1), {"x": lambda d: t(d, 4, 4), "i": lambda d: t(d, 4, 2, kind="i")}, [("i",)]),
    "scatter_add": (lambda a: torch.scatter_add(a["x"], 1, a["i"], a["s"]), {"x": lambda d: t(d, 4, 4), "i": lambda d: t(d, 4, 2, kind="i"), "s": lambda d: t(d, 4, 2)}, [("i",), ("s",)]),
    "scatter_reduce": (lambda a: a["x"].scatter_reduce(0, a["i"], a["s"], "amax"), {"x": lambda d: t(d, 4), "i": lambda d: torch.tensor([0, 1, 1, 3], device=d), "s": lambda d: t(d, 4)}, [("i",)]),
    "index with 0-dim cpu long": (lambda a: a["x"][a["i"]], {"x": lambda d: t(d, 8, 4), "i": lambda d: torch.tensor(3, device=d)}, [("i",)]),
    "index with cpu long 2 dims": (lambda a: a["x"][a["i"], a["j"]], {"x": lambda d: t(d, 8, 8), "i": lambda d: t(d, 3, kind="i", hi=8), "j": lambda d: t(d, 3, kind="i", hi=8)}, [("i",), ("i", "j")]),
    "one_hot cpu indices": (lambda a: F.one_hot(a["i"], 5).to(a["x"].dtype) + a["x"], {"i": lambda d: t(d, 4, kind="i", hi=5), "x": lambda d: t(d, 4, 5)}, [("i",)]),
    "unique return_inverse": (lambda a: torch.unique(a["x"], return_inverse=True), {"x": lambda d: t(d, 8, kind="i")}, [()]),
    "topk then index cpu": (lambda a: a["x"][a["x"].topk(2).indices.cpu()], {"x": lambda d: t(d, 8)}, [()]),
    "histc": (lambda a: torch.histc(a["x"], bins=4), {"x": lambda d: t(d, 8)}, [()]),
    "interpolate": (lambda a: F.interpolate(a["x"], scale_factor=2), {"x": lambda d: t(d, 1, 2, 4, 4)}, [()]),
    "dropout cpu generator-free": (lambda a: F.dropout(a["x"], 0.5), {"x": lambda d: t(d, 4)}, [()]),
    "bernoulli cpu p": (lambda a: torch.bernoulli(a["p"]) + a["x"], {"p": lambda d: torch.rand(4, device=d), "x": lambda d: t(d, 4)}, [("p",)]),
    "rand_like cuda cpu generator": (lambda a: torch.rand(a["x"].shape, device=a["x"].device, generator=torch.Generator().manual_seed(0)), {"x": lambda d: t(d, 4)}, [()]),
    "normal_ cpu generator": (lambda a: a["x"].normal_(generator=torch.Generator().manual_seed(0)), {"x": lambda d: t(d, 4)}, [()]),
    "randperm cuda cpu generator": (lambda a: torch.randperm(8, device="cuda" if C != "cpu" else "cpu", generator=torch.Generator().manual_seed(0)), {}, [()]),
    "foreach_add_ mixed lists": (lambda a: torch._foreach_add_([a["x"], a["y"]], [a["u"], a["v"]]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4), "u": lambda d: t(d, 4), "v": lambda d: t(d, 4)}, [("v",), ("y", "v")]),
    "adam step cpu state": (lambda a: _adam_step(a), {"p": lambda d: t(d, 4).requires_grad_(), "s": lambda d: t(d, 4)}, [("s",)]),
    "clip_grad_norm_ mixed grads": (lambda a: _clip(a), {"p": lambda d: t(d, 4).requires_grad_(), "q": lambda d: t(d, 4).requires_grad_()}, [("q",)]),
    "stack 0-dim cpu and cuda": (lambda a: torch.stack([a["x"], a["y"]]), {"x": lambda d: scalar(d), "y": lambda d: scalar(d)}, [("y",)]),
    "cat 0-dim-free 1-elem cpu": (lambda a: torch.cat([a["x"], a["y"]]), {"x": lambda d: t(d, 4), "y": lambda d: t(d, 1)}, [("y",)]),
    "sum of list mixed 0-dim": (lambda a: sum([a["x"], a["y"]]), {"x": lambda d: scalar(d), "y": lambda d: scalar(d)}, [("y",), ("x",)]),
    "python float of cuda 0-dim": (lambda a: float(a["x"]), {"x": lambda d: scalar(d)}, [()]),
    "tensor.to same device non_blocking then add": (lambda a: a["x"].to(a["y"].device, non_blocking=True) + a["y"], {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4)}, [("x",)]),
    "where python scalar": (lambda a: torch.where(a["c"], a["x"], 0.0), {"c": lambda d: t(d, 4, kind="b"), "x": lambda d: t(d, 4)}, [("c",)]),
    "cumsum dtype": (lambda a: torch.cumsum(a["x"], 0, dtype=torch.float64), {"x": lambda d: t(d, 4)}, [()]),
    "complex mul": (lambda a: a["x"] * a["y"], {"x": lambda d: torch.randn(4, dtype=torch.complex64, device=d), "y": lambda d: torch.randn(4, dtype=torch.complex64, device=d)}, [("y",)]),
    "half add float cpu 0-dim": (lambda a: a["x"] + a["y"], {"x": lambda d: torch.randn(4, dtype=torch.float16, device=d), "y": lambda d: scalar(d)}, [("y",)]),
})


def _adam_step(a):
    p = a["p"]
    p.grad = torch.ones_like(p)
    opt = torch.optim.Adam([p])
    opt.step()
    opt.state[p]["exp_avg"] = a["s"].clone()
    opt.state[p]["exp_avg_sq"] = a["s"].clone().abs()
    opt.step()


def _clip(a):
    a["p"].grad = torch.ones_like(a["p"])
    a["q"].grad = torch.ones_like(a["q"])
    return torch.nn.utils.clip_grad_norm_([a["p"], a["q"]], 1.0)



VERIFIED_CASES = dict(CASES)

GROWN_CASES: dict[str, Any] = {}
"""Cases generated beyond the verified ones (see :func:`_grow`); unverified until a GPU runs them."""


# -- running a variant on a real device -----------------------------------------------------------
def run_variant(fn, builders, cpu_args):
    args = {k: b("cpu" if k in cpu_args else C) for k, b in builders.items()}
    syncs = []

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            syncs.append(1)

    old = warnings.showwarning
    warnings.showwarning = show
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            if DEBUG:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                fn(args)
                if DEBUG:
                    torch.cuda.set_sync_debug_mode("default")
                    torch.cuda.synchronize()
                return {"outcome": "ok", "syncs": len(syncs)}
            except Exception as exc:
                return {"outcome": "raises", "type": type(exc).__name__,
                        "message": (str(exc).splitlines() or [""])[0][:240], "syncs": len(syncs)}
            finally:
                if DEBUG:
                    torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = old


def variants(name: str) -> list[tuple[str, tuple[str, ...]]]:
    """``(label, arguments on the CPU)`` of every row of case ``name``, as the table labels them:
    "all on cuda" first (unless the case has only its written form), then each variant."""
    _, _, listed = {**VERIFIED_CASES, **GROWN_CASES}[name]
    out: list[tuple[str, tuple[str, ...]]] = []
    if listed != [()]:
        out.append(("all on cuda", ()))
    for cpu_args in listed:
        out.append(("cpu: " + ", ".join(cpu_args) if cpu_args else "as written", tuple(cpu_args)))
    return out


def cpu_arguments(case: str, variant: str) -> tuple[str, ...]:
    """The arguments on the CPU in row ``(case, variant)``."""
    return dict(variants(case))[variant]


# -- the replay through placecheck's engines (CPU) ------------------------------------------------
SYNC_CODES = frozenset({"PC204", "PC205"})
"""What a host synchronisation the GPU reports is, among findings: the host waits for the device
(PC204) or a CPU tensor is copied to the device per call (PC205: a blocking host-to-device copy,
which the sync debug mode reports as well)."""
RAISE_CODES = frozenset({"PC201", "PC207"})
"""An op that crashes on the GPU: a device mismatch (PC201) or another error the GPU raises (PC207)."""


@dataclasses.dataclass(frozen=True)
class Replayed:
    """One row replayed through one simulated engine."""

    verdict: str
    """``ok`` or ``raises``, as the table's ``outcome``."""
    synced: bool
    """A host synchronisation was reported (:data:`SYNC_CODES`)."""
    codes: tuple[str, ...]
    """The forward findings' codes, sorted."""


class _Row(nn.Module):
    """A model whose forward runs one row: the CUDA arguments built in forward on the input's device,
    the CPU ones built beforehand and held as a plain attribute, which ``.to()`` leaves on the CPU."""

    def __init__(self, fn: Callable[[dict[str, Any]], Any], builders: dict[str, Any],
                 cpu_args: tuple[str, ...]) -> None:
        super().__init__()
        self.fn, self.builders = fn, builders
        self.on_cpu = {k: builders[k]("cpu") for k in cpu_args}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        args = {k: self.on_cpu[k] if k in self.on_cpu else build(x.device) for k, build in self.builders.items()}
        self.fn(args)
        return x


def replay(case: str, variant: str, engine: str) -> Replayed:
    """Row ``(case, variant)`` audited for ``cuda`` on the CPU with ``engine`` (fake, tagged, auto)."""
    import placecheck

    fn, builders, _ = {**VERIFIED_CASES, **GROWN_CASES}[case]
    cpu_args = cpu_arguments(case, variant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = placecheck.audit(lambda: _Row(fn, builders, cpu_args), "cuda", engine=engine,
                                  inputs=["float32[1]"], select=["PC2"], library_findings=True)
    codes = tuple(sorted({f.code for f in report.findings}))
    raised = bool(RAISE_CODES & set(codes))
    return Replayed("raises" if raised else "ok", bool(SYNC_CODES & set(codes)), codes)
