"""``--device-map``: a model placed by accelerate's map on simulated GPUs, audited as placed.

The map must be accelerate's own (the same as transformers' ``from_pretrained``
computes for the same inputs), the dispatch accelerate's ``dispatch_model``, and
what its hooks do not repair must be found: a stray tensor in a custom module, a
tensor created on ``cuda:0`` in a block mapped to ``cuda:1``. Bad input is one
line and exit 2.

On the CPU-only torch build (``make test-cpu-build``; its venv has accelerate
but not transformers) the option checks, the bad-input cases and the fixtures
run (moves to CUDA take another path there); the tests that need transformers
skip, saying so, as do those that need accelerate where it is not installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import CliRunner
from conftest import TESTS, assert_usage_error, fixture_cases, load_file, read_expected_lines
from forward_helpers import BranchesOnAWeight, ungrouped  # noqa: F401 (the fixture)

from placecheck.basics.devices import parse_size
from placecheck.basics.errors import UsageError
from placecheck.basics.options import AuditOptions
from placecheck.cli import app

FIXTURES = TESTS / "fixtures" / "devicemap"
CASES = fixture_cases(FIXTURES)
LLAMA_8B = "placecheck.examples.transformers_models:llama_8b"
NO_TRANSFORMERS = "transformers is not installed: the Llama-shaped examples need it"


def _accelerate() -> Any:
    return pytest.importorskip("accelerate", reason="accelerate is not installed (the CPU-only build's "
                                                    "venv has no accelerate): --device-map needs it")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["audit", *args])
    return result.exit_code, result.stdout, result.stderr


def map_file(tmp_path: Path, mapping: Any, name: str = "map.json") -> str:
    path = tmp_path / name
    path.write_text(mapping if isinstance(mapping, str) else json.dumps(mapping), encoding="utf-8")
    return str(path)


def fixture_target(name: str) -> str:
    return f"{FIXTURES / name}.py:Model"


# ---- sizes and options (no accelerate needed) -------------------------------------------------------


@pytest.mark.cpu_build
@pytest.mark.parametrize(("text", "expected"), [
    ("80GiB", 80 * 2**30), ("24GB", 24 * 10**9), ("512MiB", 512 * 2**20), ("1.5GiB", 3 * 2**29),
    ("100B", 100), ("2 TiB", 2 * 2**40), ("80G", 80 * 10**9), ("80giB", 80 * 2**30), ("512M", 512 * 10**6),
])
def test_sizes_parse(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.cpu_build
@pytest.mark.parametrize("text", [
    "80", "80i", "80iB", "eighty GiB", "-1GiB", "0GiB", "GiB", "80GiBs", "80 gigs", "",
])
def test_sizes_that_do_not_parse_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="expected"):
        parse_size(text)


@pytest.mark.cpu_build
@pytest.mark.parametrize(("options", "needle"), [
    (dict(device="keep", device_map="auto"), "--device keep and --device-map cannot be combined"),
    (dict(device="cpu", device_map="auto"), "--device cpu and --device-map cannot be combined"),
    (dict(device_map="auto", gpu_memory="80 gigs"), "--gpu-memory '80 gigs': expected a size"),
    (dict(device_map="auto", cpu_memory="lots"), "--cpu-memory 'lots': expected a size"),
    (dict(gpu_memory="24GiB"), "--gpu-memory sizes a device map: add --device-map"),
    (dict(device_map="everywhere"), "--device-map 'everywhere': use auto, balanced"),
    (dict(device_map="auto", init="cpu"), "--init cpu and --device-map cannot be combined"),
    (dict(device_map="auto", train=True), "--train and --device-map cannot be combined"),
    (dict(device_map="auto", engine="tagged"), "--engine tagged and --device-map cannot be combined"),
])
def test_contradicting_options_are_refused(options: dict[str, Any], needle: str) -> None:
    with pytest.raises(UsageError) as info:
        AuditOptions(**options).check()
    assert needle in str(info.value)


@pytest.mark.cpu_build
def test_options_round_trip_for_a_child_process() -> None:
    opts = AuditOptions(device_map="balanced", gpu_memory="24GiB", cpu_memory="64GiB", gpus=4)
    assert AuditOptions.from_dict(opts.to_dict()) == opts


@pytest.mark.cpu_build
def test_config_keys_are_checked(tmp_path: Path) -> None:
    from placecheck.basics.config import load

    path = tmp_path / "placecheck.toml"
    path.write_text('[[models]]\ntarget = "m:f"\ndevice_map = "auto"\ngpus = 4\ngpu_memory = "24 gigs"\n',
                    encoding="utf-8")
    with pytest.raises(UsageError, match="gpu_memory"):
        load(path)
    path.write_text('[[models]]\ntarget = "m:f"\ndevice_map = "auto"\ngpus = 4\ngpu_memory = "24GiB"\n',
                    encoding="utf-8")
    (model,) = load(path).models
    assert (model.options.device_map, model.options.gpu_memory, model.options.gpus) == ("auto", "24GiB", 4)


# ---- bad input from the command line: one line, exit 2 ----------------------------------------------


@pytest.mark.cpu_build
def test_cli_device_keep_with_a_device_map() -> None:
    assert_usage_error(*run(fixture_target("clean_dispatched"), "--device", "keep", "--device-map", "auto"),
                       "--device keep and --device-map cannot be combined")


@pytest.mark.cpu_build
def test_cli_gpu_memory_that_does_not_parse() -> None:
    assert_usage_error(*run(fixture_target("clean_dispatched"), "--device-map", "auto", "--gpu-memory",
                            "24Gb"), "--gpu-memory '24Gb': expected a size such as 80GiB")


@pytest.mark.cpu_build
def test_cli_map_naming_a_gpu_beyond_gpus(tmp_path: Path) -> None:
    _accelerate()
    path = map_file(tmp_path, {"embed": 0, "encoder": 0, "decoder": 3, "head": 1})
    assert_usage_error(*run(fixture_target("clean_dispatched"), "--device-map", path, "--gpus", "2"),
                       "puts 'decoder' on cuda:3, beyond --gpus 2", "use --gpus 4")


@pytest.mark.cpu_build
def test_cli_map_file_that_is_not_json(tmp_path: Path) -> None:
    _accelerate()
    path = map_file(tmp_path, "embed: 0\nencoder: 1\n")
    assert_usage_error(*run(fixture_target("clean_dispatched"), "--device-map", path), "is not JSON (line 1")


@pytest.mark.cpu_build
def test_cli_map_file_that_is_missing(tmp_path: Path) -> None:
    _accelerate()
    assert_usage_error(*run(fixture_target("clean_dispatched"), "--device-map", str(tmp_path / "no.json")),
                       "cannot read it")


@pytest.mark.cpu_build
def test_cli_map_naming_unknown_modules(tmp_path: Path) -> None:
    _accelerate()
    path = map_file(tmp_path, {"embed": 0, "encoder": 0, "decoder": 1, "head": 1, "pooler": 1})
    assert_usage_error(*run(fixture_target("clean_dispatched"), "--device-map", path),
                       "names 'pooler', which is not a module of Model",
                       "embed, encoder, decoder, head")


@pytest.mark.cpu_build
def test_cli_map_leaving_weights_without_a_device(tmp_path: Path) -> None:
    _accelerate()
    path = map_file(tmp_path, {"embed": 0, "encoder": 0, "decoder": 1})
    assert_usage_error(*run(fixture_target("clean_dispatched"), "--device-map", path),
                       "gives no device to 'head.weight' and 1 more")


@pytest.mark.cpu_build
def test_cli_map_with_a_device_that_is_not_one(tmp_path: Path) -> None:
    _accelerate()
    path = map_file(tmp_path, {"embed": 0, "encoder": "gpu1", "decoder": 1, "head": 1})
    assert_usage_error(*run(fixture_target("clean_dispatched"), "--device-map", path),
                       "'encoder' has device 'gpu1'")


@pytest.mark.cpu_build
def test_cli_without_accelerate_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate raises ImportError
    assert_usage_error(*run(fixture_target("clean_dispatched"), "--device-map", "auto"),
                       "--device-map needs accelerate", "pip install 'placecheck[accelerate]'")


# ---- the map is accelerate's own ----------------------------------------------------------------------


@pytest.mark.transformers
def test_the_8b_map_equals_what_transformers_and_accelerate_compute() -> None:
    """The map placecheck prints for Llama-8B on 4 x 24GiB is the one ``from_pretrained(device_map="auto",
    max_memory=...)`` computes (transformers' own ``_get_device_map``) and the one
    ``accelerate.infer_auto_device_map`` returns with ``get_balanced_memory``'s budget."""
    _accelerate()
    pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    import torch
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory
    from transformers.modeling_utils import _get_device_map

    from placecheck.engines.cudaapi import cuda_queries_simulated
    from placecheck.examples.transformers_models import llama_8b
    from placecheck.placement.dispatch import plan_device_map

    with torch.device("meta"):
        model = llama_8b()
    plan = plan_device_map(model, "auto", 4, "24GiB", None)
    budget = {i: 24 * 2**30 for i in range(4)}
    with cuda_queries_simulated(4):
        by_transformers = _get_device_map(model, "auto", dict(budget), None, None, None)
        balanced = get_balanced_memory(model, max_memory=dict(budget),
                                       no_split_module_classes=["LlamaDecoderLayer"])
        by_accelerate = infer_auto_device_map(model, max_memory=balanced,
                                              no_split_module_classes=["LlamaDecoderLayer"])
    assert plan.as_accelerate() == dict(by_transformers) == dict(by_accelerate)
    assert {d for _, d in plan.entries} == {0, 1, 2, 3}  # 32 GB of float32 needs all four GPUs
    assert plan.no_split == ("LlamaDecoderLayer",)
    per_device = plan.bytes_per_device()
    state = [*model.parameters(), *model.buffers()]  # non-persistent buffers (rotary inv_freq) included
    assert sum(per_device.values()) == sum(t.nelement() * t.element_size() for t in state)
    assert all(n <= 24 * 2**30 for n in per_device.values())


@pytest.mark.transformers
@pytest.mark.parametrize("spec", ["balanced_low_0", "sequential"])
def test_other_computed_maps_equal_transformers(spec: str) -> None:
    _accelerate()
    pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    import torch
    from transformers.modeling_utils import _get_device_map

    from placecheck.engines.cudaapi import cuda_queries_simulated
    from placecheck.examples.transformers_models import llama_tiny
    from placecheck.placement.dispatch import plan_device_map

    with torch.device("meta"):
        model = llama_tiny()
    budget = {0: 6 * 2**20, 1: 6 * 2**20, 2: 6 * 2**20, "cpu": 64 * 2**20}
    plan = plan_device_map(model, spec, 3, "6MiB", "64MiB")
    with cuda_queries_simulated(3):
        expected = _get_device_map(model, spec, dict(budget), None, None, None)
    assert plan.as_accelerate() == dict(expected)


# ---- fixtures: one model per pattern beside its expected findings -----------------------------------


def report_rows(source: Path, report: Any) -> list[tuple[str, str, str]]:
    rows = []
    for f in report.findings:
        path, _, lineno = f.source.rpartition(":")
        in_fixture = Path(path).name == source.name and f.code != "PC101"
        rows.append((f.code, f.where, lineno if in_fixture else "-"))
    return sorted(rows)


def audit_fixture(source: Path, tmp_path: Path, **options: Any) -> Any:
    import placecheck

    model = load_file(source)
    path = map_file(tmp_path, load_file(source, "DEVICE_MAP"))
    return placecheck.audit(model, device_map=path, inputs=load_file(source, "INPUTS"), **options)


@pytest.mark.cpu_build
@pytest.mark.usefixtures("ungrouped")
@pytest.mark.parametrize(("source", "expected"), CASES)
def test_device_map_fixture(source: Path, expected: Path, tmp_path: Path) -> None:
    _accelerate()
    assert expected.is_file(), f"{source.name} has no {expected.name} beside it"
    report = audit_fixture(source, tmp_path)
    assert report.engine == "simulated cuda"
    assert report_rows(source, report) == read_expected_lines(expected), report.notes
    assert not report.incomplete


@pytest.mark.cpu_build
def test_the_dispatched_model_is_placed_as_the_map_says(tmp_path: Path) -> None:
    """The report's device map lists every entry with its device and bytes, the GPUs' budgets, and the
    copies accelerate's hooks made between the GPUs; the clean model has no finding."""
    _accelerate()
    report = audit_fixture(FIXTURES / "clean_dispatched.py", tmp_path, gpu_memory="1MiB")
    assert report.findings == ()
    stages = {row.path: row.devices for row in report.device_map.stages}
    assert stages == {"embed": ("cuda:0",), "encoder": ("cuda:0",), "decoder": ("cuda:1",),
                      "head": ("cuda:1",)}
    assert dict(report.device_map.budgets) == {"cuda:0": 2**20, "cuda:1": 2**20}
    assert {(t.src, t.dst) for t in report.device_map.transfers} >= {("cuda:0", "cuda:1")}
    assert all("meta" not in (t.src, t.dst) for t in report.device_map.transfers)


@pytest.mark.cpu_build
def test_offloaded_entries_are_one_warning_each_with_their_bytes(tmp_path: Path) -> None:
    _accelerate()
    report = audit_fixture(FIXTURES / "offloaded.py", tmp_path)
    by_where = {f.where: f for f in report.findings}
    assert sorted(by_where) == ["decoder", "head"]
    decoder, head = by_where["decoder"], by_where["head"]
    assert (decoder.code, decoder.severity.value, decoder.device, decoder.expected) == (
        "PC208", "warning", "cpu", "cuda:0")
    assert decoder.count == 4 and decoder.nbytes == (64 * 32 + 64 + 32 * 64 + 32) * 4
    assert "offloaded to cpu by the device map" in decoder.message
    assert head.device == "disk" and "read from disk" in head.message
    notes = {row.path: row.note for row in report.device_map.stages}
    assert "copied to cuda:0 on every forward" in notes["decoder"] and notes["embed"] == ""


@pytest.mark.cpu_build
def test_a_computed_map_offloads_what_does_not_fit(tmp_path: Path) -> None:
    """--gpu-memory too small for the model: accelerate's map sends the rest to the CPU (with
    --cpu-memory) or to disk, and the audit says so."""
    _accelerate()
    import placecheck

    model = load_file(FIXTURES / "clean_dispatched.py")
    report = placecheck.audit(model, device_map="sequential", gpus=1, gpu_memory="32KiB",
                              cpu_memory="18KiB", inputs=["int64[2,8]:0..100"])
    devices = {row.path: row.devices[0] for row in report.device_map.stages}
    assert "cpu" in devices.values() and "disk" in devices.values(), devices
    assert {f.code for f in report.findings} == {"PC208"}
    assert {f.device for f in report.findings} == {"cpu", "disk"}


@pytest.mark.cpu_build
def test_tied_weights_stay_tied_and_shaped_on_fake_tensors(tmp_path: Path) -> None:
    """accelerate tells tied weights by data_ptr(), which is 0 for every fake tensor: without the shim
    every weight on a GPU would be replaced by the tied one (a shape error in forward, PC207)."""
    _accelerate()
    import torch
    import torch.nn as nn

    import placecheck

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(50, 16)
            self.body = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 16))
            self.head = nn.Linear(16, 50, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(self.embed(ids)))

    path = map_file(tmp_path, {"embed": 0, "body": 1, "head": 0})
    report = placecheck.audit(Tied, device_map=path, inputs=["int64[2,4]:0..50"])
    assert report.findings == (), [f.message for f in report.findings]
    assert not report.incomplete


