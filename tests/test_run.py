"""``placecheck.run``: whole scripts on a simulated GPU, one buggy/fixed fixture pair per problem.

Each pair lives in ``tests/fixtures/run/``: the buggy script must report the
problem at the user's lines, its fixed twin must not. The scripts really run
(in this process, as ``__main__``), bounded by ``steps``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from kept_scratch import kept, remove_kept

import placecheck
from placecheck.basics.errors import LoadError
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.report import Report
from placecheck.run import run

# runs on the CPU-only torch build too (Makefile: test-cpu-build)
pytestmark = [pytest.mark.cpu_build, pytest.mark.compat]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run"
EXAMPLES = Path(__file__).resolve().parent.parent / "placecheck" / "examples"


def script(name: str) -> str:
    """A fixture's path as the user would type it from the working directory."""
    return os.path.relpath(FIXTURES / name)


def at(name: str, line: int) -> str:
    return f"{script(name)}:{line}"


def codes(report: Report) -> list[str]:
    return [f.code for f in report.findings]


def only(report: Report, code: str) -> list[Finding]:
    return [f for f in report.findings if f.code == code]


@pytest.fixture
def cuda3_checkpoint(tmp_path: Path) -> str:
    from checkpoint_writer import save_with_locations

    path = tmp_path / "saved_on_cuda3.pt"
    save_with_locations(dict(nn.Linear(8, 2).state_dict()), path, default="cuda:3")
    return str(path)


@pytest.fixture
def cpu_resume_checkpoint(tmp_path: Path) -> str:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    path = tmp_path / "resume.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    return str(path)


# -- 1. a batch element not moved ------------------------------------------------------------------

def test_batch_element_left_on_the_cpu_names_the_loss_the_loader_line_and_the_element() -> None:
    report = run(script("batch_buggy.py"))
    [finding] = report.findings
    assert finding.code == "PC201"
    assert finding.source == at("batch_buggy.py", 16)  # the loss
    assert finding.origin == at("batch_buggy.py", 14)  # the loader loop
    assert "`labels` (batch[1], from the DataLoader at" in finding.message
    assert finding.where == "labels"
    assert finding.device == "cpu" and finding.expected == "cuda:0"
    assert "labels = labels.to(device)" in finding.hint


def test_batch_fully_moved_is_clean() -> None:
    report = run(script("batch_fixed.py"))
    assert report.findings == ()
    [ending] = [n for n in report.notes if n.startswith("run: the script ran to its end")]
    assert "2 optimizer steps, then a fast-forward from" in ending


# -- 2. a criterion or metric holding CPU tensors -------------------------------------------------------

def test_criterion_weight_pos_weight_and_metric_on_the_cpu() -> None:
    report = run(script("criterion_buggy.py"))
    found = {f.where: f for f in report.findings if f.code == "PC201"}
    assert set(found) == {"criterion.weight", "pos_weight", "total"}
    # the lines to edit: each tensor the script made without device= (issue 41 item 2); the criterion's
    # weight is fixed by moving the criterion (its hint), not at the line that made it
    assert {(f.code, f.source) for f in report.findings if f.code != "PC201"} == {
        ("PC202", at("criterion_buggy.py", 15)), ("PC202", at("criterion_buggy.py", 17))}
    assert found["criterion.weight"].source == at("criterion_buggy.py", 23)
    assert "criterion.to(device)" in found["criterion.weight"].hint
    assert found["pos_weight"].source == at("criterion_buggy.py", 24)
    assert found["pos_weight"].origin == at("criterion_buggy.py", 15)  # where it was created
    assert found["total"].source == at("criterion_buggy.py", 28)
    assert found["total"].origin == at("criterion_buggy.py", 17)


def test_criterion_moved_and_tensors_made_on_the_device_is_clean() -> None:
    assert run(script("criterion_fixed.py")).findings == ()


# -- 3. host syncs in the loop --------------------------------------------------------------------------

def test_loop_syncs_are_one_info_per_line_with_calls_per_step_forward_sync_stays_pc204() -> None:
    report = run(script("syncs_buggy.py"))
    loop = {f.source: f for f in report.findings if f.severity is Severity.INFO}
    assert set(loop) == {at("syncs_buggy.py", n) for n in (29, 30, 31)}  # .item(), .cpu(), print(loss)
    assert all(f.code == "PC204" and "1 per optimizer step" in f.message for f in loop.values())
    [forward] = [f for f in report.findings if f.severity is not Severity.INFO]
    assert (forward.code, forward.severity, forward.source) == ("PC204", Severity.WARNING,
                                                                at("syncs_buggy.py", 15))
    assert forward.where == "Net"


@pytest.mark.skipif(torch.version.cuda is None,
                    reason="torch.amp.GradScaler('cuda') needs a CUDA build of torch, simulated or not")
