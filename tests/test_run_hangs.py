"""``placecheck run`` never hangs, and its fast-forward changes nothing a library can see (issue 40, item 2).

After the ``--steps`` budget every pass over a DataLoader a library iterates still yields a batch (an
epoch-end handler reads the last batch, a metric needs an example); every loop ends, whoever drives it
(the script, a library's ``while True:``, Lightning's ``max_steps`` without ``max_epochs``, a stream
without a length); a loop that keeps going with nothing new is stopped; and the watchdog stops a run that
makes no progress at all, exit code 2 with the reason and the line.

A case that could hang runs ``python -m placecheck run`` in a subprocess with a ``timeout=``: a hang
fails the test (``TimeoutExpired``) instead of stalling the suite. Fixtures:
``tests/fixtures/run/hangs/`` (``minignite.py`` and ``trainlib.py`` stand for installed libraries: the
scripts import them, their loops are not the script's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import unwrapped

from placecheck.engines import cudaapi
from placecheck.findings.finding import Severity
from placecheck.findings.report import Report
from placecheck.run import run
from placecheck.run.fastforward import MAX_BATCHES, MAX_PASSES_AFTER, MAX_STEPS_AFTER, FastForward
from placecheck.run.lines import ScriptLines
from placecheck.run.script import Watchdog
from placecheck.run.session import StopRun

ROOT = Path(__file__).resolve().parent.parent
HANGS = ROOT / "tests" / "fixtures" / "run" / "hangs"
ENGINES = ["tagged", pytest.param("fake", marks=pytest.mark.skipif(
    cudaapi.CPU_ONLY_BUILD, reason="the fake engine of run needs torch built with CUDA support"))]
BOUND = 300
"""Seconds a bounded run may take: a hang, not a slow machine, runs past it."""


def script(name: str) -> str:
    return os.path.relpath(HANGS / name)


def bounded(name: str, *args: str, options: tuple[str, ...] = (),
            env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    """``placecheck run --format json OPTIONS SCRIPT -- ARGS`` in a subprocess that must return within
    :data:`BOUND` seconds: its exit code, its JSON report and its stderr."""
    command = [sys.executable, "-m", "placecheck", "run", "--format", "json", *options, script(name), "--",
               *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=BOUND,
                          env={**os.environ, **(env or {})}, check=False)
    return done.returncode, json.loads(done.stdout), done.stderr


def ending(report: dict[str, Any]) -> str:
    [note] = [n for n in report["notes"] if n.startswith(("run: the script ran to its end", "run: stopped"))]
    return str(note)


def failing(report: Report) -> list[tuple[str, str]]:
    """``(code, file:line)`` of every finding above info."""
    return sorted((f.code, f.source) for f in report.findings if f.severity is not Severity.INFO)


# -- every loop ends ------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_epochs", [(), ("-1",)], ids=["no-max_epochs", "max_epochs=-1"])
def test_lightning_max_steps_without_an_epoch_limit_ends(max_epochs: tuple[str, ...]) -> None:
    pytest.importorskip("lightning")
    code, report, _ = bounded("lightning_max_steps.py", *max_epochs)
    assert code == 0 and report["summary"]["unfinished"] == ""
    # each epoch after the budget is one step long: Lightning goes on to max_steps, the run stops first
    assert ending(report).startswith(f"run: stopped after {2 + MAX_STEPS_AFTER} optimizer steps (--steps 2, "
                                     f"{MAX_STEPS_AFTER} of them after the budget")


@pytest.mark.parametrize("data", [(), ("stream",)], ids=["sized", "stream"])
def test_an_hf_trainer_with_max_steps_beyond_an_epoch_ends(data: tuple[str, ...]) -> None:
    pytest.importorskip("transformers")
    code, report, stderr = bounded("hf_max_steps.py", *data)
    assert code == 0 and report["summary"]["unfinished"] == "", stderr
    assert ending(report).startswith(f"run: stopped after {2 + MAX_STEPS_AFTER} optimizer steps")


def test_accelerate_with_the_script_s_own_while_true_loop_ends() -> None:
    pytest.importorskip("accelerate")
    code, report, _ = bounded("accelerate_while_true.py")
    assert code == 0 and report["summary"]["unfinished"] == ""
    assert ending(report).startswith("run: the script ran to its end (")
    assert any("(`while True:`) ended early" in n for n in report["notes"])


def test_the_script_s_own_while_true_loop_with_a_step_counter_ends() -> None:
    code, report, _ = bounded("while_true.py")
    assert code == 0 and report["stats"]["optimizer_steps"] == 2
    assert ending(report).startswith("run: the script ran to its end (2 optimizer steps, then a fast-forward")
    assert any("(`while True:`) ended early" in n for n in report["notes"])


@pytest.mark.parametrize("name", ["library_while_true.py", "iterable_fit.py"])
def test_a_library_s_while_true_loop_ends_and_sees_whole_batches(name: str) -> None:
    # iterable_fit.py: an IterableDataset without a length whose generator never ends; its stream is
    # not cut (fit raises on a batch that is not whole), the library's loop is
    code, report, stderr = bounded(name)
    assert code == 0, stderr
    assert ending(report).startswith(f"run: stopped after {2 + MAX_STEPS_AFTER} optimizer steps")


def test_a_loop_that_keeps_passing_over_a_dataloader_with_nothing_new_is_stopped() -> None:
    code, report, _ = bounded("serve_forever.py")
    assert code == 0 and report["summary"]["unfinished"] == ""
    assert "passes in a row over the DataLoader iterated at" in ending(report)
    assert "that ran no new line of the script: the loop iterating it did not end" in ending(report)


# -- the watchdog -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("how", "lines"), [("spin", (17, 18)), ("queue", (20,))])
def test_the_watchdog_stops_a_script_stalled_after_the_budget_with_exit_2(how: str,
                                                                          lines: tuple[int, ...]) -> None:
    code, report, stderr = bounded("stalls.py", how, env={"PLACECHECK_WATCHDOG": "1"})
    # spinning, it is stopped in the loop's test or in its sleep; blocked, in the get
    stopped = report["summary"]["unfinished"]
    [at] = [f"{script('stalls.py')}:{line}" for line in lines if stopped.endswith(f":{line}")]
    assert code == 2
    assert report["summary"]["unfinished"] == f"stopped by the watchdog at {at}"
    said = f"placecheck: error: the script did not run through: stopped by the watchdog at {at}"
    assert said in unwrapped(stderr)
    assert ending(report).startswith(f"run: stopped by the watchdog at {at}: no progress for 1 s after the "
                                     "--steps budget")
    assert "the code after it is unchecked" in ending(report) and "`print(\"never\")`" in ending(report)
    # what it checked: every line but the other branch's and the last
    assert report["coverage"]["lines_not_run"] == sorted({17, 18, 20, 21} - set(lines))


def test_with_the_watchdog_off_timeout_still_stops_a_stalled_script_an_ordinary_end() -> None:
    code, report, _ = bounded("stalls.py", "spin", options=("--timeout", "20"),
                              env={"PLACECHECK_WATCHDOG": "0"})
    assert code == 0 and report["summary"]["unfinished"] == ""
    assert ending(report).startswith(f"run: stopped at --timeout 20 s at {script('stalls.py')}:")


def test_outside_the_main_thread_the_watchdog_is_not_enforced_and_a_note_says_so() -> None:
    reports: list[Report] = []
    worker = threading.Thread(target=lambda: reports.append(run(script("while_true.py"))))
    worker.start()
    worker.join(BOUND)
    assert not worker.is_alive()
    [report] = reports
    assert any(n.startswith("run: the watchdog is not enforced here") for n in report.notes)
    assert not any("watchdog" in n for n in run(script("while_true.py")).notes)


# -- an ignite-style trainer: evaluator, metric, epoch handlers -------------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
def test_an_ignite_style_trainer_with_an_evaluator_and_epoch_handlers_is_clean(engine: str) -> None:
    report = run(script("ignite_fixed.py"), engine=engine)
    assert failing(report) == [] and report.unfinished == ""
    assert any(n.startswith("run: the script ran to its end") for n in report.notes)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("name", "line", "where"), [("ignite_eval_buggy.py", 28, "x"),
                                                     ("ignite_handler_buggy.py", 39, "x")])
def test_a_bug_in_the_evaluator_or_an_epoch_handler_is_found_after_the_budget(
        name: str, line: int, where: str, engine: str) -> None:
    report = run(script(name), engine=engine)
    assert failing(report) == [("PC201", f"{script(name)}:{line}")]
    assert report.unfinished == "" and dict(report.stats)["optimizer_steps"] > 2  # found after the budget


# -- the decisions, one at a time -------------------------------------------------------------------------

def test_every_pass_over_a_dataloader_after_the_budget_yields_a_batch() -> None:
    ff = FastForward(None)
    ff.on = ff.through_loaders = True
    ff.training_loader = 1
    # the training DataLoader's iterator from before the budget ends; each later one yields one batch
    assert not ff.batch_allowed(True, 3, 0, loader=1)
    assert [ff.batch_allowed(False, n, n, loader=1) for n in range(3)] == [True, False, False]
    # another DataLoader's later iterators yield MAX_BATCHES
    assert [ff.batch_allowed(False, n, n, loader=2) for n in range(MAX_BATCHES + 1)] == \
        [True] * MAX_BATCHES + [False]


def test_passes_that_run_nothing_new_stop_the_run_and_a_new_line_resets_the_count() -> None:
    lines = ScriptLines(None)
    ff = FastForward(None, lines=lines)
    assert ff.pass_began(1, "train.py:9") == ""  # before the budget: never counted
    ff.on = True
    for _ in range(MAX_PASSES_AFTER):
        assert ff.pass_began(1, "train.py:9") == ""
        assert ff.pass_began(2, "train.py:12") == ""  # another DataLoader counts on its own
    lines.executed.add(30)  # the last pass ran a line for the first time
    assert ff.pass_began(1, "train.py:9") == ""
    for _ in range(MAX_PASSES_AFTER - 1):
        assert ff.pass_began(1, "train.py:9") == ""
    assert ff.pass_began(1, "train.py:9").startswith(f"after {MAX_PASSES_AFTER} passes in a row over the "
                                                     "DataLoader iterated at train.py:9 after the budget")


def test_the_watchdog_stops_only_after_its_time_without_progress() -> None:
    progress = [0]
    dog = Watchdog(60, lambda: progress[0])
    dog.check(1000.0)  # not armed: the budget is not spent
    dog.arm()
    start = dog._since
    dog.check(start + 59)
    progress[0] += 1  # a step, a forward, a batch or a new line
    dog.check(start + 100)  # progress: the time counts from here
    dog.check(start + 159)
    with pytest.raises(StopRun) as stop:
        dog.check(start + 160)
    assert stop.value.unfinished and stop.value.reason.startswith("by the watchdog: no progress for 60 s")
    assert Watchdog(0, lambda: 0).tick > 0 and not _armed(Watchdog(0, lambda: 0))  # 0: off


def _armed(dog: Watchdog) -> bool:
    dog.arm()
    return dog.armed
