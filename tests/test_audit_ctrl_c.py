"""Ctrl-C during a one-target ``placecheck audit`` prints what was found so far (issue 42, item 7).

A KeyboardInterrupt in the forward ends it as a forward that stopped does: the walk and the part of the
forward that ran are judged, the report says where it was interrupted (its ``incomplete``, and a note),
then ``placecheck: interrupted`` and exit 130; the Python API raises
:class:`~placecheck.commands.api.AuditInterrupted` with that report. Ctrl-C before the forward (the
model's import or constructor) writes nothing: nothing was judged yet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import placecheck
from placecheck.commands.api import AuditInterrupted
from placecheck.findings.report import EXIT_INTERRUPTED

ENGINES = ["tagged", "fake"]
BOUND = 300
"""Seconds an audit may take: only a hang runs past it."""

MODEL = '''\
import os
import signal

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.scale = torch.ones(2)  # .to() leaves it on the CPU

    def forward(self, x):
        y = self.fc(x) * self.scale  # the GPU raises here
        {interrupt}
        return y.relu() + torch.zeros(2)  # never reached: no PC202 for it
'''
SCALE, INTERRUPTED_AT = 12, 16
"""The lines of the stray attribute and of ``{interrupt}`` in :data:`MODEL`."""


def _model(tmp_path: Path, interrupt: str) -> Path:
    path = tmp_path / "net.py"
    path.write_text(MODEL.format(interrupt=interrupt))
    return path


def _load(path: Path) -> type:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_ctrl_c_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Net  # type: ignore[no-any-return]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_api_raises_with_what_was_found_until_ctrl_c(tmp_path: Path, engine: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # (paths are shown relative to the working directory)
    net = _load(_model(tmp_path, "raise KeyboardInterrupt"))
    with pytest.raises(AuditInterrupted) as stopped:
        placecheck.audit(net, "cuda", engine=engine)
    assert isinstance(stopped.value, KeyboardInterrupt)  # Ctrl-C still interrupts the caller
    report = stopped.value.report
    assert report.incomplete == f"interrupted by Ctrl-C at net.py:{INTERRUPTED_AT}"
    note = f"forward: interrupted by Ctrl-C at net.py:{INTERRUPTED_AT}: the findings are judged on the part"
    assert any(n.startswith(note) for n in report.notes)
    # the stray the forward used before the interrupt is an error (it crashed the op); the line after
    # the interrupt never ran, so nothing is said of it
    serious = {(f.code, f.source, f.severity) for f in report.findings if f.severity != "info"}
    assert ("PC101", f"net.py:{SCALE}", "error") in serious
    assert not any(f.code == "PC202" for f in report.findings)


def test_the_same_model_without_ctrl_c_is_checked_to_its_end(tmp_path: Path) -> None:
    # the control: the interrupt, not the model, made the report incomplete
    report = placecheck.audit(_load(_model(tmp_path, "pass")), "cuda", engine="tagged")
    assert report.incomplete == ""
    assert any(f.code == "PC202" for f in report.findings)  # the line after the interrupt point ran


def test_ctrl_c_before_the_forward_raises_a_plain_keyboard_interrupt() -> None:
    import torch.nn as nn

    def build() -> nn.Module:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as stopped:
        placecheck.audit(build, "cuda", engine="tagged")
    assert not isinstance(stopped.value, AuditInterrupted)


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_sigint_in_the_forward_prints_the_report_then_exits_130(tmp_path: Path, fmt: str) -> None:
    # a terminal's Ctrl-C: SIGINT to the process while the model's forward runs
    _model(tmp_path, "os.kill(os.getpid(), signal.SIGINT)")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "COLUMNS": "80",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "placecheck", "audit", "net.py:Net", "--format", fmt],
                          cwd=tmp_path, capture_output=True, text=True, timeout=BOUND, env=env, check=False)
    assert done.returncode == EXIT_INTERRUPTED, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "placecheck: interrupted"
    if fmt == "json":
        report = json.loads(done.stdout)
        assert report["summary"]["incomplete"] == f"interrupted by Ctrl-C at net.py:{INTERRUPTED_AT}"
        assert ("PC101", f"net.py:{SCALE}") in {(f["code"], f["source"]) for f in report["findings"]}
    else:
        assert f"error   PC101 scale  net.py:{SCALE}" in done.stdout
        assert f"interrupted by Ctrl-C at net.py:{INTERRUPTED_AT}" in done.stdout
