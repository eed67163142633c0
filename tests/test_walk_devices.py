"""The walk on every target device: what `.to()` cannot leave behind on the CPU still matters there.

Modules and parameters in plain containers (PC102/PC103) are missed by
``state_dict()`` and by ``model.parameters()`` (the optimizer) whatever the
device; on a CPU target nothing is off the device, so the message says what
is missed instead of where it stayed.
"""

from __future__ import annotations

import json

from cli_runner import CliRunner
from conftest import BUGGY

from placecheck.cli import app


def test_buggy_example_on_the_cpu_reports_its_unregistered_modules_and_parameters() -> None:
    result = CliRunner().invoke(app, ["audit", BUGGY, "--device", "cpu", "--format", "json", "--no-group"])
    assert result.exit_code == 1, result.stderr
    findings = json.loads(result.stdout)["findings"]
    walk = sorted((f["code"], f["where"]) for f in findings if f["code"].startswith("PC1"))
    assert walk == [("PC102", "heads[0]"), ("PC102", "heads[1]"),
                    ("PC103", "scales[0]"), ("PC103", "scales[1]")]
    for f in findings:
        if f["code"] in ("PC102", "PC103"):
            assert f["severity"] == "error" and f["device"] == f["expected"] == "cpu"
            assert "not in state_dict() and not handed to the optimizer" in f["message"]
            assert "examples/buggy.py:" in f["source"]
