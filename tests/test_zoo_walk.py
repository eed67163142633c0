"""Every torchvision classification model walks with zero findings under simulated CUDA.

A zoo of real architectures (BatchNorm, squeeze-excitation, stochastic depth,
attention, relative position tables, ...) is the best guard against false
positives from legitimate internals. Each model is built once, from a factory
(so the audit builds it and no copy is made), with random weights, and freed
before the next.
"""

from __future__ import annotations

import gc

import pytest
import torch

# Skip cleanly on the CPU-only torch build (make test-cpu-build), where torchvision is absent.
torchvision = pytest.importorskip("torchvision")

import placecheck  # noqa: E402

MODELS = torchvision.models.list_models(module=torchvision.models)


def test_zoo_is_listed() -> None:
    # guards against an empty parametrize silently testing nothing
    assert len(MODELS) >= 70 and "resnet18" in MODELS and "vit_b_16" in MODELS


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_torchvision_model_walks_clean_on_simulated_cuda(name: str) -> None:
    def build() -> torch.nn.Module:
        return torchvision.models.get_model(name, weights=None)

    # the walk alone: tests/test_zoo_forward.py runs these models' forward passes
    report = placecheck.audit(build, device="cuda", engine="fake", init="cpu", forward=False)
    assert report.engine == "simulated cuda"
    assert [(f.code, f.where, f.message) for f in report.findings] == []
    assert dict(report.stats)["parameters"] > 0
    del report
    gc.collect()
