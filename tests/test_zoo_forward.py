"""Every torchvision model in ``configs/torchvision.toml`` audits clean with its input under simulated CUDA.

No false alarms on real models: classification, segmentation, detection,
video and optical flow, each built from its builder with random weights and
audited through ``placecheck.audit`` with the forward pass, then freed: no
warning or error, walk and forward. An entry marked ``unsupported`` must still not
come back clean (a strict xfail: pytest shows the reason). What torchvision
handles itself (a stray its forward replaces or only uses on the CPU, a host
sync inside its own code) is an info finding, and the detection, SSD and RAFT
tests check the strays are reported so.

Skipped without torchvision (the CPU-only torch build).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import tomllib
import torch

torchvision = pytest.importorskip("torchvision")

from placecheck.commands.api import audit  # noqa: E402
from placecheck.engines.datadep import KNOWN_BYTES_LIMIT  # noqa: E402
from placecheck.model.construct import _ZeroLargeRandomFills  # noqa: E402
from placecheck.model.inputs import infer_inputs, parse_input_spec, resolve_inputs  # noqa: E402
from placecheck.model.load import parse_kwargs, resolve  # noqa: E402

CONFIG = Path(__file__).parents[1] / "configs" / "torchvision.toml"
ENTRIES: list[dict[str, Any]] = tomllib.loads(CONFIG.read_text(encoding="utf-8"))["models"]
FAMILIES = ("classification", "segmentation", "detection", "video", "optical_flow")


def _name(entry: dict[str, Any]) -> str:
    return str(entry["target"]).rpartition(":")[2]


def _param(entry: dict[str, Any]) -> Any:
    reason = entry.get("unsupported")
    marks = [pytest.mark.xfail(strict=True, reason=f"unsupported: {reason}")] if reason else []
    return pytest.param(entry, id=_name(entry), marks=marks)


_HANDLED = {  # builder name prefix -> the stray attribute its forward handles
    "fasterrcnn": "rpn.anchor_generator.cell_anchors[0]", "maskrcnn": "rpn.anchor_generator.cell_anchors[0]",
    "keypointrcnn": "rpn.anchor_generator.cell_anchors[0]", "retinanet": "anchor_generator.cell_anchors[0]",
    "fcos": "anchor_generator.cell_anchors[0]", "ssd300": "anchor_generator._wh_pairs[0]",
    "ssdlite320": "anchor_generator._wh_pairs[0]", "raft": "corr_block.corr_pyramid[0]",
}


def _factory(entry: dict[str, Any]) -> Any:
    builder = resolve(entry["target"])
    kwargs = parse_kwargs(None, entry.get("args", []))

    def build() -> torch.nn.Module:
        return builder(**kwargs)

    return build


def test_the_config_lists_every_torchvision_model_but_the_quantized() -> None:
    listed = [_name(e) for e in ENTRIES]
    assert len(listed) == len(set(listed)), "a model is listed twice"
    models = torchvision.models
    expected = {n for n in models.list_models() if n not in models.list_models(module=models.quantization)}
    assert set(listed) == expected
    for family in FAMILIES[1:]:
        in_family = set(models.list_models(module=getattr(models, family)))
        assert {_name(e) for e in ENTRIES if e["family"] == family} == in_family, family


def test_every_entry_has_one_input_that_parses() -> None:
    for entry in ENTRIES:
        assert entry["family"] in FAMILIES
        assert ("inputs" in entry) != ("example_inputs" in entry), _name(entry)
        for spec in entry.get("inputs", []):
            parse_input_spec(spec)
        assert set(entry) <= {"target", "family", "args", "inputs", "example_inputs", "init", "unsupported"}


@pytest.mark.parametrize("entry", [pytest.param(e, id=_name(e)) for e in ENTRIES])
def test_inference_gives_the_configured_input(entry: dict[str, Any]) -> None:
    """With neither --input nor --example-inputs, a zoo model gets its configured shape (batch aside)."""
    try:
        with torch.device("meta"):  # no memory, no init: the class and its sizes are all inference reads
            model = _factory(entry)()
    except NotImplementedError:  # RegNet computes its widths with tensors and .tolist() in __init__
        # on the CPU then, its large weights zeroed instead of drawn (as the fake engine's CPU build does):
        # drawing regnet_y_128gf's 2.4 GiB of random weights took most of this test's time
        with _ZeroLargeRandomFills(KNOWN_BYTES_LIMIT):
            model = _factory(entry)()
    inferred, _, text = infer_inputs(model)
    configured, _, _ = resolve_inputs(model, entry.get("inputs", []), entry.get("example_inputs"))

    def shapes(args: Any) -> list[tuple[int, ...]]:
        if isinstance(args, torch.Tensor):
            return [tuple(args.shape[1:]) if args.dim() == 4 or args.dim() == 5 else tuple(args.shape)]
        return [s for a in args for s in shapes(a)]

    assert shapes(inferred) == shapes(configured), text


@pytest.mark.slow
@pytest.mark.parametrize("entry", [_param(e) for e in ENTRIES])
def test_zoo_model_audits_clean_with_its_input(entry: dict[str, Any]) -> None:
    report = audit(_factory(entry), entry.get("device", "cuda"), init=entry.get("init", "auto"),
                   target=entry["target"], inputs=entry.get("inputs", ()),
                   example_inputs=entry.get("example_inputs"))
    try:
        assert report.engine.startswith("simulated cuda")
        assert any(n.startswith("forward: inputs from") for n in report.notes), report.notes
        # no warning or error; what torchvision does on purpose is an info finding at most
        assert [(f.code, f.where, f.source, f.message) for f in report.findings
                if f.severity.value != "info"] == []
        assert dict(report.stats)["parameters"] > 0
        # a stray torchvision's forward handles itself is an info PC101 saying so, not hidden
        handled = _HANDLED.get(_name(entry).split("_")[0])
        if handled:
            assert any(f.code == "PC101" and handled in (f.where, *f.instances)
                       and dict(f.details).get("forward") for f in report.findings), report.findings
    finally:
        del report
        gc.collect()
