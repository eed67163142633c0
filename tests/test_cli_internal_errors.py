"""A crash is not a finding: an unexpected error in any command is one line and exit 3.

Exit 1 means "placement problems found" to a CI step, and 2 "your input is wrong"; a bug in
placecheck (or something it did not foresee) is neither (``EXIT_INTERNAL``, docs/contract.md).
Each test breaks one internal function with monkeypatch and runs the command through the
console script's entry point, in-process; one runs a real process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, unwrapped

from placecheck import __version__
from placecheck.findings.report import EXIT_INTERNAL

pytestmark = pytest.mark.cli


def _boom(*args: object, **kwargs: object) -> object:
    raise RuntimeError("boom in placecheck")


def _break(monkeypatch: pytest.MonkeyPatch, dotted: str) -> None:
    """Replace the function ``module.name`` with :func:`_boom` (the module looked up in
    sys.modules: ``placecheck.run`` as an attribute is the function, not the package)."""
    import importlib

    module, name = dotted.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), name, _boom)


def _entrypoint(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                *argv: str) -> tuple[int, str, str]:
    from placecheck.cli import entrypoint

    monkeypatch.setattr(sys, "argv", ["placecheck", *argv])
    with pytest.raises(SystemExit) as info:
        entrypoint()
    captured = capsys.readouterr()
    code = info.value.code
    return code if isinstance(code, int) else 1, captured.out, captured.err


def _torch_version() -> str:
    from importlib import metadata

    return metadata.version("torch")


def assert_internal_error(code: int, out: str, err: str) -> None:
    """Exit 3, nothing on stdout, one line naming the error, placecheck's and torch's versions and
    --debug; no traceback."""
    assert code == EXIT_INTERNAL == 3, err
    assert out == ""
    lines = unwrapped(err).strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("placecheck: internal error: unexpected RuntimeError: boom in placecheck"), line
    assert f"placecheck {__version__}" in line and f"torch {_torch_version()}" in line, line
    assert "--debug" in line and "Traceback" not in err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Real inputs for every command, so that only the broken function can fail."""
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    model = tmp_path / "net.py"
    model.write_text("import torch.nn as nn\nNet = nn.Linear\n")
    shard = tmp_path / "shard.json"
    shard.write_text(json.dumps({"schema_version": 1}))
    config = tmp_path / "c.toml"
    config.write_text(f'[[models]]\ntarget = "{model}:Net"\nkwargs = {{in_features = 2, out_features = 2}}\n')
    return {"script": str(script), "model": f"{model}:Net", "shard": str(shard), "config": str(config),
            "checkpoint": str(tmp_path / "w.pt")}


# command line -> the internal function broken for it
CASES = {
    "audit": (["audit", "{model}", "--arg", "in_features=2", "--arg", "out_features=2"],
              "placecheck.cli.audit.run_audit"),
    "audit --config": (["audit", "--config", "{config}"], "placecheck.cli.ci.run_config_audit"),
    "run": (["run", "{script}"], "placecheck.run.run"),
    "fix": (["fix", "{model}"], "placecheck.fix.fix"),
    "fix --run": (["fix", "--run", "{script}"], "placecheck.fix.fix_run"),
    "checkpoint": (["checkpoint", "{checkpoint}"], "placecheck.cli.checkpoint.run_checkpoint"),
    "merge": (["merge", "{shard}"], "placecheck.cli.ci.merge_reports"),
    "rules": (["rules"], "placecheck.cli.rules.rules_text"),
    "explain": (["explain", "PC101"], "placecheck.cli.rules.explain_text"),
    "example-config": (["example-config"], "placecheck.cli.example_config.example_config_text"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unexpected_error_is_one_line_and_exit_3(case: str, files: dict[str, str],
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    argv, broken = CASES[case]
    if broken.startswith("placecheck.fix."):
        pytest.importorskip("libcst")
    _break(monkeypatch, broken)
    assert_internal_error(*_entrypoint(monkeypatch, capsys, *(a.format(**files) for a in argv)))


@pytest.mark.parametrize("case", ["audit", "run", "merge", "rules"])
def test_debug_shows_the_traceback_and_keeps_exit_3(case: str, files: dict[str, str],
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    argv, broken = CASES[case]
    _break(monkeypatch, broken)
    line = [a.format(**files) for a in argv]
    # --debug before the positional arguments: after run's SCRIPT it would be the script's
    code, out, err = _entrypoint(monkeypatch, capsys, line[0], "--debug", *line[1:])
    assert (code, out) == (EXIT_INTERNAL, ""), err
    assert "Traceback (most recent call last)" in err and "in _boom" in err
    last = unwrapped(err).strip().splitlines()[-1]
    assert last.startswith("placecheck: internal error: unexpected RuntimeError"), last
    assert "traceback above" in last


def test_placecheck_errors_stay_exit_2_inside_the_guard(files: dict[str, str],
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # the guard turns only unexpected errors into exit 3: bad input is still the user's, exit 2
    import importlib

    from placecheck.basics.errors import LoadError

    def not_loadable(*args: object, **kwargs: object) -> object:
        raise LoadError("cannot load shard.json: not a shard report")

    monkeypatch.setattr(importlib.import_module("placecheck.cli.ci"), "merge_reports", not_loadable)
    code, out, err = _entrypoint(monkeypatch, capsys, "merge", files["shard"])
    assert (code, out) == (2, "")
    assert err.strip() == "placecheck: error: cannot load shard.json: not a shard report"


def test_an_error_escaping_every_command_is_still_exit_3(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # the entry point's last guard: an error raised outside any command (typer, a callback)
    import importlib

    monkeypatch.setattr(importlib.import_module("placecheck.cli.app"), "app", _boom)
    assert_internal_error(*_entrypoint(monkeypatch, capsys, "rules"))


def test_in_a_real_process(tmp_path: Path) -> None:
    code = ("import importlib, sys\n"
            "def boom(*a, **k): raise RuntimeError('boom in placecheck')\n"
            "importlib.import_module('placecheck.run').run = boom\n"
            "from placecheck.cli import entrypoint\n"
            f"sys.argv = ['placecheck', 'run', {str(tmp_path / 'train.py')!r}]\n"
            "entrypoint()\n")
    (tmp_path / "train.py").write_text("print('never runs')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                          check=False)
    assert_internal_error(proc.returncode, proc.stdout, proc.stderr)


def test_the_contract_documents_exit_3() -> None:
    contract = (REPO / "docs" / "contract.md").read_text(encoding="utf-8")
    section = contract.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert "`3`" in section and "--debug" in section
