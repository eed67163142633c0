"""The truth table: which ops accept which tensor argument on the CPU while the rest are on CUDA,
which raise, and which make the host wait, as a real GPU says; and its replay through placecheck's
simulated engines on the CPU.

Each case is an op with named tensor arguments and its variants: every variant runs it with all
arguments on CUDA except those it lists as on the CPU. On a CUDA machine :func:`main` runs every
variant and records PyTorch's verdict (``ok`` or ``raises`` with the exception's type and first
line) and how many host synchronisations ``torch.cuda.set_sync_debug_mode("warn")`` reported.

Two families of cases; every row's ``verified_on`` names the GPU, torch and date of its verdict:

- :data:`VERIFIED_CASES`, exactly the cases first run on an NVIDIA H100 (torch 2.11.0+cu130,
  2026-11-25: their rows' ``first_verified_on``), then again on an NVIDIA H200 (2026-11-27), which
  gave each the same verdict. Do not edit one: its GPU verdict would no longer describe it. A changed
  case is a new case.
- :data:`GROWN_CASES`, generated to cover the aten ops the zoos and training loops call (losses,
  optimizers' foreach and fused steps, DataLoader pinning, generators, copies and non_blocking,
  indexing with CPU indices and masks, ops that need CPU arguments), first run on the H200. A case
  added here has rows with ``verified_on: null`` and no verdict until a GPU runs it; the replay test
  skips those.

    python benchmarks/mix_table.py                  # on a GPU: writes tests/data/mix-table.json
    MIX_DEVICE=cpu python benchmarks/mix_table.py   # a dry run of every case on the CPU, writes nothing
    python benchmarks/mix_table.py --replay         # the replay through the engines (CPU), a summary

Without a GPU (and without ``MIX_DEVICE=cpu``) it says so and exits 0: the committed table stands.
:func:`replay` runs one row through a simulated engine; ``tests/test_mix_table.py`` holds every
verified row to the GPU's verdict, and :data:`placecheck.basics.limits.LIMITS` lists the rows that differ.
"""
# ruff: noqa: E501, E731  (one case a line: the table reads as a table)

from __future__ import annotations

import argparse
import contextlib
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