def test_a_sync_inside_torch_names_the_function_that_made_it() -> None:
    def train() -> None:
        model = nn.Linear(4, 1).to("cuda")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        for _ in range(2):
            scaler.scale(model(torch.randn(2, 4, device="cuda")).sum()).backward()
            scaler.step(optimizer)
            scaler.update()

    [finding] = run(train).findings
    assert finding.code == "PC204" and finding.severity is Severity.INFO
    assert ".item() in GradScaler._maybe_opt_step (torch) of a cuda:0 tensor" in finding.message
    assert "syncs by design" in finding.hint


def test_formatting_a_device_scalar_works_and_is_a_sync_once() -> None:
    seen = []

    def main() -> None:
        loss = torch.ones((), device="cuda") * 2
        seen.append(f"{loss:.3f}")

    [finding] = run(main).findings
    assert seen == ["2.000"]
    assert finding.code == "PC204" and "formatting of a cuda:0 tensor" in finding.message
    assert "a host sync, once" in finding.message


@pytest.mark.transformers
def test_a_sync_inside_installed_code_in_forward_is_info_naming_it() -> None:
    transformers = pytest.importorskip("transformers")

    def main() -> None:
        config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=32)
        model = transformers.BertModel(config).to("cuda")
        ids = torch.randint(0, 50, (2, 8), device="cuda")
        model(input_ids=ids, attention_mask=torch.ones_like(ids))

    [finding] = run(main).findings
    assert (finding.code, finding.severity, finding.where) == ("PC204", Severity.INFO, "BertModel")
    assert "(transformers)" in finding.message and finding.source.rsplit(":", 1)[0].endswith("test_run.py")


def test_no_syncs_in_loop_or_forward_is_clean() -> None:
    # the loop never syncs; the one read after it (the fast-forward runs it) is an info, said as it ran
    [after] = run(script("syncs_fixed.py")).findings
    assert (after.code, after.severity, after.source) == ("PC204", Severity.INFO, at("syncs_fixed.py", 30))
    assert "once after the last optimizer step" in after.message


# -- 4. checkpoints and resumed optimizers ----------------------------------------------------------------

def test_checkpoint_from_a_gpu_the_machine_lacks_is_pc301_at_the_load(cuda3_checkpoint: str) -> None:
    report = run(script("resume_buggy.py"), [cuda3_checkpoint])
    assert codes(report) == ["PC301"]  # the load's failure itself is not a second finding
    finding = report.findings[0]
    assert finding.source == at("resume_buggy.py", 10)
    assert finding.device == "cuda:3"
    assert "map_location" in finding.hint


def test_checkpoint_from_a_gpu_the_machine_has_loads_there(tmp_path: Path) -> None:
    from checkpoint_writer import save_with_locations

    path = tmp_path / "saved_on_cuda0.pt"
    save_with_locations({"w": torch.ones(3)}, path, default="cuda:0")
    seen = []
    report = run(lambda: seen.append(str(torch.load(path)["w"].device)))
    assert report.findings == () and seen == ["cuda:0"]


def test_checkpoint_loaded_with_map_location_is_clean(cuda3_checkpoint: str) -> None:
    report = run(script("resume_fixed.py"), [cuda3_checkpoint])
    # load_state_dict copies the GPU tensors of the state into the model's CPU parameters (param.copy_,
    # as on a GPU: the model moves only after): torch's own copy, info
    assert [(f.code, f.severity) for f in report.findings] == [("PC204", Severity.INFO)]
    assert "Module._load_from_state_dict (torch)" in report.findings[0].message
    assert any("ran to its end" in n for n in report.notes)


def test_optimizer_state_resumed_before_the_move_is_pc307_with_bytes(cpu_resume_checkpoint: str) -> None:
    report = run(script("optimizer_buggy.py"), [cpu_resume_checkpoint])
    [finding] = report.findings
    assert finding.code == "PC307"
    assert finding.source == at("optimizer_buggy.py", 16)  # optimizer.load_state_dict
    assert finding.where == "Adam.param_groups[0]"
    assert (finding.device, finding.expected) == ("cpu", "cuda:0")
    # exp_avg and exp_avg_sq of 4 parameters (16*8 + 16 + 16 + 1 floats each)
    assert finding.count == 8 and finding.nbytes == 2 * (16 * 8 + 16 + 16 + 1) * 4


def test_optimizer_state_left_on_another_gpu_is_pc307(cpu_resume_checkpoint: str) -> None:
    def resume() -> None:
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to("cuda:1")
        optimizer = torch.optim.Adam(model.parameters())
        optimizer.load_state_dict(torch.load(cpu_resume_checkpoint)["optimizer"])  # cast to cuda:1
        model.to("cuda:0")
        model(torch.randn(2, 8, device="cuda:0")).sum().backward()
        optimizer.step()

    [finding] = run(resume, gpus=2).findings
    assert (finding.code, finding.device, finding.expected) == ("PC307", "cuda:1", "cuda:0")


