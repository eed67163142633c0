"""``--device keep``: a model placed across GPUs by its own code, audited as placed (issue 11, item 1).

The fixtures in ``tests/fixtures/placement/`` are collected like the forward
fixtures (``CODE WHERE LINE`` rows, ``-`` for a walk finding's line) and
audited with ``device="keep"`` on both simulating engines: fake tensors, and
real CPU values tagged with the simulated GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from cli_runner import CliRunner
from conftest import TESTS, fixture_cases, load_file, read_expected_lines, unwrapped
from forward_helpers import ungrouped  # noqa: F401 (the fixture)
from test_forward_fixtures import fixture_inputs, forward_rows

import placecheck
from placecheck.basics.errors import UsageError
from placecheck.checks.expected import Placement
from placecheck.cli import app
from placecheck.findings.formats import OutputFormat, formatter_for

FIXTURES = TESTS / "fixtures" / "placement"
CASES = fixture_cases(FIXTURES)
PIPELINE = Path(placecheck.__file__).parent / "examples" / "pipeline.py"

pytestmark = [pytest.mark.usefixtures("ungrouped"), pytest.mark.cpu_build]


def _audit(source: Path, engine: str = "auto", **kwargs: object) -> placecheck.Report:
    return placecheck.audit(load_file(source), device="keep", engine=engine, inputs=fixture_inputs(source),
                            **kwargs)  # type: ignore[arg-type]


def test_every_multi_gpu_code_has_a_fixture() -> None:
    codes = {row[0] for _, expected in (c.values for c in CASES) for row in read_expected_lines(expected)}
    assert codes == {"PC101", "PC201", "PC202", "PC208"}


@pytest.mark.parametrize("engine", ["fake", "tagged"])
@pytest.mark.parametrize("source, expected", CASES)
def test_placement_fixture(source: Path, expected: Path, engine: str) -> None:
    report = _audit(source, engine)
    assert report.engine.startswith("simulated cuda")
    assert report.device == "keep"
    assert forward_rows(source, report) == read_expected_lines(expected), report.notes


def test_the_two_stage_bug_names_both_devices_and_both_stages() -> None:
    report = _audit(FIXTURES / "pc201_forgot_move.py")
    (mismatch,) = [f for f in report.findings if f.code == "PC201"]
    assert (mismatch.device, mismatch.expected) == ("cuda:0", "cuda:1")
    assert "'s1'" in mismatch.message and "'s2'" in mismatch.message
    assert dict(mismatch.details)["stages"] == "s1 (cuda:0) -> s2 (cuda:1)"


def test_moving_the_model_to_one_device_collapses_the_placement_and_hides_the_bug() -> None:
    # the opening: --device cuda moves both stages to cuda:0 first, and the forward is clean
    collapsed = placecheck.audit(load_file(FIXTURES / "pc201_forgot_move.py"), device="cuda")
    assert not any(f.code == "PC201" for f in collapsed.findings)
    # ... and says so
    assert any(n.startswith("placement: the model's code put its tensors on cuda:0, cuda:1; .to('cuda:0')")
               and "--device keep" in n for n in collapsed.notes)
    assert any(f.code == "PC201" for f in _audit(FIXTURES / "pc201_forgot_move.py").findings)


def test_a_stray_on_another_gpu_is_judged_against_its_module() -> None:
    report = _audit(FIXTURES / "pc101_stray_in_stage.py", forward=False)
    (stray,) = report.findings
    assert (stray.code, stray.where) == ("PC101", "s2.scale")
    assert (stray.device, stray.expected) == ("cuda:0", "cuda:1")
    assert "'s2'" in stray.message


def test_the_clean_pipeline_lists_its_copies_and_its_stages() -> None:
    report = _audit(FIXTURES / "clean_pipeline.py")
    assert report.findings == ()
    device_map = report.device_map
    assert device_map is not None
    stage_bytes = (32 * 32 + 32 + 32) * 4
    assert [(r.path, r.devices, r.nbytes) for r in device_map.stages] == [
        ("s1", ("cuda:0",), stage_bytes), ("s2", ("cuda:1",), stage_bytes)]
    activation = 4 * 32 * 4
    source = FIXTURES / "clean_pipeline.py"
    rows = [(t.src, t.dst, t.nbytes, t.source.rpartition(":")[2], t.boundary) for t in device_map.transfers]
    assert rows == [("cuda:0", "cuda:1", activation, "26", "s1 -> s2"),
                    ("cuda:1", "cuda:0", activation, "27", "s2 -> (root)")]
    assert all(Path(t.source.rpartition(":")[0]).name == source.name for t in device_map.transfers)
    assert device_map.bytes_per_device() == {"cuda:0": stage_bytes, "cuda:1": stage_bytes}


def test_inputs_go_to_the_device_of_the_first_layer_they_meet() -> None:
    class SecondGpuFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.late = nn.Linear(8, 8).to("cuda:0")  # registered first, runs second
            self.early = nn.Linear(8, 8).to("cuda:1")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.late(self.early(x).to("cuda:0"))

    report = placecheck.audit(SecondGpuFirst, device="keep", inputs=["float32[2,8]"])
    assert report.findings == ()
    assert "forward: inputs on cuda:1 (the device of the first model tensor the input meets)" in report.notes


def test_the_json_report_has_the_device_map_and_the_transfers() -> None:
    report = _audit(FIXTURES / "clean_pipeline.py")
    data = json.loads(formatter_for(OutputFormat.JSON).format(report))
    assert data["device"] == "keep"
    assert [s["path"] for s in data["device_map"]["stages"]] == ["s1", "s2"]
    assert [(t["src"], t["dst"], t["boundary"]) for t in data["transfers"]] == [
        ("cuda:0", "cuda:1", "s1 -> s2"), ("cuda:1", "cuda:0", "s2 -> (root)")]


def test_the_table_shows_the_device_map_after_the_findings() -> None:
    text = formatter_for(OutputFormat.TABLE, width=100).format(_audit(FIXTURES / "clean_pipeline.py"))
    assert "on cuda:0, cuda:1, as placed, simulated (fake tensors, no data)" in text.splitlines()[0]
    section = text[text.index("device map"):]
    assert "cuda:0 -> cuda:1" in section and "s1 -> s2" in section


# -- the expected device of a module, from evidence ------------------------------------------------

def _on(module: nn.Module, device: str) -> nn.Module:
    return module.to(device)


def test_expected_device_own_state_then_descendants_then_ancestor() -> None:
    model = nn.Module()
    model.a = _on(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), "meta")
    model.b = nn.Linear(2, 2)
    placement = Placement(model)
    assert placement.expected("a.0").devices == ("meta",) and placement.expected("a.0").how == "own"
    assert placement.expected("a").devices == ("meta",) and placement.expected("a").how == "descendants"
    assert placement.expected("a.1").devices == ("meta",) and placement.expected("a.1").how == "ancestor"
    assert placement.expected("").devices == ("meta", "cpu")  # the root spans both, first used first
    assert placement.expected("").allows("cpu") and not placement.expected("a").allows("cpu")


def test_a_module_is_expected_where_most_of_its_own_bytes_are() -> None:
    layer = nn.Linear(64, 64)
    layer.bias = nn.Parameter(torch.zeros(64, device="meta"))
    assert Placement(layer).expected("").devices == ("cpu",)


# -- the CLI, options and bad input -----------------------------------------------------------------

def test_cli_keep_finds_the_buggy_pipeline_and_passes_the_fixed_one() -> None:
    runner = CliRunner()
    buggy = runner.invoke(app, ["audit", f"{PIPELINE}:BuggyPipeline", "--device", "keep"])
    assert buggy.exit_code == 1, buggy.output
    assert "PC201" in buggy.output and "PC101 s2.mask" in buggy.output
    fixed = runner.invoke(app, ["audit", f"{PIPELINE}:FixedPipeline", "--device", "keep"])
    assert fixed.exit_code == 0, fixed.output
    assert "cuda:0 -> cuda:1" in fixed.output


@pytest.mark.parametrize("args, says", [
    (["--gpus", "1"], "places tensors on cuda:1, but --gpus 1 gives it 1 GPU (cuda:0): use --gpus 2"),
    (["--init", "meta"], "--device keep builds the model as its code places it"),
    (["--checkpoint", "x.pt"], "--device keep cannot load --checkpoint"),
])
def test_cli_keep_refuses_what_makes_no_sense_in_one_line(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["audit", f"{PIPELINE}:FixedPipeline", "--device", "keep", *args])
    assert result.exit_code == 2, result.output
    assert says in unwrapped(result.output)
    assert len(unwrapped(result.output).strip().splitlines()) == 1  # one line, fitted to the width
    assert "Traceback" not in result.output


def test_gpus_fixes_the_count_the_model_sees() -> None:
    class EveryGpu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            gpus = torch.cuda.device_count()
            self.parts = nn.ModuleList(nn.Linear(4, 4).to(f"cuda:{i}") for i in range(gpus))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for part in self.parts:
                x = part(x.to(part.weight.device))
            return x

    report = placecheck.audit(EveryGpu, device="keep", gpus=3, inputs=["float32[2,4]"])
    assert report.findings == ()
    assert report.device_map is not None
    assert list(report.device_map.bytes_per_device()) == ["cuda:0", "cuda:1", "cuda:2"]
    assert any("device_count() answered 3 (--gpus)" in n for n in report.notes)


def test_python_api_refuses_keep_with_init_meta() -> None:
    with pytest.raises(UsageError, match="--init meta"):
        placecheck.audit(load_file(FIXTURES / "clean_pipeline.py"), device="keep", init="meta")


def test_the_config_accepts_device_keep() -> None:
    from placecheck.basics.config import parse

    cfg = parse('[[models]]\ntarget = "pkg.mod:Net"\ndevice = "keep"\ngpus = 2\n', "cfg.toml")
    assert (cfg.models[0].options.device, cfg.models[0].options.gpus) == ("keep", 2)
    with pytest.raises(UsageError, match="or keep"):
        parse('[[models]]\ntarget = "pkg.mod:Net"\ndevice = "kept"\n', "cfg.toml")


def test_a_keep_report_crosses_to_a_child_process_whole() -> None:
    from placecheck.commands.runner import report_from_dict
    from placecheck.findings.formats.json import report_to_dict

    report = _audit(FIXTURES / "clean_pipeline.py")
    again = report_from_dict(json.loads(json.dumps(report_to_dict(report))))
    assert again.device_map == report.device_map
    assert again.device_map is not None and len(again.device_map.transfers) == 2


def test_train_checks_each_gradient_against_its_own_parameter() -> None:
    from placecheck.model.load import model_factory

    report = placecheck.audit(model_factory(f"{PIPELINE}:FixedPipeline", {}), device="keep", train=True)
    assert report.engine == "simulated cuda (real values)"
    assert report.findings == ()
    assert report.device_map is not None and len(report.device_map.transfers) == 1


def test_an_output_off_every_device_of_the_model_is_pc206() -> None:
    class ToHost(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.s1 = nn.Linear(4, 4).to("cuda:0")
            self.s2 = nn.Linear(4, 4).to("cuda:1")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.s2(self.s1(x).to("cuda:1")).cpu()

    report = placecheck.audit(ToHost, device="keep", inputs=["float32[2,4]"], select=["PC206"])
    (output,) = report.findings
    assert (output.code, output.device, output.expected) == ("PC206", "cpu", "cuda:0 or cuda:1")


def test_a_layer_list_split_across_gpus_is_mapped_per_stage_and_a_weight_names_its_stage() -> None:
    class Split(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(8, 8).to(f"cuda:{i // 2}") for i in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for i, layer in enumerate(self.layers):
                x = layer(x.to(layer.weight.device)) if i < 3 else x @ self.layers[0].weight
            return x

    report = placecheck.audit(Split, device="keep", inputs=["float32[2,8]"])
    assert report.device_map is not None
    assert [(r.path, r.devices) for r in report.device_map.stages] == [
        ("layers.0", ("cuda:0",)), ("layers.1", ("cuda:0",)), ("layers.2", ("cuda:1",)),
        ("layers.3", ("cuda:1",))]
    assert [t.boundary for t in report.device_map.transfers] == ["layers.1 -> layers.2"]
    (mismatch,) = [f for f in report.findings if f.code == "PC201"]
    assert "comes from stage 'layers.0' on cuda:0" in mismatch.message


def test_a_third_stage_back_on_the_first_gpu_is_a_pipeline_not_a_ping_pong() -> None:
    class ThreeStages(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.s1 = nn.Linear(8, 8).to("cuda:0")
            self.s2 = nn.Linear(8, 8).to("cuda:1")
            self.s3 = nn.Linear(8, 8).to("cuda:0")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.s3(self.s2(self.s1(x).to("cuda:1")).to("cuda:0"))

    report = placecheck.audit(ThreeStages, device="keep", inputs=["float32[2,8]"])
    assert report.findings == ()
    assert report.device_map is not None
    assert [t.boundary for t in report.device_map.transfers] == ["s1 -> s2", "s2 -> s3"]


def test_the_markdown_comment_folds_the_device_map() -> None:
    text = formatter_for(OutputFormat.MARKDOWN).format(_audit(FIXTURES / "clean_pipeline.py"))
    assert "on cuda:0, cuda:1, as placed, simulated (fake tensors, no data)" in text
    folded = text[text.index("<details>"):text.index("</details>")]
    assert "cuda:0 -> cuda:1" in folded and "s1 -> s2" in folded


def test_a_stage_with_weights_of_known_values_can_be_moved_in_init() -> None:
    # the data-dependent mode keeps a weak reference to a zeroed bias (its values are known), which
    # torch.utils.swap_tensors refuses: .to("cuda:1") in __init__ failed with "Couldn't swap" (GPT-2)
    class ZeroedBias(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.s1 = nn.Linear(4, 4)
            self.s1.bias = nn.Parameter(torch.zeros(4))  # as transformers' Conv1D makes its bias
            self.s1.to("cuda:1")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.s1(x)

    report = placecheck.audit(ZeroedBias, device="keep", engine="fake", inputs=["float32[2,4]"])
    assert report.findings == ()
    assert report.device_map is not None and report.device_map.bytes_per_device() == {"cuda:1": 80}