def _grow() -> dict[str, Any]:
    """Families of cases beyond the verified ones: each binary, in-place, loss, matmul, norm, indexing,
    optimizer, foreach, generator, copy and CPU-argument op the zoos and training loops call, with the
    argument placements that matter (a full CPU tensor, a 0-dim CPU tensor, a CPU self of an in-place op)."""
    x44 = lambda d: t(d, 4, 4)
    cases: dict[str, Any] = {}
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "true_divide": torch.true_divide,
              "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
              "atan2": torch.atan2, "fmod": torch.fmod, "remainder": torch.remainder, "hypot": torch.hypot,
              "copysign": torch.copysign, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
              "ge": torch.ge, "logaddexp": torch.logaddexp, "logaddexp2": torch.logaddexp2, "xlogy": torch.xlogy,
              "floor_divide": torch.floor_divide, "nextafter": torch.nextafter, "heaviside": torch.heaviside,
              "float_power": torch.float_power, "rsub": torch.rsub, "ldexp": torch.ldexp, "igamma": torch.igamma}
    for n, f in binary.items():
        cases[f"grown {n}"] = (lambda a, f=f: f(a["x"], a["y"]), {"x": x44, "y": x44}, [("y",), ("x",)])
        cases[f"grown {n} 0-dim other"] = (lambda a, f=f: f(a["x"], a["y"]), {"x": x44, "y": lambda d: scalar(d)}, [("y",)])
        cases[f"grown {n} 0-dim self"] = (lambda a, f=f: f(a["y"], a["x"]), {"x": x44, "y": lambda d: scalar(d)}, [("y",)])
    for n in ["add_", "sub_", "mul_", "div_", "pow_", "maximum", "fmod_", "remainder_", "copysign_", "atan2_", "hypot_",
              "lerp_", "clamp_", "clamp_min_", "clamp_max_", "fill_", "masked_fill_", "__iadd__", "__isub__", "__imul__",
              "__itruediv__"]:
        call = {"lerp_": lambda x, y: x.lerp_(y, 0.5), "clamp_": lambda x, y: x.clamp_(min=y),
                "masked_fill_": lambda x, y: x.masked_fill_(x > 0, y), "fill_": lambda x, y: x.fill_(y)}.get(
                    n, lambda x, y, n=n: getattr(x, n)(y))
        cases[f"grown in-place {n} 0-dim other"] = (lambda a, c=call: c(a["x"], a["y"]), {"x": lambda d: t(d, 4), "y": lambda d: scalar(d)}, [("y",)])
        cases[f"grown in-place {n} into 0-dim self"] = (lambda a, c=call: c(a["x"], a["y"]), {"x": lambda d: scalar(d), "y": lambda d: scalar(d)}, [("x",)])
    for n, f in {"clamp min": lambda a: torch.clamp(a["x"], min=a["y"]), "clamp max": lambda a: torch.clamp(a["x"], max=a["y"]),
                 "clip": lambda a: torch.clip(a["x"], a["y"], None), "clamp_min": lambda a: torch.clamp_min(a["x"], a["y"]),
                 "where other": lambda a: torch.where(a["x"] > 0, a["x"], a["y"]), "lerp weight": lambda a: torch.lerp(a["x"], a["x"], a["y"]),
                 "addcmul value tensor": lambda a: torch.addcmul(a["x"], a["x"], a["y"]), "addcdiv": lambda a: torch.addcdiv(a["x"], a["x"], a["y"].abs() + 1),
                 "masked_fill value": lambda a: a["x"].masked_fill(a["x"] > 0, a["y"]), "cat 0-dim": lambda a: torch.cat([a["x"].flatten(), a["y"].reshape(1)]),
                 "stack 0-dim": lambda a: torch.stack([a["x"].sum(), a["y"]]), "hstack 0-dim": lambda a: torch.hstack([a["x"].sum().reshape(1), a["y"].reshape(1)]),
                 "vstack": lambda a: torch.vstack([a["x"], a["y"].expand(4, 4)]), "full_like fill": lambda a: torch.full_like(a["x"], a["y"].item()),
                 "mul scalar tensor of grad": lambda a: a["x"] * a["y"]}.items():
        cases[f"grown scalar {n}"] = (f, {"x": lambda d: t(d, 4, 4), "y": lambda d: scalar(d, 0.5)}, [("y",)])
    losses = {"mse": F.mse_loss, "l1": F.l1_loss, "smooth_l1": F.smooth_l1_loss, "huber": F.huber_loss,
              "soft_margin": F.soft_margin_loss, "bce_logits": F.binary_cross_entropy_with_logits,
              "multilabel_soft_margin": F.multilabel_soft_margin_loss, "poisson_nll": F.poisson_nll_loss,
              "hinge_embedding": F.hinge_embedding_loss, "kl_div": lambda x, y: F.kl_div(x, y, reduction="batchmean"),
              "bce": lambda x, y: F.binary_cross_entropy(x.sigmoid(), y.sigmoid()),
              "gaussian_nll": lambda x, y: F.gaussian_nll_loss(x, y, torch.ones_like(x))}
    for n, f in losses.items():
        cases[f"grown loss {n}"] = (lambda a, f=f: f(a["x"], a["y"]), {"x": lambda d: t(d, 4, 3), "y": lambda d: t(d, 4, 3)}, [("y",), ("x",)])
        cases[f"grown loss {n} backward"] = (lambda a, f=f: f(a["x"].requires_grad_(), a["y"]).backward(), {"x": lambda d: t(d, 4, 3), "y": lambda d: t(d, 4, 3)}, [("y",)])
    for n, f in {"cross_entropy": F.cross_entropy, "nll": lambda x, y: F.nll_loss(x.log_softmax(-1), y),
                 "multi_margin": F.multi_margin_loss, "cross_entropy ignore": lambda x, y: F.cross_entropy(x, y, ignore_index=0)}.items():
        cases[f"grown class loss {n}"] = (lambda a, f=f: f(a["x"], a["y"]), {"x": lambda d: t(d, 4, 3), "y": lambda d: t(d, 4, kind="i", hi=3)}, [("y",), ("x",)])
    cases["grown triplet"] = (lambda a: F.triplet_margin_loss(a["x"], a["y"], a["z"]), {"x": x44, "y": x44, "z": x44}, [("y",), ("z",)])
    mats = {"mm": lambda a: torch.mm(a["x"], a["y"]), "addmm": lambda a: torch.addmm(a["x"], a["x"], a["y"]),
            "addmv": lambda a: torch.addmv(a["x"][0], a["x"], a["y"][0]), "addr": lambda a: torch.addr(a["x"], a["y"][0], a["y"][1]),
            "chain_matmul": lambda a: torch.linalg.multi_dot([a["x"], a["y"]]), "linalg.solve": lambda a: torch.linalg.solve(a["x"] + 4 * torch.eye(4, device=a["x"].device), a["y"]),
            "cdist": lambda a: torch.cdist(a["x"], a["y"]), "cosine_similarity": lambda a: F.cosine_similarity(a["x"], a["y"]),
            "pairwise_distance": lambda a: F.pairwise_distance(a["x"], a["y"]), "bilinear": lambda a: F.bilinear(a["x"], a["x"], a["y"].unsqueeze(0)),
            "F.linear bias only": lambda a: F.linear(a["x"], a["x"], a["y"][0])}
    for n, f in mats.items():
        cases[f"grown matmul {n}"] = (f, {"x": x44, "y": x44}, [("y",), ("x",)])
    layers = {"conv2d bias": lambda a: F.conv2d(a["x"].reshape(1, 1, 4, 4), a["w"][:2, :2].reshape(1, 1, 2, 2), a["b"][:1, 0]),
              "instance_norm weight": lambda a: F.instance_norm(a["x"].reshape(1, 4, 4), weight=a["w"][0], bias=a["b"][0]),
              "layer_norm bias": lambda a: F.layer_norm(a["x"], (4,), a["w"][0], a["b"][0]),
              "embedding weight": lambda a: F.embedding(torch.tensor([0, 1], device=a["x"].device), a["w"]),
              "sdpa float mask": lambda a: F.scaled_dot_product_attention(a["x"][None, None], a["x"][None, None], a["x"][None, None], attn_mask=a["b"]),
              "prelu": lambda a: F.prelu(a["x"], a["w"][0, :1]), "glu": lambda a: F.glu(torch.cat([a["x"], a["w"]], 1)),
              "dropout train": lambda a: F.dropout(a["x"], 0.5, training=True) + a["b"],
              "lstm h0": lambda a: nn.LSTM(4, 4).to(a["x"].device)(a["x"].unsqueeze(1), (a["w"][:1, None], a["b"][:1, None])),
              "gru h0": lambda a: nn.GRU(4, 4).to(a["x"].device)(a["x"].unsqueeze(1), a["w"][:1, None])}
    for n, f in layers.items():
        cases[f"grown layer {n}"] = (f, {"x": x44, "w": x44, "b": x44}, [("w",), ("b",), ("w", "b")])
    index = {"getitem long": lambda a: a["x"][a["i"]], "getitem bool": lambda a: a["x"][a["m"]],
             "getitem long 2nd dim": lambda a: a["x"][:, a["i"]], "getitem ellipsis": lambda a: a["x"][..., a["i"]],
             "setitem long value": lambda a: a["x"].__setitem__(a["i"], a["v"][:3]), "setitem bool scalar": lambda a: a["x"].__setitem__(a["m"], 0.0),
             "setitem bool tensor value": lambda a: a["x"].__setitem__(a["m"], a["v"][0, 0]),
             "index_put accumulate": lambda a: a["x"].index_put_((a["i"],), a["v"][:3], accumulate=True),
             "take": lambda a: torch.take(a["x"], a["i"]), "index_select dim1": lambda a: a["x"].index_select(1, a["i"]),
             "gather dim0": lambda a: a["x"].gather(0, a["i"].expand(4, 3)[:3]), "masked_select": lambda a: a["x"].masked_select(a["m"]),
             "nonzero of mask then index": lambda a: a["x"][a["m"].nonzero(as_tuple=True)], "where mask": lambda a: torch.where(a["m"], a["x"], 0.0),
             "index_add": lambda a: a["x"].index_add(0, a["i"], a["v"][:3]), "scatter_reduce sum": lambda a: a["x"].scatter_reduce(0, a["i"].expand(4, 3)[:3].clamp(max=3), a["v"][:3, :3], "sum"),
             "index_fill": lambda a: a["x"].index_fill(0, a["i"], 1.0), "list of tensors index": lambda a: a["x"][[a["i"], a["i"]]]}
    for n, f in index.items():
        cases[f"grown index {n}"] = (f, {"x": x44, "i": lambda d: torch.tensor([0, 2, 3], device=d), "m": lambda d: t(d, 4, 4, kind="b"), "v": x44}, [("i",), ("m",), ("v",), ("x",)])
    for n in ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD"]:
        for foreach in (False, True):
            cases[f"grown optim {n} foreach={foreach}"] = (lambda a, n=n, fe=foreach: _optim_step(n, a, foreach=fe), {"p": lambda d: t(d, 4), "g": lambda d: t(d, 4), "s": lambda d: t(d, 4)}, [("g",), ("s",), ("p",)])
    for n in ["SGD", "Adam", "AdamW", "Adagrad"]:
        cases[f"grown optim {n} fused"] = (lambda a, n=n: _optim_step(n, a, fused=True), {"p": lambda d: t(d, 4), "g": lambda d: t(d, 4), "s": lambda d: t(d, 4)}, [("g",), ("s",), ("p",)])
    foreach = {"add_ list": lambda a: torch._foreach_add_([a["x"], a["y"]], [a["u"], a["v"]]),
               "mul_ scalar tensor": lambda a: torch._foreach_mul_([a["x"], a["y"]], a["s"]),
               "lerp_": lambda a: torch._foreach_lerp_([a["x"], a["y"]], [a["u"], a["v"]], 0.5),
               "addcmul_": lambda a: torch._foreach_addcmul_([a["x"], a["y"]], [a["u"], a["v"]], [a["u"], a["v"]]),
               "norm": lambda a: torch._foreach_norm([a["x"], a["y"]]), "sqrt": lambda a: torch._foreach_sqrt([a["x"].abs(), a["y"].abs()]),
               "copy_": lambda a: torch._foreach_copy_([a["x"], a["y"]], [a["u"], a["v"]]),
               "clip_grad_norm_ foreach": lambda a: _clip_lists(a, foreach=True), "clip_grad_norm_ loop": lambda a: _clip_lists(a, foreach=False),
               "clip_grad_value_": lambda a: _clip_lists(a, value=True)}
    for n, f in foreach.items():
        cases[f"grown foreach {n}"] = (f, {"x": lambda d: t(d, 4), "y": lambda d: t(d, 4), "u": lambda d: t(d, 4), "v": lambda d: t(d, 4), "s": lambda d: scalar(d)}, [("v",), ("y", "v"), ("s",), ("x", "y", "u", "v")])
    gens = {"randn": lambda g: torch.randn(4, device=C, generator=g), "rand": lambda g: torch.rand(4, device=C, generator=g),
            "randint": lambda g: torch.randint(0, 4, (4,), device=C, generator=g), "randperm": lambda g: torch.randperm(4, device=C, generator=g),
            "normal_": lambda g: torch.empty(4, device=C).normal_(generator=g), "uniform_": lambda g: torch.empty(4, device=C).uniform_(generator=g),
            "bernoulli": lambda g: torch.bernoulli(torch.full((4,), 0.5, device=C), generator=g), "bernoulli_": lambda g: torch.empty(4, device=C).bernoulli_(0.5, generator=g),
            "multinomial": lambda g: torch.multinomial(torch.ones(4, device=C), 2, generator=g), "exponential_": lambda g: torch.empty(4, device=C).exponential_(generator=g),
            "geometric_": lambda g: torch.empty(4, device=C).geometric_(0.5, generator=g), "cauchy_": lambda g: torch.empty(4, device=C).cauchy_(generator=g),
            "log_normal_": lambda g: torch.empty(4, device=C).log_normal_(generator=g), "random_": lambda g: torch.empty(4, device=C).random_(generator=g),
            "poisson": lambda g: torch.poisson(torch.ones(4, device=C), generator=g), "normal tensors": lambda g: torch.normal(torch.zeros(4, device=C), torch.ones(4, device=C), generator=g),
            "randn_like no generator": lambda g: torch.randn_like(torch.zeros(4, device=C)), "cpu op cuda generator": lambda g: torch.randn(4, generator=g)}
    for n, f in gens.items():
        cases[f"grown generator {n} cpu generator"] = (lambda a, f=f: f(torch.Generator().manual_seed(0)), {}, [()])
        cases[f"grown generator {n} device generator"] = (lambda a, f=f: f(torch.Generator(device=C).manual_seed(0)), {}, [()])
    copies = {"to cpu": lambda a: a["x"].to("cpu"), "to cpu non_blocking": lambda a: a["x"].to("cpu", non_blocking=True),
              "to cpu non_blocking then read": lambda a: a["x"].to("cpu", non_blocking=True).tolist(),
              "cpu()": lambda a: a["x"].cpu(), "cuda() pageable": lambda a: a["y"].to(C), "cuda() pinned non_blocking": lambda a: a["y"].pin_memory().to(C, non_blocking=True) if C != "cpu" else a["y"],
              "copy_ non_blocking d2h": lambda a: a["y"].copy_(a["x"], non_blocking=True), "copy_ h2d": lambda a: a["x"].copy_(a["y"]),
              "pin_memory cpu": lambda a: a["y"].pin_memory() if C != "cpu" else a["y"], "pin_memory device": lambda a: a["x"].pin_memory(),
              "numpy": lambda a: a["x"].numpy(), "item": lambda a: a["x"][0].item(), "tolist": lambda a: a["x"].tolist(),
              "float()": lambda a: float(a["x"][0]), "int()": lambda a: int(a["x"][0]), "bool()": lambda a: bool(a["x"][0] > 0),
              "torch.tensor of device": lambda a: torch.tensor([a["x"][0], a["x"][1]]), "as_tensor to device": lambda a: torch.as_tensor(a["y"], device=C),
              "type_as cpu": lambda a: a["x"].type_as(a["y"]), "equal": lambda a: torch.equal(a["x"], a["x"]),
              "allclose": lambda a: torch.allclose(a["x"], a["x"]), "print": lambda a: repr(a["x"])}
    for n, f in copies.items():
        cases[f"grown copy {n}"] = (f, {"x": lambda d: t(d, 4), "y": lambda d: torch.randn(4)}, [()])
    cases["grown dataloader pin_memory device dataset"] = (lambda a: next(iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(a["x"]), batch_size=2, pin_memory=C != "cpu"))), {"x": lambda d: t(d, 4, 2)}, [(), ("x",)])
    host_args = {"pack_padded sorted": lambda a: pack_padded_sequence(a["x"], a["l"], batch_first=True),
                 "pack_padded unsorted": lambda a: pack_padded_sequence(a["x"], a["l"].flip(0), batch_first=True, enforce_sorted=False),
                 "ctc_loss lengths": lambda a: F.ctc_loss(a["x"].log_softmax(2).transpose(0, 1), torch.ones(3, 2, dtype=torch.long, device=a["l"].device), a["l"], torch.full((3,), 2, device=a["l"].device)),
                 "tensor_split indices": lambda a: torch.tensor_split(a["x"], a["l"][1:] - 1),
                 "repeat_interleave output_size": lambda a: torch.repeat_interleave(a["x"], a["l"], dim=0, output_size=10),
                 "bincount minlength": lambda a: torch.bincount(a["l"], minlength=6), "histc": lambda a: torch.histc(a["x"], bins=4, min=-1, max=1),
                 "bucketize": lambda a: torch.bucketize(a["x"], a["l"].float()), "searchsorted": lambda a: torch.searchsorted(a["l"].sort().values, a["l"]),
                 "embedding_bag offsets": lambda a: F.embedding_bag(a["l"], a["x"].reshape(-1, 4), torch.tensor([0, 1], device=a["l"].device)),
                 "one_hot": lambda a: F.one_hot(a["l"], 6), "sparse_coo indices": lambda a: torch.sparse_coo_tensor(a["l"][None, :2].clamp(max=1), a["x"][0, 0, :2], (2,))}
    for n, f in host_args.items():
        cases[f"grown host argument {n}"] = (f, {"x": lambda d: t(d, 3, 5, 4), "l": lambda d: torch.tensor([5, 3, 2], device=d)}, [("l",), ("x",)])
    return cases


