"""``placecheck run`` never changes the user's files (issue 40, item 1): every write of the script lands in
a scratch area the script reads back (:mod:`placecheck.run.scratch`), under both engines, in DataLoader
workers and torchrun ranks; after the run every file is byte-identical and nothing new is left; the
report lists the writes; a write that gets past the scratch area is refused or found, and reported."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest
from fresh import fresh

from placecheck.run import run

pytestmark = [pytest.mark.compat]

ENGINES = pytest.mark.parametrize("engine", ["tagged", "fake"])


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (by its path relative to it) -> the sha256 of its bytes; "dir" for a
    directory."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


RESUME = """import os
import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

model = nn.Linear(4, 2).to("cuda")
resumed = os.path.exists("best.safetensors")
if resumed:
    model.load_state_dict(load_file("best.safetensors", device="cuda"))
    extra = torch.load("best.pt", map_location="cuda")
    assert extra["step"] == 7, extra
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 4, device="cuda")).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
save_file(model.state_dict(), "best.safetensors")
torch.save({"model": model.state_dict(), "step": 99}, "best.pt")
# saved earlier in this run: found where the script looks, read back as written
assert os.path.isfile("best.pt") and os.path.getsize("best.safetensors") > 0
assert torch.load("best.pt", map_location="cuda")["step"] == 99
assert set(load_file("best.safetensors")) == {"weight", "bias"}
with open("train.log", "a") as log:
    log.write(f"resumed={resumed}\\n")
print(open("train.log").read().strip())
"""


@ENGINES
def test_a_resumed_checkpoint_is_never_overwritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   engine: str) -> None:
    pytest.importorskip("safetensors")
    import torch
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)
    weights = {"weight": torch.full((2, 4), 3.0), "bias": torch.ones(2)}
    save_file(weights, "best.safetensors")
    torch.save({"model": weights, "step": 7}, "best.pt")
    (tmp_path / "train.log").write_text("before\n")
    (tmp_path / "train.py").write_text(RESUME, encoding="utf-8")
    before = _tree(tmp_path)
    for _ in range(2):  # twice: the second run resumes from the user's files, as the first did
        report = run(str(tmp_path / "train.py"), engine=engine)
        assert not report.unfinished, report.notes
        assert _tree(tmp_path) == before
        changes = {Path(w.path).name: w.change for w in report.writes or ()}
        assert changes == {"best.safetensors": "overwritten", "best.pt": "overwritten",
                           "train.log": "overwritten"}
        assert any("never to your files" in n for n in report.notes)
    from safetensors.torch import load_file

    assert torch.equal(load_file("best.safetensors")["weight"], weights["weight"])


GPU_OP = "import torch\ntorch.ones(1, device='cuda')  # one GPU op: a run that checks nothing exits 2\n"
"""The scripts below are about files; each does one op on the simulated GPU, so that the run checked
something (issue 40: a run that checked nothing is unfinished, exit 2)."""

FILES = GPU_OP + """import glob, json, os, pathlib, shutil
import numpy as np

os.makedirs("out/sub", exist_ok=True)
pathlib.Path("out/sub/a.json").write_text(json.dumps({"a": 1}))
assert json.loads(open("out/sub/a.json").read()) == {"a": 1}
np.save("out/x.npy", np.arange(4))
np.arange(4, dtype=np.int64).tofile("out/raw.bin")
assert np.load("out/x.npy").tolist() == [0, 1, 2, 3] and os.path.getsize("out/raw.bin") == 32
assert sorted(glob.glob("out/**/*", recursive=True)) == [
    "out/raw.bin", "out/sub", "out/sub/a.json", "out/x.npy"]
os.remove("keep.txt")
assert not os.path.exists("keep.txt") and "keep.txt" not in os.listdir(".")
os.rename("old.txt", "new.txt")
assert open("new.txt").read() == "old" and not os.path.exists("old.txt")
shutil.rmtree("results")
assert not os.path.exists("results")
os.makedirs("results")
assert os.listdir("results") == []
with open("results/r.txt", "w") as f:
    f.write("fresh")
with open("notes.txt", "a") as f:
    f.write(" appended")