def test_optimizer_state_loaded_after_the_move_is_clean(cpu_resume_checkpoint: str) -> None:
    assert run(script("optimizer_fixed.py"), [cpu_resume_checkpoint]).findings == ()


# -- 5. DataLoader and copies ---------------------------------------------------------------------------

def test_whole_dataset_copied_every_step_is_pc209_and_pinning_mismatches_are_notes() -> None:
    report = run(script("loader_buggy.py"))
    [finding] = report.findings
    assert (finding.code, finding.severity, finding.source) == ("PC209", Severity.WARNING,
                                                                at("loader_buggy.py", 19))
    assert finding.nbytes == 256 * 8 * 4
    [unpinned] = [n for n in report.notes if "non_blocking=True) of" in n]
    assert unpinned.startswith(at("loader_buggy.py", 17)) and "batch[0], batch[1]" in unpinned
    [blocking] = [n for n in report.notes if "blocking .to()" in n]
    assert blocking.startswith(at("loader_buggy.py", 18))


def test_pinned_non_blocking_batches_and_dataset_moved_once_is_clean() -> None:
    report = run(script("loader_fixed.py"))
    assert report.findings == ()
    assert not [n for n in report.notes if "pin_memory" in n]


# -- 6. an optimizer of a model the forward no longer uses ---------------------------------------------

def test_optimizer_built_before_the_model_is_recreated_is_pc308() -> None:
    report = run(script("stale_buggy.py"))
    [finding] = report.findings
    assert finding.code == "PC308"
    assert finding.source == at("stale_buggy.py", 8)  # the line that built the optimizer
    assert "0.weight, 0.bias, 2.weight, 2.bias" in finding.message


def test_optimizer_built_from_the_trained_model_is_clean() -> None:
    assert run(script("stale_fixed.py")).findings == ()


def test_optimizer_built_before_model_to_stays_valid() -> None:
    """On a GPU .to() keeps each Parameter object, so an optimizer built before the move is fine."""

    def train() -> None:
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.to("cuda")
        for _ in range(3):
            model(torch.randn(2, 4, device="cuda")).sum().backward()
            optimizer.step()

    report = run(train)
    assert report.findings == ()


def test_the_live_modules_are_every_module_alive_and_nothing_else() -> None:
    """PC308's evidence: which live modules register an optimizer's parameters. The scan filters in C
    against nn.Module's subclasses; it must find what a test of each object finds, a class with two bases
    and one made at run time included."""
    import gc

    from placecheck.run.optimizers import _live_modules

    class Mixin:
        pass

    class Both(Mixin, nn.Linear):
        pass

    made = type("Made", (nn.Sequential,), {})
    kept = [Both(2, 2), made(nn.ReLU()), nn.Linear(2, 2), Mixin()]
    found = {id(m) for m in _live_modules()}
    assert {id(m) for m in kept[:3]} | {id(kept[1][0])} <= found
    assert id(kept[3]) not in found
    assert found == {id(o) for o in gc.get_objects() if isinstance(o, nn.Module)}


def test_optimizer_built_before_a_move_that_overwrites_parameters_is_pc308() -> None:
    def train() -> None:
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.to("cuda")
        model(torch.randn(2, 4, device="cuda")).sum().backward()
        optimizer.step()

    assert codes(run(train)) == ["PC308"]


def test_state_dict_saved_by_the_script_is_plain_and_loads_back_where_it_was(tmp_path: Path) -> None:
    saved = tmp_path / "model.pt"
    seen = []

    def train() -> None:
        model = nn.Linear(4, 1).to("cuda")
        torch.save(model.state_dict(), saved)
        state = torch.load(saved)  # weights_only: a placecheck class in the file would be refused
        seen.append(str(state["weight"].device))

    report = run(train)
    assert report.findings == ()
    assert seen == ["cuda:0"]
    assert type(torch.load(saved, map_location="cpu")["weight"]) is torch.Tensor


# -- forward-pass performance anywhere in the run ---------------------------------------------------------

def test_created_then_copied_in_forward_is_pc202_and_cpu_indices_are_pc205() -> None:
    report = run(script("forward_buggy.py"))
    found = {(f.code, f.source, f.where) for f in report.findings}
    assert found == {("PC202", at("forward_buggy.py", 16), "Net"),
                     ("PC202", at("forward_buggy.py", 17), "Net"),  # the CPU index made per call, as audit
                     ("PC205", at("forward_buggy.py", 18), "Net"),
                     ("PC205", at("forward_buggy.py", 25), "")}