def _optim_step(name: str, a: dict[str, Any], **options: Any) -> None:
    p = torch.nn.Parameter(a["p"].clone())
    p.grad = a["g"].clone()
    opt = getattr(torch.optim, name)([p], lr=0.1, **options)
    opt.step()
    for key, value in list(opt.state[p].items()):
        if isinstance(value, torch.Tensor) and value.shape == p.shape:
            opt.state[p][key] = a["s"].clone().abs()
    p.grad = a["g"].clone()
    opt.step()


def _clip_lists(a: dict[str, Any], foreach: bool = False, value: bool = False) -> Any:
    ps = [torch.nn.Parameter(a[k].clone()) for k in ("x", "y")]
    for p, k in zip(ps, ("u", "v"), strict=True):
        p.grad = a[k].clone()
    if value:
        return torch.nn.utils.clip_grad_value_(ps, 1.0)
    return torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=foreach)


GROWN_CASES.update(_grow())


# -- running a variant on a real device -----------------------------------------------------------
@contextlib.contextmanager
def fresh_process_defaults():
    """The process-wide settings a fresh process starts with, for the block: a row's verdict must not
    depend on what ran before it. ``torch.compile``'s first call turns off the argument checks of
    ``torch.distributions`` for the rest of the process (TorchDynamo's ``TorchPatcher``), and with them
    the host syncs those checks make; a script that ``placecheck run`` ran in this process may have
    compiled."""
    validate = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(__debug__)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(validate)


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
                with fresh_process_defaults():
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
SYNC_CODES = frozenset({"PC202", "PC204", "PC205"})
"""What a host synchronisation the GPU reports is, among findings: the host waits for the device
(PC204), or a CPU tensor is copied to the device per call (PC205: a blocking host-to-device copy, which
the sync debug mode reports as well), or a tensor the row creates on the host is copied to the device
(PC202: "a host allocation and a blocking host-to-device copy on every call"; the rows' CPU arguments are
attributes, never created in forward, so a PC202 here is the row's own host tensor: ``y.to("cuda")``,
``torch.as_tensor(y, device="cuda")``, a layer built in forward and moved)."""
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
    says: tuple[str, ...] = ()
    """What the PC201 findings quote PyTorch as raising on a GPU (their messages' "this raises '...'")."""