assert open("notes.txt").read() == "start appended"
"""


def test_python_writes_are_redirected_and_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("keep")
    (tmp_path / "old.txt").write_text("old")
    (tmp_path / "notes.txt").write_text("start")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.txt").write_text("previous")
    (tmp_path / "script.py").write_text(FILES, encoding="utf-8")
    before = _tree(tmp_path)
    report = run(str(tmp_path / "script.py"), engine="tagged")
    assert not report.unfinished, report.notes
    assert _tree(tmp_path) == before
    changes = {os.path.relpath(w.path, tmp_path): w.change for w in report.writes or ()}
    assert changes["keep.txt"] == "deleted" and changes["old.txt"] == "deleted"
    assert changes["new.txt"] == "created" and changes["out/x.npy"] == "created"
    assert changes["notes.txt"] == "overwritten" and changes["results"] == "deleted"
    assert changes["results/r.txt"] == "overwritten"


def test_the_scripts_own_modules_leave_no_bytecode_cache_in_the_users_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's Python writes ``__pycache__`` beside each module it imports (PYTHONDONTWRITEBYTECODE is
    seldom set, and this process may run with it): the script's own modules imported during the run leave
    none."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.dont_write_bytecode", False)
    (tmp_path / "pc_bytecode_helper.py").write_text("def scale():\n    return 2\n", encoding="utf-8")
    (tmp_path / "script.py").write_text("import torch\nimport pc_bytecode_helper\n\n"
                                        "x = torch.ones(2).cuda() * pc_bytecode_helper.scale()\n"
                                        "print(x.sum().item())\n", encoding="utf-8")
    before = _tree(tmp_path)
    report = run(str(tmp_path / "script.py"), engine="tagged")
    assert not report.unfinished, report.notes
    assert _tree(tmp_path) == before
    assert sys.dont_write_bytecode is False  # what the run held for itself is given back


def test_keep_scratch_keeps_the_files_and_says_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("open('out.txt', 'w').write('made by the script')\n", encoding="utf-8")
    report = run(str(tmp_path / "s.py"), engine="tagged", keep_scratch=True)
    [write] = report.writes or ()
    assert (write.path, write.change) == (str(tmp_path / "out.txt"), "created")
    assert not (tmp_path / "out.txt").exists()
    try:
        assert Path(write.scratch).read_text() == "made by the script"
        root = write.scratch[:write.scratch.index("/tree/")]
        assert any(f"kept at {root}" in n for n in report.notes)
    finally:
        shutil.rmtree(write.scratch[:write.scratch.index("/tree/")], ignore_errors=True)
    report = run(str(tmp_path / "s.py"), engine="tagged")  # without it: removed
    [write] = report.writes or ()
    assert write.scratch == ""


def test_a_write_past_the_patches_is_refused_and_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # io.FileIO called directly opens the path itself: the audit hook refuses it
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(GPU_OP + "import io\ntry:\n    io.FileIO('evil.txt', 'w')\n"
                                   "except PermissionError:\n    print('refused')\n", encoding="utf-8")
    report = run(str(tmp_path / "s.py"), engine="tagged")
    assert not (tmp_path / "evil.txt").exists()
    assert [(Path(w.path).name, w.change) for w in report.writes or ()] == [("evil.txt", "blocked")]
    assert "got past placecheck's scratch area" in report.unfinished


def test_a_write_nothing_in_python_saw_is_found_after_the_run(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's C++ zip writer given a path by the script itself (not through torch.save): C code writing
    # by itself; the snapshot after the run finds the file and the run says it did not run clean
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(GPU_OP + "w = torch._C.PyTorchFileWriter('c.bin')\n"
                                   "w.write_record('x', b'abc', 3)\nw.write_end_of_file()\n",
                                   encoding="utf-8")
    report = run(str(tmp_path / "s.py"), engine="tagged")
    assert [(Path(w.path).name, w.change) for w in report.writes or ()] == [("c.bin", "escaped")]
    assert "changed on disk during the run" in report.unfinished
    assert any("cannot redirect" in n for n in report.notes)


LOGGED = GPU_OP + """import logging
handler = logging.FileHandler("run.log")
logging.getLogger("job").addHandler(handler)
logging.getLogger("job").warning("step 1")
handler.close()
assert open("run.log").read() == "step 1\\n"
"""


def test_a_logging_file_is_redirected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(LOGGED, encoding="utf-8")
    report = run(str(tmp_path / "s.py"), engine="tagged")
    assert not report.unfinished, report.notes
    assert not (tmp_path / "run.log").exists()
    assert [(Path(w.path).name, w.change) for w in report.writes or ()] == [("run.log", "created")]


WORKER = GPU_OP + """import os
import torch
from torch.utils.data import DataLoader, Dataset

