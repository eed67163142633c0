"""Docs that CI users copy: the workflows of the README and docs/ci.md, the pre-commit hook,
configs/example.toml."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path
from typing import Any

import typer
import yaml

from placecheck.basics import config
from placecheck.cli import app
from placecheck.findings import shards

REPO = Path(__file__).resolve().parents[1]


def _section(title: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _flags(command: str) -> set[str]:
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {opt for param in click_command.params for opt in param.opts}


def _check_command_line(line: str) -> None:
    words = shlex.split(line)
    assert words[0] == "placecheck", line
    command = words[1]
    known = _flags(command)
    used = {w.split("=", 1)[0] for w in words[2:] if w.startswith("-")}
    assert used <= known, f"unknown flags {used - known} in {line!r}"


def _ci_text() -> str:
    """What a CI user reads: the README's CI section, then docs/ci.md."""
    return _section("Use in CI") + (REPO / "docs" / "ci.md").read_text(encoding="utf-8")


def _workflows() -> list[dict[str, Any]]:
    """The GitHub Actions workflows of the README's CI section and docs/ci.md, parsed."""
    blocks = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", _ci_text(), re.S)]
    return [block for block in blocks if "jobs" in block]


def _workflow(job: str) -> dict[str, Any]:
    [workflow] = [w for w in _workflows() if job in w["jobs"]]
    return workflow


def test_readme_workflow_is_valid_yaml_naming_real_flags() -> None:
    assert len(_workflows()) == 2  # one job (the README's); a matrix of shards and their merge (docs/ci.md)
    readme_first = re.findall(r"```yaml\n(.*?)```", _section("Use in CI"), re.S)[0]
    assert "placecheck" in yaml.safe_load(readme_first)["jobs"]  # the one-job workflow is the README's
    workflow = _workflow("placecheck")
    steps = workflow["jobs"]["placecheck"]["steps"]
    runs = [step["run"] for step in steps if "run" in step and "placecheck audit" in step["run"]]
    assert len(runs) == 1
    _check_command_line(runs[0])
    # the default engine (auto) falls back to real values where fake tensors stop (.item()): no --engine
    assert "--engine" not in runs[0] and "--format sarif" in runs[0]
    assert workflow["jobs"]["placecheck"]["runs-on"].startswith("ubuntu")  # a CPU runner
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("github/codeql-action/upload-sarif"))
    out = shlex.split(runs[0])
    sarif = out[out.index("--output") + 1]
    assert upload["with"]["sarif_file"] == sarif
    # after findings (exit 1) too, but not after a config error, which writes no SARIF
    assert upload["if"] == f"always() && hashFiles('{sarif}') != ''"
    assert workflow["jobs"]["placecheck"]["permissions"]["security-events"] == "write"


def _pins() -> dict[str, str]:
    """The torch and torchvision builds placecheck is tested with (constraints.txt, the Makefile's pins)."""
    text = (REPO / "constraints.txt").read_text(encoding="utf-8")
    return dict(re.findall(r"^(torch|torchvision)==(\S+)$", text, re.M))


def test_readme_workflow_installs_matching_cpu_builds_first() -> None:
    # torch alone from the CPU index, then placecheck, pulled a PyPI torchvision built for another torch
    # ("operator torchvision::nms does not exist"), and an index torch newer than the pin was replaced
    # by a CUDA torch from PyPI
    jobs = [_workflow("placecheck")["jobs"]["placecheck"], *_workflow("merge")["jobs"].values()]
    pins = _pins()
    assert set(pins) == {"torch", "torchvision"}
    for job in jobs:
        installs = [shlex.split(s["run"]) for s in job["steps"]
                    if str(s.get("run", "")).startswith("pip install")]
        first, second = installs
        assert first == ["pip", "install", f"torch=={pins['torch']}", f"torchvision=={pins['torchvision']}",
                         "--index-url", "https://download.pytorch.org/whl/cpu"]
        assert second == ["pip", "install", "placecheck"]


