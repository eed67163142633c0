"""``--init``: a meta build finds exactly what a CPU build finds, and reports unmoved tensors on cpu.

Every walk fixture (``tests/fixtures/walk/``) and every forward fixture
(``tests/fixtures/forward/``, when present) is audited under both inits and
the findings are compared field by field, beside cases written here for what
a meta build could get wrong (shared references, tuples, frozen dataclasses,
modules in plain lists, a custom ``_apply``, library internals).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import sys
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from cli_runner import CliRunner

import placecheck.model.construct as construct
from placecheck.basics.errors import LoadError, UsageError
from placecheck.basics.options import EngineChoice
from placecheck.basics.values import Device
from placecheck.checks.walk import Snapshot, walk
from placecheck.cli import app
from placecheck.commands.api import audit
from placecheck.engines.engine import choose_engine, move_model
from placecheck.examples.many_modules import MODULES_PER_BLOCK, blocks_for, many_modules

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

FIXTURES = Path(__file__).parent / "fixtures"


# -- models written for what a meta build could get wrong ------------------------------------------

Pair = namedtuple("Pair", "cos sin")


@dataclasses.dataclass(frozen=True)
class FrozenTables:
    table: torch.Tensor
    size: int = 3


class Helper:
    def __init__(self) -> None:
        self.cache = {"k": torch.zeros(2, 3), "v": [torch.zeros(3)]}


class Strays(nn.Module):
    """Every kind of unmoved state, shared references included."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.mask = torch.ones(4)
        self.same_mask = self.mask  # one tensor, two names: one finding, as on the CPU
        self.scale = torch.tensor(2.0)
        self.pair = Pair(torch.ones(2), torch.ones(2))
        self.frozen = FrozenTables(torch.ones(5))
        self.helper = Helper()
        self.mixed = (torch.ones(1), "label", 3)
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))
        self.steps_ref = self.steps  # a stale buffer reference
        self.refs = {"w": self.lin.weight}  # a plain reference to a registered parameter: fine


class PlainContainers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heads = [nn.Linear(4, 2), nn.Linear(4, 2)]
        self.by_name = {"a": nn.Linear(4, 4)}
        self.params = [nn.Parameter(torch.ones(3))]
        self.ok = nn.ModuleList([nn.Linear(2, 2)])


class KeepsBufferOnCpu(nn.Module):
    """A custom ``_apply`` that keeps a buffer back: PC105."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("table", torch.ones(3))

    def _apply(self, fn: Any, recurse: bool = True) -> nn.Module:
        table = self._buffers.pop("table")
        super()._apply(fn, recurse)
        self._buffers["table"] = table
        return self


class Internals(nn.Module):
    """Legitimate internals that must give no finding under either init."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 4, num_layers=2)
        self.bn = nn.BatchNorm1d(4)
        self.lazy = nn.LazyLinear(3)
        self.attn = nn.MultiheadAttention(4, 2)
        self.wn = nn.utils.parametrizations.weight_norm(nn.Linear(4, 4))
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.emb.weight  # tied