@pytest.mark.transformers
def test_the_printed_8b_map_is_accelerates(tmp_path: Path) -> None:
    """The map ``placecheck audit llama_8b --device-map auto --gpus 4 --gpu-memory 24GiB`` prints (JSON)
    equals ``infer_auto_device_map`` for the same model and budget."""
    _accelerate()
    pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    import torch
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    from placecheck.engines.cudaapi import cuda_queries_simulated
    from placecheck.examples.transformers_models import llama_8b

    code, out, err = run(LLAMA_8B, "--init", "meta", "--device-map", "auto", "--gpus", "4", "--gpu-memory",
                         "24GiB", "--no-forward", "--format", "json", "--exit-zero")
    assert code == 0, err
    printed = {row["path"]: row["devices"] for row in json.loads(out)["device_map"]["stages"]}
    with torch.device("meta"):
        model = llama_8b()
    budget = {i: 24 * 2**30 for i in range(4)}
    with cuda_queries_simulated(4):
        no_split = ["LlamaDecoderLayer"]
        balanced = get_balanced_memory(model, max_memory=budget, no_split_module_classes=no_split)
        expected = infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split)
    assert printed == {name: [f"cuda:{d}"] for name, d in expected.items()}
    assert json.loads(out)["device_map"]["budgets"] == {f"cuda:{i}": 24 * 2**30 for i in range(4)}


def test_a_branch_on_an_assumed_value_is_in_the_device_map_audits_summary_too() -> None:
    """A device-mapped model goes through the same walk and forward as a moved one: where its code
    branched on a value the fake engine assumed, the summary does not claim that everything ran."""
    _accelerate()
    import placecheck

    report = placecheck.audit(BranchesOnAWeight, device_map="auto", gpus=2, inputs=["float32[2,4]"],
                              ignore=["PC204"])
    assert not report.findings and not report.incomplete
    assert dict(report.stats)["assumed_branches"] == 1
    assert report.summary_line().startswith("no placement problems found")
    assert "the paths other values take are unchecked" in report.summary_line()
