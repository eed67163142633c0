"""The transformers examples (``configs/transformers.toml``) audit clean; the 70B one on the meta device.

Skipped when the optional ``transformers`` extra is absent (``make install``
installs it, so ``make test`` runs these).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomllib
import torch

pytest.importorskip("transformers")

from placecheck.api import audit
from placecheck.examples import transformers_models
from placecheck.load import resolve

CONFIG = Path(__file__).parents[1] / "configs" / "transformers.toml"
ENTRIES = tomllib.loads(CONFIG.read_text(encoding="utf-8"))["models"]


def _short(entry: dict[str, Any]) -> str:
    return str(entry["target"]).rpartition(":")[2]


def test_the_config_lists_the_four_models() -> None:
    assert [_short(e) for e in ENTRIES] == ["gpt2", "bert", "t5", "llama_70b"]
    assert {e["init"] for e in ENTRIES if _short(e) == "llama_70b"} == {"meta"}


@pytest.mark.parametrize("entry", ENTRIES, ids=_short)
def test_example_audits_clean(entry: dict[str, Any]) -> None:
    factory = resolve(entry["target"])
    init = entry.get("init", "auto")
    report = audit(factory, entry["device"], init=init, target=entry["target"])
    assert report.findings == ()
    assert report.ok
    assert dict(report.stats)["parameters"] > 0
    if init == "meta":
        assert any(n.startswith("init: meta") for n in report.notes)


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
    report = audit(model, "cuda", init="cpu")
    assert report.findings == ()
