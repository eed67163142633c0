"""``placecheck.commands.runner`` and ``audit --config``: one process per model, crashes and hangs reported.

The end-to-end test runs real child processes (each imports torch), so it is
one run over every failure mode at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import unwrapped

from placecheck.basics.config import Allow, ModelConfig, RunConfig, parse
from placecheck.basics.options import AuditOptions
from placecheck.commands import runner
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.report import Report

REPO = Path(__file__).resolve().parents[1]
MODELS = "tests/fixtures/ci/models.py"


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "placecheck.toml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def _placecheck(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "placecheck", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "CI": "true"})


def test_crashing_hanging_and_oom_models_do_not_lose_the_healthy_ones(tmp_path: Path) -> None:
    config = _config(tmp_path, f"""
        jobs = 3
        timeout = 300
        [[models]]
        target = "{MODELS}:Healthy"
        [[models]]
        target = "{MODELS}:Segfault"
        [[models]]
        target = "{MODELS}:Hang"
        # its own limit (the run's is 300 s): kept short, the suite waits it out
        timeout = 4
        [[models]]
        target = "{MODELS}:Buggy"
        kwargs = {{ width = 6 }}
        inputs = ["float32[3,6]"]
        [[models]]
        target = "{MODELS}:OutOfMemory"
        [[models]]
        target = "{MODELS}:KilledByKernel"
        """)
    proc = _placecheck("audit", "--config", str(config), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    by_model = {m["target"].rpartition(":")[2]: m for m in data["models"]}
    assert list(by_model) == ["Healthy", "Segfault", "Hang", "Buggy", "OutOfMemory", "KilledByKernel"]
    assert by_model["Healthy"]["findings"] == []
    assert by_model["Healthy"]["engine"] == "simulated cuda"
    buggy = {(f["code"], f["where"]) for f in by_model["Buggy"]["findings"]}
    assert {("PC101", "mask"), ("PC102", "heads[0]")} <= buggy
    # the forward pass ran with the config's inputs and the constructor's kwargs: its mismatch is
    # evidence of the stray that caused it (one problem per root cause)
    evidence = {e["code"] for f in by_model["Buggy"]["findings"] for e in f["evidence"]}
    assert "PC201" in {code for code, _ in buggy} | evidence
    assert any("float32[3,6]" in note for note in by_model["Buggy"]["notes"]), by_model["Buggy"]["notes"]

    def incomplete(name: str) -> dict[str, str]:
        [finding] = by_model[name]["findings"]
        assert finding["code"] == "PC901" and finding["kind"] == "audit-incomplete"
        return {"message": finding["message"], **finding["details"]}

    segfault = incomplete("Segfault")
    assert segfault["reason"] == "crash" and "SIGSEGV" in segfault["message"]
    assert "models.py" in segfault["stderr"]  # faulthandler's stack names the line that crashed
    hang = incomplete("Hang")
    assert hang["reason"] == "timeout" and "within 4 s and was stopped" in hang["message"]
    assert incomplete("OutOfMemory")["reason"] == "out-of-memory"
    killed = incomplete("KilledByKernel")
    assert killed["reason"] == "out-of-memory" and "SIGKILL" in killed["message"]
    assert "auditing" not in unwrapped(proc.stderr)  # no progress bar when not a terminal / under CI...
    progress = [line for line in unwrapped(proc.stderr).splitlines() if line.startswith("placecheck: [")]
    assert len(progress) == 6 and progress[-1].startswith("placecheck: [6/6] ")  # ...a line per model
    assert "0 running, 4 failed" in progress[-1]  # Segfault, Hang, OutOfMemory, KilledByKernel


def test_a_model_that_does_not_load_exits_2_and_keeps_the_others(tmp_path: Path) -> None:
    config = _config(tmp_path, f"""
        [[models]]
        target = "{MODELS}:Healthy"
        [[models]]
        target = "{MODELS}:Missing"
        """)
    proc = _placecheck("audit", "--config", str(config), "--format", "json")
    assert proc.returncode == 2
    errors = [line for line in unwrapped(proc.stderr).splitlines() if not line.startswith("placecheck: [")]
    assert len(errors) == 1 and errors[0].startswith(f"placecheck: error: {MODELS}:Missing (config line 4): ")
    models = json.loads(proc.stdout)["models"]
    assert models[0]["findings"] == []
    assert models[1]["findings"][0]["details"]["reason"] == "load-error"


# ---- the parent's logic, with the child replaced ---------------------------------------------------


def _finding(code: str, where: str = "") -> Finding:
    return Finding(code=code, kind="k", severity=Severity.ERROR, where=where, message="m", hint="h")


def _fake(findings: dict[str, list[Finding]], calls: list[tuple[str, float]]) -> Any:
    """An ``audit_one`` that records its calls and returns canned findings (no child process)."""

    def audit_one(model: ModelConfig, timeout: float, workdir: str | None) -> runner.ModelOutcome:
        calls.append((model.label, timeout))
        report = Report.build(model.target, "cuda:0", "fake", findings[model.target])
        return runner.ModelOutcome(model, report)

    return audit_one


def test_outcomes_in_config_order_with_timeouts_and_allows() -> None:
    cfg = parse(textwrap.dedent("""
        timeout = 50
        [[models]]
        target = "a:A"
        timeout = 7
        allow = [{ code = "PC101", where = "cache.*", reason = "rebuilt each call" }]
        [[models]]
        target = "b:B"
        name = "bee"
        ignore = ["PC901"]
        """))
    calls: list[tuple[str, float]] = []
    findings = {"a:A": [_finding("PC101", "cache.k"), _finding("PC102", "heads")],
                "b:B": [_finding("PC901")]}
    outcomes = runner.run_models(cfg, jobs=2, progress=False, audit_one=_fake(findings, calls))
    assert sorted(calls) == [("a:A", 7.0), ("bee", 50.0)]
    a, b = (o.report for o in outcomes)
    assert [f.code for f in a.findings] == ["PC102"]
    assert "allowed by config line 6: PC101 at cache.k (rebuilt each call)" in a.notes
    assert b.target == "bee" and b.findings == ()  # PC901 explicitly ignored


def test_pc901_survives_select() -> None:
    model = ModelConfig(target="a:A", options=AuditOptions(select=("PC1",)))
    outcome = runner.ModelOutcome(model, Report.build("a:A", "cuda:0", "not run", [_finding("PC901")]))
    assert [f.code for f in runner.finish(outcome).report.findings] == ["PC901"]


def test_unused_allow_is_noted() -> None:
    model = ModelConfig(target="a:A", allow=(Allow("PC204", "*", "why", 9),))
    outcome = runner.finish(runner.ModelOutcome(model, Report.build("a:A", "cuda:0", "x", [])))
    assert outcome.report.notes == ("config line 9: allow PC204 where '*' matched no finding",)


def test_the_command_line_overrides_the_config_timeout() -> None:
    cfg = RunConfig(path="x", models=(ModelConfig(target="a:A"),), timeout=50)
    calls: list[tuple[str, float]] = []
    runner.run_models(cfg, timeout=3, progress=False, audit_one=_fake({"a:A": []}, calls))
    assert calls == [("a:A", 3)]


def test_report_json_round_trip() -> None:
    from placecheck.findings.formats.json import report_to_dict

    finding = Finding(code="PC101", kind="stray-tensor", severity=Severity.ERROR, where="m", message="x",
                      hint="y", shape=(2, 3), details=(("op", "add"),), nbytes=24, count=1)
    report = Report.build("t", "cuda:0", "fake", [finding], ["n"], {"modules": 3})
    assert runner.report_from_dict(json.loads(json.dumps(report_to_dict(report)))) == report
    stopped = Report.build("t", "cuda:0", "fake", [], incomplete="fake tensors stopped (.item())")
    assert runner.report_from_dict(json.loads(json.dumps(report_to_dict(stopped)))) == stopped


@pytest.mark.parametrize("tty, ci, shown", [(True, None, True), (True, "true", False), (False, None, False),
                                             (True, "1", False), (True, "false", True), (True, "0", True),
                                             (True, "", True)])
def test_progress_bar_only_on_a_terminal_outside_ci(monkeypatch: pytest.MonkeyPatch, tty: bool,
                                                    ci: str | None, shown: bool) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    assert runner.show_progress() is shown


def test_the_progress_bar_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = RunConfig(path="x", models=(ModelConfig(target="a:A"), ModelConfig(target="b:B")))
    calls: list[tuple[str, float]] = []
    outcomes = runner.run_models(cfg, progress=True, audit_one=_fake({"a:A": [], "b:B": []}, calls))
    assert len(outcomes) == 2


def test_timeout_and_jobs_need_a_config() -> None:
    proc = _placecheck("audit", "placecheck/examples/clean.py:CleanNet", "--jobs", "2")
    assert proc.returncode == 2
    assert unwrapped(proc.stderr) == (
        "placecheck: error: --jobs apply to --config runs (many models); for one TARGET drop them\n")
    proc = _placecheck("audit", "placecheck/examples/clean.py:CleanNet", "--shard", "1/2", "--isolation",
                       "spawn")
    assert proc.returncode == 2
    assert unwrapped(proc.stderr) == (
        "placecheck: error: --shard and --isolation apply to --config runs (many models); for one TARGET "
        "drop them\n")


def test_per_model_options_are_refused_with_a_config(tmp_path: Path) -> None:
    config = _config(tmp_path, '[[models]]\ntarget = "a:b"\n')
    proc = _placecheck("audit", "--config", str(config), "--kwargs", "{}")
    assert proc.returncode == 2
    assert unwrapped(proc.stderr).startswith(
        "placecheck: error: --kwargs describe one model: put them in the model's")
    proc = _placecheck("audit", "x:y", "--config", str(config))
    assert unwrapped(proc.stderr) == "placecheck: error: give a TARGET or --config FILE, not both\n"


def test_no_target_and_no_config(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "placecheck", "audit"], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 2
    assert "pass --config FILE, or add [tool.placecheck] to ./pyproject.toml" in unwrapped(proc.stderr)


def test_pyproject_is_used_when_no_target_is_given(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(f"""
        [tool.placecheck]
        [[tool.placecheck.models]]
        target = "{REPO / MODELS}:Buggy"
        select = ["PC101"]
        """))
    proc = subprocess.run([sys.executable, "-m", "placecheck", "audit", "--format", "github"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("::error ") and "PC101" in proc.stdout and "PC102" not in proc.stdout


# ---- one model's failure never loses the others ---------------------------------------------------


def test_an_exception_for_one_model_becomes_its_pc901() -> None:
    cfg = RunConfig(path="x", models=(ModelConfig(target="a:A"), ModelConfig(target="b:B")))
    healthy = _fake({"a:A": [_finding("PC101", "mask")]}, [])

    def audit_one(model: ModelConfig, timeout: float, workdir: str | None) -> runner.ModelOutcome:
        if model.target == "b:B":
            raise RuntimeError("boom")
        return healthy(model, timeout, workdir)  # type: ignore[no-any-return]

    a, b = (o.report for o in runner.run_models(cfg, progress=False, audit_one=audit_one))
    assert [f.code for f in a.findings] == ["PC101"]
    assert [(f.code, f.message) for f in b.findings] == [
        ("PC901", "placecheck failed on this model: RuntimeError: boom")]


def test_a_spec_json_cannot_encode_is_that_models_pc901() -> None:
    # a date kwarg (config validation refuses it; the API can still pass one): json.dumps raises in
    # the parent before any child starts
    import datetime

    dated = ModelConfig(target="d:D", kwargs={"width": datetime.date(1979, 5, 27)})
    cfg = RunConfig(path="x", models=(ModelConfig(target="a:A"), dated))
    healthy = _fake({"a:A": []}, [])

    def audit_one(model: ModelConfig, timeout: float, workdir: str | None) -> runner.ModelOutcome:
        if model.target == "d:D":
            return runner.audit_in_subprocess(model, timeout, workdir)
        return healthy(model, timeout, workdir)  # type: ignore[no-any-return]

    a, d = (o.report for o in runner.run_models(cfg, progress=False, audit_one=audit_one))
    assert a.target == "a:A" and a.findings == ()
    [finding] = d.findings
    assert finding.code == "PC901" and "TypeError" in finding.message


def test_a_corrupt_child_result_is_that_models_pc901(monkeypatch: pytest.MonkeyPatch) -> None:
    def writes_garbage(spec_path: Path, result_path: Path) -> list[str]:
        return [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('{not json')",
                str(result_path)]

    monkeypatch.setattr(runner, "_child_command", writes_garbage)
    outcome = runner.audit_in_subprocess(ModelConfig(target="a:A"), timeout=60)
    [finding] = outcome.report.findings
    assert finding.code == "PC901" and "unreadable result" in finding.message
    assert dict(finding.details)["reason"] == "error"


def test_bad_command_line_overrides_fail_once_before_any_model_runs(tmp_path: Path) -> None:
    config = _config(tmp_path, """
        [[models]]
        target = "tests/fixtures/ci/models.py:Healthy"
        [[models]]
        target = "tests/fixtures/ci/models.py:Buggy"
        """)
    proc = _placecheck("audit", "--config", str(config), "--device", "gpu")
    assert proc.returncode == 2
    assert unwrapped(proc.stderr) == (
        "placecheck: error: unknown device 'gpu': use cuda, cuda:N, cpu, mps, meta or keep\n")
    proc = _placecheck("audit", "--config", str(config), "--engine", "bogus")
    assert proc.returncode == 2
    # the message a single TARGET gets (the options module's), not the config's own wording
    assert unwrapped(proc.stderr) == (
        "placecheck: error: unknown engine 'bogus': use one of auto, real, fake, tagged\n")
    proc = _placecheck("audit", "--config", str(config), "--init", "disk")
    assert proc.returncode == 2
    assert unwrapped(proc.stderr) == "placecheck: error: unknown --init 'disk': use one of auto, cpu, meta\n"


# ---- one TARGET with --timeout --------------------------------------------------------------------


def test_one_target_that_hangs_is_stopped_by_timeout() -> None:
    proc = _placecheck("audit", f"{MODELS}:Hang", "--timeout", "2")
    assert proc.returncode == 2
    assert unwrapped(proc.stderr) == (
        f"placecheck: error: {MODELS}:Hang did not finish within 2 s (a forward that hangs? if it is only "
        "slow, raise --timeout)\n")
    assert proc.stdout == ""


def test_one_target_with_timeout_reports_as_in_process() -> None:
    proc = _placecheck("audit", f"{MODELS}:Buggy", "--kwargs", '{"width": 3}', "--timeout", "300",
                       "--select", "PC1", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["target"] == f"{MODELS}:Buggy"  # the single-report shape
    assert [(f["code"], f["where"], f["shape"]) for f in report["findings"]] == [
        ("PC101", "mask", [3]), ("PC102", "heads[0]", None)]


def test_one_target_with_timeout_that_does_not_load() -> None:
    proc = _placecheck("audit", f"{MODELS}:Missing", "--timeout", "300")
    assert proc.returncode == 2
    said = unwrapped(proc.stderr)
    assert said.startswith("placecheck: error: ") and said.count("\n") == 1
    assert "Missing" in unwrapped(proc.stderr)
