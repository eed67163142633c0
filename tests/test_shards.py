"""``--shard K/N`` and ``placecheck merge``: stable shards, and shards merged into one run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import unwrapped
from report_schema import validate_json, validate_report

from placecheck import __version__
from placecheck.basics.config import parse
from placecheck.findings import shards
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.formats.json import run_to_dict
from placecheck.findings.report import Report

REPO = Path(__file__).resolve().parents[1]
MODELS = "tests/fixtures/ci/models.py"


def _placecheck(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "placecheck", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "CI": "true"})


def _config_text(labels: list[str]) -> str:
    return "".join(f'[[models]]\ntarget = "m:{label}"\n' for label in labels)


# ---- which models a shard audits ----------------------------------------------------------------


def test_adding_a_model_moves_no_other() -> None:
    before = parse(_config_text([f"Model{i}" for i in range(40)]))
    after = parse(_config_text([f"Model{i}" for i in range(40)] + [f"New{i}" for i in range(25)]))

    def assignment(config: Any) -> dict[str, int]:
        placed: dict[str, int] = {}
        for k in range(1, 5):
            subset, positions = shards.select(config, shards.Shard(k, 4))
            assert [config.models[p] for p in positions] == list(subset.models)
            for model in subset.models:
                assert model.label not in placed  # every model in exactly one shard
                placed[model.label] = k
        assert len(placed) == len(config.models)
        return placed

    old, new = assignment(before), assignment(after)
    assert {label: new[label] for label in old} == old
    assert set(old.values()) == {1, 2, 3, 4}  # 40 models fill every shard


@pytest.mark.parametrize("spec", ["0/2", "3/2", "a/b", "2", "1/0", "-1/2", ""])
def test_a_bad_shard_is_one_line(tmp_path: Path, spec: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(_config_text(["A"]))
    proc = _placecheck("audit", "--config", str(config), "--shard", spec)
    assert proc.returncode == 2
    said = unwrapped(proc.stderr)
    assert said.startswith(f"placecheck: error: --shard {spec!r}: ") and said.count("\n") == 1
    assert proc.stdout == ""


def test_write_baseline_is_refused_with_a_shard(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(_config_text(["A"]))
    proc = _placecheck("audit", "--config", str(config), "--shard", "1/2", "--write-baseline",
                       str(tmp_path / "b.json"))
    assert proc.returncode == 2 and unwrapped(proc.stderr).count("\n") == 1
    assert "placecheck merge" in unwrapped(proc.stderr)


# ---- merge, with shard reports made in-process --------------------------------------------------


def _finding(code: str, where: str, reason: str = "") -> Finding:
    return Finding(code=code, kind="k", severity=Severity.ERROR, where=where, message=f"{code} at {where}",
                   hint="h", details=(("reason", reason),) if reason else ())


def _shards(tmp_path: Path, labels: list[str], count: int, findings: dict[str, list[Finding]],
            options: dict[str, Any] | None = None, baseline: str | None = None) -> list[Path]:
    config = parse(_config_text(labels), "c.toml")
    paths = []
    for k in range(1, count + 1):
        subset, positions = shards.select(config, shards.Shard(k, count))
        reports = [Report.build(m.label, "cuda:0", "simulated cuda", findings.get(m.label, []))
                   for m in subset.models]
        run = shards.run_info(config, shards.Shard(k, count), positions,
                              options or {"fail_on": "warning", "group": True, "hints": False}, baseline)
        path = tmp_path / f"shard-{k}.json"
        path.write_text(json.dumps(validate_report(run_to_dict(reports, run))))
        paths.append(path)
    return paths


LABELS = [f"m:Model{i}" for i in range(12)]


def test_merge_gives_the_run_in_config_order_with_one_exit_code(tmp_path: Path) -> None:
    paths = _shards(tmp_path, [label.removeprefix("m:") for label in LABELS], 3,
                    {"m:Model5": [_finding("PC101", "mask")]})
    proc = _placecheck("merge", *map(str, reversed(paths)), "--format", "json")
    assert proc.returncode == 1, proc.stderr
    merged = validate_json(proc.stdout)
    assert [m["target"] for m in merged["models"]] == LABELS
    assert "run" not in merged  # one run, no longer a shard
    assert [(f["target"], f["code"]) for f in merged["findings"]] == [("m:Model5", "PC101")]
    for fmt in ("sarif", "junit", "markdown", "table"):
        out = _placecheck("merge", *map(str, paths), "--format", fmt)
        assert out.returncode == 1 and "PC101" in out.stdout, (fmt, out.stderr)
    assert _placecheck("merge", *map(str, paths), "--fail-on", "never").returncode == 0


def test_merge_applies_the_baseline_once(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"placecheck_baseline": 2, "entries": [
        {"model": "m:Model5", "code": "PC101", "where": "mask", "file": "", "count": 1},
        {"model": "m:Gone", "code": "PC102", "where": "heads", "file": "", "count": 1}]}))
    paths = _shards(tmp_path, [label.removeprefix("m:") for label in LABELS], 3,
                    {"m:Model5": [_finding("PC101", "mask")]}, baseline=str(baseline))
    proc = _placecheck("merge", *map(str, paths), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["findings"] == []
    # the entry of a model no shard audited is stale once, as in one --config run
    said = unwrapped(proc.stderr)
    assert said.count("1 stale entry") == 1 and "m:Gone: PC102 at heads" in said


def test_a_model_that_did_not_load_makes_the_merge_exit_2(tmp_path: Path) -> None:
    paths = _shards(tmp_path, ["A", "B", "C"], 2,
                    {"m:B": [_finding("PC901", "", "load-error")]})
    proc = _placecheck("merge", *map(str, paths), "--format", "json")
    assert proc.returncode == 2
    assert unwrapped(proc.stderr) == "placecheck: error: m:B: PC901 at\n"  # fitted: no trailing space
    assert len(json.loads(proc.stdout)["models"]) == 3


def _rewrite(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data["run"])
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("case, expected", [
    ("version", "are shards of different runs (placecheck 0.0.1 vs placecheck " + __version__),
    ("options", "are shards of different runs (options"),
    ("config", "are shards of different runs (config digest"),
    ("twice", "is given twice"),
    ("missing", "shard 2 of 3 missing"),
    ("split", "merge the shards of one split"),
    ("not a shard", "is not a shard report"),
    ("not json", "is not JSON"),
])
def test_merge_refuses_reports_of_different_runs(tmp_path: Path, case: str, expected: str) -> None:
    paths = _shards(tmp_path, [label.removeprefix("m:") for label in LABELS], 3, {})
    args = [str(p) for p in paths]
    if case == "version":
        _rewrite(paths[1], lambda run: run.update(placecheck_version="0.0.1"))
    elif case == "options":
        _rewrite(paths[2], lambda run: run["options"].update(select=["PC1"]))
    elif case == "config":
        _rewrite(paths[2], lambda run: run.update(config_sha256="0" * 64))
    elif case == "twice":
        args = [args[0], args[0], args[1], args[2]]
    elif case == "missing":
        args = [args[0], args[2]]
    elif case == "split":
        _rewrite(paths[1], lambda run: run["shard"].update(count=4))
    elif case == "not a shard":
        data = json.loads(paths[0].read_text())
        del data["run"]
        paths[0].write_text(json.dumps(data))
    elif case == "not json":
        paths[0].write_text("<testsuites/>")
    proc = _placecheck("merge", *args)
    assert proc.returncode == 2
    said = unwrapped(proc.stderr)
    assert said.startswith("placecheck: error: ") and said.count("\n") == 1
    assert expected in unwrapped(proc.stderr), proc.stderr
    assert proc.stdout == ""


# ---- end to end: real shards of a real config ---------------------------------------------------


def test_shards_merged_equal_one_run(tmp_path: Path) -> None:
    config = tmp_path / "placecheck.toml"
    config.write_text(textwrap.dedent(f"""
        jobs = 2
        [[models]]
        target = "{REPO / MODELS}:Healthy"
        name = "healthy"
        [[models]]
        target = "{REPO / MODELS}:Buggy"
        name = "buggy-6"
        kwargs = {{ width = 6 }}
        inputs = ["float32[3,6]"]
        allow = [{{ code = "PC102", where = "heads[0]", reason = "kept in a list on purpose" }}]
        [[models]]
        target = "{REPO / MODELS}:Buggy"
        name = "buggy-4"
        inputs = ["float32[3,4]"]
        """))
    baseline = tmp_path / "baseline.json"
    written = _placecheck("audit", "--config", str(config), "--select", "PC101", "--write-baseline",
                          str(baseline), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    data = json.loads(baseline.read_text())
    data["entries"] = [e for e in data["entries"] if e["model"] == "buggy-4"]  # buggy-6's stray is new
    baseline.write_text(json.dumps(data))
    whole = _placecheck("audit", "--config", str(config), "--select", "PC1", "--baseline", str(baseline),
                        "--format", "json", cwd=tmp_path)
    assert whole.returncode == 1, whole.stderr
    outputs = []
    for k in (1, 2):
        out = tmp_path / f"shard-{k}.json"
        shard = _placecheck("audit", "--config", str(config), "--select", "PC1", "--baseline", str(baseline),
                            "--shard", f"{k}/2", "--format", "json", "--output", str(out), "--exit-zero",
                            cwd=tmp_path)
        assert shard.returncode == 0, shard.stderr
        outputs.append(str(out))
    # the names split the models 2 + 1 (a test of the split itself: tests above)
    assert [len(validate_json(Path(o).read_text())["models"]) for o in outputs] == [1, 2]  # with their run
    merged = _placecheck("merge", *outputs, "--format", "json", cwd=tmp_path)
    assert merged.returncode == whole.returncode, merged.stderr
    # the same run, but for the memory each process found free (an init note)
    free = re.compile(r"[\d.]+ GiB of memory available")
    assert free.sub("", merged.stdout) == free.sub("", whole.stdout)
    validate_json(whole.stdout)
    findings = {(f["target"], f["code"], f["where"]) for f in validate_json(merged.stdout)["findings"]}
    # buggy-6's PC102 allowed, buggy-4's PC101 baselined (written with --select PC101): gone
    assert findings == {("buggy-6", "PC101", "mask"), ("buggy-4", "PC102", "heads[0]")}