class Shared(nn.Module):
    """One module under two parents, as T5's shared embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Embedding(10, 4)
        self.encoder = nn.Sequential(self.shared)
        self.decoder = nn.Sequential(self.shared)


CASES = [Strays, PlainContainers, KeepsBufferOnCpu, Internals, Shared]


def _fixture_targets(kind: str) -> list[Any]:
    """Each fixture file's ``Model`` (the fixtures' convention), else every module class it
    defines that builds with no arguments."""
    folder = FIXTURES / kind
    targets = []
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        if path.name.startswith("_"):
            continue
        name = f"_init_meta_fixture_{kind}_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        classes = {attr: value for attr, value in vars(module).items()
                   if isinstance(value, type) and issubclass(value, nn.Module)
                   and value.__module__ == name and not attr.startswith("_") and _builds_bare(value)}
        if "Model" in classes:
            classes = {"Model": classes["Model"]}
        targets += [pytest.param(value, id=f"{kind}/{path.stem}:{attr}") for attr, value in classes.items()]
    return targets


def _builds_bare(cls: type) -> bool:
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in list(inspect.signature(cls.__init__).parameters.values())[1:])


def _init_note(report: Any) -> str:
    """The one note that says what ``--init`` chose."""
    (note,) = [n for n in report.notes if n.startswith("init: ")]
    return str(note)


def _rows(report: Any) -> list[dict[str, Any]]:
    return [f.to_dict() for f in report.findings]


def _audit_both(factory: Any, **kwargs: Any) -> tuple[Any, Any]:
    return (audit(factory, "cuda", init="cpu", **kwargs), audit(factory, "cuda", init="meta", **kwargs))


@pytest.mark.parametrize("model_class", CASES, ids=[c.__name__ for c in CASES])
def test_meta_build_finds_what_cpu_build_finds(model_class: type) -> None:
    on_cpu, on_meta = _audit_both(model_class, forward=False)  # these have no forward()
    assert _rows(on_meta) == _rows(on_cpu)
    assert dict(on_meta.stats) == dict(on_cpu.stats)


@pytest.mark.parametrize("model_class", _fixture_targets("walk"))
def test_walk_fixtures_same_under_both_inits(model_class: type) -> None:
    on_cpu, on_meta = _audit_both(model_class, forward=False)
    assert _rows(on_meta) == _rows(on_cpu)


def _with_forward() -> list[Any]:
    """Models whose forward pass finds things (or must find nothing), for both inits."""
    from placecheck.examples.buggy import BuggyNet
    from placecheck.examples.clean import CleanNet

    return [pytest.param(BuggyNet, id="examples/buggy:BuggyNet"),
            pytest.param(CleanNet, id="examples/clean:CleanNet"),
            pytest.param(lambda: many_modules(40, stray_every=3), id="many_modules:strays-used-in-forward"),
            *_fixture_targets("forward")]


@pytest.mark.parametrize("model_class", _with_forward())
def test_forward_findings_same_under_both_inits(model_class: Any) -> None:
    on_cpu, on_meta = _audit_both(model_class)
    assert any(n.startswith("forward: ") for n in on_meta.notes)  # the forward did run
    assert _rows(on_meta) == _rows(on_cpu)


def test_forward_of_a_meta_build_finds_the_stray_it_uses() -> None:
    """The stray ``scale`` (on cpu) meets CUDA activations in forward: PC201, as after a CPU build."""
    report = audit(lambda: many_modules(40, stray_every=3), "cuda", init="meta")
    mismatches = [f for f in report.findings if f.code == "PC201"]
    assert mismatches
    assert all("meta" not in f.message for f in report.findings)


def test_the_cases_do_find_things() -> None:
    """The comparisons above are not between two empty lists."""
    codes = {name: {f.code for f in audit(cls, "cuda", init="meta", forward=False).findings}
             for name, cls in [("Strays", Strays), ("PlainContainers", PlainContainers),
                               ("KeepsBufferOnCpu", KeepsBufferOnCpu), ("Internals", Internals)]}
    assert codes == {"Strays": {"PC101"}, "PlainContainers": {"PC102", "PC103"},
                     "KeepsBufferOnCpu": {"PC105"}, "Internals": set()}


def test_unmoved_tensors_are_reported_on_cpu_not_meta() -> None:
    report = audit(Strays, "cuda", init="meta", forward=False)
    wheres = {f.where for f in report.findings}
    assert wheres == {"mask", "scale", "pair.cos", "pair.sin", "frozen.table", "helper.cache['k']",
                      "helper.cache['v'][0]", "mixed[0]", "steps_ref"}
    for finding in [*report.findings, *audit(PlainContainers, "cuda", init="meta", forward=False).findings]:
        assert finding.device == "cpu"
        assert "meta" not in finding.message
    assert "init: meta (as requested)" in _init_note(report)


def test_leftovers_become_cpu_tensors_keeping_identity_and_kind() -> None:
    with torch.device("meta"):
        model = Strays()
    eng = choose_engine(Device("cuda", 0))
    with eng.session():
        snapshot = Snapshot.take(model)
        move_model(model, eng)
        count = construct.leftovers_to_default_device(model, snapshot)
    assert eng.simulated
    assert count == 10  # the nine strays and the plain reference to lin.weight
    from torch._subclasses.fake_tensor import FakeTensor

    assert not isinstance(model.mask, FakeTensor)  # small leftovers hold real (zero) CPU data
    assert model.mask is model.same_mask
    assert isinstance(model.pair, Pair) and model.pair.cos.device.type == "cpu"
    assert model.frozen.table.device.type == "cpu"
    assert model.mixed[1:] == ("label", 3)
    assert model.steps_ref.dtype == torch.int64
    assert id(model.steps_ref) in snapshot.buffers  # still known as the stale buffer reference
    assert id(model.refs["w"]) in snapshot.params
    assert not any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])


@pytest.mark.skipif(torch.version.cuda is None,
                    reason="a CPU-only torch build aborts on fake CUDA x CPU scalar ops")
def test_a_zero_dim_leftover_is_a_legal_scalar_beside_cuda_tensors() -> None:
    """As after a CPU build: a 0-dim CPU tensor times a CUDA tensor is fine; a 0-dim meta one raises."""
    with torch.device("meta"):
        model = Strays()
    eng = choose_engine(Device("cuda", 0))
    with eng.session():
        move_model(model, eng)
        with pytest.raises(RuntimeError, match="same device"):
            model.lin.weight * model.scale
        construct.leftovers_to_default_device(model)
        assert (model.lin.weight * model.scale).device.type == "cuda"


def test_leftovers_beyond_the_budget_take_no_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    monkeypatch.setattr(construct, "REAL_LEFTOVER_BUDGET", 0)
    with torch.device("meta"):
        model = PlainContainers()
    eng = choose_engine(Device("cuda", 0))
    with eng.session():
        move_model(model, eng)
        construct.leftovers_to_default_device(model)
    for tensor in (model.params[0], model.heads[0].weight, model.by_name["a"].bias):
        assert isinstance(tensor, FakeTensor) and tensor.device.type == "cpu"
    assert isinstance(model.params[0], nn.Parameter)


def test_auto_builds_on_cpu_when_the_model_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(construct, "available_memory", lambda: 64 * 2**30)
    report = audit(Strays, "cuda", init="auto", forward=False)
    assert _init_note(report).startswith("init: cpu (auto: ")
    assert "64.0 GiB of memory available" in _init_note(report)


def test_auto_builds_on_meta_when_the_model_would_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(construct, "available_memory", lambda: 100)  # bytes
    report = audit(Strays, "cuda", init="auto", forward=False)
    assert _init_note(report).startswith("init: meta (auto: ")
    assert "too much to build on the CPU" in _init_note(report)
    assert _rows(report) == _rows(audit(Strays, "cuda", init="cpu", forward=False))


class NeedsValuesWhileBuilding(nn.Module):
    """Reads a tensor's value in ``__init__``: impossible on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, int(torch.tensor(3).item()))


