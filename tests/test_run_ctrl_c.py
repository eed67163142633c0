"""Ctrl-C during ``placecheck run`` prints what was found so far (issue 42, item 7).

A KeyboardInterrupt raised while the script runs ends the run as a stop does: the report of what the
recorder found until then, marked unfinished ("interrupted by Ctrl-C at FILE:LINE"), in the chosen
format, then ``placecheck: interrupted`` and exit 130; the script's writes stay in the scratch area,
which is removed. Each case runs ``python -m placecheck run`` in a subprocess whose script interrupts
itself after a real finding (a tensor attribute ``.to()`` leaves on the CPU, used with a GPU tensor), as
a terminal's Ctrl-C would: SIGINT to the process, or the KeyboardInterrupt it becomes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import unwrapped

from placecheck.engines import cudaapi
from placecheck.findings.report import EXIT_INTERRUPTED

ENGINES = ["tagged", pytest.param("fake", marks=pytest.mark.skipif(
    cudaapi.CPU_ONLY_BUILD, reason="the fake engine of run needs torch built with CUDA support"))]
BOUND = 300
"""Seconds a run may take: only a hang runs past it."""

SCRIPT = '''\
import os
import signal

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.scale = torch.ones(2)

    def forward(self, x):
        return self.fc(x) * self.scale  # the GPU raises here: scale stayed on the CPU


model = Net().to("cuda")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with open("log.txt", "w") as log:
    log.write("started\\n")
for step in range(3):
    loss = model(torch.randn(3, 4, device="cuda")).sum()
    loss.backward()
    opt.step()
    if step == 1:
        {interrupt}
print("after the interrupt")
'''
INTERRUPTED_AT = "train.py:27"
"""The line of ``{interrupt}`` in :data:`SCRIPT`."""

SIGINT = "os.kill(os.getpid(), signal.SIGINT)"


def _run_interrupted(tmp_path: Path, interrupt: str, *options: str) -> subprocess.CompletedProcess[str]:
    """``placecheck run OPTIONS train.py`` in ``tmp_path/work``, the scratch area under ``tmp_path/tmp``."""
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    (work / "train.py").write_text(SCRIPT.format(interrupt=interrupt))
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "TMPDIR": str(tmp), "COLUMNS": "80",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "placecheck", "run", *options, "train.py"], cwd=work,
                          capture_output=True, text=True, timeout=BOUND, env=env, check=False)
    # the script's write went to the scratch area, which is gone: the user's directory is as it was
    assert sorted(p.name for p in work.iterdir()) == ["train.py"], done.stderr
    assert not any(tmp.glob("placecheck-run-*")), "the scratch area outlived the interrupted run"
    return done


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("interrupt", [SIGINT, "raise KeyboardInterrupt"])
def test_ctrl_c_prints_the_findings_so_far_and_exits_130(tmp_path: Path, interrupt: str, engine: str) -> None:
    done = _run_interrupted(tmp_path, interrupt, "--engine", engine)
    assert done.returncode == EXIT_INTERRUPTED == 130, done.stderr
    assert "error   PC101 scale  train.py:12" in done.stdout, done.stdout
    summary = unwrapped(done.stdout.split("\n\n")[-1]).replace("\n  ", " ")
    assert f"the script did not run through (interrupted by Ctrl-C at {INTERRUPTED_AT})" in summary, summary
    # the script ended there (the notes quote the line that never ran; the script's print would be a line)
    assert "after the interrupt" not in (done.stdout + done.stderr).splitlines()
    assert unwrapped(done.stderr).splitlines()[-1] == "placecheck: interrupted", done.stderr
    assert "placecheck: error" not in done.stderr  # an interrupt, not a failed run


def test_ctrl_c_prints_the_report_in_the_chosen_format(tmp_path: Path) -> None:
    done = _run_interrupted(tmp_path, SIGINT, "--format", "json", "--engine", "tagged")
    assert done.returncode == 130, done.stderr
    report = json.loads(done.stdout)
    assert report["summary"]["unfinished"] == f"interrupted by Ctrl-C at {INTERRUPTED_AT}"
    assert [f["where"] for f in report["findings"] if f["code"] == "PC101"] == ["scale"]
    assert [Path(w["path"]).name for w in report["writes"]] == ["log.txt"]  # written so far, kept apart
    [ending] = [n for n in report["notes"] if n.startswith("run: interrupted")]
    assert ending.startswith(f"run: interrupted by Ctrl-C at {INTERRUPTED_AT}, after 2 optimizer steps:"), \
        ending
    assert done.stderr.splitlines()[-1] == "placecheck: interrupted"


def test_a_caller_of_run_still_gets_the_keyboard_interrupt_with_the_report() -> None:
    import torch
    import torch.nn as nn

    from placecheck.run import run
    from placecheck.run.script import RunInterrupted

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.scale = torch.ones(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * self.scale  # the GPU raises here: scale stayed on the CPU

    def program() -> None:
        model = Net().to("cuda")
        model(torch.randn(3, 4, device="cuda"))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as caught:
        run(program, engine="tagged")
    assert isinstance(caught.value, RunInterrupted)
    report = caught.value.report
    assert report.unfinished.startswith("interrupted by Ctrl-C at "), report.unfinished
    assert "PC101" in [f.code for f in report.findings]
