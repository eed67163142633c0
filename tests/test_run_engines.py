"""``placecheck run --engine auto|tagged|fake``: a job of any size, and the one detector under both engines.

The fake engine runs a whole script with fake tensors (:mod:`placecheck.run.fake`); ``auto``
starts with real values and switches to fake tensors when a real-valued step would not fit
(:mod:`placecheck.run.auto`). Fixtures: ``tests/fixtures/run/size/`` (a 4 GB embedding, far more
than a test may allocate) and every script of ``tests/fixtures/run/``, whose findings must be the
same codes at the same lines under both engines.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from cli_runner import CliRunner
from conftest import unwrapped

from placecheck.basics.errors import UsageError
from placecheck.cli import app
from placecheck.engines.engine import SIMULATED_CUDA, SIMULATED_CUDA_VALUES
from placecheck.run import run
from placecheck.run.auto import parse_bytes

pytestmark = [pytest.mark.compat]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run"
SIZE = FIXTURES / "size"


def script(path: Path) -> str:
    return os.path.relpath(path)


WIDE_BUGGY = script(SIZE / "wide_buggy.py")
WIDE_FIXED = script(SIZE / "wide_fixed.py")


def codes_and_lines(report: object) -> list[tuple[str, str]]:
    return sorted((f.code, f.source) for f in report.findings)  # type: ignore[attr-defined]


# -- the fake engine: a model no real-valued run could hold ----------------------------------------

def test_fake_engine_finds_the_loss_weight_left_on_the_cpu_of_a_model_too_big_for_real_values() -> None:
    report = run(WIDE_BUGGY, engine="fake")
    assert report.engine == SIMULATED_CUDA
    [mismatch] = [f for f in report.findings if f.code == "PC201"]
    assert mismatch.source == f"{WIDE_BUGGY}:14"
    assert mismatch.where == "criterion.weight"
    assert mismatch.device == "cpu" and mismatch.expected == "cuda:0"
    assert dict(report.stats)["optimizer_steps"] == 2
    assert any(n.startswith("engine: CUDA simulated with fake tensors") and "--engine fake" in n
               for n in report.notes)


def test_fake_engine_notes_each_assumed_value_at_its_line() -> None:
    report = run(WIDE_BUGGY, engine="fake")
    assumed = [n for n in report.notes if "ran on an assumption" in n]
    assert any(f"{WIDE_BUGGY}:18" in n and ".item()" in n and "the value 1.0" in n for n in assumed), assumed
    assert any(f"{WIDE_BUGGY}:20" in n and ".item()" in n for n in assumed), assumed
    assert any(f"{WIDE_BUGGY}:20" in n and n.startswith("run: printing a tensor") for n in assumed), assumed


def test_fake_engine_prints_known_values_as_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    def main() -> None:
        x = torch.tensor([1.5, 2.5]).to("cuda")
        print(x * 2)
        print(f"{(x * 2).sum().item():.1f}")

    report = run(main, engine="fake")
    out = capsys.readouterr().out
    assert "tensor([3., 5.], device='cuda:0')" in out
    assert "8.0" in out
    assert not [n for n in report.notes if "ran on an assumption" in n]  # the values were known


def test_fake_engine_gives_gradients_to_what_the_loss_reaches() -> None:
    grads: list[tuple[str, torch.Size]] = []

    def main() -> None:
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)).to("cuda")
        frozen = nn.Linear(4, 4).to("cuda")
        frozen.requires_grad_(False)
        model(frozen(torch.randn(5, 4, device="cuda"))).sum().backward()
        grads.extend((str(p.grad.device), p.grad.shape) for p in model.parameters())
        grads.append(("frozen", frozen.weight.grad))  # type: ignore[arg-type]

    run(main, engine="fake")
    assert grads[:4] == [("cuda:0", torch.Size([3, 4])), ("cuda:0", torch.Size([3])),
                         ("cuda:0", torch.Size([2, 3])), ("cuda:0", torch.Size([2]))]
    assert grads[4] == ("frozen", None)


def test_fixed_twin_exits_0_under_the_fake_engine() -> None:
    result = CliRunner().invoke(app, ["run", "--engine", "fake", WIDE_FIXED])
    assert result.exit_code == 0, result.output
    assert "PC201" not in result.stdout


# -- auto: fake tensors when a real-valued step would not fit -------------------------------------

def test_auto_switches_to_fake_tensors_when_the_model_would_not_fit() -> None:
    report = run(WIDE_BUGGY)
    assert report.engine == SIMULATED_CUDA
    [chose] = [n for n in report.notes if n.startswith("engine: auto chose fake tensors")]
    assert f"when the script reached {WIDE_BUGGY}:7" in chose  # where the 4 GB embedding was built
    found = [(f.code, f.source) for f in report.findings if f.code == "PC201"]
    assert found == [("PC201", f"{WIDE_BUGGY}:14")]


def test_auto_keeps_real_values_for_a_small_script_and_runs_it_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[float] = []

    def main() -> None:
        model = nn.Linear(4, 1).to("cuda")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(torch.ones(2, 4, device="cuda")).sum()
        calls.append(loss.item())
        print("loss is real")
        loss.backward()
        optimizer.step()

    report = run(main)
    assert report.engine == SIMULATED_CUDA_VALUES
    assert len(calls) == 1 and calls[0] != 1.0
    assert capsys.readouterr().out.count("loss is real") == 1
    assert any(n.startswith("engine: CUDA simulated with real CPU values (1 GPU), chosen by --engine auto")
               for n in report.notes)


def test_auto_over_a_small_budget_runs_again_with_fake_tensors_and_drops_the_first_output(
        capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []

    def main() -> None:
        calls.append("started")
        print("hello once")
        model = nn.Linear(64, 64).to("cuda")
        model(torch.ones(2, 64, device="cuda")).sum().backward()

    report = run(main, memory="1KiB")
    assert calls == ["started", "started"]  # what ran before the switch runs twice (the note says so)
    assert capsys.readouterr().out.count("hello once") == 1
    assert report.engine == SIMULATED_CUDA
    [chose] = [n for n in report.notes if n.startswith("engine: auto chose fake tensors")]
    assert "over the budget of 1.0 KiB (run(memory=...))" in chose and "happened twice" in chose


def test_auto_reads_its_budget_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLACECHECK_RUN_MEMORY", "2K")
    report = run(script(FIXTURES / "batch_buggy.py"))
    assert report.engine == SIMULATED_CUDA
    assert any("PLACECHECK_RUN_MEMORY=2K" in n for n in report.notes)
    assert codes_and_lines(report) == [("PC201", f"{script(FIXTURES / 'batch_buggy.py')}:16")]


def test_a_bad_budget_is_the_users_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLACECHECK_RUN_MEMORY", "lots")
    with pytest.raises(UsageError, match="PLACECHECK_RUN_MEMORY 'lots': expected a size such as"):
        run(script(FIXTURES / "batch_fixed.py"))
    assert parse_bytes("512MiB") == 512 << 20 and parse_bytes("8g") == 8 * 10**9
    assert parse_bytes("100B") == 100
    with pytest.raises(UsageError, match="the unit is required"):
        parse_bytes("100")  # the one grammar (placecheck.basics.values.Size): the unit is required


def test_a_bad_engine_is_one_line_and_exit_2() -> None:
    result = CliRunner().invoke(app, ["run", "--engine", "gpu", script(FIXTURES / "batch_fixed.py")])
    assert result.exit_code == 2
    lines = unwrapped(result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placecheck: error: ") and "--engine 'gpu'" in lines[0]
    assert "auto|tagged|fake" in lines[0]
    with pytest.raises(UsageError):
        run(script(FIXTURES / "batch_fixed.py"), engine="real")


@pytest.mark.cpu_build
def test_a_cpu_only_build_of_torch_keeps_real_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # fake CUDA tensors cannot record autograd there: fake is refused, auto keeps real values
    import placecheck.engines.cudaapi

    monkeypatch.setattr(placecheck.engines.cudaapi, "CPU_ONLY_BUILD", True)
    with pytest.raises(UsageError, match="--engine fake needs torch built with CUDA support"):
        run(script(FIXTURES / "batch_fixed.py"), engine="fake")
    report = run(script(FIXTURES / "batch_buggy.py"), memory="1k")
    assert report.engine == SIMULATED_CUDA_VALUES
    assert any("keeps real values on a CPU-only build" in n for n in report.notes)
    assert codes_and_lines(report) == [("PC201", f"{script(FIXTURES / 'batch_buggy.py')}:16")]


# -- one detector: the same findings at the same lines under both engines --------------------------

SKIPPED = {
    "hangs.py": "never ends: only --timeout stops it",
    "frameworks/lightning_buggy.py": "Lightning's clean-up after the --steps stop moves the module back, "
                                     "which the fake engine cannot (a note; the test above)",
    "frameworks/lightning_fixed.py": "the same",
    "custom_backward_buggy.py": "the fake engine runs no backward code (a custom autograd.Function's "
                                "mistake there is the real-valued engine's to find; a note says so)",
}
"""Fixtures not compared, and why. No other fixture's findings differ between the engines."""