def test_auto_falls_back_to_cpu_when_meta_fails_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(construct, "available_memory", lambda: 100)
    report = audit(NeedsValuesWhileBuilding, "cuda", init="auto", forward=False)
    assert _init_note(report).startswith("init: cpu (auto: building on the meta device raised ")
    assert "built on the CPU instead" in _init_note(report)


def test_explicit_meta_that_fails_is_a_load_error() -> None:
    with pytest.raises(LoadError, match="use --init cpu"):
        audit(NeedsValuesWhileBuilding, "cuda", init="meta", forward=False)


def test_init_usage_errors() -> None:
    with pytest.raises(UsageError, match="unknown --init 'gpu'"):
        audit(Strays, "cuda", init="gpu")
    with pytest.raises(UsageError, match="already built"):
        audit(Strays(), "cuda", init="meta")
    with pytest.raises(UsageError, match="target is meta itself"):
        audit(Strays, "meta", init="meta")


def test_meta_on_a_real_cpu_target_materialises_with_to_empty() -> None:
    on_cpu = audit(PlainContainers, "cpu", init="cpu", forward=False)
    on_meta = audit(PlainContainers, "cpu", init="meta", forward=False)
    assert _rows(on_meta) == _rows(on_cpu)


def test_cli_init_option() -> None:
    runner = CliRunner()
    target = "placecheck.examples.buggy:BuggyNet"
    outputs = {}
    for init in ("cpu", "meta"):
        result = runner.invoke(app, ["audit", target, "--init", init, "--format", "json"])
        assert result.exit_code == 1, result.output
        outputs[init] = json.loads(result.stdout)["findings"]
    assert outputs["meta"] == outputs["cpu"] != []
    bad = runner.invoke(app, ["audit", target, "--init", "gpu"])
    assert bad.exit_code == 2
    assert "unknown --init 'gpu': use one of auto, cpu, meta" in bad.output


