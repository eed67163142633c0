"""``placecheck run --nproc-per-node N`` of FSDP scripts: FSDP2's ``fully_shard`` (public and private
import paths) sharding each rank's module into DTensors on its simulated GPU (:mod:`placecheck.run.dtensors`),
FSDP1's ``FullyShardedDataParallel`` and Lightning's ``fsdp`` strategy run as each rank's placement
(:mod:`placecheck.run.fsdp`).

Each buggy script in ``tests/fixtures/run/ranks/`` has its bug at a known line and a fixed twin that
exits 0; each run starts one interpreter per rank, so each script runs once per test.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from rank_scripts import FIXTURES, at, failing, script

from placecheck.findings.report import Report, exit_code
from placecheck.run import run
from placecheck.run.fsdp import ALL_GATHER, NOTE, fully_shard_homes


def past_the_steps(note: str) -> bool:
    """The ending note of a run that went on past its 2 optimizer steps: it fast-forwarded to the end of
    the script (or stopped at the steps, where the fast-forward could not end the training)."""
    return (note.startswith("run: the script ran to its end (") and "a fast-forward from" in note) \
        or note.startswith("run: stopped after ")


def clean(report: Report) -> bool:
    """No finding above info, exit 0, and the run went on to its --steps."""
    return failing(report) == [] and exit_code([report]) == 0 and \
        any(past_the_steps(n) for n in report.notes) and not report.unfinished


# -- FSDP2 ---------------------------------------------------------------------------------------------------

def test_a_correct_fsdp2_script_trains_on_every_rank_with_finite_losses(capsys: pytest.CaptureFixture[str]
                                                                       ) -> None:
    report = run(script("fsdp2_fixed.py"), nproc_per_node=2)
    assert clean(report), (failing(report), report.notes)
    assert report.device == "cuda:0, cuda:1"
    # the .item() under `if dist.get_rank() == 0` ran on rank 0 only, and read a real, finite loss
    [sync] = [f for f in report.findings if f.code == "PC204"]
    assert sync.source == at("fsdp2_fixed.py", 38) and dict(sync.details)["ranks"] == "0"
    printed = re.findall(r"\[rank(\d)\]: step 0: loss (\S+)", capsys.readouterr().out)
    assert [rank for rank, _ in printed] == ["0"] and math.isfinite(float(printed[0][1]))
    assert not any("FSDP is not simulated" in n for n in report.notes)


def test_missing_set_device_shards_every_rank_onto_cuda_0() -> None:
    report = run(script("fsdp2_set_device_buggy.py"), nproc_per_node=2)
    assert failing(report) == [("PC401", at("fsdp2_set_device_buggy.py", 11), "1"),
                               ("PC401", at("fsdp2_set_device_buggy.py", 16), "0-1")]
    moved, shared = sorted((f for f in report.findings if f.code == "PC401"), key=lambda f: f.source)
    assert (moved.device, moved.expected) == ("cuda:0", "cuda:1")
    assert "fully_shard put Linear's parameters on cuda:0" in moved.message
    assert dict(shared.details)["call"] == ALL_GATHER and shared.device == "cuda:0"
    assert "Duplicate GPU detected" in shared.message and "DistributedDataParallel" not in shared.hint
    assert exit_code([report]) == 1
    fixed = run(script("fsdp2_set_device_fixed.py"), nproc_per_node=2)
    assert clean(fixed) and fixed.findings == ()


def test_fully_shard_from_the_private_path_runs_and_a_target_left_on_the_cpu_is_found() -> None:
    # the script imports fully_shard from torch.distributed._composable.fsdp: that name is patched too
    assert "from torch.distributed._composable.fsdp import fully_shard" in \
        (FIXTURES / "fsdp2_batch_buggy.py").read_text()
    report = run(script("fsdp2_batch_buggy.py"), nproc_per_node=2)
    # the sharded model moved its CPU input to the rank's GPU (as FSDP2's root does); the target it
    # meets in the loss was not moved
    assert failing(report) == [("PC201", at("fsdp2_batch_buggy.py", 22), "0-1")]
    [finding] = [f for f in report.findings if f.code == "PC201"]
    assert finding.where == "y" and "from the DataLoader" in finding.message
    fixed = run(script("fsdp2_batch_fixed.py"), nproc_per_node=2)
    assert clean(fixed), failing(fixed)


def test_a_tensor_attribute_left_out_of_fully_shard_stays_on_the_cpu() -> None:
    # built on the meta device, sharded, then to_empty: the plain attribute was never FSDP's to place
    report = run(script("fsdp2_stray_buggy.py"), nproc_per_node=2)
    assert failing(report) == [("PC201", at("fsdp2_stray_buggy.py", 19), "0-1")]
    fixed = run(script("fsdp2_stray_fixed.py"), nproc_per_node=2)
    assert clean(fixed), failing(fixed)


def on_the_cpu(name: str, tmp_path: Path) -> str:
    """The stray fixture ``name`` with its model built on the CPU instead of meta (lines unchanged)."""
    text = (FIXTURES / name).read_text()
    text = text.replace('with torch.device("meta"):', "if True:")
    text = text.replace("model.to_empty(device=device)", "pass")
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_fully_shard_of_a_cpu_built_model_leaves_a_tensor_attribute_behind(tmp_path: Path) -> None:
    buggy = on_the_cpu("fsdp2_stray_buggy.py", tmp_path)
    report = run(buggy, nproc_per_node=2)
    # fully_shard moved each block (line 29), then the root (line 30): what .to() cannot see stayed on
    # the CPU, found by the walk of each move
    assert set(failing(report)) == {("PC101", f"{buggy}:16", "0-1"), ("PC201", f"{buggy}:19", "0-1")}
    strays = {(f.where, dict(f.details)["moved at"]) for f in report.findings if f.code == "PC101"}
    assert ("scale", f"{buggy}:29") in strays and ("1.scale", f"{buggy}:30") in strays
    fixed = run(on_the_cpu("fsdp2_stray_fixed.py", tmp_path), nproc_per_node=2)
    assert clean(fixed), failing(fixed)


def test_every_module_that_holds_fully_shard_is_patched() -> None:
    import torch.distributed._composable.fsdp as private
    import torch.distributed.fsdp as public

    homes = [owner for owner, _ in fully_shard_homes()]
    assert public in homes and private in homes


# -- FSDP1 and Lightning -------------------------------------------------------------------------------------

def test_fsdp1_without_device_id_leaves_the_model_on_the_cpu() -> None:
    report = run(script("fsdp1_buggy.py"), nproc_per_node=2)
    found = failing(report)
    assert {code for code, _, _ in found} == {"PC201"}
    assert {(source, ranks) for _, source, ranks in found} == {(at("fsdp1_buggy.py", 16), "0-1")}
    assert all("is on cpu" in f.message for f in report.findings if f.code == "PC201")
    fixed = run(script("fsdp1_fixed.py"), nproc_per_node=2)
    assert clean(fixed), failing(fixed)


def test_lightning_fsdp_at_two_devices_runs_as_two_ranks_and_finds_the_bug_on_both() -> None:
    pytest.importorskip("lightning")
    report = run(script("lightning_fsdp_buggy.py"), nproc_per_node=2)
    assert failing(report) == [("PC201", at("lightning_fsdp_buggy.py", 17), "0-1"),
                               ("PC202", at("lightning_fsdp_buggy.py", 16), "0-1")]  # the line to edit
    fixed = run(script("lightning_fsdp_fixed.py"), nproc_per_node=2)
    assert clean(fixed), (failing(fixed), fixed.notes)
    assert not any("copies of itself" in n for n in fixed.notes)


# -- the fake process group's outputs ------------------------------------------------------------------------

def test_gathered_and_scattered_outputs_hold_the_ranks_own_values(capsys: pytest.CaptureFixture[str]) -> None:
    # the fake group moves no data: without the rank's own values the outputs (torch.empty) would be
    # uninitialised memory, and the script's own asserts on them would fail (PC207)
    report = run(script("collective_values.py"), nproc_per_node=2)
    assert failing(report) == [] and exit_code([report]) == 0
    printed = dict(re.findall(r"\[rank(\d)\]: collectives ok: (\S+)", capsys.readouterr().out))
    assert printed == {"0": "12.0", "1": "92.0"}  # each rank's arange(4) + 10 * rank, gathered twice


# -- FSDP2's DTensor parameters, as pytorch/examples' fsdp2 example trains ----------------------------------

def test_fsdp2_gives_dtensor_shards_on_every_ranks_gpu_and_trains_through(capsys: pytest.CaptureFixture[str]
                                                                          ) -> None:
    # the script asserts what a GPU gives: every parameter a Shard(0) DTensor on cuda:LOCAL_RANK, its local
    # shard there, full_tensor()s there (an AssertionError would be the script's error: exit 2)
    report = run(script("fsdp2_transformer_fixed.py"), nproc_per_node=2)
    assert clean(report), (failing(report), report.notes, report.unfinished)
    assert NOTE in report.notes and dict(report.stats)["optimizer_steps"] == 2
    out = capsys.readouterr().out
    losses = re.findall(r"\[rank0\]: step \d: loss (\S+)", out)
    assert len(losses) == 2 and all(math.isfinite(float(loss)) for loss in losses)
    assert "[rank0]: full state dict: 25 tensors" in out  # after the fast-forward, from the full_tensor()s


def test_a_target_left_on_the_cpu_in_fsdp2_training_is_found_on_every_rank() -> None:
    # launched as python -m torch.distributed.run --nproc-per-node 2 would launch it
    report = run("torch.distributed.run", ["--nproc-per-node", "2", script("fsdp2_transformer_buggy.py")],
                 module=True)
    # the crash, and the target's creation without device= (PC202: the line to edit)
    assert failing(report) == [("PC201", at("fsdp2_transformer_buggy.py", 85), "0-1"),
                               ("PC202", at("fsdp2_transformer_buggy.py", 82), "0-1")]
    [finding] = [f for f in report.findings if f.code == "PC201"]
    assert "cross_entropy" in finding.message and "is on cpu" in finding.message
    assert at("fsdp2_transformer_buggy.py", 82) in finding.message  # where the target was made
    assert exit_code([report]) == 1


def test_fsdp2_cpu_offload_keeps_shards_gradients_and_optimizer_state_on_the_cpu() -> None:
    # the script asserts it (and the gathered bfloat16 parameters on the GPU): a shard reported on the GPU
    # would stop it with its own AssertionError (exit 2); FSDP2's copies between them are not the script's
    report = run(script("fsdp2_offload_fixed.py"), nproc_per_node=2)
    assert clean(report), (failing(report), report.notes, report.unfinished)
    assert report.findings and all(f.code == "PC204" for f in report.findings)


def test_a_sharded_parameter_read_outside_its_modules_forward_is_pc201_and_the_run_goes_on() -> None:
    # the head was sharded and never called: its weight is a DTensor where the loop multiplies by it, which
    # raises on the ranks ("got mixed torch.Tensor and DTensor"); decided from the arguments' types
    report = run(script("fsdp2_outside_buggy.py"), nproc_per_node=2)
    assert failing(report) == [("PC201", at("fsdp2_outside_buggy.py", 33), "0-1")]
    [finding] = [f for f in report.findings if f.code == "PC201"]
    assert dict(finding.details)["op"] == "Tensor.matmul" and "DTensor" in finding.message
    assert any(past_the_steps(n) for n in report.notes) and not report.unfinished
    fixed = run(script("fsdp2_outside_fixed.py"), nproc_per_node=2)
    assert clean(fixed) and fixed.findings == (), failing(fixed)


def test_dtensors_over_a_simulated_cuda_mesh_are_where_a_gpu_puts_them() -> None:
    # one rank in this process: DTensor's own ops, to_local(), full_tensor(), moves to the CPU and back
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    from placecheck.basics.patching import patched
    from placecheck.engines.tagged import SimulatedDeviceMismatchError, tagged_cuda
    from placecheck.placement.replicas import _fake_process_group
    from placecheck.run import dtensors

    gpu = torch.device("cuda", 1)
    own = dict(vars(DTensor))
    with tagged_cuda(2), _fake_process_group(1, 2), patched(dtensors.patches(), "test"):
        torch.cuda.set_device(1)
        mesh = init_device_mesh("cuda", (2,))
        sharded = distribute_tensor(torch.arange(8.0, device=gpu), mesh, [Shard(0)])
        assert (sharded.device, sharded.to_local().device, sharded.to_local().shape) == (gpu, gpu, (4,))
        computed = sharded * 2 + 1  # DTensor's own dispatch: its new local shard stays on the GPU
        assert isinstance(computed, DTensor) and computed.to_local().device == gpu
        full = computed.full_tensor()
        assert not isinstance(full, DTensor) and (full.device, full.shape) == (gpu, (8,))
        assert sharded.redistribute(mesh, [Replicate()]).to_local().device == gpu
        host = sharded.cpu()
        assert host.device.type == "cpu" and (host + 1).to_local().device.type == "cpu"
        assert host.to(gpu).to_local().device == gpu
        with pytest.raises(SimulatedDeviceMismatchError):
            torch.ones(4) + sharded.to_local()  # a CPU tensor meeting the GPU shard, as on a GPU
    assert dict(vars(DTensor)) == own  # DTensor as torch has it once the session ends
