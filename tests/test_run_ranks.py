"""``placecheck run --nproc-per-node N``: a torchrun script run as each of its ranks, with NCCL's rules.

Each buggy script in ``tests/fixtures/run/ranks/`` has its bug at a known line and a fixed twin that
exits 0. Every rank is a child process of its own (torchrun's environment, N simulated GPUs, PyTorch's
fake process group), so each run here starts N interpreters: the tests run each script once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from cli_runner import CliRunner, separate_stderr_capture
from conftest import unwrapped
from rank_scripts import FIXTURES, at, failing, script
from report_schema import validate_json

from placecheck.basics.errors import UsageError
from placecheck.cli import app
from placecheck.findings.finding import Finding
from placecheck.findings.report import Report, exit_code
from placecheck.run import run
from placecheck.run.ranks import ranks_label, torchrun_command


def past_the_steps(note: str) -> bool:
    """The ending note of a run that went on past its 2 optimizer steps: it fast-forwarded to the end of
    the script (or stopped at the steps, where the fast-forward could not end the training)."""
    return (note.startswith("run: the script ran to its end (") and "a fast-forward from" in note) \
        or note.startswith("run: stopped after ")


def ranks_of(finding: Finding) -> str:
    return dict(finding.details)["ranks"]


# -- the launch itself -----------------------------------------------------------------------------------

def test_a_correct_ddp_script_runs_clean_on_every_rank_and_the_rank_0_guard_runs_on_rank_0_only() -> None:
    report = run(script("ddp_fixed.py"), nproc_per_node=2)
    assert failing(report) == [] and exit_code([report]) == 0
    assert report.device == "cuda:0, cuda:1"
    assert dict(report.stats)["ranks"] == 2
    assert any(n.startswith("ranks: 2 (torchrun --nproc-per-node 2 simulated") for n in report.notes)
    # the .item() under `if dist.get_rank() == 0:` ran on rank 0 only
    [sync] = [f for f in report.findings if f.code == "PC204"]
    assert sync.source == at("ddp_fixed.py", 24) and ranks_of(sync) == "0"
    assert sync.message.startswith("on rank 0, ")
    assert any(past_the_steps(n) for n in report.notes)


def test_only_rank_0_takes_its_guarded_branch_and_only_rank_0_has_its_bug() -> None:
    report = run(script("rank0_buggy.py"), nproc_per_node=2)
    # the op that crashed, and the line to edit: the offset made without device= (PC202)
    assert failing(report) == [("PC201", at("rank0_buggy.py", 18), "0"),
                               ("PC202", at("rank0_buggy.py", 17), "0")]
    fixed = run(script("rank0_fixed.py"), nproc_per_node=2)
    assert failing(fixed) == [] and exit_code([fixed]) == 0


# -- a rank off its own GPU, two ranks on one GPU ------------------------------------------------------------

def test_missing_set_device_puts_rank_1_on_cuda_0_and_ddp_on_one_gpu_for_both() -> None:
    report = run(script("set_device_buggy.py"), nproc_per_node=2)
    assert failing(report) == [("PC401", at("set_device_buggy.py", 10), "1"),
                               ("PC401", at("set_device_buggy.py", 11), "0-1")]
    moved, shared = sorted((f for f in report.findings if f.code == "PC401"), key=lambda f: f.source)
    assert (moved.device, moved.expected) == ("cuda:0", "cuda:1")
    assert at("set_device_buggy.py", 14) in dict(moved.details)["lines"]  # the batch too, counted there
    assert dict(shared.details)["call"] == "DistributedDataParallel(...)"
    assert "Duplicate GPU detected" in shared.message and shared.device == "cuda:0"
    assert exit_code([report]) == 1


def test_set_device_first_makes_cuda_the_ranks_own_gpu() -> None:
    report = run(script("set_device_fixed.py"), nproc_per_node=2)
    assert report.findings == () and exit_code([report]) == 0


def test_a_hard_coded_cuda_0_is_found_at_its_line_and_where_ddp_feeds_rank_1s_gpu() -> None:
    report = run(script("hardcoded_buggy.py"), nproc_per_node=2)
    assert failing(report) == [("PC201", at("hardcoded_buggy.py", 18), "1"),
                               ("PC401", at("hardcoded_buggy.py", 13), "1"),
                               ("PC401", at("hardcoded_buggy.py", 14), "0-1")]
    assert not any("NoneType" in f.message for f in report.findings)  # DDP's input copy is simulated


# -- collectives --------------------------------------------------------------------------------------------

def test_a_cpu_tensor_in_an_nccl_all_reduce_is_found_on_every_rank() -> None:
    report = run(script("allreduce_cpu_buggy.py"), nproc_per_node=2)
    assert failing(report) == [("PC402", at("allreduce_cpu_buggy.py", 20), "0-1")]
    [finding] = [f for f in report.findings if f.code == "PC402"]
    assert finding.message.startswith("on ranks 0-1, dist.all_reduce got a CPU tensor (int64[2])")
    fixed = run(script("allreduce_cpu_fixed.py"), nproc_per_node=2)
    assert failing(fixed) == [] and exit_code([fixed]) == 0


def test_a_comm_hook_of_the_script_runs_and_its_collective_on_the_host_is_found() -> None:
    # the hook all-reduces the gradient bucket after .cpu(): NCCL refuses it at the first backward
    report = run(script("comm_hook_buggy.py"), nproc_per_node=2)
    assert failing(report) == [("PC402", at("comm_hook_buggy.py", 13), "0-1")]
    fixed = run(script("comm_hook_fixed.py"), nproc_per_node=2)
    assert failing(fixed) == [] and exit_code([fixed]) == 0
    # the budget's 2 steps, then one per later epoch whose loader still yields a batch after the budget
    # (issue 40: a library's pass after the fast-forward sees a batch); HF Trainer's next epoch takes one
    assert 2 <= dict(fixed.stats)["optimizer_steps"] <= 3


def test_a_built_in_comm_hook_runs_to_the_end_of_its_steps(tmp_path: Path) -> None:
    builtin = tmp_path / "builtin_hook.py"
    builtin.write_text((FIXTURES / "comm_hook_fixed.py").read_text().replace(
        "model.register_comm_hook(None, default_hooks.fp16_compress_hook)",
        "model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)"))
    report = run(os.path.relpath(builtin), nproc_per_node=2)
    assert failing(report) == [] and dict(report.stats)["optimizer_steps"] == 2


def test_what_a_rank_prints_is_shown_while_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import threading
    import time

    go = tmp_path / "go"
    monkeypatch.setenv("GO_FILE", str(go))
    reports: list[Report] = []
    runner = threading.Thread(target=lambda: reports.append(run(script("waits_for_go.py"), nproc_per_node=2)))
    runner.start()
    seen = ""
    deadline = time.monotonic() + 120
    while "[rank1]: ready" not in seen or "[rank0]: ready" not in seen:
        assert time.monotonic() < deadline, f"the ranks' lines were not shown while they ran: {seen!r}"
        time.sleep(0.2)
        seen += capsys.readouterr().out
    go.touch()  # only now may the ranks end
    runner.join(timeout=120)
    seen += capsys.readouterr().out
    assert "[rank0]: went" in seen and "[rank1]: went" in seen and len(reports) == 1


def test_a_cpu_tensor_is_legal_in_a_gloo_group(tmp_path: Path) -> None:
    gloo = tmp_path / "gloo.py"
    gloo.write_text((FIXTURES / "allreduce_cpu_buggy.py").read_text().replace('"nccl"', '"gloo"'))
    report = run(str(gloo), nproc_per_node=2)
    assert failing(report) == []


# -- resume --------------------------------------------------------------------------------------------------

def test_map_location_cuda_0_loads_every_ranks_state_onto_gpu_0(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt.pt"
    torch.save(nn.Linear(8, 4).state_dict(), checkpoint)
    report = run(script("resume_buggy.py"), [str(checkpoint)], nproc_per_node=2)
    assert failing(report) == [("PC401", at("resume_buggy.py", 15), "1")]
    [finding] = report.findings
    assert finding.message.startswith("on rank 1, torch.load puts the checkpoint's tensors on cuda:0")
    fixed = run(script("resume_fixed.py"), [str(checkpoint)], nproc_per_node=2)
    assert fixed.findings == () and exit_code([fixed]) == 0


@pytest.mark.parametrize("name", ["ddp_fixed.py", "lightning_ddp_fixed.py"])
def test_a_plain_run_of_a_torchrun_script_says_to_use_nproc_per_node(name: str) -> None:
    if name.startswith("lightning"):
        pytest.importorskip("lightning")
    report = run(script(name), gpus=2)
    assert any("placecheck run --nproc-per-node" in n for n in report.notes), report.notes


def test_what_a_script_sets_in_the_environment_does_not_outlive_its_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's launcher sets WORLD_SIZE and MASTER_ADDR; left behind, the next run's HF Trainer took
    # them for a distributed launch and waited for its peers
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    sets = tmp_path / "sets.py"
    sets.write_text("import os\nos.environ['MASTER_ADDR'] = '10.0.0.1'\n")
    run(str(sets))
    assert "MASTER_ADDR" not in os.environ


# -- torchrun's command line ---------------------------------------------------------------------------------

def test_python_m_torch_distributed_run_is_read_as_torchrun() -> None:
    args = ["--standalone", "--nproc_per_node=2", script("allreduce_cpu_buggy.py")]
    report = run("torch.distributed.run", args, module=True)
    assert failing(report) == [("PC402", at("allreduce_cpu_buggy.py", 20), "0-1")]
    assert report.target == script("allreduce_cpu_buggy.py")


@pytest.mark.parametrize(("args", "nproc", "expected"), [
    (["--nproc-per-node", "4", "train.py", "--lr", "1"], None, ("train.py", ["--lr", "1"], False, 4)),
    (["--nproc_per_node=2", "--nnodes=1", "train.py"], None, ("train.py", [], False, 2)),
    (["--standalone", "train.py"], 3, ("train.py", [], False, 3)),
    (["-m", "pkg.train", "x"], None, ("pkg.train", ["x"], True, 1)),
])
def test_torchrun_arguments(args: list[str], nproc: int | None, expected: tuple[object, ...]) -> None:
    assert torchrun_command(args, nproc) == expected


@pytest.mark.parametrize(("args", "needle"), [
    (["--nnodes", "2", "train.py"], "simulates one node"),
    (["--frobnicate", "train.py"], "unknown torchrun option"),
    (["--nproc-per-node", "0", "train.py"], "integer >= 1"),
    (["--nproc-per-node", "2"], "give the script"),
])
def test_torchrun_arguments_refused_with_one_line(args: list[str], needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        torchrun_command(args, None)


def test_rank_labels() -> None:
    assert [ranks_label(r) for r in ([1], [0, 1, 2, 3], [0, 2])] == ["rank 1", "ranks 0-3", "ranks 0, 2"]


@pytest.mark.cli
def test_the_command_line_flag_and_the_module_form() -> None:
    result = CliRunner().invoke(app, ["run", "-m", "torch.distributed.run", "--standalone",
                                      "--nproc-per-node", "2", script("allreduce_cpu_buggy.py")])
    assert result.exit_code == 1, result.stderr
    assert "PC402" in result.stdout and at("allreduce_cpu_buggy.py", 20) in result.stdout
    assert "on ranks 0-1, dist.all_reduce" in " ".join(result.stdout.split())


@pytest.mark.cli
@separate_stderr_capture
def test_json_of_the_ranks_follows_the_schema_and_the_script_output_goes_to_stderr() -> None:
    result = CliRunner().invoke(app, ["run", "--nproc_per_node", "2", "--format", "json",
                                      script("rank0_buggy.py")])
    assert result.exit_code == 1, result.stderr
    data = validate_json(result.stdout)
    # grouped: the offset's creation (PC202) is the problem, the op it crashed its evidence
    [finding] = [f for f in data["findings"] if f["code"] == "PC202"]
    assert finding["details"]["ranks"] == "0" and finding["source"] == at("rank0_buggy.py", 17)
    assert [(e["code"], e["source"]) for e in finding["evidence"]] == [("PC201", at("rank0_buggy.py", 18))]
    assert data["device"] == "cuda:0, cuda:1" and data["stats"]["ranks"] == 2
    # what rank 0 printed, with torchrun's prefix, on stderr (stdout stays parseable)
    assert any(line.startswith("[rank0]: ") for line in result.stderr.splitlines())


@pytest.mark.cli
@separate_stderr_capture
@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_nproc_per_node_is_one_line_and_exit_2(value: str) -> None:
    result = CliRunner().invoke(app, ["run", "--nproc-per-node", value, script("ddp_fixed.py")])
    assert result.exit_code == 2
    lines = unwrapped(result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placecheck: error: --nproc-per-node"), result.stderr


# -- Lightning: Trainer(devices=2, strategy="ddp") under torchrun -------------------------------------------

def test_lightning_ddp_at_two_devices_runs_as_two_ranks_and_finds_the_bug_on_both() -> None:
    pytest.importorskip("lightning")
    report = run(script("lightning_ddp_buggy.py"), nproc_per_node=2)
    assert failing(report) == [("PC201", at("lightning_ddp_buggy.py", 17), "0-1"),
                               ("PC202", at("lightning_ddp_buggy.py", 16), "0-1")]  # the line to edit
    fixed = run(script("lightning_ddp_fixed.py"), nproc_per_node=2)
    assert failing(fixed) == [] and exit_code([fixed]) == 0
    assert any(past_the_steps(n) for n in fixed.notes)
    assert not any("copies of itself" in n for n in fixed.notes)  # torchrun's env: Lightning spawns nothing


def test_the_ranks_keep_real_values_under_auto_and_refuse_the_fake_engine() -> None:
    # DDP reads its parameters' data when it is built: under fake tensors that raised inside the
    # simulation and read as the script's PC207 at the DDP line, so ranks run on real values
    report = run(script("set_device_buggy.py"), nproc_per_node=2, engine="auto", memory=1)
    assert failing(report) == [("PC401", at("set_device_buggy.py", 10), "1"),
                               ("PC401", at("set_device_buggy.py", 11), "0-1")]
    assert any("the ranks run with real values" in n for n in report.notes)
    with pytest.raises(UsageError, match="--engine fake and --nproc-per-node cannot be combined"):
        run(script("set_device_buggy.py"), nproc_per_node=2, engine="fake")


@pytest.mark.parametrize(("package", "name", "bugs"), [
    ("accelerate", "accelerate", [("PC201", 16)]),
    ("transformers", "hf_trainer", [("PC101", 27), ("PC201", 31)]),
])
def test_accelerate_and_hf_trainer_scripts_under_torchrun_find_their_bugs_on_every_rank(
        package: str, name: str, bugs: list[tuple[str, int]]) -> None:
    # launched by torchrun, accelerate's Accelerator and HF Trainer wrap the model in DDP on the rank's GPU;
    # the bugs are those a plain run finds (tests/test_run_frameworks.py), now on both ranks
    pytest.importorskip(package)
    frameworks = FIXTURES.parent / "frameworks"
    buggy_path = os.path.relpath(frameworks / f"{name}_buggy.py")
    buggy = run(buggy_path, nproc_per_node=2)
    assert failing(buggy) == [(code, f"{buggy_path}:{line}", "0-1") for code, line in bugs]
    fixed = run(os.path.relpath(frameworks / f"{name}_fixed.py"), nproc_per_node=2)
    assert failing(fixed) == [] and exit_code([fixed]) == 0
    # the budget's 2 steps, then one per later epoch whose loader still yields a batch after the budget
    # (issue 40: a library's pass after the fast-forward sees a batch); HF Trainer's next epoch takes one
    assert 2 <= dict(fixed.stats)["optimizer_steps"] <= 3


# -- the ranks' process forked from a warm server ------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "fork") or os.uname().sysname == "Darwin", reason="forks only where safe")
def test_the_ranks_of_later_runs_fork_from_one_warm_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from placecheck.run import ranks

    monkeypatch.setattr(ranks, "_SERVERS", {})
    first = run(script("allreduce_cpu_buggy.py"), nproc_per_node=2)
    [server] = ranks._SERVERS.values()
    second = run(script("allreduce_cpu_fixed.py"), nproc_per_node=2)
    assert list(ranks._SERVERS.values()) == [server] and server.process.poll() is None
    assert failing(first) == [("PC402", at("allreduce_cpu_buggy.py", 20), "0-1")]
    assert failing(second) == [] and exit_code([second]) == 0
    server.close()


def test_without_a_warm_server_the_ranks_start_a_process_of_their_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from placecheck.basics import forkserver
    from placecheck.run import ranks

    monkeypatch.setattr(ranks, "_SERVERS", {})
    # a server that dies at once
    monkeypatch.setattr(forkserver, "_server_command", lambda modules: [sys.executable, "-c", "pass"])
    report = run(script("allreduce_cpu_buggy.py"), nproc_per_node=2)
    assert failing(report) == [("PC402", at("allreduce_cpu_buggy.py", 20), "0-1")]
    assert ranks._SERVERS == {}  # the dead server was dropped


@pytest.mark.skipif(not hasattr(os, "fork") or os.uname().sysname == "Darwin", reason="forks only where safe")
@pytest.mark.parametrize("served", [True, False], ids=["warm-server", "own-process"])
@pytest.mark.parametrize("cache_dir", [False, True], ids=["", "TORCHINDUCTOR_CACHE_DIR"])
def test_the_ranks_fork_after_torchs_training_modules_are_imported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        served: bool, cache_dir: bool) -> None:
    # an optimizer's or DDP's first call imports torch._dynamo (seconds): once before the fork, not per rank;
    # not where that import would make a cache folder the user named outside the temp folder (the script's
    # own use makes it, in the scratch area)
    import sys
    import tempfile

    from placecheck.basics import forkserver
    from placecheck.run import ranks

    monkeypatch.setattr(ranks, "_SERVERS", {})
    if not served:
        monkeypatch.setattr(forkserver, "_server_command", lambda modules: [sys.executable, "-c", "pass"])
    if cache_dir:  # a folder the user named, outside the temp folder
        (tmp_path / "temp").mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp_path / "temp"))
        monkeypatch.setattr(tempfile, "tempdir", None)  # read again from TMPDIR
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    else:  # torch's own, as a process that imported torch._dynamo passes it on
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torchinductor"))  # in the temp folder
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nprint('dynamo imported:', 'torch._dynamo' in sys.modules)\n")
    run(str(probe), nproc_per_node=2)
    printed = capsys.readouterr().out
    for rank in (0, 1):
        assert f"[rank{rank}]: dynamo imported: {not cache_dir}" in printed, printed
    assert not (tmp_path / "inductor").exists()
    assert bool(ranks._SERVERS) == served
    for server in ranks._SERVERS.values():
        server.close()


@pytest.mark.skipif(os.name != "posix", reason="SIGINT as a terminal's Ctrl-C sends it")
def test_ctrl_c_ends_every_rank_with_the_run(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    # the ranks write their pids outside the script's directory, into the temporary directory, where
    # placecheck run writes as told (what a script writes in its own directory goes to the scratch area);
    # placecheck's own temporary folders go there too, and none is left behind
    temp = tmp_path / "tmp"
    (tmp_path / "job").mkdir()
    (temp / "pids").mkdir(parents=True)
    waits = tmp_path / "job" / "waits.py"
    waits.write_text("import os, pathlib, time\n"
                     "pathlib.Path(os.environ['PIDS'], os.environ['RANK']).write_text(str(os.getpid()))\n"
                     "print('ready', flush=True)\n"
                     "time.sleep(60)\n")
    env = {**os.environ, "PIDS": str(temp / "pids"), "TMPDIR": str(temp)}
    proc = subprocess.Popen([sys.executable, "-m", "placecheck", "run", "--nproc-per-node", "2", str(waits)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a shell's
    assert proc.stdout is not None
    seen = ""
    while "[rank0]: ready" not in seen or "[rank1]: ready" not in seen:
        line = proc.stdout.readline()
        assert line, seen
        seen += line
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    pids = [int((temp / "pids" / rank).read_text()) for rank in ("0", "1")]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), "a rank outlived the interrupted run"
    assert [p for p in os.listdir(temp) if p.startswith("placecheck")] == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
