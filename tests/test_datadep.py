"""The fake engine runs through data-dependent ops with stated assumptions (placecheck.engines.datadep)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import forward_helpers
import pytest
import torch
import torch.nn as nn
from forward_helpers import BranchesOnAWeight, marked_source
from torch._subclasses.fake_tensor import FakeTensorMode

import placecheck
from placecheck.engines.datadep import DataDependentMode

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

# The CPU-only torch build refuses to create a fake CUDA tensor outright ("not linked with support
# for cuda devices"): these tests make them directly, and the MoE audit stops there before the router.
_NEEDS_FAKE_CUDA_FACTORIES = pytest.mark.skipif(
    torch.version.cuda is None, reason="the CPU-only torch build cannot create fake CUDA tensors directly")

HERE = Path(__file__).name


@pytest.fixture
def mode() -> Iterator[DataDependentMode]:
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake, DataDependentMode(fake) as data_mode:
        yield data_mode


def _unknown(*shape: int) -> torch.Tensor:
    """A fake CUDA tensor whose values nobody knows (as a weight built on meta)."""
    return torch.empty(shape, device="cuda")


@_NEEDS_FAKE_CUDA_FACTORIES
def test_nonzero_and_masks_of_unknown_values_take_the_largest_shape(mode: DataDependentMode) -> None:
    x = _unknown(4, 3)
    assert tuple(x.nonzero().shape) == (12, 2)
    assert tuple(x[x > 0].shape) == (12,)
    assert tuple(x.masked_select(x > 0).shape) == (12,)
    assert [tuple(t.shape) for t in torch.where(x > 0)] == [(12,), (12,)]
    assert tuple(torch.unique(x).shape) == (12,)
    assert tuple(x.repeat_interleave(x[:, 0].long(), dim=0).shape) == (4, 3)  # each count assumed 1
    notes = mode.notes()
    assert any("nonzero()" in n and "every element is nonzero" in n and f"{HERE}:" in n for n in notes)
    assert any("boolean-mask indexing" in n for n in notes)
    assert any("unique()" in n and "distinct" in n for n in notes)
    assert any("repeat_interleave()" in n and "each repeat count is 1" in n for n in notes)


@_NEEDS_FAKE_CUDA_FACTORIES
def test_values_read_from_unknown_tensors_are_representative_and_noted(mode: DataDependentMode) -> None:
    x = _unknown(4, 3)
    assert x.sum().item() == 1.0
    assert int(x.sum()) == 1
    assert x[0].tolist() == [1.0, 1.0, 1.0]
    assert [1, 2, 3][x.long()[0, 0]] == 2  # used as an index
    assert not any(a.branch for a in mode.assumptions)
    if (x > 0).all():  # MARK branch
        pass
    (branch,) = mode.branched()
    assert branch.line.endswith(marked_source(__file__, "MARK branch"))
    assert "a path another value takes was not checked" in branch.note()


@_NEEDS_FAKE_CUDA_FACTORIES
def test_known_values_give_exact_answers_without_assumptions(mode: DataDependentMode) -> None:
    ids = torch.tensor([[5, 0, 7]]).to("cuda")  # from host data: its values are known
    assert (0 in ids[:, [-1, 0]], 5 in ids) == (False, True)
    assert torch.arange(5, device="cuda").sum().item() == 10
    assert ids.nonzero().tolist() == [[0, 0], [0, 2]]
    assert mode.notes() == []


def test_finite_values_are_assumed_so_error_checks_do_not_fire(mode: DataDependentMode) -> None:
    x = _unknown(4, 3)
    assert not bool(torch.isnan(x).any())
    (assumption,) = mode.assumptions
    assert "finite values" in assumption.what and assumption.op == "bool()"


def test_an_unknown_write_forgets_known_values(mode: DataDependentMode) -> None:
    counts = torch.zeros(3, device="cuda", dtype=torch.long)
    assert counts.sum().item() == 0  # known: no assumption
    counts.index_add_(0, torch.tensor([1], device="cuda"), _unknown(1).long())
    counts.sum().item()
    assert any("the value 1" in n for n in mode.notes())  # no longer the stale 0


@_NEEDS_FAKE_CUDA_FACTORIES
def test_an_unknown_write_forgets_every_known_view_of_the_storage(mode: DataDependentMode) -> None:
    counts = torch.zeros(4, device="cuda", dtype=torch.long)
    head = counts[:2]  # a view: its values are known too
    assert head.sum().item() == 0 and not mode.notes()
    counts.add_(_unknown(4).long())  # written with unknown values, through the base
    head.sum().item()
    assert any("the value 1" in n for n in mode.notes())  # the view's stale zeros are gone


class Router(nn.Module):
    """A mixture-of-experts block routed like transformers' Mixtral: nonzero, then an index per expert."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.experts[2].scale = torch.ones(8)  # type: ignore[assignment]  # a stray in one expert

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = self.gate(x).argmax(-1)
        out = torch.zeros_like(x)
        hit = torch.nn.functional.one_hot(chosen, 4).sum(0).nonzero()
        for index in hit:
            expert = self.experts[index]
            rows = (chosen == index).nonzero().squeeze(-1)
            y = expert(x[rows])
            if hasattr(expert, "scale"):
                y = y * expert.scale  # MARK scale
            out.index_add_(0, rows, y)
        return out