class Writing(Dataset):
    def __len__(self):
        return 2
    def __getitem__(self, i):
        with open(f"worker{i}.txt", "w") as f:
            f.write(str(os.getpid()))
        return torch.tensor([float(i)])

for batch in DataLoader(Writing(), batch_size=1, num_workers=1):
    pass
assert sorted(n for n in os.listdir(".") if n.startswith("worker")) == ["worker0.txt", "worker1.txt"]
"""


def test_a_dataloader_worker_writes_into_the_scratch_area(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(WORKER, encoding="utf-8")
    # the DataLoader forks its worker: a fresh interpreter, as a command line's (tests/fresh.py)
    report = fresh(run, str(tmp_path / "s.py"), engine="tagged", steps=0)
    assert not report.unfinished, report.notes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]
    assert sorted(Path(w.path).name for w in report.writes or ()) == ["worker0.txt", "worker1.txt"]


SAVE_PRETRAINED = """import os
import torch
from transformers import BertConfig, BertForSequenceClassification
config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, num_labels=2)
model = BertForSequenceClassification(config).to("cuda")
model.save_pretrained("out")
assert BertConfig.from_pretrained("out").hidden_size == 16
assert sorted(os.listdir("out")) == ["config.json", "model.safetensors"], os.listdir("out")
"""


@pytest.mark.transformers
@ENGINES
def test_save_pretrained_is_redirected_and_loads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      engine: str) -> None:
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(SAVE_PRETRAINED, encoding="utf-8")
    report = run(str(tmp_path / "s.py"), engine=engine)
    assert not report.unfinished, report.notes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]
    assert {os.path.relpath(w.path, tmp_path) for w in report.writes or ()} >= {
        "out", "out/config.json", "out/model.safetensors"}


LIGHTNING = """import os
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
trainer = L.Trainer(accelerator="gpu", devices=1, max_epochs=1, default_root_dir="runs",
                    logger=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Net(), data)
trainer.save_checkpoint("runs/last.ckpt")
assert os.path.isfile("runs/last.ckpt")
"""


def test_a_lightning_checkpoint_is_redirected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(LIGHTNING, encoding="utf-8")
    report = run(str(tmp_path / "s.py"), engine="tagged")
    assert not report.unfinished, report.notes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]
    assert "runs/last.ckpt" in {os.path.relpath(w.path, tmp_path) for w in report.writes or ()}


def test_the_json_report_lists_the_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from report_schema import validate_report

    from placecheck.findings.formats.json import report_from_dict, report_to_dict

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("open('a.txt', 'w').write('x')\n", encoding="utf-8")
    report = run(str(tmp_path / "s.py"), engine="tagged")
    data = validate_report(report_to_dict(report))
    assert data["writes"] == [{"path": str(tmp_path / "a.txt"), "change": "created", "scratch": ""}]
    assert report_from_dict(data).writes == report.writes


def test_nothing_is_patched_after_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from placecheck.basics.patching import installed

    opened, stat = builtins.open, os.stat
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("open('a.txt', 'w').write('x')\n", encoding="utf-8")
    run(str(tmp_path / "s.py"), engine="tagged")
    assert (builtins.open, os.stat) == (opened, stat)
    assert installed() == []
    with open(tmp_path / "after.txt", "w") as f:  # outside a run writes go where they are told
        f.write("y")
    assert (tmp_path / "after.txt").read_text() == "y"


RANKS = """import os
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.save(torch.ones(2, device="cuda"), f"rank{rank}.pt")
assert torch.load(f"rank{rank}.pt").device == torch.device("cuda", rank)
dist.barrier()
"""


def test_torchrun_ranks_write_into_the_scratch_area(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(RANKS, encoding="utf-8")
    report = run(str(tmp_path / "s.py"), nproc_per_node=2)
    assert not report.unfinished, report.notes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]
    assert sorted(Path(w.path).name for w in report.writes or ()) == ["rank0.pt", "rank1.pt"]


CHILDREN = GPU_OP + """import os, subprocess, sys
from placecheck.run.scratch import child_environment

bootstrapped = ("from placecheck.run.scratch import protect_from_environment\\n"
                "with protect_from_environment():\\n"
                "    open('child.txt', 'w').write('from the child')\\n")
