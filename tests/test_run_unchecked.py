"""Issue 40 item 3: ``placecheck run`` never passes what it did not check.

A run that stopped before any forward pass or optimizer step (argparse's ``--help``, a ``sys.exit(0)``
before the loop) or ran no op on a simulated GPU (a script that runs on the CPU by design) is
unfinished: exit code 2, ``--exit-zero`` included, with one line saying what was checked. A correct
inference script (forwards on the GPU, no optimizer) passes. Fixtures: ``tests/fixtures/run/unchecked/``,
each under both engines.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_runner import CliRunner
from conftest import unwrapped
from report_schema import validate_json

from placecheck.cli import app
from placecheck.findings.report import exit_code
from placecheck.run import run

pytestmark = [pytest.mark.compat]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run" / "unchecked"
ENGINES = pytest.mark.parametrize("engine", ["tagged", "fake"])


def script(name: str) -> str:
    return os.path.relpath(FIXTURES / name)


@ENGINES
def test_help_stops_the_script_before_anything_is_checked_exit_2_even_with_exit_zero(engine: str) -> None:
    result = CliRunner().invoke(app, ["run", "--engine", engine, "--exit-zero", "--format", "json",
                                      script("train_args.py"), "--help"])
    why = (f"the script stopped at sys.exit(0) at {script('train_args.py')}:15, before any forward pass: "
           "0 forward passes, 0 optimizer steps: nothing was checked")
    assert result.exit_code == 2, result.stderr
    assert unwrapped(result.stderr).strip().splitlines()[-1] == f"placecheck: error: {why}"
    report = validate_json(result.stdout)  # the new stats keys are in the schema's integer stats
    assert report["findings"] == [] and report["summary"]["unfinished"] == why
    assert report["summary"]["line"].startswith("nothing checked on cuda:0")
    assert (report["stats"]["forward_passes"], report["stats"]["optimizer_steps"]) == (0, 0)


@ENGINES
def test_sys_exit_0_before_the_loop_is_unfinished_and_the_loop_itself_passes(engine: str) -> None:
    stopped = run(script("train_args.py"), ["--dry-run"], engine=engine)
    assert stopped.unfinished == (f"the script stopped at sys.exit(0) at {script('train_args.py')}:19, "
                                  "before any forward pass: 0 forward passes, 0 optimizer steps: nothing was "
                                  "checked")
    assert exit_code([stopped]) == exit_code([stopped], exit_zero=True) == 2
    trained = run(script("train_args.py"), engine=engine)
    assert trained.unfinished == "" and exit_code([trained]) == 0
    assert dict(trained.stats)["forward_passes"] == 2 and dict(trained.stats)["device_ops"] > 0


@ENGINES
def test_a_script_on_the_cpu_by_design_checked_nothing_exit_2(engine: str) -> None:
    report = run(script("cpu_only.py"), engine=engine)
    assert report.findings == ()
    assert report.unfinished == ("the script ran no op on a simulated GPU (2 forward passes, 2 optimizer "
                                 "steps, all on the CPU): nothing was checked")
    assert dict(report.stats)["device_ops"] == 0
    assert exit_code([report], exit_zero=True) == 2
    assert report.summary_line().startswith("nothing checked on cuda:0")


@ENGINES
def test_a_correct_inference_script_without_an_optimizer_passes(engine: str) -> None:
    report = run(script("inference_fixed.py"), engine=engine)
    assert report.unfinished == ""
    assert exit_code([report]) == 0
    stats = dict(report.stats)
    assert (stats["forward_passes"], stats["optimizer_steps"], stats["optimizers"]) == (2, 0, 0)