@_NEEDS_FAKE_CUDA_FACTORIES
def test_every_expert_runs_under_meta_init_so_a_stray_in_one_is_found() -> None:
    report = placecheck.audit(Router, "cuda", engine="fake", init="meta", inputs=["float32[6,8]"])
    assert not report.incomplete
    assert any("every element is nonzero" in n for n in report.notes)
    mismatches = [f for f in report.findings if f.code == "PC201"]
    assert [f.source.rpartition("/")[2] for f in mismatches] == [marked_source(__file__, "MARK scale")]


def test_a_branch_on_an_assumed_value_keeps_the_summary_from_claiming_everything_ran() -> None:
    # the host sync itself is a PC204; ignored, nothing is left to report for the path that ran
    report = placecheck.audit(BranchesOnAWeight, "cuda", engine="fake", init="meta", inputs=["float32[2,4]"],
                              ignore=["PC204"])
    assert not report.findings and not report.incomplete
    assert dict(report.stats)["assumed_branches"] == 1
    assert report.summary_line().startswith("no placement problems found")
    assert "the code branched on 1 value the simulation assumed, the paths other values take are " \
           "unchecked" in report.summary_line()
    assert any(n.endswith("a path another value takes was not checked") and
               marked_source(forward_helpers.__file__, "MARK weight branch") in n for n in report.notes)
    tagged = placecheck.audit(BranchesOnAWeight, "cuda", engine="tagged", inputs=["float32[2,4]"],
                              ignore=["PC204"])
    assert "assumed_branches" not in dict(tagged.stats) and "assumed" not in tagged.summary_line()


def _transformers() -> Any:
    return pytest.importorskip("transformers")


def _tiny(name: str) -> Any:
    tf = _transformers()
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 1000}
    if name == "bert":
        return lambda: tf.BertModel(tf.BertConfig(intermediate_size=64, **small)).eval()
    if name == "roberta":
        return lambda: tf.RobertaModel(tf.RobertaConfig(intermediate_size=64, **small)).eval()
    if name == "mixtral":
        return lambda: tf.MixtralForCausalLM(tf.MixtralConfig(
            intermediate_size=64, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
            **small)).eval()
    return lambda: tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
        intermediate_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=32,
        num_key_value_heads=1, num_experts=4, num_experts_per_tok=2, **small)).eval()


@pytest.mark.transformers
@pytest.mark.parametrize("name", ["bert", "roberta", "mixtral", "qwen2_moe"])
def test_tiny_configs_run_on_the_fake_engine_with_the_real_valued_engines_findings(name: str) -> None:
    factory = _tiny(name)
    inputs = ["input_ids=int64[1,8]:0..1000"]
    fake = placecheck.audit(factory, "cuda", engine="fake", init="meta", inputs=inputs, library_findings=True)
    assert not fake.incomplete
    assert not any("fake tensors stopped" in n or "checked only up to" in n for n in fake.notes)
    tagged = placecheck.audit(factory, "cuda", engine="tagged", init="cpu", inputs=inputs,
                              library_findings=True)
    assert {(f.code, f.where, f.source) for f in fake.findings} == \
        {(f.code, f.where, f.source) for f in tagged.findings}
    auto = placecheck.audit(factory, "cuda", init="meta", inputs=inputs)
    assert auto.engine == "simulated cuda"  # no fallback to the real-valued engine


@_NEEDS_FAKE_CUDA_FACTORIES
def test_nms_of_unknown_scores_keeps_every_box_and_says_so(mode: DataDependentMode) -> None:
    pytest.importorskip("torchvision")
    from torchvision.ops import nms

    boxes, scores = _unknown(5, 4), _unknown(5)
    kept = nms(boxes, scores, 0.5)
    assert kept.device.type == "cuda" and tuple(kept.shape) == (5,) and kept.dtype == torch.int64
    (assumption,) = [a for a in mode.assumptions if a.op == "nms()"]
    # the line is the innermost frame outside torch: torchvision's nms wrapper, which calls the op
    assert "every box is kept" in assumption.what and "torchvision/ops/boxes.py:" in assumption.line
    # boxes from host data: the real nms runs, no assumption
    mode.reset()
    known = torch.tensor([[0.0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]]).to("cuda")
    assert nms(known, torch.tensor([0.9, 0.8, 0.7]).to("cuda"), 0.5).tolist() == [0, 2]
    assert mode.notes() == []


class SizedByAValue(nn.Module):
    """A size read from a weight-derived value, as torchvision's mask paste reads box corners: right for
    any real weights (12), wrong for the value the fake engine assumes (1), where the view raises."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = int((self.lin(x) * 0 + 3).sum())
        return x.new_ones(k).view(3, 4)


@_NEEDS_FAKE_CUDA_FACTORIES  # there the forward stops earlier, at the fake CUDA factory of new_ones
def test_an_error_after_assumed_values_is_the_simulations_limit_not_a_pc207() -> None:
    fake = placecheck.audit(SizedByAValue, "cuda", engine="fake", init="meta", inputs=["float32[1,4]"],
                            ignore=["PC204"])
    assert not [f for f in fake.findings if f.code == "PC207"]
    assert "fake tensors stopped" in fake.incomplete
    assert "after ops that ran on assumed values" in fake.incomplete
    auto = placecheck.audit(SizedByAValue, "cuda", init="meta", inputs=["float32[1,4]"], ignore=["PC204"])
    assert auto.engine.startswith("simulated cuda (real values)") and not auto.incomplete
    assert any("after ops that ran on assumed values" in n for n in auto.notes)
