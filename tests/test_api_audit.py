"""``placecheck.audit()`` as Python users call it: it never touches the caller's model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
from conftest import EXAMPLES, load_file

import placecheck
from placecheck.basics.errors import LoadError, UsageError
from placecheck.findings.formats import OutputFormat, formatter_for

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

BuggyNet = load_file(EXAMPLES / "buggy.py", "BuggyNet")
CleanNet = load_file(EXAMPLES / "clean.py", "CleanNet")


def test_audit_does_not_modify_the_callers_model() -> None:
    model = BuggyNet()
    params = {name: p for name, p in model.named_parameters()}
    values = {name: p.detach().clone() for name, p in params.items()}
    mask, head_weight, scale = model.blocks[0].mask, model.heads[0].weight, model.scales[0]

    report = placecheck.audit(model, device="cuda", engine="fake")

    assert not report.ok
    assert {name: p for name, p in model.named_parameters()} == params  # same objects
    for name, p in model.named_parameters():
        assert p.device.type == "cpu" and type(p) is nn.Parameter
        assert torch.equal(p.detach(), values[name])
    assert model.blocks[0].mask is mask and model.heads[0].weight is head_weight
    assert model.scales[0] is scale and mask.device.type == "cpu"


def test_audit_of_a_weight_norm_model_leaves_it_usable() -> None:
    with pytest.warns(FutureWarning):
        model = nn.Sequential(nn.utils.weight_norm(nn.Linear(4, 4)))
    assert placecheck.audit(model, device="cuda", engine="fake").findings == ()
    assert model(torch.ones(1, 4)).shape == (1, 4)
    assert model[0].weight_v.device.type == "cpu"


def test_report_api() -> None:
    report = placecheck.audit(BuggyNet, device="cuda", engine="fake", forward=False)
    assert isinstance(report, placecheck.Report)
    assert report.device == "cuda:0" and report.engine == "simulated cuda"
    assert report.target == "BuggyNet"
    assert len(report.findings) == 12 and not report.ok
    assert {f.code for f in report.findings} == {"PC101", "PC102", "PC103"}
    assert dict(report.stats)["unregistered_tensors"] == 10
    table = formatter_for(OutputFormat.TABLE).format(report)
    # the API's report lists instances; its count is the CLI's (one grouping, one count)
    assert table.rstrip().endswith("5 problems (12 instances) in 3 modules: 5 errors; 13.1 KiB not on cuda:0")
    assert report.grouped().summary_line() == report.summary_line()


def test_clean_model_is_ok() -> None:
    report = placecheck.audit(CleanNet(), device="cuda", engine="fake")
    assert report.ok and report.findings == ()


def test_select_and_ignore() -> None:
    assert {f.code for f in placecheck.audit(BuggyNet, engine="fake", select=["PC102"]).findings} == {"PC102"}
    assert {f.code for f in placecheck.audit(BuggyNet, engine="fake", ignore=["PC10"]).findings} == {
        "PC201", "PC202", "PC203"}  # the forward pass's findings from the same bugs
    assert placecheck.audit(BuggyNet, engine="fake", ignore=["PC1", "PC2"]).findings == ()


def test_walk_findings_carry_the_line_that_assigned_the_attribute() -> None:
    # recorded while the audit built the model (placecheck.checks.assignments)
    findings = placecheck.audit(BuggyNet, engine="fake", select=["PC1"]).findings
    assert findings and all("examples/buggy.py:" in f.source for f in findings)


@pytest.mark.parametrize("kwargs, error, pattern", [
    ({"device": "tpu"}, UsageError, "unknown device 'tpu'"),
    ({"engine": "warp"}, UsageError, "unknown engine 'warp'"),
    ({"select": ["PC999"]}, UsageError, "PC999"),
])
def test_bad_options_raise_usage_errors(kwargs: dict[str, object], error: type[Exception],
                                        pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        placecheck.audit(CleanNet, **kwargs)  # type: ignore[arg-type]


def test_factory_returning_non_module() -> None:
    with pytest.raises(LoadError, match="returned a dict"):
        placecheck.audit(lambda: {"a": 1}, engine="fake")  # type: ignore[arg-type, return-value]


def test_copy_model_false_audits_in_place() -> None:
    model = CleanNet()
    placecheck.audit(model, device="cuda", engine="fake", copy_model=False)
    # the caller asked for it: the model itself was moved (to simulated cuda)
    assert all(p.device == torch.device("cuda:0") for p in model.parameters())


def test_instance_holding_a_non_leaf_tensor_in_a_container_is_copied_and_audited() -> None:
    # copy.deepcopy refuses non-leaf tensors; the audit must still run on a copy and find it
    class Derived(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)
            self.cache = {"k": self.proj.weight * 2}

    model = Derived()
    cached = model.cache["k"]
    report = placecheck.audit(model, device="cuda", engine="fake", forward=False)
    assert [(f.code, f.where) for f in report.findings] == [("PC101", "cache['k']")]
    assert model.cache["k"] is cached and cached.grad_fn is not None


def test_instance_with_uninitialised_lazy_modules_is_copied() -> None:
    model = nn.Sequential(nn.LazyLinear(3))
    assert placecheck.audit(model, device="cuda", engine="fake", forward=False).findings == ()
    assert isinstance(model[0].weight, nn.parameter.UninitializedParameter)
    assert model(torch.ones(1, 5)).shape == (1, 3)  # the caller's lazy module still initialises


def test_the_collector_runs_less_often_during_an_audit_and_as_before_after() -> None:
    import gc

    seen: list[tuple[int, int, int]] = []

    class Records(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            seen.append(gc.get_threshold())
            self.lin = nn.Linear(2, 2)

    before = gc.get_threshold()
    placecheck.audit(Records, device="cuda", engine="fake", forward=False)
    assert seen and seen[0][0] >= 10_000 and seen[0][0] > before[0]
    assert gc.get_threshold() == before
    def raises() -> nn.Module:
        raise RuntimeError("the constructor failed")

    with pytest.raises(RuntimeError, match="the constructor failed"):
        placecheck.audit(raises, device="cuda", engine="fake")
    assert gc.get_threshold() == before


def test_an_audit_draws_the_same_random_values_every_time_and_leaves_the_callers_generator() -> None:
    drawn: list[list[float]] = []

    class Draws(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            drawn.append(self.lin.weight.detach().flatten().tolist())

    torch.manual_seed(1234)
    expected_next = torch.rand(3)
    torch.manual_seed(1234)
    placecheck.audit(Draws, device="cuda", engine="fake", init="cpu", forward=False)
    placecheck.audit(Draws, device="cuda", engine="fake", init="cpu", forward=False)
    assert len(drawn) == 2 and drawn[0] == drawn[1]
    assert torch.equal(torch.rand(3), expected_next)  # the caller's generator is where it was


def test_the_public_functions_stand_side_by_side_at_the_root(tmp_path: Path) -> None:
    # audit, run and check_checkpoint are placecheck's attributes, loaded on first use (importing the
    # package stays torch-free: tests/test_architecture.py)
    import placecheck.checkpoint
    import placecheck.commands.api
    import placecheck.run

    assert placecheck.audit is placecheck.commands.api.audit
    assert callable(placecheck.run)
    assert placecheck.check_checkpoint is placecheck.checkpoint.check_checkpoint
    path = tmp_path / "w.pt"
    torch.save({"w": torch.zeros(2)}, path)
    result = placecheck.check_checkpoint(str(path), device="cuda", engine="fake")
    assert result.report.findings == () and not result.refused


def test_the_version_is_the_distributions() -> None:
    from importlib import metadata

    assert placecheck.__version__ == metadata.version("placecheck")