env = {**os.environ, **child_environment()}
subprocess.run([sys.executable, "-c", bootstrapped], env=env, check=True)
assert open("child.txt").read() == "from the child"  # the child's write, read back by the script
subprocess.run([sys.executable, "-c", "open('plain.txt', 'w').write('past the scratch area')"], check=True)
"""


def test_a_spawned_child_writes_into_the_scratch_area_a_plain_one_is_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a Python child entering protect_from_environment (the bootstrap of a spawned child) writes into the
    # run's scratch area; one that does not writes on disk, which the snapshot after the run reports
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                    os.environ.get("PYTHONPATH")])))
    (tmp_path / "s.py").write_text(CHILDREN, encoding="utf-8")
    report = run(str(tmp_path / "s.py"), engine="tagged")
    assert not (tmp_path / "child.txt").exists()
    assert sorted((Path(w.path).name, w.change) for w in report.writes or ()) == [
        ("child.txt", "created"), ("plain.txt", "escaped")]
    assert "plain.txt changed on disk during the run" in report.unfinished


ACCELERATE = """import os
import torch
from accelerate import Accelerator

accelerator = Accelerator()
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.save_state("state")
accelerator.load_state("state")
assert os.path.isdir("state") and os.listdir("state")
"""


def test_accelerate_save_state_is_redirected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("accelerate")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(ACCELERATE, encoding="utf-8")
    report = run(str(tmp_path / "s.py"), engine="tagged")
    assert not report.unfinished, report.notes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]
    assert any(os.path.relpath(w.path, tmp_path).startswith("state/") for w in report.writes or ())


TENSORBOARD = """import os, pickle, json
import torch
from torch.utils.tensorboard import SummaryWriter
model = torch.nn.Linear(2, 1).to("cuda")
writer = SummaryWriter("runs/exp")
for step in range(3):
    loss = model(torch.randn(4, 2, device="cuda")).sum()
    writer.add_scalar("loss", loss.item(), step)
writer.close()
with open("state.pkl", "wb") as f:
    pickle.dump({"step": 3}, f)
with open("metrics.json", "w") as f:
    json.dump({"loss": loss.item()}, f)
assert len([n for n in os.listdir("runs/exp") if n.startswith("events.out.tfevents")]) == 1
assert pickle.load(open("state.pkl", "rb")) == {"step": 3} and "loss" in json.load(open("metrics.json"))
"""


@ENGINES
def test_tensorboard_events_pickle_and_json_are_redirected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          engine: str) -> None:
    """TensorBoard's event file (written by its own writer thread), pickle and json dumps: the script
    finds them where it wrote them, the user's directory has none of them."""
    pytest.importorskip("tensorboard")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(TENSORBOARD, encoding="utf-8")
    report = run(str(tmp_path / "s.py"), engine=engine)
    assert not report.unfinished, report.notes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]
    written = {os.path.relpath(w.path, tmp_path) for w in report.writes or ()}
    assert {"state.pkl", "metrics.json"} <= written
    assert any(w.startswith("runs/exp/events.out.tfevents") for w in written), written


def test_pathlib_and_glob_see_the_scratch_area(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pathlib and glob change between Python versions (3.13's glob of a Path keeps os.lstat and
    # os.scandir in a class of its own): what they show is the script's view, on every version
    from placecheck.run import scratch
    from placecheck.run.redirect import protected

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("hello\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "k.txt").write_text("keep")
    before = _tree(tmp_path)
    session = scratch.start(str(tmp_path / "train.py"), keep=False)
    assert session is not None
    try:
        with protected(session.overlay):
            with Path("a.txt").open("a") as f:
                f.write("more\n")
            assert Path("a.txt").read_text() == "hello\nmore\n"
            Path("a.txt").rename("b.txt")
            assert not Path("a.txt").exists() and Path("b.txt").read_text() == "hello\nmore\n"
            shutil.rmtree("out")
            Path("out/deep").mkdir(parents=True)
            Path("out/deep/p.json").write_text("{}")
            Path("t.txt").touch()
            assert sorted(p.name for p in Path(".").iterdir()) == ["b.txt", "out", "t.txt"]
            assert [str(p) for p in Path(".").glob("out/**/*.json")] == ["out/deep/p.json"]
            assert [str(p) for p in Path(".").rglob("*.txt")] in (["b.txt", "t.txt"], ["t.txt", "b.txt"])
            assert sorted(d for d, _, _ in os.walk(".")) == [".", "./out", "./out/deep"]
        writes = {os.path.relpath(w.path, tmp_path): w.change for w in session.writes()}
    finally:
        session.close()
    assert _tree(tmp_path) == before
    assert writes == {"a.txt": "deleted", "b.txt": "created", "out": "deleted", "out/deep": "created",
                      "out/deep/p.json": "created", "t.txt": "created"}