# -- the 10,000-module model: the walk's correctness at that size (its speed is in benchmarks/) ---

def test_walk_of_ten_thousand_modules_finds_every_planted_stray() -> None:
    blocks = blocks_for(10_000)
    report = audit(lambda: many_modules(10_000, stray_every=500), "cuda", init="meta", forward=False)
    stats = dict(report.stats)
    assert stats["modules"] == 2 + MODULES_PER_BLOCK * blocks >= 10_000
    assert stats["parameters"] == 4 * blocks
    # natural order: blocks.500 before blocks.1000
    assert [(f.code, f.where, f.device) for f in report.findings] == [
        ("PC101", f"blocks.{i}.scale", "cpu") for i in range(0, blocks, 500)]


def test_walk_of_ten_thousand_modules_clean() -> None:
    model = many_modules(10_000)
    eng = choose_engine(Device("cuda", 0))
    with eng.session():
        snapshot = Snapshot.take(model)
        result = walk(move_model(model, eng), "cuda:0", snapshot)
    assert result.findings == []
    assert result.stats["modules"] == 10_002


# -- the speed of a meta build and its move (issue 14: thousands of experts) ----------------------

class _RecordOps(torch.utils._python_dispatch.TorchDispatchMode):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_a_meta_build_skips_value_fills_but_keeps_the_fills_that_raise() -> None:
    aten = torch.ops.aten
    with torch.device("meta"), _RecordOps() as record, construct._NoValueFillsOnMeta():  # sees what passes
        layer = nn.Linear(8, 8)  # kaiming_uniform_ and uniform_ on meta tensors
        with torch.no_grad():
            layer.weight.normal_(0, 0.02)
            layer.bias.zero_()
    assert layer.weight.device.type == "meta" and layer.weight.shape == (8, 8)
    assert not {aten.uniform_.default, aten.normal_.default, aten.zero_.default} & set(record.ops), record.ops
    with torch.device("meta"), construct._NoValueFillsOnMeta():
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            nn.Parameter(torch.empty(2)).normal_()  # autograd refuses it on a CPU build too
        with pytest.raises((RuntimeError, NotImplementedError)):
            torch.empty(2, dtype=torch.int64).normal_()  # no normal_ for integers


def test_the_move_of_a_meta_build_makes_fake_cuda_tensors_without_a_copy_per_tensor() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 2))
    model.register_buffer("steps", torch.zeros(3, 5, device="meta").t())  # non-contiguous strides
    engine = choose_engine(Device.parse("cuda"), EngineChoice.FAKE)
    with engine.session(), _RecordOps() as record:
        moved = move_model(model, engine)
    assert torch.ops.aten._to_copy.default not in record.ops
    for name, t in [*moved.named_parameters(), *moved.named_buffers()]:
        assert t.device == torch.device("cuda:0") and type(t).__name__ in ("FakeTensor", "Parameter"), name
    assert isinstance(moved[0].weight, nn.Parameter) and moved[0].weight.requires_grad
    assert moved.steps.shape == (5, 3) and moved.steps.stride() == (1, 5)


@pytest.mark.skipif(torch.version.cuda is None, reason="the CPU-only build's session makes every move to "
                    "CUDA a fake tensor itself (engine.FakeCuda), and cannot make one outright")
