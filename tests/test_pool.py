"""``--isolation fork``: warm servers fork a fresh child per model; progress on stderr.

The isolation itself (a crash, a hang, out of memory each that model's PC901)
is tested end to end in tests/test_runner.py, which runs with the default,
``fork``; here: that nothing leaks from one forked model into the next, that
``fork`` and ``spawn`` agree, the fallbacks, and the progress display.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import unwrapped

from placecheck.basics import forkserver
from placecheck.basics.config import ModelConfig, RunConfig, parse
from placecheck.basics.options import AuditOptions
from placecheck.commands import runner, worker
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.report import Report

REPO = Path(__file__).resolve().parents[1]
MODELS = "tests/fixtures/ci/models.py"


def _run(body: str, **kwargs: Any) -> list[runner.ModelOutcome]:
    return runner.run_models(parse(textwrap.dedent(body)), progress="off", workdir=str(REPO), **kwargs)


def _codes(outcome: runner.ModelOutcome) -> list[tuple[str, str, str]]:
    return [(f.code, f.where, dict(f.details).get("reason", "")) for f in outcome.report.findings]


@pytest.mark.skipif(not runner.fork_available(), reason="os.fork is not available here")
def test_a_model_changing_global_state_does_not_leak_into_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pids = tmp_path / "pids.txt"
    monkeypatch.setenv("PLACECHECK_TEST_PIDS", str(pids))
    # one job: both models go through the same warm server, one after the other
    sets, sees = _run(f"""
        jobs = 1
        [[models]]
        target = "{MODELS}:SetsGlobals"
        inputs = ["float32[2,4]"]
        [[models]]
        target = "{MODELS}:SeesNoLeak"
        inputs = ["float32[2,4]"]
        """, isolation="fork")
    assert not sets.failed, sets.report.findings
    assert not sees.failed, sees.report.findings  # its constructor raises when it sees a leak
    recorded = dict((kind, (int(pid), int(ppid))) for kind, pid, ppid in
                    (line.split() for line in pids.read_text().splitlines()))
    (sets_pid, sets_parent), (sees_pid, sees_parent) = recorded["sets"], recorded["sees"]
    assert sets_pid != sees_pid  # a fresh child per model...
    assert sets_parent == sees_parent != os.getpid()  # ...forked from the one warm server


def test_fork_and_spawn_give_the_same_findings() -> None:
    body = f"""
        jobs = 2
        [[models]]
        target = "{MODELS}:Healthy"
        [[models]]
        target = "{MODELS}:Buggy"
        kwargs = {{ width = 6 }}
        inputs = ["float32[3,6]"]
        [[models]]
        target = "{MODELS}:Segfault"
        [[models]]
        target = "{MODELS}:Missing"
        """
    forked = _run(body, isolation="fork")
    spawned = _run(body, isolation="spawn")
    assert [_codes(o) for o in forked] == [_codes(o) for o in spawned]
    assert [o.report.engine for o in forked] == [o.report.engine for o in spawned]
    assert _codes(spawned[2]) == [("PC901", "", "crash")]
    assert spawned[3].load_error and forked[3].load_error == spawned[3].load_error
    assert {("PC101", "mask", ""), ("PC102", "heads[0]", "")} <= set(_codes(forked[1]))


def _fake_spawn(calls: list[str]) -> Any:
    def audit(model: ModelConfig, timeout: float, workdir: str | None = None,
              threads: int = 0) -> runner.ModelOutcome:
        calls.append(model.label)
        return runner.ModelOutcome(model, Report.build(model.label, "cuda:0", "fake", []))

    return audit


def test_fork_falls_back_to_spawn_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []
    monkeypatch.setattr(runner, "fork_available", lambda: False)
    monkeypatch.setattr(runner, "audit_in_subprocess", _fake_spawn(calls))
    cfg = RunConfig(path="x", models=(ModelConfig(target="a:A"), ModelConfig(target="b:B")))
    runner.run_models(cfg, progress="off", isolation="fork")
    assert sorted(calls) == ["a:A", "b:B"]
    assert "--isolation fork is not available" in capsys.readouterr().err
    runner.run_models(cfg, progress="off")  # the config's default, fork: the fallback is silent
    assert len(calls) == 4 and capsys.readouterr().err == ""


def test_a_server_that_does_not_start_falls_back_to_spawn(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []
    monkeypatch.setattr(runner, "audit_in_subprocess", _fake_spawn(calls))
    started: list[list[str]] = []

    def server_command(modules: list[str]) -> list[str]:
        started.append(modules)
        return [sys.executable, "-c", "import sys; sys.stderr.write('no torch here\\n'); sys.exit(3)"]

    monkeypatch.setattr(forkserver, "_server_command", server_command)
    cfg = RunConfig(path="x", models=(ModelConfig(target="a:A"), ModelConfig(target="b:B")))
    outcomes = runner.run_models(cfg, jobs=1, progress="off", isolation="fork")
    assert sorted(calls) == ["a:A", "b:B"] and not any(o.failed for o in outcomes)
    assert started == [["a", "b"]]  # one try: the second model spawns without another
    err = capsys.readouterr().err
    assert err.count("a warm worker did not start") == 1 and "no torch here" in err


def test_the_warm_servers_import_the_targets_installed_libraries(tmp_path: Path) -> None:
    models = [ModelConfig(target="torchvision.models:resnet18"),
              ModelConfig(target="tests/fixtures/ci/models.py:Healthy"),
              ModelConfig(target="torchvision.models.detection:ssd300_vgg16",
                          options=AuditOptions(example_inputs="placecheck.model.zoo:detection_images")),
              ModelConfig(target="mypkg.models:Net")]
    assert runner.preload_modules(models) == ["mypkg.models", "placecheck.model.zoo", "torchvision.models",
                                              "torchvision.models.detection"]
    # of those, the server imports the installed ones and placecheck's own, never the user's code
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        assert not worker._installed("mypkg.models")
    finally:
        sys.path.remove(str(tmp_path))
    assert worker._installed("placecheck.model.zoo")
    pytest.importorskip("torchvision")
    assert worker._installed("torchvision.models")


def test_bad_isolation_and_progress_are_one_line(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[[models]]\ntarget = "{MODELS}:Healthy"\n')
    for flag, value, choices in [("--isolation", "thread", "fork, spawn"),
                                 ("--progress", "fancy", "auto, bar, lines, off")]:
        proc = subprocess.run([sys.executable, "-m", "placecheck", "audit", "--config", str(config), flag,
                               value], capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 2
        assert unwrapped(proc.stderr) == f"placecheck: error: {flag} {value!r}: use one of {choices}\n"
    config.write_text(f'isolation = "thread"\n[[models]]\ntarget = "{MODELS}:Healthy"\n')
    proc = subprocess.run([sys.executable, "-m", "placecheck", "audit", "--config", str(config)],
                          capture_output=True, text=True, cwd=REPO)
    said = unwrapped(proc.stderr)
    assert proc.returncode == 2 and said.count("\n") == 1
    assert said.startswith("placecheck: error: ")
    assert 'c.toml:1: isolation: expected one of "fork", "spawn"' in said


# ---- progress ----------------------------------------------------------------------------------


def _canned(model: ModelConfig, timeout: float, workdir: str | None) -> runner.ModelOutcome:
    code = "PC901" if model.target == "b:B" else "PC101"
    finding = Finding(code=code, kind="k", severity=Severity.ERROR, where="w", message="m", hint="h",
                      details=(("reason", "crash"),) if code == "PC901" else ())
    return runner.ModelOutcome(model, Report.build(model.target, "cuda:0", "fake", [finding]))


_THREE = RunConfig(path="x", models=(ModelConfig(target="a:A"), ModelConfig(target="b:B"),
                                     ModelConfig(target="c:C")))


def test_progress_lines_for_ci_logs(capsys: pytest.CaptureFixture[str]) -> None:
    runner.run_models(_THREE, jobs=1, progress="lines", audit_one=_canned)
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout carries the report formats only
    lines = unwrapped(captured.err).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("placecheck: [1/3] a:A: 1 problem in ")
    assert lines[1].startswith("placecheck: [2/3] b:B: PC901 crash in ")
    assert lines[2].startswith("placecheck: [3/3] c:C: 1 problem in ") and "0 running, 1 failed" in lines[2]


def test_the_progress_line_counts_as_the_report_does(capsys: pytest.CaptureFixture[str]) -> None:
    def strays(model: ModelConfig, timeout: float, workdir: str | None) -> runner.ModelOutcome:
        findings = [Finding(code="PC101", kind="stray-tensor", severity=Severity.ERROR,
                            where=f"blocks.{i}.mask", module=f"blocks.{i}", message="m", hint="h")
                    for i in range(3)]
        return runner.ModelOutcome(model, Report.build(model.target, "cuda:0", "fake", findings))

    outcomes = runner.run_models(RunConfig(path="x", models=(ModelConfig(target="a:A"),)), jobs=1,
                                 progress="lines", audit_one=strays)
    line = capsys.readouterr().err.splitlines()[0]
    assert line.startswith("placecheck: [1/1] a:A: 1 problem (3 instances) in "), line
    assert outcomes[0].report.grouped().summary_line().startswith("1 problem (3 instances) in 3 modules")


def test_ctrl_c_keeps_the_outcomes_of_the_models_that_finished() -> None:
    def audit_one(model: ModelConfig, timeout: float, workdir: str | None) -> runner.ModelOutcome:
        return _interrupt_main() if model.target == "b:B" else _canned(model, timeout, workdir)

    import signal

    # Python's own Ctrl-C handler, whatever an earlier test in this worker left installed (Lightning sets
    # SIGINT to SIG_IGN in its interrupt handling and in fabric's distributed teardown: the signal was lost)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(runner.PartialRun) as info:
            runner.run_models(_THREE, jobs=1, progress="off", audit_one=audit_one)
    finally:
        signal.signal(signal.SIGINT, before)
    assert [o.model.target for o in info.value.finished] == ["a:A"] and info.value.total == 3


def _interrupt_main() -> runner.ModelOutcome:
    import signal

    # Ctrl-C delivered to this worker thread, the case CI once hit: Python's handler only sets a flag that
    # the main thread, which waits on the models, must still see before the next model starts
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
    time.sleep(5)
    raise AssertionError("the interrupt did not arrive")


def test_progress_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    screen = io.StringIO()
    monkeypatch.setattr(runner, "_console", lambda: Console(file=screen, force_terminal=True, width=160))
    runner.run_models(_THREE, jobs=1, progress="bar", audit_one=_canned)
    drawn = screen.getvalue()
    assert "auditing" in drawn and "3/3" in drawn and "1 failed" in drawn and "running" in drawn
    assert "0:00:0" in drawn  # the elapsed time
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("tty, ci, mode", [(True, None, "bar"), (False, None, "lines"),
                                           (True, "true", "lines")])
def test_auto_progress_is_the_bar_at_a_terminal_and_lines_elsewhere(
        monkeypatch: pytest.MonkeyPatch, tty: bool, ci: str | None, mode: str) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    assert runner.progress_mode(None) == runner.progress_mode("auto") == mode
    assert runner.progress_mode("off") == "off" and runner.progress_mode(False) == "off"


def test_progress_off_prints_nothing(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[[models]]\ntarget = "{MODELS}:Healthy"\n')
    proc = subprocess.run([sys.executable, "-m", "placecheck", "audit", "--config", str(config),
                           "--progress", "off", "--format", "json"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert json.loads(proc.stdout)["models"][0]["findings"] == []


def test_child_threads_share_the_cores_out_among_the_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert runner.child_threads(1) == 0  # one job: torch's default, every core
    assert [runner.child_threads(jobs) for jobs in (2, 3, 4, 8, 16)] == [4, 2, 2, 1, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own choice, which every child inherits
    assert runner.child_threads(2) == 0


@pytest.mark.parametrize("isolation", ["fork", "spawn"])
def test_parallel_models_each_get_their_share_of_the_cores(
        isolation: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two jobs: each model's process runs torch with its share of the threads, not one per core each
    (both jobs spinning a thread per core on the same cores made some audits ten times slower)."""
    if isolation == "fork" and not runner.fork_available():
        pytest.skip("os.fork is not available here")
    log = tmp_path / "threads.txt"
    monkeypatch.setenv("PLACECHECK_TEST_PIDS", str(log))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # tests/conftest.py sets it under xdist
    outcomes = _run(f"""
        jobs = 2
        [[models]]
        name = "first"
        target = "{MODELS}:CountsThreads"
        inputs = ["float32[2,4]"]
        [[models]]
        name = "second"
        target = "{MODELS}:CountsThreads"
        inputs = ["float32[2,4]"]
        """, isolation=isolation)
    assert not any(o.failed for o in outcomes), [o.report.findings for o in outcomes]
    # each model is built twice (--init auto measures it on the meta device first), in its process
    records = [line.split() for line in log.read_text().splitlines()]
    assert len({pid for _, pid, _ in records}) == 2  # two processes...
    share = runner.child_threads(2)
    assert share >= 1 and {count for count, _, _ in records} == {f"threads={share}"}  # ...their share


@pytest.mark.parametrize(("models", "jobs"), [(1, 2), (2, 2), (3, 2), (2, 1)])
def test_the_share_counts_the_models_that_really_run_at_once(
        models: int, jobs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--jobs 2`` with one model leaves that model every core."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    given: list[int] = []

    def spawn(model: ModelConfig, timeout: float, workdir: str | None = None,
              threads: int = 0) -> runner.ModelOutcome:
        given.append(threads)
        return runner.ModelOutcome(model, Report.build(model.label, "cuda:0", "fake", []))

    monkeypatch.setattr(runner, "audit_in_subprocess", spawn)
    cfg = RunConfig(path="x", models=tuple(ModelConfig(target=f"m{i}:M") for i in range(models)))
    runner.run_models(cfg, jobs=jobs, progress="off", isolation="spawn")
    assert given == [runner.child_threads(min(models, jobs))] * models
    assert given[0] == {1: 0, 2: 2}[min(models, jobs)]
