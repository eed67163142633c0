"""Framework semantics without false findings (issue 33 item 3): one buggy/fixed fixture pair per idiom.

Each pair lives in ``tests/fixtures/semantics/``: the buggy script marks each line a finding must be
reported at with ``# expect PCnnn``; its fixed twin, the same program written correctly, must give no
warning or error (and none of the codes its twin expects, at any severity). Both run under both
engines of ``placecheck run``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import typing
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from expect_comments import expected_at, serious
from torch.nn.utils.rnn import unpad_sequence

import placecheck
from placecheck.findings.finding import Severity
from placecheck.findings.report import Report
from placecheck.run import run

pytestmark = [pytest.mark.compat]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "semantics"
ENGINES = ("tagged", "fake")


def script(name: str) -> str:
    """A fixture's path as the user would type it from the working directory."""
    return os.path.relpath(FIXTURES / name)


def expected(name: str, command: str = "run") -> set[tuple[str, str]]:
    """(code, source) of every ``# expect PCnnn`` comment of fixture ``name`` (tests/expect_comments.py)."""
    return expected_at(script(name), command)


def model_class(name: str, cls: str) -> type:
    """Class ``cls`` of fixture ``name``, imported (its ``__main__`` part does not run)."""
    spec = importlib.util.spec_from_file_location(f"semantics_{name.removesuffix('.py')}", FIXTURES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return typing.cast(type, getattr(module, cls))


GPUS = {"dp": 2}
"""The simulated GPUs a pair needs (default 1)."""
RUN_PAIRS = ["gan", "ema", "cache", "pack", "script", "dp", "topk", "dataset", "assign", "scriptmodule",
             "scriptmoved", "moveback", "generator", "reload", "schedule"]
"""Pairs whose ``__main__`` is a training script for ``placecheck run``."""

AUDIT_PAIRS = {"cache": ("Cached", "float32[4,8]"), "pack": ("Tagger", "float32[4,6,8]"),
               "script": ("Encoded", "float32[4,8]"), "dp": ("Net", "float32[4,8]"),
               "topk": ("TopK", "float32[4,8]")}
"""Pairs whose model (class, input) ``placecheck audit`` checks too: forward-pass matters."""
WRAPPED = {"dp": nn.DataParallel}
"""What the audited model is wrapped in, as the pair's script wraps it (audited per replica)."""


def audited(pair: str, name: str, engine: str) -> Report:
    """``placecheck.audit`` of the pair's model class in fixture ``name``."""
    cls, given = AUDIT_PAIRS[pair]
    built = model_class(name, cls)
    wrap = WRAPPED.get(pair)
    factory = (lambda: wrap(built())) if wrap is not None else built
    return placecheck.audit(factory, "cuda", engine=engine, inputs=[given], gpus=GPUS.get(pair, 1))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pair", RUN_PAIRS)
def test_buggy_script_is_found_at_its_line(pair: str, engine: str) -> None:
    report = run(script(f"{pair}_buggy.py"), engine=engine, steps=3, gpus=GPUS.get(pair, 1))
    assert serious(report) == expected(f"{pair}_buggy.py")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pair", RUN_PAIRS)
def test_fixed_script_is_clean(pair: str, engine: str) -> None:
    report = run(script(f"{pair}_fixed.py"), engine=engine, steps=3, gpus=GPUS.get(pair, 1))
    assert serious(report) == set()
    assert report.unfinished == "", report.notes  # ran through: no stop of the simulation either
    # the budget was spent (a GAN's iteration that spends it steps its second optimizer too before the
    # fast-forward ends the loop)
    assert dict(report.stats)["optimizer_steps"] in (3, 4)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pair", AUDIT_PAIRS)
def test_audit_finds_the_buggy_model_at_its_line(pair: str, engine: str) -> None:
    report = audited(pair, f"{pair}_buggy.py", engine)
    assert serious(report) == expected(f"{pair}_buggy.py", "audit")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pair", AUDIT_PAIRS)
def test_audit_of_the_fixed_model_is_clean(pair: str, engine: str) -> None:
    report = audited(pair, f"{pair}_fixed.py", engine)
    assert serious(report) == set()
    assert not report.incomplete


# -- "on every call" only when it happens on every call ------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_a_cached_mask_is_info_with_its_counts(engine: str) -> None:
    report = run(script("cache_fixed.py"), engine=engine, steps=3)
    [cached] = [f for f in report.findings if f.code == "PC202"]
    assert cached.source == f"{script('cache_fixed.py')}:17"
    assert "made 1 time in 3 forwards: a cache, not a copy on every call" in cached.message


@pytest.mark.parametrize("engine", ENGINES)
def test_audit_names_the_attribute_a_cached_mask_is_kept_in(engine: str) -> None:
    report = placecheck.audit(model_class("cache_fixed.py", "Cached"), "cuda", engine=engine,
                              inputs=["float32[4,8]"])
    [cached] = [f for f in report.findings if f.code == "PC202"]
    assert cached.source.endswith("cache_fixed.py:17")
    assert "the forward keeps the copy in mask for later calls" in cached.message


# -- syncs and copies a documented torch API makes by itself -------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_run_names_pad_packed_sequence_for_the_sync_it_makes(engine: str) -> None:
    report = run(script("pack_fixed.py"), engine=engine, steps=3)
    [sync] = [f for f in report.findings if f.code == "PC204"]
    assert sync.severity is Severity.INFO
    assert "in pad_packed_sequence (torch)" in sync.message


@pytest.mark.parametrize("engine", ENGINES)
def test_audit_names_the_torch_function_for_its_own_syncs_and_copies(engine: str) -> None:
    report = placecheck.audit(model_class("pack_fixed.py", "Tagger"), "cuda", engine=engine,
                              inputs=["float32[4,6,8]"])
    found = {(f.code, f.severity, f.message.partition(", not your code")[0]) for f in report.findings}
    assert found == {("PC202", Severity.INFO, "in pack_padded_sequence (torch)"),
                     ("PC204", Severity.INFO, "in pad_packed_sequence (torch)")}


class _Unpad(nn.Module):
    """unpad_sequence with the lengths the user made on the GPU: torch's code selects each sequence
    with a boolean mask of its own making (a sync torch makes, whatever the lengths' device)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lengths = torch.tensor([3, 2], device=x.device)
        return torch.cat(unpad_sequence(self.lin(x), lengths, batch_first=True))


class _Unique(nn.Module):
    """torch.unique (torch/functional.py) on the user's own tensor: the user's call, a warning."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.unique(self.lin(x).round())


@pytest.mark.parametrize("engine", ENGINES)
def test_a_sync_on_a_tensor_the_api_made_is_info_and_one_on_the_users_a_warning(engine: str) -> None:
    inside = placecheck.audit(_Unpad, "cuda", engine=engine, inputs=["float32[2,4,3]"])
    [sync] = [f for f in inside.findings if f.code == "PC204"]
    assert sync.severity is Severity.INFO and sync.message.startswith("in unpad_sequence (torch)")
    own = placecheck.audit(_Unique, "cuda", engine=engine, inputs=["float32[2,4,3]"])
    [sync] = [f for f in own.findings if f.code == "PC204"]
    assert sync.severity is Severity.WARNING and "torch.unique" in sync.message


# -- code inside TorchScript functions, at its own line ------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_a_torchscript_helper_runs_as_python_and_says_so(engine: str) -> None:
    report = run(script("script_buggy.py"), engine=engine, steps=3)
    assert any("TorchScript function encode ran as its Python" in n for n in report.notes), report.notes
    cls = model_class("script_buggy.py", "Encoded")
    audited = placecheck.audit(cls, "cuda", engine=engine, inputs=["float32[4,8]"])
    assert any("TorchScript function encode ran as the Python" in n for n in audited.notes), audited.notes
    module = importlib.import_module(cls.__module__) if cls.__module__ in sys.modules else None
    helper = cls.forward.__globals__["encode"]
    assert isinstance(helper, torch.jit.ScriptFunction)  # put back after the audit
    assert module is None or module.encode is helper


@pytest.mark.parametrize("engine", ENGINES)
def test_a_scripted_module_runs_its_python_and_stays_a_script_module(engine: str) -> None:
    """``torch.jit.script(module)``: its methods run as their Python (a finding at its line: the pair), its
    ``save`` still writes TorchScript (the fake engine's tensors as meta tensors, no crash)."""
    report = run(script("scriptmodule_fixed.py"), engine=engine, steps=3)
    assert any("TorchScript module Encoder ran its Python forward" in n for n in report.notes), report.notes
    assert any("ran to its end" in n for n in report.notes), report.notes


# -- DataParallel scatters CPU inputs ------------------------------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_data_parallel_on_one_gpu_takes_cpu_inputs_and_returns_on_it(engine: str) -> None:
    seen: list[tuple[str, str, list[int]]] = []

    def main() -> None:
        model = nn.DataParallel(nn.Linear(8, 1).to("cuda"))
        out = model(torch.randn(4, 8))
        seen.append((str(out.device), str(model.src_device_obj), list(model.device_ids)))

    report = run(main, engine=engine, gpus=1)
    assert serious(report) == set()
    assert seen == [("cuda:0", "cuda:0", [0])]


@pytest.mark.parametrize("engine", ENGINES)
def test_data_parallel_refuses_a_module_left_off_device_ids_0_as_torch_does(engine: str) -> None:
    def main() -> None:
        model = nn.DataParallel(nn.Linear(8, 1))  # never moved: torch refuses it on a GPU machine
        model(torch.randn(4, 8))

    report = run(main, engine=engine, gpus=2)
    said = [f.message for f in report.findings] + list(report.notes)
    assert any("parameters and buffers on device cuda:0 (device_ids[0])" in text for text in said), said


# -- PC308 by identity: what the optimizer holds when it steps -----------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_an_optimizer_given_the_new_model_s_parameters_before_stepping_is_clean(engine: str) -> None:
    def main() -> None:
        model = nn.Linear(4, 1).to("cuda")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model = nn.Linear(4, 1).to("cuda")  # re-created, and the optimizer told so
        optimizer.param_groups[0]["params"] = list(model.parameters())
        model(torch.randn(2, 4, device="cuda")).sum().backward()
        optimizer.step()

    assert run(main, engine=engine).findings == ()



@pytest.mark.parametrize("engine", ENGINES)
def test_an_assign_load_under_the_script_s_swap_flag_keeps_the_optimizer_valid(engine: str) -> None:
    """With ``torch.__future__``'s swap flag set by the script, torch swaps the loaded tensors into the
    module's own Parameter objects: the optimizer built before the load still holds them (no PC308)."""
    kept: list[bool] = []

    def main() -> None:
        torch.__future__.set_swap_module_params_on_conversion(True)
        model = nn.Linear(4, 1).to("cuda")
        weight = model.weight
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(state, assign=True)
        kept.append(model.weight is weight)
        model(torch.randn(2, 4, device="cuda")).sum().backward()
        optimizer.step()

    try:
        assert run(main, engine=engine).findings == ()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert kept == [True]
