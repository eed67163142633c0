"""Shared by the forward-pass tests: reports with one finding per instance, and marked lines.

These tests check what the tracer detects, instance by instance (a PC201 and
the PC202 that fed it are two findings); the report's grouping of findings
into problems by root cause has tests of its own. The fixture builds every
report of a test ungrouped, as ``--no-group`` does. :func:`marked_line` finds
the line a finding's ``source`` must name, by a ``# MARK ...`` comment on it.
:class:`BranchesOnAWeight` branches on a value the fake engine can only assume.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

import placecheck.findings.report


@pytest.fixture
def ungrouped(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``Report.build`` in the test keeps one finding per instance."""
    build = placecheck.findings.report.Report.build
    if "group" in inspect.signature(build).parameters:
        def one_per_instance(*args: Any, **kwargs: Any) -> placecheck.findings.report.Report:
            kwargs["group"] = False
            return build(*args, **kwargs)

        monkeypatch.setattr(placecheck.findings.report.Report, "build", staticmethod(one_per_instance))
    yield


def marked_line(test_file: str, text: str) -> int:
    """The number of the one line of ``test_file`` containing ``text`` (a ``# MARK ...`` comment), the
    lines that look it up (``marked_line``, ``_line_of``) aside."""
    lines = Path(test_file).read_text(encoding="utf-8").splitlines()
    (line,) = [i + 1 for i, s in enumerate(lines)
               if text in s and "marked_" not in s and "_line_of" not in s]
    return line


def marked_source(test_file: str, text: str) -> str:
    """``name.py:LINE`` of :func:`marked_line`: how a finding's ``source`` (or a note) ends."""
    return f"{Path(test_file).name}:{marked_line(test_file, text)}"


class BranchesOnAWeight(nn.Module):
    """Which layer runs depends on a value computed from weights: the fake engine must assume it (a
    branch on an assumed value, noted at the line marked here)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.other = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.lin(x) > 0).any():  # MARK weight branch
            return self.lin(x)
        return self.other(x)
