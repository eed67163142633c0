"""Replicas: DataParallel, DDP and FSDP2 models audited as each replica (rank) sees it.

Each ``tests/fixtures/replicas/NAME.py`` defines ``Model`` (a class or a
factory), ``WRAP`` (``dp``, ``ddp``, ``fsdp``) and optionally ``WORLD_SIZE``
(default 2) and ``INPUTS`` (``--input`` specs; default: inferred).
``NAME.expected`` lists ``CODE WHERE LINE REPLICAS`` rows: ``REPLICAS`` is
``all`` for a finding every replica has (reported once, unlabelled) or the
replicas that have it (``1`` or ``1,2``), which the finding names. The
CLI, bad input, the simulated current device and the process group's teardown
have their own tests below.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from cli_runner import CliRunner
from conftest import TESTS, fixture_cases, load_file, unwrapped
from forward_helpers import ungrouped  # noqa: F401 (the fixture)

import placecheck
from placecheck.basics.errors import UsageError
from placecheck.basics.values import Device
from placecheck.cli import app

FIXTURES = TESTS / "fixtures" / "replicas"
CPU_ONLY_BUILD = torch.version.cuda is None
FSDP_ON_CPU_BUILD = ("FSDP2's sharding cannot run on fake CUDA tensors of a CPU-only build of torch "
                     "(narrow/copy_ raise 'not linked with support for cuda devices'): --wrap fsdp "
                     "refuses that build (test_fsdp_refused_on_the_cpu_only_build)")

pytestmark = [pytest.mark.usefixtures("ungrouped"), pytest.mark.cpu_build]


def _fixture(source: Path) -> Any:
    load_file(source)
    return sys.modules[f"_pc_fixture_{source.parent.name}_{source.stem}"]


def _expected(path: Path) -> list[tuple[str, str, str, str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            code, where, lineno, replicas = line.split()
            rows.append((code, "" if where == "<root>" else where, lineno, replicas))
    return sorted(rows)


def _rows(source: Path, report: placecheck.Report) -> list[tuple[str, str, str, str]]:
    rows = []
    for f in report.findings:
        path, _, lineno = f.source.rpartition(":")
        assert Path(path).name == source.name, f"{f.code} points outside the fixture: {f.source}"
        labels = dict(f.details).get("replicas")
        replicas = "all" if labels is None else ",".join(
            label.split()[1] for label in labels.split(", "))
        if labels is not None:
            assert f.message.startswith(f"on {labels}, "), f.message  # the finding names its replicas
        rows.append((f.code, f.where, lineno, replicas))
    return sorted(rows)


def _audit(source: Path, **options: Any) -> placecheck.Report:
    module = _fixture(source)
    options.setdefault("wrap", module.WRAP)
    options.setdefault("world_size", getattr(module, "WORLD_SIZE", None))
    options.setdefault("inputs", getattr(module, "INPUTS", []))
    return placecheck.audit(module.Model, "cuda", engine="fake", **options)


@pytest.mark.parametrize(("source", "expected"), fixture_cases(FIXTURES))
def test_fixture(source: Path, expected: Path) -> None:
    if source.stem.startswith("fsdp") and CPU_ONLY_BUILD:
        pytest.skip(FSDP_ON_CPU_BUILD)
    report = _audit(source)
    assert _rows(source, report) == _expected(expected), report.notes
    count = getattr(_fixture(source), "WORLD_SIZE", 2)
    assert report.device == ", ".join(f"cuda:{k}" for k in range(count))
    assert not report.incomplete


@pytest.mark.parametrize("name", ["dp_hardcoded_cuda0", "dp_current_device_in_init", "ddp_first_gpu_tensor"])
def test_without_replicas_the_bug_is_invisible(name: str) -> None:
    """What the replicas add: audited on one GPU, replica 0's view, the same models are clean."""
    report = placecheck.audit(_fixture(FIXTURES / f"{name}.py").Model, "cuda", engine="fake")
    assert [f.code for f in report.findings if f.severity.rank >= 2] == []


def test_a_data_parallel_object_is_audited_per_replica_without_wrap() -> None:
    model = nn.DataParallel(_fixture(FIXTURES / "dp_hardcoded_cuda0.py").Model())
    report = placecheck.audit(model, "cuda", engine="fake", inputs="float32[2,8]")
    assert [(f.code, dict(f.details)["replicas"]) for f in report.findings] == [
        ("PC201", "replica 1 (cuda:1)"), ("PC202", "replica 1 (cuda:1)")]
    assert report.notes[0].startswith("replicas: 2 (nn.DataParallel")


def test_a_factory_returning_data_parallel_is_audited_per_replica() -> None:
    inner = _fixture(FIXTURES / "dp_current_device_in_init.py").Model

    def factory() -> nn.Module:
        return nn.DataParallel(inner())

    report = placecheck.audit(factory, "cuda", engine="fake", world_size=3, inputs="float32[2,8]")
    assert {dict(f.details).get("replicas") for f in report.findings} == {
        "replica 1 (cuda:1), replica 2 (cuda:2)"}