_QUOTE = "this raises '"


class _Row(nn.Module):
    """A model whose forward runs one row: the CUDA arguments built in forward on the input's device,
    the CPU ones built beforehand and held as a plain attribute, which ``.to()`` leaves on the CPU."""

    def __init__(self, fn: Callable[[dict[str, Any]], Any], builders: dict[str, Any],
                 cpu_args: tuple[str, ...]) -> None:
        super().__init__()
        self.fn, self.builders = fn, builders
        self.on_cpu = {k: builders[k]("cpu") for k in cpu_args}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the GPU ran each row with autograd on (the loss rows call backward()); an audit's forward runs
        # under no_grad, so the row turns it back on
        with torch.enable_grad():
            args = {k: self.on_cpu[k] if k in self.on_cpu else build(x.device) for k, build in self.builders.items()}
            self.fn(args)
        return x


def replay(case: str, variant: str, engine: str) -> Replayed:
    """Row ``(case, variant)`` audited for ``cuda`` on the CPU with ``engine`` (fake, tagged, auto)."""
    import placecheck

    fn, builders, _ = {**VERIFIED_CASES, **GROWN_CASES}[case]
    cpu_args = cpu_arguments(case, variant)
    with warnings.catch_warnings(), fresh_process_defaults():
        warnings.simplefilter("ignore")
        report = placecheck.audit(lambda: _Row(fn, builders, cpu_args), "cuda", engine=engine,
                                  inputs=["float32[1]"], select=["PC2"], library_findings=True)
    codes = tuple(sorted({f.code for f in report.findings}))
    raised = bool(RAISE_CODES & set(codes))
    says = tuple(sorted({f.message.split(_QUOTE, 1)[1].removesuffix("'") for f in report.findings
                         if f.code == "PC201" and _QUOTE in f.message}))
    return Replayed("raises" if raised else "ok", bool(SYNC_CODES & set(codes)), codes, says)


