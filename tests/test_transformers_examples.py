"""The transformers examples (``configs/transformers.toml``) audit clean; the 70B one on the meta device.

Skipped when the optional ``transformers`` extra is absent (``make install``
installs it, so ``make test`` runs these).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from placecheck.basics.config import ModelConfig, load
from placecheck.commands.api import audit
from placecheck.examples import transformers_models
from placecheck.model.load import resolve

pytestmark = pytest.mark.transformers

CONFIG = Path(__file__).parents[1] / "configs" / "transformers.toml"
MODELS = load(CONFIG).models  # the project's own config loader validates every key


def _short(entry: ModelConfig) -> str:
    return entry.target.rpartition(":")[2]


def _options(entry: ModelConfig) -> Any:
    """The entry's audit options (device, init, inputs): its options object where the config has one."""
    return getattr(entry, "options", entry)


def test_the_config_lists_the_four_models() -> None:
    assert [_short(m) for m in MODELS] == ["gpt2", "bert", "t5", "llama_70b"]
    assert {_options(m).init for m in MODELS if _short(m) == "llama_70b"} == {"meta"}
    assert all(_options(m).inputs for m in MODELS)


@pytest.mark.parametrize("entry", MODELS, ids=_short)
def test_example_audits_clean(entry: ModelConfig) -> None:
    factory = resolve(entry.target)
    opts = _options(entry)
    report = audit(factory, opts.device, init=opts.init, target=entry.target, inputs=opts.inputs)
    # no warning or error; what transformers does on purpose is an info finding at most
    assert [(f.code, f.where, f.message) for f in report.findings if f.severity.value != "info"] == []
    assert report.ok
    assert dict(report.stats)["parameters"] > 0
    assert any(n.startswith("forward: ") for n in report.notes)  # the forward ran with the inputs
    assert not any("not checked" in n for n in report.notes)
    if opts.init == "meta":
        assert any(n.startswith("init: meta") for n in report.notes)


def test_a_llama_forward_finds_the_same_on_meta_and_cpu() -> None:
    """The same architecture at toy size, audited with its forward under both inits."""
    inputs = ["input_ids=int64[1,16]:0..32000"]
    on_cpu = audit(transformers_models.llama_tiny, "cuda", init="cpu", inputs=inputs)
    on_meta = audit(transformers_models.llama_tiny, "cuda", init="meta", inputs=inputs)
    assert [f.to_dict() for f in on_meta.findings] == [f.to_dict() for f in on_cpu.findings]
    assert any(n.startswith("forward: ") for n in on_meta.notes)


def test_llama_70b_is_seventy_billion_parameters_and_needs_no_weights() -> None:
    with torch.device("meta"):
        model = transformers_models.llama_70b()
    params = sum(p.numel() for p in model.parameters())
    assert 70e9 < params < 71e9
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_shared_embedding_of_t5_moves_under_simulation() -> None:
    """T5 registers one embedding under three parents; .to() under fake tensors must cope."""
    model = transformers_models.t5()
    assert model.shared is model.encoder.embed_tokens
    report = audit(model, "cuda", init="cpu", forward=False)
    assert report.findings == ()


@pytest.mark.parametrize("library_findings", [False, True])
def test_bert_with_sdpa_attention_syncs_with_the_host_inside_transformers(library_findings: bool) -> None:
    """The SDPA mask check is a real host sync, in transformers' own code: an info finding naming the
    package by default (the user cannot change that line, but can pick another attention or drop an
    all-ones mask), its rule's warning with library_findings."""
    report = audit(lambda: transformers_models.bert(attention="sdpa"), "cuda",
                   library_findings=library_findings,
                   inputs=["input_ids=int64[1,16]:0..30522", "attention_mask=int64[1,16]:1..2"])
    found = [(f.code, f.severity.value, f.source.rpartition("/")[2].partition(":")[0])
             for f in report.findings]
    severity = "warning" if library_findings else "info"
    assert found == [("PC204", severity, "modeling_attn_mask_utils.py")], report.notes
    assert report.findings[0].message.startswith("in transformers, not your code: ")