_SCRIPTS = [*FIXTURES.glob("*.py"), *FIXTURES.glob("frameworks/*.py")]
COMPARED = sorted(n for n in (p.relative_to(FIXTURES).as_posix() for p in _SCRIPTS) if n not in SKIPPED)


@pytest.mark.parametrize("name", COMPARED)
def test_both_engines_find_the_same_codes_at_the_same_lines(name: str) -> None:
    if name.startswith("frameworks/"):
        pytest.importorskip({"accelerate": "accelerate", "hf": "transformers"}.get(
            name.split("/")[1].split("_")[0], "torch"))
    path = script(FIXTURES / name)
    tagged = run(path, engine="tagged", timeout=60)
    fake = run(path, engine="fake", timeout=60)
    assert tagged.engine == SIMULATED_CUDA_VALUES and fake.engine == SIMULATED_CUDA
    assert codes_and_lines(fake) == codes_and_lines(tagged)


def test_lightning_runs_its_steps_under_the_fake_engine_and_fast_forwards_through_its_loader() -> None:
    # Lightning deep-copies logged values (fake copies); after the --steps budget its fit loop (not the
    # script's) ends through the DataLoader's iterator, and fit() returns as after its last epoch: its
    # teardown (the module moved back to the CPU) runs, never the script's PC207
    pytest.importorskip("lightning")
    buggy = run(script(FIXTURES / "frameworks" / "lightning_buggy.py"), engine="fake")
    found = [(f.code, f.source.rsplit(":", 1)[1]) for f in buggy.findings if f.code != "PC204"]
    assert found == [("PC201", "17"), ("PC202", "16")]  # the tensor made without device=, at its line
    fixed = run(script(FIXTURES / "frameworks" / "lightning_fixed.py"), engine="fake")
    assert "PC207" not in [f.code for f in fixed.findings] and dict(fixed.stats)["optimizer_steps"] == 2
    assert all(f.severity.value == "info" for f in fixed.findings)  # the host syncs Lightning makes
    assert any("the iterators of the DataLoader iterated at" in n and "ended early: 2 batches skipped" in n
               for n in fixed.notes)
    assert fixed.unfinished == ""