# -- the table ------------------------------------------------------------------------------------
def verified_on() -> str:
    """How this machine names a verification: GPU, torch and date."""
    return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {datetime.date.today().isoformat()}"


def generate(cases: dict[str, Any]) -> list[dict[str, Any]]:
    """Every variant of ``cases`` run on this machine's device (``MIX_DEVICE``), one row each."""
    rows = []
    stamp = verified_on() if DEBUG else None
    for name, (fn, builders, _) in cases.items():
        for label, cpu_args in variants(name):
            result = run_variant(fn, builders, cpu_args)
            rows.append({"case": name, "variant": label, "cpu": list(cpu_args), **result, "verified_on": stamp})
            print(f"{name:<44} {label:<22} {result['outcome']:<7} syncs={result['syncs']} "
                  f"{result.get('message', '')[:80]}", file=sys.stderr)
    return rows


def unverified(cases: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of ``cases`` with no verdict yet: no GPU has run them."""
    return [{"case": name, "variant": label, "cpu": list(cpu_args), "outcome": None, "syncs": None,
             "verified_on": None} for name in cases for label, cpu_args in variants(name)]


def load(path: Path = TABLE) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def verified_rows(path: Path = TABLE) -> list[dict[str, Any]]:
    """The rows a GPU has given its verdict on (what the replay test holds the engines to)."""
    return [r for r in load(path)["rows"] if r.get("verified_on")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default=str(TABLE), help="where the table goes (on a GPU)")
    parser.add_argument("--replay", action="store_true", help="replay the verified rows through the engines")
    args = parser.parse_args(argv)
    if args.replay:
        return _print_replay()
    if not DEBUG:
        rows = generate({**VERIFIED_CASES, **GROWN_CASES})
        print(f"dry run on the CPU: {len(rows)} rows, {sum(r['outcome'] == 'raises' for r in rows)} raise here "
              "(every argument is on the CPU: a case that raises is broken); nothing written")
        return 0
    if not torch.cuda.is_available():
        print("the truth table needs a CUDA GPU, and this machine has none: the committed table "
              f"({TABLE.relative_to(ROOT)}) stands. MIX_DEVICE=cpu dry-runs the cases.")
        return 0
    rows = generate({**VERIFIED_CASES, **GROWN_CASES})
    # a row whose verdict the committed table already had keeps the first GPU that gave it
    before = {(r["case"], r["variant"]): r for r in load()["rows"]} if TABLE.exists() else {}
    verdict = ("outcome", "syncs", "type", "message")
    for row in rows:
        old = before.get((row["case"], row["variant"]))
        if old and old.get("verified_on") and all(old.get(k) == row.get(k) for k in verdict):
            row["first_verified_on"] = old.get("first_verified_on") or old["verified_on"]
    payload = {"provenance": {"verified": f"every row: {verified_on()}, by benchmarks/mix_table.py",
                              "first_verified": "first_verified_on: the GPU that first gave a row the same verdict",
                              "torch": "the GPU's; tests/test_mix_table.py replays the rows with the project's torch"},
               "rows": rows}
    Path(args.out).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


def _print_replay() -> int:
    from placecheck.basics.limits import mix_table_limits

    limits = mix_table_limits()
    rows = verified_rows()
    for engine in ("fake", "tagged"):
        differ = [r for r in rows if not agrees(r, replay(r["case"], r["variant"], engine))]
        known = [r for r in differ if (r["case"], r["variant"], engine) in limits]
        print(f"{engine}: {len(rows) - len(differ)} of {len(rows)} verified rows agree with the GPU; "
              f"{len(known)} of the {len(differ)} others documented in placecheck.basics.limits")
    return 0


def agrees(row: dict[str, Any], got: Replayed) -> bool:
    """Same verdict as the GPU, and a host sync reported wherever the GPU reported one."""
    return got.verdict == row["outcome"] and (got.synced or not row["syncs"])


if __name__ == "__main__":
    sys.exit(main())