def test_rank_context_is_torn_down() -> None:
    import torch.distributed as dist

    _audit(FIXTURES / "ddp_first_gpu_tensor.py")
    assert not dist.is_initialized()
    assert placecheck.engines.cudaapi.current_index() == 0


def test_json_names_the_replicas(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    target = f"{FIXTURES / 'ddp_first_gpu_tensor.py'}:Model"
    result = CliRunner().invoke(app, ["audit", target, "--wrap", "ddp", "--engine", "fake", "--no-group",
                                      "--format", "json", "-o", str(out)])
    assert result.exit_code == 1, result.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["device"] == "cuda:0, cuda:1"
    assert {(f["code"], f["details"]["replicas"]) for f in data["findings"]} == {
        ("PC101", "rank 1 (cuda:1)"), ("PC201", "rank 1 (cuda:1)")}


@pytest.mark.parametrize(("name", "wrap", "code"), [
    ("dp_hardcoded_cuda0", "dp", 1), ("dp_clean", "dp", 0),
    ("ddp_rank_zero_tensor", "ddp", 1), ("ddp_clean", "ddp", 0)])
def test_cli(name: str, wrap: str, code: int) -> None:
    result = CliRunner().invoke(app, ["audit", f"{FIXTURES / name}.py:Model", "--wrap", wrap,
                                      "--world-size", "3", "--engine", "fake", "--input", "float32[2,8]"])
    assert result.exit_code == code, result.stdout + result.stderr
    assert "cuda:0, cuda:1, cuda:2" in result.stdout
    if code:
        assert "on replica 1 (cuda:1), replica 2 (cuda:2), " in " ".join(result.stdout.split()) \
            or "on rank 1 (cuda:1), rank 2 (cuda:2), " in " ".join(result.stdout.split())


@pytest.mark.skipif(CPU_ONLY_BUILD, reason=FSDP_ON_CPU_BUILD)
def test_cli_fsdp() -> None:
    target = f"{FIXTURES / 'fsdp_unsharded_module.py'}:Model"
    result = CliRunner().invoke(app, ["audit", target, "--wrap", "fsdp", "--engine", "fake"])
    assert result.exit_code == 1, result.stdout + result.stderr
    assert "no fully_shard manages its module" in result.stdout


@pytest.mark.skipif(not CPU_ONLY_BUILD, reason="the CPU-only build's refusal; a CUDA build runs FSDP2")
def test_fsdp_refused_on_the_cpu_only_build() -> None:
    with pytest.raises(UsageError, match="--wrap fsdp needs a CUDA build of torch"):
        _audit(FIXTURES / "fsdp_clean.py")


@pytest.mark.parametrize(("args", "needle"), [
    (["--wrap", "tp"], "unknown --wrap 'tp': use one of dp, ddp, fsdp"),
    (["--wrap", "ddp", "--world-size", "3", "--gpus", "2"],
     "--world-size 3 needs 3 GPUs; --gpus 2 was given"),
    (["--wrap", "dp", "--device", "cpu"], "use --device cuda, not cpu"),
    (["--wrap", "dp", "--device", "cuda:1"], "use --device cuda, not cuda:1"),
    (["--wrap", "ddp", "--device", "keep"], "--wrap ddp places each replica on its own GPU"),
    (["--world-size", "2"], "--world-size needs replicas: pass --wrap dp|ddp|fsdp"),
    (["--wrap", "fsdp", "--train"],
     "--train with --wrap fsdp" if not CPU_ONLY_BUILD else "--wrap fsdp needs"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(app, ["audit", f"{FIXTURES / 'dp_clean.py'}:Model", *args])
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = unwrapped(result.stderr).strip().splitlines()  # one line, fitted to the width
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_world_size_below_1_or_not_an_integer() -> None:
    for size in (0, -1, 1.5, True):
        with pytest.raises(UsageError, match="expected an integer >= 1"):
            placecheck.audit(nn.Linear(2, 2), "cuda", wrap="dp", world_size=size)  # type: ignore[arg-type]


def test_world_size_for_a_factory_that_builds_no_wrapper() -> None:
    with pytest.raises(UsageError, match="--world-size needs replicas"):
        placecheck.audit(lambda: nn.Linear(2, 2), "cuda", engine="fake", world_size=2)


def test_bad_config_keys(tmp_path: Path) -> None:
    from placecheck.basics import config

    path = tmp_path / "placecheck.toml"
    head = f'[[models]]\ntarget = "{FIXTURES / "dp_clean.py"}:Model"\n'
    path.write_text(head + 'wrap = "tp"\n', encoding="utf-8")
    with pytest.raises(UsageError, match=r"models\[0\]\.wrap: unknown --wrap 'tp': use one of dp, ddp, fsdp"):
        config.load(path)
    path.write_text(head + "world_size = 0\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"world_size.*an integer >= 1"):
        config.load(path)
    path.write_text(head + 'wrap = "ddp"\nworld_size = 3\n', encoding="utf-8")
    options = config.load(path).models[0].options
    assert (options.wrap, options.world_size) == ("ddp", 3)


# -- the simulated current device ----------------------------------------------------------------

@pytest.mark.parametrize("engine", ["fake", "tagged"])
def test_the_current_device_decides_where_cuda_goes(engine: str) -> None:
    from placecheck.engines.engine import EngineChoice, choose_engine

    eng = choose_engine(Device("cuda", 0), EngineChoice(engine), gpus=2)
    with placecheck.engines.engine.current_device_moves(), eng.session():  # as each replica's audit runs
        with torch.cuda.device(1):
            assert torch.cuda.current_device() == 1
            made = torch.zeros(2, device="cuda")
            moved = torch.ones(2).cuda()
            to = torch.ones(2).to("cuda")
        assert torch.cuda.current_device() == 0
        assert torch.zeros(2, device="cuda").device == torch.device("cuda", 0)
        torch.cuda.set_device(1)
        assert torch.zeros(2, device="cuda").device == torch.device("cuda", 1)
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.cuda.set_device(2)
    assert {made.device, moved.device, to.device} == {torch.device("cuda", 1)}
    assert placecheck.engines.cudaapi.current_index() == 0  # the session ends where it began


def test_every_replica_runs_on_the_same_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with one GPU has a real cuda:0 but no cuda:1: replica 0 must not run on the real GPU
    while replica 1 is simulated (one engine, one report)."""
    from placecheck.engines import engine

    def one_gpu(device: str) -> tuple[bool, str]:
        return (device in ("cpu", "cuda:0"), "" if device == "cuda:0" else "this machine has 1 GPU")

    monkeypatch.setattr(engine, "_real_available", one_gpu)
    report = placecheck.audit(_fixture(FIXTURES / "dp_hardcoded_cuda0.py").Model, "cuda", wrap="dp",
                              inputs="float32[2,8]")
    assert report.engine == "simulated cuda"
    assert [n for n in report.notes if n.startswith("engine:")] == [
        "engine: simulated cuda: this machine has 1 GPU; CUDA simulated with fake tensors (2 GPUs)"]


@pytest.mark.skipif(CPU_ONLY_BUILD, reason=FSDP_ON_CPU_BUILD)
def test_fsdp_shards_a_plain_model_over_the_ranks() -> None:
    """--wrap fsdp on a model that does not shard itself: fully_shard on its root moves the CPU-built
    parameters onto the rank's simulated GPU as DTensor shards of the mesh."""
    from torch.distributed.tensor import DTensor, Shard

    from placecheck.basics.options import WrapChoice
    from placecheck.engines.engine import EngineChoice, choose_engine
    from placecheck.placement.replicas import Replicas

    replica = Replicas(WrapChoice.FSDP, 2).replica(1)
    eng = choose_engine(Device("cuda", 1), EngineChoice.FAKE, gpus=2)
    with replica.attempt(), eng.session():
        model = replica.place(nn.Linear(8, 4), lambda m: m)
        weight = model.weight
        assert isinstance(weight, DTensor) and weight.placements == (Shard(0),)
        assert (tuple(weight.shape), tuple(weight.to_local().shape)) == ((4, 8), (2, 8))
        assert weight.to_local().device == torch.device("cuda", 1)


def test_the_docs_show_a_replicated_run() -> None:
    """tests/test_readme.py re-runs every run-output block; this one must stay among them."""
    page = (TESTS.parent / "docs" / "many-gpus.md").read_text(encoding="utf-8")
    block = page[page.index("## Replicas"):]
    block = block[block.index("<!-- run-output:start -->"):block.index("<!-- run-output:end -->")]
    assert "$ placecheck audit placecheck/examples/replicas.py:BuggyReplicated --wrap ddp\n" in block
    assert "on rank 1 (cuda:1), " in block


DDP_FACTORY = '''
import tempfile
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def make():
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    return DistributedDataParallel(nn.Linear(4, 4).cuda(), device_ids=[0])
'''


def test_a_factory_building_ddp_itself_is_told_to_use_wrap_ddp(tmp_path: Path) -> None:
    """DDP's constructor reads parameter data simulated GPUs lack: one line that says what to do."""
    import subprocess

    (tmp_path / "ddp_factory.py").write_text(DDP_FACTORY)
    command = [sys.executable, "-m", "placecheck", "audit", "ddp_factory.py:make", "--device", "cuda"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = unwrapped(done.stderr).strip().splitlines()
    assert len(lines) == 1 and "DistributedDataParallel's constructor" in lines[0]
    assert "--wrap ddp" in lines[0] and done.stdout == ""
