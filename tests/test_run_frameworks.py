"""``placecheck run`` on scripts written for frameworks, as users run them: Lightning's ``Trainer``, HF
``Trainer``, accelerate's ``Accelerator``, ``torch.compile`` and the ``torch.accelerator`` API.

Each framework has a buggy script and its fixed twin in ``tests/fixtures/run/frameworks/``: the bug is
found at its line, the fixed one exits 0 with no finding of the framework's own making. Lightning is an
optional test extra (``pip install -e '.[frameworks]'``); its tests skip without it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from conftest import walk_findings

from placecheck.findings.finding import Severity
from placecheck.findings.report import Report, exit_code
from placecheck.run import run

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run" / "frameworks"


def past_the_steps(note: str) -> bool:
    """The ending note of a run that went on past its 2 optimizer steps: it fast-forwarded to the end of
    the script (or stopped at the steps, where the fast-forward could not end the training)."""
    return (note.startswith("run: the script ran to its end (") and "a fast-forward from" in note) \
        or note.startswith("run: stopped after ")


def script(name: str) -> str:
    return os.path.relpath(FIXTURES / name)


def at(name: str, line: int) -> str:
    return f"{script(name)}:{line}"


def above_info(report: Report) -> list[tuple[str, str, str]]:
    """``(code, where, source)`` of every finding that fails a run (warning or error)."""
    return sorted((f.code, f.where, f.source) for f in report.findings if f.severity is not Severity.INFO)


def clean(report: Report) -> bool:
    """The fixed twin: exits 0 and went on past its ``--steps``, not stopped at an error."""
    return exit_code([report]) == 0 and any(past_the_steps(n) for n in report.notes)


# -- torch.compile -----------------------------------------------------------------------------------

def test_compiled_model_and_function_run_eagerly_and_the_bug_is_found_in_the_eager_code() -> None:
    report = run(script("compile_buggy.py"))
    # the crash, and the line to edit: the forward's torch.arange without device= (PC202, as audit)
    assert above_info(report) == [("PC201", "positions", at("compile_buggy.py", 14)),
                                  ("PC202", "Encoder", at("compile_buggy.py", 13))]
    [finding] = [f for f in report.findings if f.code == "PC201"]
    assert finding.origin == at("compile_buggy.py", 13)  # the torch.arange line
    assert any("torch.compile ran eagerly" in n and "not the compiled graph" in n for n in report.notes)


def test_compiled_fixed_twin_is_clean() -> None:
    report = run(script("compile_fixed.py"))
    assert report.findings == () and clean(report)


def test_compile_returns_what_it_returns_on_a_gpu_and_is_restored_after_the_run() -> None:
    compile_before = torch.compile
    seen = {}

    def main() -> None:
        model = torch.compile(nn.Linear(4, 2).to("cuda"))
        seen["wrapped"] = hasattr(model, "_orig_mod")  # an OptimizedModule, as on a GPU
        seen["keys"] = sorted(model.state_dict())
        model(torch.randn(3, 4, device="cuda")).sum().backward()

    report = run(main)
    assert report.findings == ()
    assert seen == {"wrapped": True, "keys": ["_orig_mod.bias", "_orig_mod.weight"]}
    assert torch.compile is compile_before
    assert dynamo_config().disable is False


def dynamo_config() -> Any:
    from torch._dynamo import config

    return config


# -- torch.accelerator ---------------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(torch, "accelerator"), reason="torch.accelerator is new in torch 2.6")
def test_torch_accelerator_sees_the_simulated_gpus_and_the_bug_is_found() -> None:
    report = run(script("accelerator_buggy.py"), gpus=2)
    # the crash, and the labels' creation without device= (PC202: the line to edit)
    assert above_info(report) == [("PC201", "labels", at("accelerator_buggy.py", 14)),
                                  ("PC202", "", at("accelerator_buggy.py", 12))]
    [finding] = [f for f in report.findings if f.code == "PC201"]
    assert finding.expected == "cuda:1"  # set_device_index(device_count() - 1), then .to(device)


@pytest.mark.skipif(not hasattr(torch, "accelerator"), reason="torch.accelerator is new in torch 2.6")
def test_torch_accelerator_fixed_twin_is_clean() -> None:
    report = run(script("accelerator_fixed.py"), gpus=2)
    assert report.findings == () and clean(report)


@pytest.mark.skipif(not hasattr(torch, "accelerator"), reason="torch.accelerator is new in torch 2.6")
def test_torch_accelerator_answers_and_is_restored() -> None:
    before = (torch.accelerator.is_available(), torch.accelerator.device_count())
    seen = {}

    def main() -> None:
        seen["available"] = torch.accelerator.is_available()
        seen["accelerator"] = torch.accelerator.current_accelerator()
        seen["checked"] = torch.accelerator.current_accelerator(check_available=True)
        seen["count"] = torch.accelerator.device_count()
        torch.accelerator.set_device_index(2)
        seen["index"] = torch.accelerator.current_device_index()
        seen["cuda index"] = torch.cuda.current_device()
        with torch.accelerator.device_index(1):
            seen["inside"] = torch.accelerator.current_device_index()
        seen["after"] = torch.accelerator.current_device_index()
        seen["made on"] = torch.ones(2, device=torch.accelerator.current_accelerator()).device

    run(main, gpus=3)
    assert seen == {"available": True, "accelerator": torch.device("cuda"), "checked": torch.device("cuda"),
                    "count": 3, "index": 2, "cuda index": 2, "inside": 1, "after": 2,
                    "made on": torch.device("cuda", 2)}
    assert (torch.accelerator.is_available(), torch.accelerator.device_count()) == before


# -- HF Trainer ----------------------------------------------------------------------------------------

def test_hf_trainer_model_with_a_plain_tensor_attribute() -> None:
    pytest.importorskip("transformers")
    report = run(script("hf_trainer_buggy.py"))
    assert above_info(report) == [("PC101", "class_weights", at("hf_trainer_buggy.py", 27)),
                                  ("PC201", "Classifier", at("hf_trainer_buggy.py", 31))]


def test_hf_trainer_fixed_twin_is_clean_its_own_syncs_are_info_naming_transformers() -> None:
    pytest.importorskip("transformers")
    report = run(script("hf_trainer_fixed.py"))
    assert clean(report)
    assert all(f.severity is Severity.INFO and "(transformers)" in f.message for f in report.findings)
    # its copies of pinned batches are blocking: transformers' own, not a note the script could act on
    assert not any("pinned memory" in n for n in report.notes)


# -- accelerate ------------------------------------------------------------------------------------------

def test_accelerate_loader_not_prepared() -> None:
    pytest.importorskip("accelerate")
    report = run(script("accelerate_buggy.py"))
    assert above_info(report) == [("PC201", "inputs", at("accelerate_buggy.py", 16)),
                                  ("PC201", "labels", at("accelerate_buggy.py", 16))]
    assert all(f.origin == at("accelerate_buggy.py", 15) for f in report.findings)  # the loader loop


def test_accelerate_fixed_twin_is_clean() -> None:
    pytest.importorskip("accelerate")
    report = run(script("accelerate_fixed.py"))
    assert report.findings == () and clean(report)


# -- Lightning -------------------------------------------------------------------------------------------

def test_lightning_training_step_noise_made_on_the_cpu() -> None:
    pytest.importorskip("lightning")
    report = run(script("lightning_buggy.py"))
    assert above_info(report) == [("PC201", "noise", at("lightning_buggy.py", 17)),
                                  ("PC202", "", at("lightning_buggy.py", 16))]  # the line to edit
    [finding] = [f for f in report.findings if f.code == "PC201"]
    assert finding.origin == at("lightning_buggy.py", 16)


def test_lightning_fixed_twin_is_clean_the_trainer_is_not_module_state() -> None:
    pytest.importorskip("lightning")
    report = run(script("lightning_fixed.py"))
    assert clean(report)
    # the Trainer Lightning attaches as LightningModule._trainer (with the DataLoader's dataset) is not walked
    assert any("'_trainer' holds a lightning Trainer" in n for n in report.notes)
    # Lightning's own teardown .cpu() is info naming lightning
    assert all(f.severity is Severity.INFO and "(lightning)" in f.message for f in report.findings)


# -- launchers: copies of the script in other processes ------------------------------------------------

def test_a_script_starting_copies_of_itself_is_stopped_there_with_a_note(tmp_path: Path) -> None:
    marker = tmp_path / "rank1.txt"
    report = run(script("launches_itself.py"), [str(marker)])
    assert not marker.exists()  # no copy ran outside the simulation
    assert report.findings == ()  # not the script's error
    assert any(n.startswith("run: stopped where the script starts copies of itself in other processes")
               for n in report.notes)


def test_lightning_ddp_at_two_devices_is_stopped_before_its_launcher_starts_rank_1() -> None:
    pytest.importorskip("lightning")

    def main() -> None:
        import sys

        sys.argv = [script("lightning_fixed.py")]
        source = (FIXTURES / "lightning_fixed.py").read_text().replace("devices=1", "devices=2")
        exec(compile(source, script("lightning_fixed.py"), "exec"), {"__name__": "__main__"})

    report = run(main, gpus=2)
    assert report.findings == ()
    assert any("starts copies of itself in other processes" in n
               and "placecheck run --nproc-per-node 2 SCRIPT" in n for n in report.notes)


# -- what is module state: evidence, not class names ---------------------------------------------------

def _driver(model: nn.Module, back_reference: bool) -> object:
    """An installed package's object (typer's, a dependency) holding data, and the model when asked."""
    import typer

    driver = typer.Typer()
    driver.data = torch.zeros(3)  # type: ignore[attr-defined]
    if back_reference:
        driver.model = model  # type: ignore[attr-defined]
    return driver


def test_an_installed_packages_object_holding_the_model_is_its_owner_not_its_state() -> None:
    def build() -> nn.Module:
        model = nn.Linear(2, 2)
        model.driver = _driver(model, back_reference=True)
        return model

    assert walk_findings(build) == []


def test_an_installed_packages_object_not_holding_the_model_is_state() -> None:
    def build() -> nn.Module:
        model = nn.Linear(2, 2)
        model.cache = _driver(model, back_reference=False)
        return model

    assert walk_findings(build) == [("PC101", "cache.data")]


class _UserHelper:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.data = torch.zeros(3)


def test_the_users_own_object_holding_the_model_is_state() -> None:
    def build() -> nn.Module:
        model = nn.Linear(2, 2)
        model.helper = _UserHelper(model)
        return model

    assert walk_findings(build) == [("PC101", "helper.data")]