def test_tensors_made_on_the_device_in_forward_is_clean() -> None:
    assert run(script("forward_fixed.py")).findings == ()


def test_layer_built_in_forward_is_pc203_at_its_line() -> None:
    def main() -> None:
        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.proj: nn.Module | None = None

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if self.proj is None:
                    self.proj = nn.Linear(x.shape[-1], 2)
                return self.proj(x)

        Net().to("cuda")(torch.randn(2, 4, device="cuda"))

    found = {f.code: f for f in run(main).findings}
    assert set(found) == {"PC201", "PC203"}  # built on the CPU: it also mixes devices at its first call
    assert (found["PC203"].where, found["PC203"].device) == ("Net.proj", "cpu")
    path, line = found["PC203"].source.rsplit(":", 1)
    assert path.endswith("test_run.py")
    assert "self.proj = nn.Linear" in Path(__file__).read_text().splitlines()[int(line) - 1]


def test_a_slice_of_a_modulelist_in_forward_builds_no_layer_but_a_new_one_still_is_pc203() -> None:
    # self.layers[:n] makes a new ModuleList holding the existing layers (transformers' Llama does so in
    # every forward): the layers were the model's before the forward, nothing is built there
    def main() -> None:
        class Net(nn.Module):
            def __init__(self, built_late: bool) -> None:
                super().__init__()
                self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
                self.built_late = built_late

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                for layer in self.layers[:2]:
                    x = layer(x)
                if self.built_late and len(self.layers) == 3:
                    self.layers.append(nn.Linear(4, 4, device=x.device))
                return x

        for built_late in (False, True):
            net = Net(built_late).to("cuda")
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            net(torch.randn(2, 4, device="cuda")).sum().backward()
            optimizer.step()

    found = [(f.code, f.where, f.severity) for f in run(main, steps=0).findings]
    assert found == [("PC203", "ModuleList.3", Severity.WARNING)]


def _stray_run(rotary: type[nn.Module], used: bool) -> Finding:
    """The PC101 of a run whose model is a ``rotary`` embedding holding a stale alias of its buffer
    (``original_inv_freq``), which the script reads (``used``) or never does."""
    def main() -> None:
        model = rotary().to("cuda")
        positions = torch.arange(4, device="cuda")[None]
        out = model(torch.randn(1, 4, 8, device="cuda"), positions)[0]
        if used:
            out = out + model.original_inv_freq.to(out.device).sum()
        out.sum()

    (found,) = [f for f in run(main).findings if f.code == "PC101"]
    assert found.where == "original_inv_freq"
    return found


@pytest.mark.parametrize("used", [True, False])
def test_a_stray_the_script_never_uses_in_an_installed_class_is_info_naming_the_package(used: bool) -> None:
    # transformers' rotary embedding keeps original_inv_freq, a plain-attribute alias of its buffer, which
    # only dynamic RoPE reads: as audit says it of a forward that never used it, from what the run did
    # with it and where the class lives, not from the names
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, max_position_embeddings=16)
    found = _stray_run(lambda: LlamaRotaryEmbedding(config), used)
    if used:
        # used only through a moved copy (.to(out.device)): never meets a device tensor, as audit says
        assert found.severity is Severity.INFO and "never used" not in found.message
        assert not found.message.startswith("in transformers")
        assert ("forward", "moved-copies") in found.details
    else:
        assert found.severity is Severity.INFO
        assert found.message.startswith("in transformers, not your code: ")
        assert found.message.endswith("the script never used it in the run")
        assert found.hint == "state of transformers, unused here: nothing to change in your code"


def test_a_stray_the_script_never_uses_in_its_own_class_stays_an_error() -> None:
    class Rotary(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("inv_freq", torch.ones(4), persistent=False)
            self.original_inv_freq = self.inv_freq

        def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor]:
            return (x * self.inv_freq.sum(),)

    found = _stray_run(Rotary, used=False)
    assert found.severity is Severity.ERROR and "never used" not in found.message


# -- the script's code that autograd calls during a backward ------------------------------------------

def test_a_cpu_mask_in_a_gradient_hook_is_found_at_the_hook() -> None:
    # autograd calls the hook inside loss.backward(): it runs simulated, with the gradient on its device
    buggy = run(script("grad_hook_buggy.py"))
    [found] = [f for f in buggy.findings if f.code == "PC201"]
    assert (found.code, found.where, found.source) == ("PC201", "mask", at("grad_hook_buggy.py", 10))
    # the line to edit: the mask made without device= (issue 41 item 2)
    assert [(f.code, f.source) for f in buggy.findings if f.code != "PC201"] == [
        ("PC202", at("grad_hook_buggy.py", 9))]
    assert run(script("grad_hook_fixed.py")).findings == ()