def test_the_fake_move_makes_each_new_tensor_the_parameter_itself_without_a_detach() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))
    model[1].weight.requires_grad_(False)
    new = nn.Parameter.__dict__["__new__"]
    engine = choose_engine(Device.parse("cuda"), EngineChoice.FAKE)
    with engine.session(), _RecordOps() as record:
        moved = move_model(model, engine)
        mine = torch.empty(3, device="cuda")
        wrapped = nn.Parameter(mine)  # not Module._apply's: Parameter's own path, a detached alias
    assert torch.ops.aten.detach.default in record.ops  # the user's Parameter only
    assert record.ops.count(torch.ops.aten.detach.default) == 1
    assert all(isinstance(p, nn.Parameter) and p.device == torch.device("cuda:0") for p in moved.parameters())
    assert moved[0].weight.requires_grad and not moved[1].weight.requires_grad
    assert wrapped is not mine and not mine.requires_grad
    assert nn.Parameter.__dict__["__new__"] is new  # restored after the move


def test_a_cpu_build_for_the_fake_engine_zeroes_large_random_fills_only() -> None:
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(1024, 1024), nn.Linear(8, 8))  # 4 MiB weight, then 256 B

    seen: dict[str, Any] = {}

    def record(model: nn.Module) -> nn.Module:
        built = model()
        seen.update(big=built[0].weight.detach().clone(), small=built[1].weight.detach().clone())
        return built

    construct.construct(build, construct.InitChoice.CPU, "cuda", record, values_needed=False)
    assert seen["big"].count_nonzero() == 0  # above datadep.KNOWN_BYTES_LIMIT: zeroed, not drawn
    assert seen["small"].count_nonzero() == 64  # small tensors keep random values (datadep reads them)
    construct.construct(build, construct.InitChoice.CPU, "cuda", record)  # a real-valued engine
    assert seen["big"].count_nonzero() > 1000
    refused = pytest.raises(RuntimeError, match="leaf Variable that requires grad")
    with construct._ZeroLargeRandomFills(0), refused:
        nn.Parameter(torch.empty(2)).normal_()  # autograd still refuses it, as on a plain CPU build


def test_the_fake_engine_audit_builds_without_drawing_large_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    values: list[bool] = []
    real_built = construct._built

    def spy(*args: Any, **kwargs: Any) -> Any:
        values.append(kwargs.get("values_needed", True))
        return real_built(*args, **kwargs)

    monkeypatch.setattr(construct, "_built", spy)
    audit(lambda: nn.Linear(4, 4), "cuda", engine="fake", init="cpu", forward=False)
    audit(lambda: nn.Linear(4, 4), "cuda", engine="tagged", init="cpu", forward=False)
    assert values == [False, True]


@pytest.mark.skipif(torch.version.cuda is None, reason="the CPU-only build's session makes every move to "
                    "CUDA a fake tensor itself (engine.FakeCuda), values unknown")
def test_the_move_of_a_cpu_build_makes_fake_cuda_tensors_and_keeps_small_values_known() -> None:
    from placecheck.engines.datadep import active

    model = nn.Sequential(nn.Linear(4, 6), nn.Linear(512, 1024))  # 96 B weight, then a 2 MiB one
    model.register_buffer("steps", torch.arange(15.0).reshape(3, 5).t().contiguous())
    before = model[0].weight.detach().clone()
    engine = choose_engine(Device.parse("cuda"), EngineChoice.FAKE)
    with engine.session(), _RecordOps() as record:
        moved = move_model(model, engine)
        mode = active()
        assert mode is not None
        small, _ = mode.value(moved[0].weight)
        big, _ = mode.value(moved[1].weight)
        steps, _ = mode.value(moved.steps)
    assert torch.ops.aten._to_copy.default not in record.ops
    assert moved[0].weight.device == torch.device("cuda:0") and isinstance(moved[0].weight, nn.Parameter)
    assert small is not None and torch.equal(small, before)
    assert big is None  # over datadep.KNOWN_BYTES_LIMIT: unknown, as after torch's own _to_copy
    assert steps is not None and steps.tolist() == torch.arange(15.0).reshape(3, 5).t().tolist()
