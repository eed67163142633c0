"""Identical module calls on the fake engine run once (placecheck.engines.reuse): same findings, fewer ops.

Each test audits a model with ``reuse_calls`` on (the default) and off, and
checks that the findings (code, where, source) and the notes other than the
reuse note are the same, and how many calls were reused: a call is reused only
when it is identical to one that ran and did nothing placement-related. The
models are built on the meta device (``init="meta"``), as a large model is:
their weights' values are unknown, so an expert's output is too (a call whose
output has values the data-dependent mode knows is never reused).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from cli_runner import CliRunner
from forward_helpers import marked_source

import placecheck
from placecheck.cli import app
from placecheck.findings.report import Report

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

INPUT = ["float32[4,8]"]


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(self.act(self.up(x)))
        if hasattr(self, "scale"):
            y = y * self.scale  # MARK scale
        return y


class Experts(nn.Module):
    """Eight identical experts, summed."""

    expert = Expert

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(self.expert() for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for expert in self.experts:
            out = out + expert(x)
        return out


def _both(model: Any, **options: Any) -> tuple[Report, Report]:
    """The audit with identical calls reused, and with every call run; their findings must agree."""
    options = {"init": "meta", **options}
    reused = placecheck.audit(model, "cuda", engine="fake", inputs=INPUT, **options)
    every = placecheck.audit(model, "cuda", engine="fake", inputs=INPUT, reuse_calls=False, **options)
    assert {(f.code, f.where, f.source) for f in reused.findings} == \
        {(f.code, f.where, f.source) for f in every.findings}
    assert [n for n in reused.notes if "did not run again" not in n] == list(every.notes)
    assert not reused.incomplete and not every.incomplete
    return reused, every


def _reused(report: Report) -> int:
    """How many calls the report says did not run again (0 without the note)."""
    for note in report.notes:
        found = re.match(r"forward: ([\d,]+) module calls? did not run again", note)
        if found:
            return int(found.group(1).replace(",", ""))
    return 0


def test_identical_expert_calls_run_once_and_the_findings_are_the_same() -> None:
    reused, every = _both(Experts)
    assert _reused(reused) == 7 and _reused(every) == 0
    assert reused.summary_line().startswith("no placement problems found")
    note = next(n for n in reused.notes if "did not run again" in n)
    assert "e.g. experts.1 as experts.0" in note and "--no-reuse-calls" in note


class Layers(nn.Module):
    """A projection, then three layers of eight experts. The projection's unknown weights make every
    layer's input unknown: the first layer runs, reusing its expert 0 for the other seven, and the
    other two are the first one's call again, reused whole (a reused call inside a watched one is no
    placement event)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.layers = nn.ModuleList(Experts() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_layer_of_reused_experts_is_itself_reused_whole() -> None:
    reused, _ = _both(Layers)
    assert _reused(reused) == 7 + 2
    assert "e.g. layers.1 as layers.0" in next(n for n in reused.notes if "did not run again" in n)


class OneStray(Experts):
    def __init__(self) -> None:
        super().__init__()
        self.experts[5].scale = torch.ones(8)  # type: ignore[assignment]  # .to() leaves it on the CPU


def test_a_stray_in_one_expert_is_still_found_at_its_line() -> None:
    reused, _ = _both(OneStray)
    mismatches = [f for f in reused.findings if f.code == "PC201"]
    assert [f.source.rpartition("/")[2] for f in mismatches] == [marked_source(__file__, "MARK scale")]
    assert any(f.code == "PC101" and f.where == "experts.5.scale" for f in reused.findings)
    assert _reused(reused) == 6  # experts 1-4, 6 and 7 as expert 0; expert 5 differs and runs


class MakesACpuTensor(Expert):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x))) + torch.ones(8)  # MARK ones


class CpuTensorExperts(Experts):
    expert = MakesACpuTensor


def test_a_call_that_meets_an_off_target_tensor_is_never_reused() -> None:
    reused, _ = _both(CpuTensorExperts)
    assert any(f.code in ("PC201", "PC202") and f.source.endswith(marked_source(__file__, "MARK ones"))
               for f in reused.findings)
    assert _reused(reused) == 0