def test_a_custom_functions_backward_runs_simulated_and_its_cpu_tensor_is_found_there() -> None:
    buggy = run(script("custom_backward_buggy.py"), engine="tagged")
    [found] = [f for f in buggy.findings if f.code == "PC201"]
    # the tensor made without device= in the backward, at its line (issue 41 item 2)
    assert [(f.code, f.source) for f in buggy.findings if f.code != "PC201"] == [
        ("PC202", at("custom_backward_buggy.py", 17))]
    assert (found.code, found.source) == ("PC201", at("custom_backward_buggy.py", 17))
    assert run(script("custom_backward_fixed.py"), engine="tagged").findings == ()


@pytest.mark.skipif(torch.version.cuda is None, reason="--engine fake needs a CUDA build of torch (no GPU)")
def test_the_fake_engine_says_a_custom_functions_backward_did_not_run() -> None:
    report = run(script("custom_backward_buggy.py"), engine="fake")
    assert [f for f in report.findings if f.severity is not Severity.INFO] == []
    assert any(n.startswith(f"run: the backward of ScaleGrad ({at('custom_backward_buggy.py', 15)}), a "
                            "custom autograd.Function, did not run") for n in report.notes), report.notes


def test_a_gradient_a_custom_backward_returns_on_the_cpu_is_autograds_own_error() -> None:
    class Detached(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
            return torch.ones(grad.shape)  # a gradient on the CPU for a cuda:0 input

    def main() -> None:
        x = torch.randn(3, device="cuda", requires_grad=True)
        Detached.apply(x).sum().backward()

    [found] = run(main, engine="tagged").findings
    assert found.code == "PC201"
    assert "Function DetachedBackward returned an invalid gradient at index 0 - expected device cuda:0 but " \
           "got cpu" in found.message


def test_whole_module_saved_and_loaded_by_the_script(tmp_path: Path) -> None:
    saved = tmp_path / "whole.pt"
    seen = []

    def main() -> None:
        model = nn.BatchNorm1d(3).to("cuda")
        torch.save(model, saved)
        seen.append(str(next(model.parameters()).device))  # the script's model is untouched
        loaded = torch.load(saved, weights_only=False)
        seen.append(str(loaded.running_mean.device))
        loaded(torch.randn(4, 3, device="cuda"))

    report = run(main)
    assert report.findings == ()
    assert seen == ["cuda:0", "cuda:0"]
    plain = torch.load(saved, weights_only=False, map_location="cpu")  # the file names no placecheck class
    assert type(plain.weight) is nn.Parameter and plain.weight.device.type == "cpu"


# -- the seeds' loop ------------------------------------------------------------------------------------

def test_example_training_loop_with_labels_forgotten() -> None:
    pytest.importorskip("torchvision")  # the example loads FakeData; no torchvision beside the CPU-only build
    buggy = run(os.path.relpath(EXAMPLES / "train_buggy.py"))
    assert [f.where for f in buggy.findings if f.code == "PC201"] == ["labels"]
    # the logging line after optimizer.step() ran after both steps (the fast-forward ends the loop after
    # the iteration of the second step, not inside it)
    [logging] = [f for f in buggy.findings if f.code == "PC204"]
    assert "1 per optimizer step" in logging.message
    fixed = run(os.path.relpath(EXAMPLES / "train_fixed.py"))
    assert fixed.ok and "PC201" not in codes(fixed)


# -- walking module moves -------------------------------------------------------------------------------

def test_modules_the_script_moves_are_walked_at_the_move() -> None:
    def main() -> None:
        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = nn.Linear(4, 4)
                self.mask = torch.ones(4)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.fc(x)

        Net().to("cuda")

    report = run(main)
    [finding] = report.findings
    assert (finding.code, finding.where) == ("PC101", "mask")
    assert ("model", "Net") in finding.details


# -- how runs end, and bad input -------------------------------------------------------------------------

def test_missing_script_syntax_error_and_missing_module_are_load_errors(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="no such script"):
        run(str(tmp_path / "absent.py"))
    broken = tmp_path / "broken.py"
    broken.write_text((FIXTURES / "syntax_error.py.txt").read_text())
    with pytest.raises(LoadError, match=r"broken.py:1: syntax error"):
        run(str(broken))
    with pytest.raises(LoadError, match="no module named 'placecheck_no_such_module'"):
        run("placecheck_no_such_module", module=True)


def test_sys_exit_is_reported_in_the_notes_not_raised() -> None:
    report = run(script("exits_3.py"))
    assert report.findings == ()
    said = f"sys.exit(3) at {at('exits_3.py', 9)} after 0 optimizer steps: python exits with status 3"
    assert any(said in n for n in report.notes)


def test_a_non_zero_sys_exit_leaves_the_run_unfinished_exit_code_2_its_message_reported() -> None:
    from placecheck.findings.report import exit_code

    for name, status, said in (("exits_3.py", 3, ""), ("exits_message.py", 1, ": config file missing")):
        report = run(script(name))
        assert report.findings == ()
        assert report.unfinished == f"the script exited with status {status} at {at(name, 9)}{said}"
        assert "the script did not run through" in report.summary_line()
        assert exit_code([report]) == 2
        assert exit_code([report], exit_zero=True) == 2  # not a finding: --exit-zero does not hide it
    report = run(script("exits_message.py"))
    assert any("python prints 'config file missing' and exits with status 1" in n for n in report.notes)
    for args in ([], ["no-code"]):  # sys.exit(0), sys.exit()
        fixed = run(script("exits_0.py"), args)
        assert fixed.unfinished == "" and exit_code([fixed]) == 0


def test_a_limit_of_the_simulation_is_a_note_naming_it_never_the_scripts_pc207() -> None:
    from placecheck.findings.report import exit_code

    buggy = run(script("limit_buggy.py"))
    assert [(f.code, f.source) for f in buggy.findings] == [("PC201", at("limit_buggy.py", 11)),
                                                            ("PC202", at("limit_buggy.py", 10))]
    [note] = [n for n in buggy.notes if n.startswith("run: stopped at")]
    assert note.startswith(f"run: stopped at {at('limit_buggy.py', 12)}: the code there needs a real CUDA")
    assert buggy.unfinished == f"the simulation stopped at {at('limit_buggy.py', 12)}"
    assert exit_code([buggy]) == 1  # a finding was made before the stop
    fixed = run(script("limit_fixed.py"))
    assert fixed.findings == () and fixed.unfinished
    assert "no placement problems found" in fixed.summary_line()
    assert "the script did not run through" in fixed.summary_line()
    assert exit_code([fixed]) == 2  # nothing found, the rest unchecked


def test_a_python_bug_inside_placecheck_during_the_run_is_the_simulations_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from placecheck.run.recorder import RunRecorder

    monkeypatch.setattr(RunRecorder, "step_done", None)  # the optimizer hook then fails inside placecheck
    report = run(script("batch_fixed.py"))
    assert "PC207" not in codes(report)
    [note] = [n for n in report.notes if "the simulation could not run the code there" in n]
    assert "placecheck's simulation raised TypeError: 'NoneType' object is not callable" in note
    assert report.unfinished.startswith("the simulation stopped at " + script("batch_fixed.py"))


def test_after_the_steps_the_evaluation_runs_fast_forwarded_and_finds_the_accumulator() -> None:
    report = run(script("eval_buggy.py"))
    assert report.unfinished == ""
    [ending] = [n for n in report.notes if n.startswith("run: the script ran to its end")]
    assert f"2 optimizer steps, then a fast-forward from {at('eval_buggy.py', 21)} (--steps 2)" in ending
    assert (f"the loop at {script('eval_buggy.py')}:16-21 (`for _step in range(4):`) ended early: "
            "2 iterations skipped") in "\n".join(report.notes)
    for whole in (report, run(script("eval_buggy.py"), steps=0)):
        [finding] = [f for f in whole.findings if f.code == "PC201"]
        # the accumulator made without device=, at its line (issue 41 item 2)
        assert [(f.code, f.source) for f in whole.findings if f.code != "PC201"] == [
            ("PC202", at("eval_buggy.py", 24))]
        assert (finding.code, finding.where, finding.source, finding.origin) == (
            "PC201", "val_loss", at("eval_buggy.py", 28), at("eval_buggy.py", 24))
        assert "created by torch.tensor at" in finding.message
    assert run(script("eval_fixed.py")).findings == ()
    assert run(script("eval_fixed.py"), steps=0).findings == ()


_STOP_IN_FUNCTION = (
    "import torch\n"                                                       # 1
    "\n"                                                                   # 2
    "\n"                                                                   # 3
    "def evaluate(model):\n"                                               # 4
    "    return model(torch.randn(2, 4, device='cuda')).sum().item()\n"    # 5
    "\n"                                                                   # 6
    "\n"                                                                   # 7
    "def main():\n"                                                        # 8
    "    model = torch.nn.Linear(4, 1).cuda()\n"                           # 9
    "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"              # 10
    "    for epoch in range(3):\n"                                         # 11
    "        for _ in range(40):\n"                                        # 12
    "            model(torch.randn(2, 4, device='cuda')).sum().backward()\n"  # 13
    "            opt.step()\n"                                             # 14
    "        print(epoch, evaluate(model))\n"                              # 15
    "\n"                                                                   # 16
    "\n"                                                                   # 17
    "main()\n")                                                            # 18


def test_the_fast_forward_runs_the_functions_after_the_loop_once(tmp_path: Path) -> None:
    train = tmp_path / "train.py"
    train.write_text(_STOP_IN_FUNCTION)
    report = run(str(train), steps=3)
    [finding] = report.findings
    assert (finding.code, finding.source) == ("PC204", f"{train}:5")  # evaluate's .item()
    notes = "\n".join(report.notes)
    assert f"the loop at {train}:12-14 (`for _ in range(40):`) ended early: 37 iterations skipped" in notes
    assert f"the loop at {train}:11-15 (`for epoch in range(3):`) ended early: 2 iterations skipped" in notes
    assert dict(report.stats)["optimizer_steps"] == 3
    assert report.coverage is not None and report.coverage.run == report.coverage.lines


def test_a_stop_the_fast_forward_cannot_avoid_names_the_unrun_functions_it_would_call(tmp_path: Path) -> None:
    # the training loop is in a helper module of the user's (run as it is, not rewritten) over a range, no
    # DataLoader: nothing ends it, and the run stops MAX_STEPS_AFTER steps after the budget, naming what
    # the stop left unrun
    (tmp_path / "helper.py").write_text(
        "import torch\n"
        "\n"
        "def fit(model):\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for _ in range(40):\n"
        "        model(torch.randn(2, 4, device='cuda')).sum().backward()\n"
        "        opt.step()\n")
    train = tmp_path / "train.py"
    train.write_text(
        "import torch\n"                                                       # 1
        "from helper import fit\n"                                             # 2
        "\n"                                                                   # 3
        "\n"                                                                   # 4
        "def evaluate(model):\n"                                               # 5
        "    return model(torch.randn(2, 4, device='cuda')).sum().item()\n"    # 6
        "\n"                                                                   # 7
        "\n"                                                                   # 8
        "def main():\n"                                                        # 9
        "    model = torch.nn.Linear(4, 1).cuda()\n"                           # 10
        "    fit(model)\n"                                                     # 11
        "    print(evaluate(model))\n"                                         # 12
        "\n"                                                                   # 13
        "\n"                                                                   # 14
        "main()\n")                                                            # 15
    report = run(str(train), steps=3)
    [note] = [n for n in report.notes if n.startswith("run: stopped")]
    assert "after 11 optimizer steps (--steps 3, 8 of them after the budget: the fast-forward did not " \
           "end the training loop)" in note
    assert "lines 12 (`print(evaluate(model))`); evaluate() (line 6); --steps 0 runs" in note
    assert run(str(train), steps=0).findings[0].code == "PC204"  # evaluate's .item() ran


def test_a_module_run_with_m_fast_forwards_as_a_script(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "trainmod.py").write_text(_STOP_IN_FUNCTION)
    monkeypatch.chdir(tmp_path)
    report = run("trainmod", steps=3, module=True)
    assert [(f.code, f.source.rsplit(":", 1)[1]) for f in report.findings] == [("PC204", "5")]
    assert dict(report.stats)["optimizer_steps"] == 3


def test_sync_rates_come_from_the_counts_not_assumed_per_step() -> None:
    report = run(script("syncs_every_n.py"), steps=0)
    rates = {f.source: f.message for f in report.findings}
    assert "2 times in 20 optimizer steps" in rates[at("syncs_every_n.py", 16)]
    assert "once after the last optimizer step" in rates[at("syncs_every_n.py", 17)]
    cut = run(script("syncs_every_n.py"), steps=5)  # step 0 only: once in the steps that ran
    cut_rates = {f.source: f.message for f in cut.findings}
    assert "once in 5 optimizer steps" in cut_rates[at("syncs_every_n.py", 16)]
    # --steps 2 fast-forwards after the iteration of the second step(): the line after step() could run
    # in two steps, ran in one; the line after the loop ran once after them
    short = {f.source: f.message for f in run(script("syncs_every_n.py"), steps=2).findings}
    assert "once in 2 optimizer steps" in short[at("syncs_every_n.py", 16)]
    assert "per optimizer step" not in short[at("syncs_every_n.py", 16)]
    assert "once after the last optimizer step" in short[at("syncs_every_n.py", 17)]
    three = {f.source: f.message for f in run(script("syncs_every_n.py"), steps=3).findings}
    assert "once in 3 optimizer steps" in three[at("syncs_every_n.py", 16)]


def test_a_checkpoint_saved_from_a_second_gpu_carries_cuda_1_and_resuming_it_on_one_gpu_is_pc301(
        tmp_path: Path) -> None:
    from placecheck.checkpoint import read_checkpoint

    saved = str(tmp_path / "ckpt.pt")
    assert run(script("save_cuda1.py"), [saved], gpus=2).findings == ()
    assert {s.location for s in read_checkpoint(saved).storages} == {"cuda:1"}
    buggy = run(script("resume_cuda1_buggy.py"), [saved])
    assert {(f.code, f.source) for f in buggy.findings} == {("PC301", at("resume_cuda1_buggy.py", 10))}
    assert run(script("resume_cuda1_fixed.py"), [saved]).findings == ()
    assert run(script("resume_cuda1_buggy.py"), [saved], gpus=2).findings == ()  # the machine has cuda:1


def test_script_without_model_or_optimizer_gets_a_note() -> None:
    report = run(script("no_model.py"))
    assert report.findings == ()
    assert any("moved no module to the GPU and built no optimizer" in n for n in report.notes)


def test_the_scripts_own_error_is_no_finding_but_an_unfinished_run_at_its_line() -> None:
    from placecheck.findings.report import exit_code

    report = run(script("raises.py"))  # a shape error: the script's bug, not a placement problem
    assert report.findings == ()
    # torch's own text after the line (torch 2.15 starts it with "addmm: ")
    assert report.unfinished.startswith(f"the script raised RuntimeError at {at('raises.py', 8)}: ")
    assert "mat1 and mat2 shapes cannot be multiplied" in report.unfinished
    path = at("raises.py", 8).rpartition(":")[0]
    assert report.script_traceback[0] == f'  File "{path}", line 8, in <module>'
    assert exit_code([report]) == exit_code([report], exit_zero=True) == 2
    # a device error is still a finding (PC201 here), and the run goes on past it: it ran through
    buggy = run(script("batch_buggy.py"))
    assert [f.code for f in buggy.findings] == ["PC201"] and buggy.unfinished == ""


def test_dataloader_workers_run_on_the_cpu() -> None:
    report = run(script("workers_fixed.py"))
    assert report.findings == ()
    assert dict(report.stats)["optimizer_steps"] == 2


def test_timeout_stops_a_hanging_script() -> None:
    report = run(script("hangs.py"), timeout=0.5)
    assert any("stopped at --timeout 0.5 s at " + at("hangs.py", 9) in n for n in report.notes)


def test_steps_bound_the_run_and_zero_runs_to_the_end() -> None:
    assert dict(run(script("stale_fixed.py"), steps=1).stats)["optimizer_steps"] == 1
    assert dict(run(script("stale_fixed.py"), steps=0).stats)["optimizer_steps"] == 4


def test_module_form_runs_like_python_dash_m(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES)
    report = run("batch_buggy", module=True)
    assert report.target == "-m batch_buggy"
    assert [f.where for f in report.findings] == ["labels"]


def test_script_sees_its_argv_and_the_simulated_gpus(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    out = tmp_path / "seen.txt"
    probe.write_text("import sys, torch\n"
                     "open(sys.argv[2], 'w').write(f'{sys.argv[1:]} {torch.cuda.is_available()} '\n"
                     "                             f'{torch.cuda.device_count()} {__name__}')\n")
    report = run(str(probe), ["--flag", str(out)], gpus=4, keep_scratch=True)
    try:  # the script's file is in the scratch area (placecheck run never changes the user's files)
        assert kept(report.writes or (), out).read_text() == f"['--flag', '{out}'] True 4 __main__"
        assert not out.exists()
    finally:
        remove_kept(report.writes or ())


def test_a_gpu_the_machine_lacks_fails_as_on_the_machine_and_two_gpus_can_mismatch() -> None:
    def second_gpu() -> None:
        model = nn.Linear(4, 1).to("cuda:1")
        model(torch.randn(2, 4, device="cuda:0"))

    [finding] = run(second_gpu).findings
    assert finding.code == "PC207" and "invalid device ordinal" in finding.message
    [finding] = run(second_gpu, gpus=2).findings
    assert (finding.code, finding.device, finding.expected) == ("PC201", "cuda:0", "cuda:1")


def test_select_and_ignore_filter_run_findings() -> None:
    assert run(script("criterion_buggy.py"), ignore=["PC2"]).findings == ()
    assert codes(run(script("criterion_buggy.py"), select=["PC201"])) == ["PC201"] * 3


def test_package_attribute_is_callable_as_the_function() -> None:
    assert callable(placecheck.run)
    assert placecheck.run(script("batch_fixed.py")).findings == ()


# -- a non-blocking copy to the host read before a synchronize (PC210, as audit finds it) -----------

def test_nonblocking_copy_read_before_a_synchronize_is_pc210_at_the_read() -> None:
    report = run(script("nonblocking_read_buggy.py"), steps=0)
    [finding] = only(report, "PC210")
    assert finding.source == at("nonblocking_read_buggy.py", 15)  # the print that reads it
    assert finding.origin == at("nonblocking_read_buggy.py", 14)  # the non-blocking copy
    assert ".tolist()" in finding.message
    assert codes(report) == ["PC210"]


def test_nonblocking_copy_read_after_a_synchronize_is_clean() -> None:
    assert run(script("nonblocking_read_fixed.py"), steps=0).findings == ()
