"""The walk's guarantee: zero findings from PyTorch's own legitimate internals.

Each test builds one model using an internal that a naive walker misreads
(docs/contract.md, "Never a finding") and requires the simulated-CUDA
audit to report nothing. If one of these fails, the fix belongs in walk.py.
Also here: details of findings the fixtures do not pin (counts, bytes, devices).
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.utils.prune
from conftest import TESTS, load_file, walk_findings
from torch.nn.utils import parametrizations, parametrize

import placecheck

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)


def _wrap(*children: nn.Module) -> nn.Module:
    model = nn.Sequential(*children)
    return model


def test_lstm_gru_rnn_flat_weights() -> None:
    # _flat_weights is a plain list of the same Parameter objects, refreshed by their _apply
    model = _wrap(nn.LSTM(4, 8, num_layers=2, bidirectional=True), nn.GRU(8, 8), nn.RNN(8, 8))
    assert walk_findings(model) == []


def test_lstm_with_projection() -> None:
    assert walk_findings(nn.LSTM(4, 8, proj_size=2)) == []


def test_tied_weights() -> None:
    class TiedLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.lm_head = nn.Linear(4, 10, bias=False)
            self.lm_head.weight = self.embed.weight

    assert walk_findings(TiedLM) == []


def test_parametrize_register_parametrization() -> None:
    class Symmetric(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.triu() + x.triu(1).transpose(-1, -2)

    layer = nn.Linear(4, 4)
    parametrize.register_parametrization(layer, "weight", Symmetric())
    assert walk_findings(_wrap(layer)) == []


def test_parametrizations_weight_norm() -> None:
    assert walk_findings(_wrap(parametrizations.weight_norm(nn.Linear(4, 4)))) == []


def test_parametrizations_orthogonal() -> None:
    assert walk_findings(_wrap(parametrizations.orthogonal(nn.Linear(4, 4)))) == []


def test_parametrizations_spectral_norm() -> None:
    assert walk_findings(_wrap(parametrizations.spectral_norm(nn.Linear(4, 4)))) == []


def test_old_style_weight_norm() -> None:
    # keeps weight_g/weight_v as parameters and sets .weight from a forward pre-hook
    with pytest.warns(FutureWarning):
        layer = nn.utils.weight_norm(nn.Linear(4, 4))
    assert walk_findings(_wrap(layer)) == []


def test_old_style_spectral_norm() -> None:
    assert walk_findings(_wrap(nn.utils.spectral_norm(nn.Conv2d(3, 3, 3)))) == []


def test_prune() -> None:
    # weight_orig parameter + weight_mask buffer; .weight recomputed by a pre-hook
    layer = nn.Linear(4, 4)
    nn.utils.prune.l1_unstructured(layer, "weight", amount=0.5)
    nn.utils.prune.random_unstructured(layer, "bias", amount=0.5)
    assert walk_findings(_wrap(layer)) == []


def test_lazy_modules_uninitialised() -> None:
    model = _wrap(nn.LazyLinear(4), nn.LazyConv2d(3, 3))
    assert walk_findings(model) == []


def test_lazy_modules_uninitialised_from_a_factory() -> None:
    assert walk_findings(lambda: _wrap(nn.LazyLinear(4), nn.LazyConv2d(3, 3))) == []


def test_lazy_batchnorm_uninitialised_buffers() -> None:
    # fake tensors cannot dispatch on UninitializedBuffer; engine.move_model empties it first
    assert walk_findings(lambda: _wrap(nn.LazyBatchNorm1d())) == []
    tagged = placecheck.audit(lambda: _wrap(nn.LazyLinear(4), nn.LazyBatchNorm1d()), engine="tagged",
                              select=["PC1"])
    assert not tagged.findings


def test_multihead_attention() -> None:
    model = _wrap(nn.MultiheadAttention(8, 2), nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    assert walk_findings(model) == []


def test_transformer_encoder() -> None:
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)
    assert walk_findings(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)) == []


def test_transformer() -> None:
    model = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=16)
    assert walk_findings(model) == []


def test_batchnorm_num_batches_tracked() -> None:
    model = _wrap(nn.BatchNorm1d(4), nn.BatchNorm2d(4), nn.SyncBatchNorm(4), nn.InstanceNorm1d(4,
                  track_running_stats=True))
    assert walk_findings(model) == []


def _greet(x: int) -> int:
    return x


class WithPlainAttributes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.n_layers = 2
        self.scale = 0.5
        self.name = "encoder"
        self.flag = True
        self.nothing = None
        self.device_hint = torch.device("cpu")
        self.dtype_hint = torch.float16
        self.shape = torch.Size([2, 3])
        self.table = np.zeros((3, 3))
        self.fn = _greet
        self.lam = lambda x: x
        self.act = torch.relu
        self.kind = nn.Linear
        self.mod = types
        self.tokenizer = {"vocab": {"a": 0, "b": 1}, "bos": "<s>", "special": ["<s>", "</s>"]}
        self.sizes = (1, 2, 3)
        self.ids = range(4)


def test_non_tensor_attributes() -> None:
    assert walk_findings(WithPlainAttributes) == []


class _RaisingGetattr:
    __slots__ = ("unset",)

    def __getattr__(self, name: str) -> object:
        raise RuntimeError("a helper whose __getattr__ raises")


class _InventsAttributes:
    def __getattr__(self, name: str) -> object:
        return _InventsAttributes()  # a proxy: every attribute exists


class WithOddObjects(nn.Module):
    def __init__(self) -> None:
        import enum
        import functools
        import io
        import logging
        import re
        import threading
        import weakref

        super().__init__()
        self.proj = nn.Linear(2, 2)
        self.generator = torch.Generator()
        self.lock = threading.Lock()
        self.log = logging.getLogger("placecheck-test")
        self.pattern = re.compile("a+")
        self.mode = enum.Enum("Mode", "TRAIN EVAL").TRAIN
        self.stream = io.StringIO()
        self.scalar = np.float32(1.0)
        self.raising = _RaisingGetattr()
        self.proxy = _InventsAttributes()
        self.ref = weakref.ref(self.proj)
        self.bound = functools.partial(print, "x")
        self.finfo = torch.finfo(torch.float32)


def test_odd_objects_neither_crash_nor_report() -> None:
    assert walk_findings(WithOddObjects) == []


def test_plain_list_aliasing_registered_modules() -> None:
    class Aliased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
            self.layer_list = list(self.layers)
            self.by_name = {"first": self.layers[0]}

    assert walk_findings(Aliased) == []


def test_plain_list_aliasing_registered_parameters() -> None:
    # on a real GPU .to() keeps each Parameter object and swaps its data: the alias follows
    class Aliased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.params = [self.proj.weight, self.proj.bias]
            self.named = {"w": self.proj.weight}

    assert walk_findings(Aliased) == []


def test_bound_method_and_hooks_are_not_walked() -> None:
    class Hooked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.callback = self.proj.forward
            self.proj.register_forward_hook(lambda m, i, o: o)

    assert walk_findings(Hooked) == []


# -- details the fixtures do not pin -----------------------------------------------------


def test_unregistered_module_counts_its_tensors_once() -> None:
    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(4, 4)
            self.heads = [nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))]

    report = placecheck.audit(Heads, device="cuda", engine="fake")
    (finding,) = report.findings
    assert (finding.code, finding.where) == ("PC102", "heads[0]")
    # Linear weight+bias (4*3+3 floats), BatchNorm weight, bias, running mean/var (4*3 floats)
    # and num_batches_tracked (one int64)
    assert finding.count == 7
    assert finding.nbytes == (12 + 3 + 12) * 4 + 8
    assert finding.device == "cpu" and finding.expected == "cuda:0"
    assert "nn.ModuleList" in finding.hint


def test_stray_tensor_finding_carries_dtype_shape_bytes_and_hint() -> None:
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.mask = torch.ones(3, 5, dtype=torch.float16)

    (finding,) = placecheck.audit(Masked, device="cuda", engine="fake").findings
    assert finding.code == "PC101" and finding.kind == "stray-tensor"
    assert (finding.dtype, finding.shape, finding.nbytes) == ("float16", (3, 5), 30)
    assert (finding.device, finding.expected, finding.module) == ("cpu", "cuda:0", "")
    assert 'register_buffer("mask"' in finding.hint and "persistent=False" in finding.hint


def test_parameter_in_plain_list_hint_names_parameterlist() -> None:
    class Scales(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.scales = [nn.Parameter(torch.ones(2))]

    (finding,) = placecheck.audit(Scales, device="cuda", engine="fake").findings
    assert finding.code == "PC103" and "nn.ParameterList" in finding.hint


def test_on_the_cpu_target_a_plain_tensor_is_fine_but_unregistered_modules_and_parameters_are_not() -> None:
    # everything starts on cpu: .to("cpu") leaves nothing behind, but state_dict() and the
    # optimizer miss modules and parameters in plain containers on any device
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask = torch.ones(2)
            self.heads = [nn.Linear(2, 2)]
            self.scales = [nn.Parameter(torch.ones(2))]

    assert walk_findings(Masked, device="cpu") == [("PC102", "heads[0]"), ("PC103", "scales[0]")]
    report = placecheck.audit(Masked, device="cpu", select=["PC1"], forward=False)
    for finding in report.findings:
        assert finding.severity == "error" and finding.device == finding.expected == "cpu"
        assert "not in state_dict() and not handed to the optimizer" in finding.message
        assert "stay" not in finding.message  # nothing is left off the device
    assert report.bytes_off_device() == 0


def test_walk_result_records_origins_for_the_forward_pass() -> None:
    from placecheck.checks.walk import Snapshot, walk

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask = torch.ones(4)
            self.cache = {"k": torch.zeros(2)}

    model = Masked()
    result = walk(model, "cuda:0", Snapshot.take(model))
    assert result.origins[id(model.mask)] == "mask"
    assert result.origins[id(model.cache["k"])] == "cache['k']"
    view = model.mask[:2]
    assert result.storages[view.untyped_storage().data_ptr()] == "mask"
    assert result.finding_by_origin["mask"].code == "PC101"


def test_unregistered_module_with_back_reference_counts_only_its_own_tensors() -> None:
    model = load_file(TESTS / "fixtures" / "walk" / "module_in_list_backref.py")
    report = placecheck.audit(model, device="cuda", engine="fake")
    (head,) = [f for f in report.findings if f.code == "PC102"]
    assert (head.where, head.count, head.nbytes) == ("heads[0]", 2, (4 * 2 + 2) * 4)


class _Node:
    """A linked-list node of a plain helper object, holding one stray tensor."""

    def __init__(self, nxt: object) -> None:
        self.nxt = nxt
        self.t = torch.ones(1)


class _Chain(nn.Module):
    """``length`` helper objects, each inside the previous: as deep as the walk may have to go."""

    def __init__(self, length: int) -> None:
        super().__init__()
        node: object = None
        for _ in range(length):
            node = _Node(node)
        self.chain = node


def test_depth_limit_is_a_note_naming_the_path() -> None:
    from placecheck.checks.walk import MAX_DEPTH, Snapshot, walk

    short = _Chain(12)
    assert walk(short, "cuda:0", Snapshot.take(short)).notes == []
    long = _Chain(MAX_DEPTH + 5)
    result = walk(long, "cuda:0", Snapshot.take(long))
    assert len(result.findings) == MAX_DEPTH  # one tensor per node the walk reached
    (note,) = result.notes
    assert f"stopped {MAX_DEPTH} containers deep at 'chain" in note and "not checked" in note


def test_set_members_are_reported_in_the_same_order_whatever_their_ids() -> None:
    def audit_bag(order: list[int]) -> list[tuple[str, str]]:
        shapes = [(1,), (2,), (3,), (2, 2), (5,)]

        class Bag(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.proj = nn.Linear(2, 2)
                padding = [torch.ones(1) for _ in range(order[0] * 3)]  # shifts the ids
                self.bag = set()
                for i in order:
                    self.bag.add(torch.ones(shapes[i]))
                del padding

        report = placecheck.audit(Bag, device="cuda", engine="fake", forward=False)
        return [(f.where, f.message) for f in report.findings]

    runs = [audit_bag(order) for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3],
                                           [3, 4, 0, 2, 1])]
    assert all(run == runs[0] for run in runs), runs
    assert [w for w, _ in runs[0]] == [f"bag{{{i}}}" for i in range(5)]


def test_tensor_shared_with_an_unregistered_module_counts_once_in_the_summary() -> None:
    double = load_file(TESTS / "fixtures" / "walk" / "shared_with_unregistered_module.py")
    report = placecheck.audit(double, device="cuda", engine="fake", forward=False)
    assert report.bytes_off_device() == 100 * 4 + (4 + 2) * 4
    assert report.summary()["bytes_off_device"] == 424


def test_zero_dim_stray_is_a_warning_but_rules_keep_the_default() -> None:
    from placecheck.findings.rules import rule

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)
            self.scale = torch.tensor(0.5)

    (finding,) = placecheck.audit(Scaled, device="cuda", engine="fake", forward=False).findings
    assert (finding.code, finding.severity.value) == ("PC101", "warning")
    assert "does not raise" in finding.message
    assert rule("PC101").severity.value == "error"


def test_class_level_tensor_shared_by_instances_is_reported_once() -> None:
    class WithTable(nn.Module):
        table = torch.arange(4)

        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = WithTable()
            self.b = WithTable()

    assert walk_findings(Pair) == [("PC101", "a.table")]


def test_class_attributes_of_torch_classes_are_not_walked() -> None:
    # nn.Module and its library subclasses carry class-level state (_version, __constants__, ...)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.LSTM(4, 4), nn.MultiheadAttention(4, 2))
    assert walk_findings(model) == []


def test_depth_limit_note_reaches_the_report() -> None:
    from placecheck.checks.walk import MAX_DEPTH

    report = placecheck.audit(_Chain(MAX_DEPTH + 5), device="cuda", engine="fake", forward=False)
    assert [n for n in report.notes if n.startswith("walk: stopped")], report.notes
