"""A whole model saved through a file object and loaded back in the same run (word_language_model's
``with open(args.save, "wb") as f: torch.save(model, f)``): under both engines the loaded model is
where the saved one was, as on a GPU, and the file is written (the fake engine writes meta tensors)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from placecheck.run import run

SCRIPT = """import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to("cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.randn(3, 4, device="cuda")).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
with open("model.pt", "wb") as f:
    torch.save(model, f)
with open("model.pt", "rb") as f:
    model = torch.load(f, weights_only=False)
out = model(torch.randn(3, 4, device=DEVICE))  # MARK use
"""


@pytest.mark.parametrize("engine", ["tagged", "fake"])
@pytest.mark.parametrize(("device", "expected"), [('"cuda"', []), ('"cpu"', ["PC201"])])
def test_a_model_saved_through_a_file_object_loads_where_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, device: str,
        expected: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    text = SCRIPT.replace("DEVICE", device)
    (tmp_path / "train.py").write_text(text, encoding="utf-8")
    report = run(str(tmp_path / "train.py"), engine=engine)
    line = next(i + 1 for i, s in enumerate(text.splitlines()) if "MARK use" in s)
    serious = [(f.code, f.source) for f in report.findings if f.severity.value != "info"]
    assert serious == [(code, f"{os.path.relpath(tmp_path / 'train.py')}:{line}") for code in expected]
    assert not report.unfinished, report.notes
    assert (tmp_path / "model.pt").stat().st_size > 0
