"""A whole model saved through a file object and loaded back in the same run (word_language_model's
``with open(args.save, "wb") as f: torch.save(model, f)``): under both engines the loaded model is
where the saved one was, as on a GPU, and the file is written (the fake engine writes meta tensors), in
the scratch area (``placecheck run`` never changes the user's files: read here with ``keep_scratch``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kept_scratch import kept, remove_kept

from placecheck.findings.report import Report
from placecheck.run import run

TRAINED = """import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to("cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.randn(3, 4, device="cuda")).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
"""A model trained on the GPU; each test saves and loads it back its own way, then uses it (MARK use)."""

SCRIPT = TRAINED + """with open("model.pt", "wb") as f:
    torch.save(model, f)
with open("model.pt", "rb") as f:
    model = torch.load(f, weights_only=False)
out = model(torch.randn(3, 4, device=DEVICE))  # MARK use
"""

SAFETENSORS = TRAINED + """from safetensors.torch import load_file, save_file

save_file(model.state_dict(), "model.safetensors")
model.load_state_dict(load_file("model.safetensors", device="cuda"))
out = model(torch.randn(3, 4, device=DEVICE))  # MARK use
"""

USED_ON = pytest.mark.parametrize(("device", "expected"), [('"cuda"', []), ('"cpu"', ["PC201", "PC202"])])
"""The loaded model used with a GPU input (clean) or a CPU one (PC201 at the MARK, and PC202 there: the
input's creation on the CPU, the line to edit)."""
ENGINES = pytest.mark.parametrize("engine", ["tagged", "fake"])


def _found_at_the_mark(tmp_path: Path, script: str, device: str, engine: str, expected: list[str]) -> Report:
    """``script`` (DEVICE: ``device``) run under ``engine`` through to its end, with ``expected`` the codes
    of its warnings and errors, each at the line marked ``# MARK use``; its report (the scratch area
    kept: :func:`remove_kept` it)."""
    text = script.replace("DEVICE", device)
    (tmp_path / "train.py").write_text(text, encoding="utf-8")
    report = run(str(tmp_path / "train.py"), engine=engine, keep_scratch=True)
    line = next(i + 1 for i, s in enumerate(text.splitlines()) if "MARK use" in s)
    serious = [(f.code, f.source) for f in report.findings if f.severity.value != "info"]
    assert serious == [(code, f"{os.path.relpath(tmp_path / 'train.py')}:{line}") for code in expected]
    assert not report.unfinished, report.notes
    return report


@ENGINES
@USED_ON
def test_a_model_saved_through_a_file_object_loads_where_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, device: str,
        expected: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    report = _found_at_the_mark(tmp_path, SCRIPT, device, engine, expected)
    try:
        assert kept(report.writes or (), tmp_path / "model.pt").stat().st_size > 0
        assert not (tmp_path / "model.pt").exists()
    finally:
        remove_kept(report.writes or ())


@ENGINES
@USED_ON
def test_a_safetensors_save_is_written_and_loads_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, device: str,
        expected: list[str]) -> None:
    # the fake engine's tensors hold no data: safetensors (which reads their memory) writes their bytes
    # as zeros, the names, shapes and dtypes right; before, the save was "the script's own error"
    pytest.importorskip("safetensors")
    monkeypatch.chdir(tmp_path)
    report = _found_at_the_mark(tmp_path, SAFETENSORS, device, engine, expected)
    from safetensors.torch import load_file

    try:
        saved = load_file(str(kept(report.writes or (), tmp_path / "model.safetensors")))
        assert {k: tuple(v.shape) for k, v in saved.items()} == {
            "0.weight": (8, 4), "0.bias": (8,), "2.weight": (2, 8), "2.bias": (2,)}
    finally:
        remove_kept(report.writes or ())


@pytest.mark.transformers
def test_save_pretrained_of_a_fake_model_writes_it_and_runs_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers tells tied weights by storage pointers, which every fake tensor shared (0): its check
    # for weights shared against its config stopped save_pretrained
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(
        "import torch\n"
        "from transformers import BertConfig, BertForSequenceClassification\n"
        "config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,\n"
        "                    intermediate_size=32, num_labels=2)\n"
        "model = BertForSequenceClassification(config).to('cuda')\n"
        "model.save_pretrained('out')\n"
        "print(model(input_ids=torch.randint(0, 50, (2, 6), device='cuda')).logits.shape)\n",
        encoding="utf-8")
    report = run(str(tmp_path / "train.py"), engine="fake", keep_scratch=True)
    try:
        assert not report.unfinished, report.notes
        assert [f.code for f in report.findings if f.severity.value != "info"] == []
        assert kept(report.writes or (), tmp_path / "out" / "model.safetensors").stat().st_size > 0
    finally:
        remove_kept(report.writes or ())


@ENGINES
def test_a_safetensors_file_read_lazily_onto_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     engine: str) -> None:
    # safetensors reads a file's bytes into the memory of a tensor it makes: under the fake engine that
    # was a fake tensor without memory, and the process died (SIGSEGV); it is read on the host now
    pytest.importorskip("safetensors")
    import torch
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)
    save_file({"w": torch.arange(6.0).reshape(2, 3)}, str(tmp_path / "w.safetensors"))
    (tmp_path / "read.py").write_text(
        "from safetensors import safe_open\n"
        "with safe_open('w.safetensors', framework='pt', device=0) as f:\n"
        "    row = f.get_slice('w')[:1]\n"
        "    whole = f.get_tensor('w')\n"
        "    keys = list(f.keys())\n"
        "open('seen.txt', 'w').write(f'{row.device} {tuple(row.shape)} {whole.device} {keys}')\n",
        encoding="utf-8")
    report = run(str(tmp_path / "read.py"), engine=engine, keep_scratch=True)
    try:
        assert not report.unfinished, report.notes
        assert kept(report.writes or (), tmp_path / "seen.txt").read_text() == "cuda:0 (1, 3) cuda:0 ['w']"
    finally:
        remove_kept(report.writes or ())
