"""``audit`` and ``run`` are one detector: the same classifier, host-sync table, source attribution and
traversal (issue 23 item 1).

The same model goes through both: ``placecheck.audit`` of its class, and ``placecheck.run`` of a
script that builds it and calls it in a training loop. Every problem of the model is reported by both,
with the same code at the same line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import placecheck
from placecheck.run import run

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "one_detector"
SCRIPT = os.path.relpath(FIXTURES / "model_and_loop.py")


def _line(text: str) -> str:
    """``file:line`` of the fixture line containing ``text``."""
    lines = (FIXTURES / "model_and_loop.py").read_text(encoding="utf-8").splitlines()
    return f"{SCRIPT}:{next(i for i, line in enumerate(lines, 1) if text in line)}"


@pytest.fixture
def model_class(monkeypatch: pytest.MonkeyPatch) -> type:
    monkeypatch.syspath_prepend(str(FIXTURES))
    sys.modules.pop("model_and_loop", None)
    import model_and_loop

    return model_and_loop.Net  # type: ignore[no-any-return]


@pytest.mark.parametrize("engine", [
    pytest.param("fake", marks=pytest.mark.skipif(
        torch.version.cuda is None, reason="fake tensors stop at nonzero on the CPU-only torch build")),
    "tagged"])
def test_audit_and_run_report_the_same_problems_of_one_model(model_class: type, engine: str) -> None:
    audited = placecheck.audit(model_class, "cuda", engine=engine, inputs=["float32[4,8]"])
    ran = run(SCRIPT, steps=2)
    found_by_audit = sorted((f.code, f.source, f.severity) for f in audited.findings)
    found_by_run = sorted((f.code, f.source, f.severity) for f in ran.findings)
    assert found_by_run == found_by_audit
    # the syncs audit always found and run's own list of 9 calls missed: boolean-mask indexing, nonzero
    syncs = {f.source: f for f in ran.findings if f.code == "PC204"}
    assert set(syncs) == {_line("h[h > 0]"), _line("torch.nonzero")}
    # each code's message comes from its rule, whichever command found it
    assert sorted(f.message for f in ran.findings if f.code != "PC201") \
        == sorted(f.message for f in audited.findings if f.code != "PC201")


def test_a_limit_of_the_simulation_is_a_note_in_run_as_in_audit() -> None:
    def needs_a_driver() -> None:
        raise RuntimeError("Found no NVIDIA driver on your system.")

    report = run(needs_a_driver)
    assert report.findings == ()
    assert any(n.startswith("run: stopped at ") and "needs a real CUDA driver" in n for n in report.notes)


def test_run_leaves_torch_as_it_found_it() -> None:
    """run's few patches (placecheck/run/patches.py) are all undone, also when the script raises."""
    import subprocess

    import torch.nn as nn
    from torch.utils.data import dataloader

    owners = [(nn.Module, "to"), (nn.Module, "cuda"), (torch.optim.Optimizer, "__init__"),
              (torch.optim.Optimizer, "load_state_dict"), (dataloader.DataLoader, "__iter__"),
              (dataloader._BaseDataLoaderIter, "__next__"), (torch, "load"), (torch, "save"),
              (torch.__future__, "set_overwrite_module_params_on_conversion"), (torch, "compile"),
              (subprocess.Popen, "__init__"), (torch, "from_numpy"), (torch, "frombuffer")]
    before = [vars(owner).get(name) for owner, name in owners]

    def raises() -> None:
        nn.Linear(2, 2).to("cuda")
        raise ValueError("the script's own bug")

    report = run(raises)  # the script's own error: no finding, the run did not run through
    assert report.findings == () and report.unfinished.startswith("the script raised ValueError at ")
    assert [vars(owner).get(name) for owner, name in owners] == before
    assert not torch.__future__.get_swap_module_params_on_conversion()