class BuildsALayer(Expert):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "extra"):
            self.extra = nn.Linear(8, 8)  # MARK lazy
        return self.extra(self.down(self.act(self.up(x))))


class LazyExperts(Experts):
    expert = BuildsALayer


def test_each_expert_that_builds_a_layer_in_forward_is_still_reported() -> None:
    reused, _ = _both(LazyExperts)
    assert any(f.code == "PC203" and f.source.endswith(marked_source(__file__, "MARK lazy"))
               for f in reused.findings)
    assert _reused(reused) == 0


class CountsCalls(Expert):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1  # a write to its own state: the next call may differ
        return super().forward(x)


class ReturnsItsInput(Expert):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.up(x)
        return x  # a view of the input: new tensors of its shape would not be the same object


@pytest.mark.parametrize("expert", [CountsCalls, ReturnsItsInput])
def test_a_call_that_writes_its_state_or_returns_its_input_is_never_reused(expert: type[nn.Module]) -> None:
    model = type("Model", (Experts,), {"expert": expert})
    reused, _ = _both(model)
    assert _reused(reused) == 0


def test_a_module_with_hooks_runs_every_call_so_its_hooks_see_every_call() -> None:
    seen: list[int] = []

    def hooked() -> nn.Module:
        model = Experts()
        for k, expert in enumerate(model.experts):
            expert.register_forward_hook(lambda *_, k=k: seen.append(k))
        return model

    reused = placecheck.audit(hooked, "cuda", engine="fake", init="meta", inputs=INPUT)
    assert _reused(reused) == 0 and seen == list(range(8))


class Indexed(Expert):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        if self.index == 6:
            y = y + torch.ones(8)  # MARK index six
        return y


class IndexedExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(Indexed(k) for k in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([e(x) for e in self.experts]).sum(0)


def test_an_attribute_the_code_branches_on_keeps_the_calls_apart() -> None:
    reused, _ = _both(IndexedExperts)
    assert any(f.source.endswith(marked_source(__file__, "MARK index six")) for f in reused.findings)
    assert _reused(reused) == 0  # each expert's index differs: no two calls are identical


class Routed(Expert):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = (self.up(x).sum(-1) > 0).nonzero().squeeze(-1)  # MARK route: unknown weights
        return torch.zeros_like(x).index_add(0, rows, super().forward(x[rows]))


class RoutedExperts(Experts):
    expert = Routed


@pytest.mark.skipif(torch.version.cuda is None, reason="the CPU-only torch build cannot index fake CUDA "
                    "tensors by a tensor; the MoE audit stops before the router")
def test_assumptions_of_reused_calls_are_counted_as_if_they_ran() -> None:
    reused, _ = _both(RoutedExperts)
    assert _reused(reused) == 7
    line = marked_source(__file__, "MARK route")
    assumed = [n for n in reused.notes if line in n and "every element is nonzero" in n]
    assert len(assumed) == 1 and "(8 times)" in assumed[0], reused.notes


def test_the_cli_flag_and_the_config_key_run_every_call(tmp_path: Path) -> None:
    target = f"{Path(__file__)}:Experts"
    runner = CliRunner()
    args = ["audit", target, "--engine", "fake", "--init", "meta", "--input", INPUT[0], "-f", "json"]
    default = json.loads(runner.invoke(app, args).stdout)
    every = json.loads(runner.invoke(app, [*args, "--no-reuse-calls"]).stdout)
    assert any("did not run again" in n for n in default["notes"])
    assert not any("did not run again" in n for n in every["notes"])
    config = tmp_path / "models.toml"
    config.write_text(f'[[models]]\ntarget = "{target}"\nengine = "fake"\ninit = "meta"\n'
                      f'inputs = ["{INPUT[0]}"]\nreuse_calls = false\n', encoding="utf-8")
    result = runner.invoke(app, ["audit", "--config", str(config), "-f", "json", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "did not run again" not in result.stdout