def test_readme_shard_matrix_uses_real_flags_and_merges_every_shard() -> None:
    workflow = _workflow("merge")
    audit, merge = workflow["jobs"]["audit"], workflow["jobs"]["merge"]
    matrix = audit["strategy"]["matrix"]["shard"]
    assert matrix == [1, 2, 3, 4]
    [run] = [s["run"] for s in audit["steps"] if "placecheck audit" in str(s.get("run", ""))]
    [upload] = [s for s in audit["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    written = []
    for k in matrix:  # what each job of the matrix runs, with GitHub's expression filled in
        line = run.replace("${{ matrix.shard }}", str(k))
        _check_command_line(line)
        words = shlex.split(line)
        assert shards.parse_shard(words[words.index("--shard") + 1]) == shards.Shard(k, len(matrix))
        assert words[words.index("--format") + 1] == "json"  # what merge reads
        output = words[words.index("--output") + 1]
        assert upload["with"]["path"].replace("${{ matrix.shard }}", str(k)) == output
        written.append(output)
    assert merge["needs"] == "audit"
    [download] = [s for s in merge["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact")]
    artifact = upload["with"]["name"].replace("${{ matrix.shard }}", "1")
    assert fnmatch.fnmatch(artifact, download["with"]["pattern"])
    [merge_run] = [s["run"] for s in merge["steps"] if "placecheck merge" in str(s.get("run", ""))]
    _check_command_line(merge_run)
    words = shlex.split(merge_run)
    reports = [w for w in words[2:] if not w.startswith("-") and words[words.index(w) - 1] not in
               ("--format", "--output")]
    assert sorted(f for f in written if any(fnmatch.fnmatch(f, r) for r in reports)) == sorted(written)
    sarif = words[words.index("--output") + 1]
    [upload_sarif] = [s for s in merge["steps"]
                      if str(s.get("uses", "")).startswith("github/codeql-action/upload-sarif")]
    assert upload_sarif["with"]["sarif_file"] == sarif and words[words.index("--format") + 1] == "sarif"
    assert merge["permissions"]["security-events"] == "write"


def test_readme_console_examples_name_real_flags() -> None:
    console = re.findall(r"```console\n(.*?)```", _ci_text(), re.S)
    lines = [line.split("#")[0].strip() for block in console for line in block.splitlines()]
    commands = [line for line in lines if line.startswith("placecheck ")]
    assert len(commands) >= 4
    for line in commands:
        if line.split()[1] in ("audit", "checkpoint"):
            _check_command_line(line)


def test_pre_commit_hook() -> None:
    [hook] = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert hook["id"] == "placecheck" and hook["language"] == "python"
    assert hook["entry"] == "placecheck audit"  # no TARGET: audits [tool.placecheck]
    assert hook["pass_filenames"] is False
    # the README's snippet names that hook
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", _section("Use in CI"), re.S)]
    [config] = [b for b in blocks if "repos" in b]
    assert [h["id"] for h in config["repos"][0]["hooks"]] == [hook["id"]]


def test_example_config_documents_every_key() -> None:
    text = (REPO / "configs" / "example.toml").read_text(encoding="utf-8")
    written = set(re.findall(r"^#?\s*([a-z_]+)\s*=", text, re.M))
    tables = set(re.findall(r"^\[\[?(?:models\.)?([a-z_]+)\]?\]", text, re.M))
    for key in [*config.TOP_KEYS, *config.MODEL_KEYS, *config.ALLOW_KEYS]:
        assert key in written or key in tables, f"configs/example.toml does not document {key!r}"
    assert config.load(REPO / "configs" / "example.toml").models


def test_defaults_config_matches_the_code() -> None:
    cfg = config.load(REPO / "configs" / "defaults.toml")
    code_default = config.ModelConfig(target=cfg.models[0].target)
    assert (cfg.jobs, cfg.timeout, cfg.fail_on) == (config.DEFAULT_JOBS, config.DEFAULT_TIMEOUT, "warning")
    model, default = cfg.models[0].options, code_default.options
    assert (model.device, model.engine, model.init, model.trust, model.ignore) == (
        default.device, default.engine, default.init, default.trust, default.ignore)
    assert config.load(REPO / "configs" / "defaults.toml").models[0].options.select == ("ALL",)
    assert (cfg.group, cfg.hints) == (True, False)