@pytest.mark.parametrize("engine", ["tagged", "fake"])
def test_a_transformers_llama_fine_tune_runs_clean_with_no_finding_of_its_making(engine: str) -> None:
    # benchmarks/size/llama_finetune.py at a tiny shape: its ModuleList slice (self.layers[:n]) builds
    # no layer, and its rotary embedding's unused alias of a buffer is transformers' own (info)
    pytest.importorskip("transformers")
    path = script(Path(__file__).resolve().parent.parent / "benchmarks" / "size" / "llama_finetune.py")
    report = run(path, args=["--size", "tiny", "--seq-len", "16"], engine=engine)
    assert dict(report.stats)["optimizer_steps"] == 2
    assert [(f.code, f.severity.value) for f in report.findings if f.severity.value != "info"] == []
    [stray] = [f for f in report.findings if f.code == "PC101"]
    assert stray.where == "model.rotary_emb.original_inv_freq"
    assert stray.message.startswith("in transformers, not your code: ")


def test_a_fake_tensor_refusal_is_the_simulations_limit_never_the_scripts_error() -> None:
    # mnist's DataLoader under --engine fake read a value of a fake tensor: a limit note, exit 2, no finding
    # and no "the script raised"
    import torch

    from placecheck.engines.compat import DataDependentOutputException
    from placecheck.run.recorder import RunRecorder

    recorder = RunRecorder(gpus=1, steps=2)
    recorder.fake_engine = True
    error = DataDependentOutputException(torch.ops.aten._local_scalar_dense.default)
    assert recorder.error_finding(error) is None
    assert recorder.limit.startswith("run: stopped: the fake engine could not go on: it reads tensor values")
    real_values = RunRecorder(gpus=1, steps=2)  # the tagged engine never raises it: no limit claimed there
    assert real_values.error_finding(error) is not None and real_values.limit == ""
