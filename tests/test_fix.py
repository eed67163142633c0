"""``placecheck fix``: fixture pairs patched byte for byte, proven, idempotent; write refusals; CLI.

Each ``tests/fixtures/fix/NAME.py`` defines ``Model`` with bugs placecheck fix
rewrites; ``NAME.fixed.py`` beside it is the file expected after ``fix`` and
``write``, byte for byte. Cases are collected automatically.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import CliRunner
from conftest import TESTS

pytest.importorskip("libcst")  # the fix extra; the CPU-build venv installs only the dev extra

from placecheck.basics.options import AuditOptions
from placecheck.cli import app
from placecheck.fix import FixRefused, fix, fix_run, write
from placecheck.fix.edits import NotFixable, Request, Rewrite, rewrite

pytestmark = pytest.mark.compat

FIXTURES = TESTS / "fixtures" / "fix"
CASES = [pytest.param(py, py.with_name(py.stem + ".fixed.py"), id=py.stem)
         for py in sorted(FIXTURES.glob("*.py")) if not py.name.endswith(".fixed.py")]


def _copy(source: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The fixture copied into ``folder`` (the working directory), as a TARGET."""
    shutil.copy(source, folder / source.name)
    monkeypatch.chdir(folder)
    return f"{source.name}:Model"


RUN_FIXTURES = FIXTURES / "run"
RUN_CASES = [pytest.param(py, py.with_name(py.stem + ".fixed.py"), id=py.stem)
             for py in sorted(RUN_FIXTURES.glob("*.py")) if not py.name.endswith(".fixed.py")]
"""Scripts for ``fix --run``: each gets a checkpoint saved on cuda:3 as argv[1] (the PC301 case reads it)."""


def test_fixture_directories_cover_every_rewritten_code() -> None:
    from placecheck.fix import AUTOFIX

    codes = {case.values[0].name[:5].upper() for case in [*CASES, *RUN_CASES]}
    assert codes == set(AUTOFIX)


@pytest.mark.parametrize("source, expected", CASES)
def test_fixture_patched_byte_for_byte_proven_and_idempotent(
        source: Path, expected: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert expected.is_file(), f"{source.name} has no {expected.name} beside it"
    target = _copy(source, tmp_path, monkeypatch)
    result = fix(target, AuditOptions())
    assert result.edits and not result.failed and not result.not_fixable
    assert (tmp_path / source.name).read_bytes() == source.read_bytes(), "fix wrote without write()"
    assert write(result) == [source.name]
    assert (tmp_path / source.name).read_bytes() == expected.read_bytes()
    assert result.remaining == [] and result.exit_code == 0
    again = fix(target, AuditOptions())
    assert again.edits == [] and not again.report.findings and again.exit_code == 0


@pytest.fixture
def cuda3_checkpoint(tmp_path: Path) -> str:
    import torch.nn as nn
    from checkpoint_writer import save_with_locations

    path = tmp_path / "checkpoints" / "saved_on_cuda3.pt"
    path.parent.mkdir()
    save_with_locations(dict(nn.Linear(8, 2).state_dict()), path, default="cuda:3")
    return str(path)


@pytest.mark.parametrize("source, expected", RUN_CASES)
def test_run_fixture_patched_byte_for_byte_proven_and_idempotent(
        source: Path, expected: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        cuda3_checkpoint: str) -> None:
    assert expected.is_file(), f"{source.name} has no {expected.name} beside it"
    shutil.copy(source, tmp_path / source.name)
    monkeypatch.chdir(tmp_path)
    result = fix_run(source.name, [cuda3_checkpoint])
    assert result.report.findings and result.edits and not result.failed and not result.not_fixable, \
        result.summary()
    assert (tmp_path / source.name).read_bytes() == source.read_bytes(), "fix wrote without write()"
    assert write(result) == [source.name]
    assert (tmp_path / source.name).read_bytes() == expected.read_bytes()
    assert result.remaining == [] and result.exit_code == 0
    again = fix_run(source.name, [cuda3_checkpoint])
    assert again.edits == [] and not again.report.findings and again.exit_code == 0


def test_cli_fix_run_writes_the_script_and_refuses_model_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cuda3_checkpoint: str) -> None:
    source = RUN_FIXTURES / "pc301_map_location.py"
    shutil.copy(source, tmp_path / source.name)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    shown = runner.invoke(app, ["fix", "--run", source.name, "--", cuda3_checkpoint])
    assert shown.exit_code == 0, shown.output
    assert '+    map_location="cpu",' in shown.stdout and "would fix 1 of 1 instance" in shown.stdout
    assert "nothing written: --write applies the edits" in shown.stdout  # not "fixed": nothing is yet
    assert (tmp_path / source.name).read_bytes() == source.read_bytes()
    written = runner.invoke(app, ["fix", "--run", source.name, "--write", "--", cuda3_checkpoint])
    assert written.exit_code == 0 and written.stdout.startswith(f"wrote {source.name}\n"), written.output
    fixed = source.with_name("pc301_map_location.fixed.py")
    assert (tmp_path / source.name).read_bytes() == fixed.read_bytes()
    for bad in (["fix", "--run", source.name, "--kwargs", "{}"], ["fix", "m.py:M", "--steps", "3"],
                ["fix", "m.py:M", "--", "an-argument"]):
        refused = runner.invoke(app, bad)
        assert refused.exit_code == 2, (bad, refused.output)


def test_batch_element_moved_beside_its_sibling_or_before_an_inline_use() -> None:
    src = ("for step, (x, y) in enumerate(loader):\n    opt.zero_grad()\n"
           "    loss = crit(model(x.cuda(non_blocking=True)), y)\n")
    out = _rewrite(src, Request("PC201", 1, where="y", batch="batch[1]", use=3))
    assert out.after == ("    y = y.cuda(non_blocking=True)\n"
                         "    loss = crit(model(x.cuda(non_blocking=True)), y)\n")
    unpacked = "for batch in loader:\n    x, y = batch\n    x = x.to(dev)\n    print(model(x) + y)\n"
    assert _rewrite(unpacked, Request("PC201", 1, where="y", batch="batch[1]", use=4)).source == (
        "for batch in loader:\n    x, y = batch\n    x = x.to(dev)\n    y = y.to(dev)\n"
        "    print(model(x) + y)\n")
    alone = rewrite("for x, y in loader:\n    model.to(dev)\n    crit(model(x), y)\n",
                    Request("PC201", 1, where="y", batch="batch[1]", use=3))
    assert isinstance(alone, NotFixable) and "no other element of the batch is moved" in alone.reason
    not_batch = rewrite("x = a + b\n", Request("PC201", 1, where="b"))
    assert isinstance(not_batch, NotFixable) and "origin" in not_batch.reason


def test_a_dict_batch_item_is_moved_where_it_is_read_with_its_siblings_arguments() -> None:
    src = ("for batch in loader:\n    out = model(batch['x'].to(dev, non_blocking=True))\n"
           "    loss = crit(out, batch['y']) + aux(batch['y'])\n    batch['y'] = 0\n")
    out = _rewrite(src, Request("PC201", 1, where='batch["y"]', batch="batch['y']", use=3))
    # every read in the statement, written as the script writes it; the sibling's non_blocking kept
    assert out.after == ("    loss = crit(out, batch['y'].to(dev, non_blocking=True)) "
                         "+ aux(batch['y'].to(dev, non_blocking=True))\n")
    no_sibling = "device = 'cuda'\nmodel.to(device)\nfor b in loader:\n    crit(model(b[0]), b[1])\n"
    assert _rewrite(no_sibling, Request("PC201", 3, where="b[1]", batch="batch[1]", use=4)).after == \
        "    crit(model(b[0]), b[1].to(device))\n"  # the script's own device expression
    nothing = rewrite("for b in loader:\n    crit(model(b[0]), b[1])\n",
                      Request("PC201", 1, where="b[1]", batch="batch[1]", use=2))
    assert isinstance(nothing, NotFixable) and "which device" in nothing.reason
    written = rewrite(src, Request("PC201", 1, where='batch["y"]', batch="batch['y']", use=4))
    assert isinstance(written, NotFixable)  # line 4 writes batch['y']: no read to move
    elsewhere = rewrite(src, Request("PC201", 1, where='batch["z"]', batch="batch['z']", use=3))
    assert isinstance(elsewhere, NotFixable) and "does not read" in elsewhere.reason


def test_proof_runs_in_a_fresh_interpreter_where_this_process_cannot_fork_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a real GPU initialised here, or autograd's device threads started: a forked child cannot run the audit
    from placecheck.fix import proof

    monkeypatch.setattr(proof, "_may_fork", lambda: False)
    target = _copy(FIXTURES / "pc103_parameter_list.py", tmp_path, monkeypatch)
    result = fix(target, AuditOptions())
    assert [e.code for e in result.edits] == ["PC103"] and not result.failed, result.summary()
    assert result.remaining == []
    # the fresh process is a child of this process's warm proof server, which the next proof reuses
    (server,) = proof._SERVER
    assert fix(target, AuditOptions()).edits and [server] == proof._SERVER and server.process.poll() is None


def test_without_its_warm_server_the_proof_starts_an_interpreter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from placecheck.basics import forkserver
    from placecheck.fix import proof

    monkeypatch.setattr(proof, "_may_fork", lambda: False)
    monkeypatch.setattr(proof, "_SERVER", [])
    monkeypatch.setattr(forkserver, "_server_command", lambda modules: [sys.executable, "-c", "pass"])  # dies
    started: list[object] = []
    real_run = proof.subprocess.run
    monkeypatch.setattr(proof.subprocess, "run", lambda *a, **k: started.append(a) or real_run(*a, **k))
    target = _copy(FIXTURES / "pc103_parameter_list.py", tmp_path, monkeypatch)
    result = fix(target, AuditOptions())
    assert [e.code for e in result.edits] == ["PC103"] and not result.failed, result.summary()
    assert started and proof._SERVER == []


def test_the_fork_server_runs_only_placecheck_entry_points() -> None:
    from placecheck.commands import worker

    assert worker._entry(None) is worker.child_main
    from placecheck.fix.proof import fresh_job

    assert worker._entry("placecheck.fix.proof:fresh_job") is fresh_job
    for name in ("os:system", "placecheck.fix.proof", "subprocess:run"):
        with pytest.raises(ValueError, match="placecheck's own entry points"):
            worker._entry(name)


def test_a_child_forked_after_autograd_threads_started_is_refused_and_answered_fresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from placecheck.fix import proof

    monkeypatch.setattr(proof, "_fork_refused", lambda: True)  # what the probe says in such a child
    fresh: list[object] = []
    monkeypatch.setattr(proof, "_reaudit_fresh", lambda audit_once, edited, folder: fresh.append(edited)
                        or proof.ProofOutcome(error="answered fresh"))
    assert proof.reaudit(lambda: None, {"x.py": "x = 1\n"}).error == "answered fresh" and fresh


def test_write_refuses_a_file_changed_since_the_audit(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    source = FIXTURES / "pc102_module_containers.py"
    target = _copy(source, tmp_path, monkeypatch)
    result = fix(target, AuditOptions())
    assert result.edits
    changed = source.read_text() + "# edited by hand meanwhile\n"
    (tmp_path / source.name).write_text(changed)
    with pytest.raises(FixRefused, match="changed on disk since the audit"):
        write(result)
    assert (tmp_path / source.name).read_text() == changed
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [source.name], "a temporary file was left"


def test_buggy_example_fixes_what_it_can_and_explains_the_rest() -> None:
    result = fix("placecheck/examples/buggy.py:BuggyNet", AuditOptions())
    assert sorted(e.code for e in result.edits) == ["PC101", "PC101", "PC101", "PC102", "PC103", "PC202"], \
        result.summary()
    assert not result.failed
    reasons = {u.finding.code: u.reason for u in result.not_fixable}
    assert "nn.LazyLinear" in reasons["PC203"] and "PC203" in reasons["PC201"]  # the gate's mismatch
    assert result.exit_code == 1  # the lazy layer and the mismatch it causes remain
    diff = result.diff()
    assert "+        self.heads = nn.ModuleList([" in diff and "+class RopeCache(nn.Module):" in diff
    assert '+        self.register_buffer("cache_k", torch.zeros(length, dim), persistent=False)' in diff
    assert "state_dict() gains" in result.summary()
    verdicts = {(f.code, f.where or f.source): (fixed, how) for f, fixed, how in result.verdicts()}
    assert verdicts[("PC101", "rope.cos")] == (True, "edit at placecheck/examples/buggy.py:13-19")
    assert verdicts[("PC203", "gate")][0] is False
    assert len(result.verdicts()) == len(result.report.findings)  # every finding gets its line


def test_cli_json_lists_each_edit_and_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _copy(FIXTURES / "pc202_device_from_input.py", tmp_path, monkeypatch)
    out = CliRunner().invoke(app, ["fix", target, "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    edits = {(e["code"], e["start_line"], e["end_line"]) for e in data["edits"]}
    assert edits == {("PC202", 14, 14), ("PC202", 15, 15)}
    assert all(e["file"] == "pc202_device_from_input.py" and e["before"] != e["after"] for e in data["edits"])
    assert data["written"] == []
    assert {(f["code"], f["fixed"], f.get("edit")) for f in data["findings"]} == {
        ("PC201", True, "edit at its origin pc202_device_from_input.py:14"),
        ("PC202", True, "edit at pc202_device_from_input.py:14"),
        ("PC202", True, "edit at pc202_device_from_input.py:15")}


def test_cli_exit_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["fix", "x.py:M", "--diff", "--write"]).exit_code == 2
    out = runner.invoke(app, ["fix", "placecheck/examples/buggy.py:BuggyNet"])
    assert out.exit_code == 1
    assert "2 not fixed" in out.stdout and out.stdout.startswith("--- a/placecheck/examples/buggy.py")
    assert "\n  not fixed: PC203 gate: a layer built in forward" in out.stdout  # one line per finding
    assert " would fix: PC202 placecheck/examples/buggy.py:54: edit at placecheck/examples/buggy.py:54 " \
        in " ".join(out.stdout.split())  # the summary is wrapped to the terminal's width
    target = _copy(FIXTURES / "pc103_parameter_list.py", tmp_path, monkeypatch)
    assert runner.invoke(app, ["fix", target, "--write"]).exit_code == 0
    assert runner.invoke(app, ["fix", target]).exit_code == 0  # nothing left to fix


def test_audit_fix_writes_like_fix_write_and_reports_what_remains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = FIXTURES / "pc102_module_containers.py"
    target = _copy(source, tmp_path, monkeypatch)
    runner = CliRunner()
    out = runner.invoke(app, ["audit", target, "--fix", "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["findings"] == []
    assert f"--fix: wrote {source.name}" in data["notes"]
    assert "--fix: fixed 4 of 4 instances (2 of 2 problems) with 2 edits" in data["notes"]
    assert (tmp_path / source.name).read_bytes() == source.with_name(source.stem + ".fixed.py").read_bytes()
    (tmp_path / "lazy.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n    def __init__(self) -> None:\n"
        "        super().__init__()\n        self.proj = nn.Linear(4, 4)\n        self.mask = torch.ones(4)\n"
        "        self.extra: nn.Linear | None = None\n\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        x = self.proj(x) + torch.randn(x.shape)\n        if self.extra is None:\n"
        "            self.extra = nn.Linear(x.shape[-1], x.shape[-1])\n"
        "        return self.extra(x) * self.mask\n")
    left = runner.invoke(app, ["audit", "lazy.py:Model", "--fix", "--select", "PC2"])
    # the layer built in forward with sizes from the input (PC203) stays
    assert left.exit_code == 1, left.output
    assert "PC203" in left.stdout and "PC101" not in left.stdout and "--fix: wrote lazy.py" in left.stdout
    assert "torch.randn(x.shape, device=x.device)" in (tmp_path / "lazy.py").read_text(), left.stdout
    assert "self.mask = torch.ones(4)" in (tmp_path / "lazy.py").read_text(), "--select PC2 rewrote PC101"
    for bad in (["audit", target, "--fix", "--timeout", "9"], ["audit", "--fix", "--config", "x.toml"]):
        assert runner.invoke(app, bad).exit_code == 2


def test_libcst_is_the_declared_fix_extra_and_make_install_installs_it() -> None:
    import tomllib

    project = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert [d for d in project["optional-dependencies"]["fix"] if d.startswith("libcst")]
    makefile = (TESTS.parent / "Makefile").read_text(encoding="utf-8")
    rule = makefile[makefile.index("\n$(STAMP):"):].split("\n\n")[0]  # what make install runs
    extras = [line.split("-e '.[", 1)[1].split("]")[0].split(",") for line in rule.splitlines()
              if "-e '.[" in line]
    assert extras and "fix" in extras[0]


# rewrites alone (no audit): layout, import styles, refusals

def _rewrite(source: str, request: Request) -> Rewrite:
    out = rewrite(source, request)
    assert isinstance(out, Rewrite), out
    return out


def test_unsafe_buffer_is_persistent_and_says_so() -> None:
    src = "import torch\nclass M:\n    def __init__(self):\n        self.m = torch.ones(2)  # keep\n"
    out = _rewrite(src, Request("PC101", 4, where="m", unsafe=True))
    assert out.after == '        self.register_buffer("m", torch.ones(2))  # keep\n'
    assert "state_dict()" in out.note


def test_container_spelled_as_the_file_imports_nn() -> None:
    src = ("from torch.nn import Linear, ModuleList\nclass M:\n    def __init__(self):\n"
           "        self.h = (Linear(1, 1),)\n")
    assert _rewrite(src, Request("PC102", 4, where="h[0]")).after == \
        "        self.h = ModuleList((Linear(1, 1),))\n"


def test_not_fixable_outside_init_or_without_a_tensor_argument() -> None:
    src = "import torch\nclass M:\n    def setup(self):\n        self.m = torch.ones(2)\n" \
          "    def forward(self, n: int):\n        return torch.zeros(n)\n"
    outside = rewrite(src, Request("PC101", 4, where="m"))
    assert isinstance(outside, NotFixable) and "__init__" in outside.reason
    no_tensor = rewrite(src, Request("PC202", 6, op="torch.zeros"))
    assert isinstance(no_tensor, NotFixable) and "no tensor argument" in no_tensor.reason


def test_torch_load_gets_map_location() -> None:
    src = "import torch\nstate = torch.load(path)\n"
    assert _rewrite(src, Request("PC301", 2)).after == 'state = torch.load(path, map_location="cpu")\n'
    keywords = "import torch\nstate = torch.load(\n    path,  # c\n    weights_only=True,  # d\n)\n"
    assert _rewrite(keywords, Request("PC301", 2)).source == (
        "import torch\nstate = torch.load(\n    path,  # c\n    weights_only=True,  # d\n"
        '    map_location="cpu",\n)\n')
    one = _rewrite("import torch\nstate = torch.load(\n    path,  # c\n)\n", Request("PC301", 2))
    assert one.source == 'import torch\nstate = torch.load(\n    path,  # c\n    map_location="cpu",\n)\n'
    on_meta = _rewrite(src, Request("PC301", 2, device="meta"))  # the audit's device says otherwise
    assert on_meta.after == 'state = torch.load(path, map_location="meta")\n'
    positional = rewrite("import torch\nstate = torch.load(path, 'cpu')\n", Request("PC301", 2))
    assert isinstance(positional, NotFixable)


def test_explain_says_whether_a_code_is_auto_fixable() -> None:
    runner = CliRunner()

    def said(code: str) -> str:
        out = runner.invoke(app, ["explain", code])
        assert out.exit_code == 0, out.output
        return str(out.stdout.split("placecheck fix:")[1])

    assert said("PC102").startswith(" auto-fixable: ") and "nn.ModuleList" in said("PC102")
    lazy = said("PC203")
    assert lazy.startswith(" auto-fixable: ") and "__init__" in lazy and "nn.Lazy" in lazy
    stray = said("PC101")  # the forms: a plain attribute, a list or dict literal, a helper class
    assert "register_buffer" in stray and "list or dict literal" in stray and "helper class" in stray
    made = said("PC202")
    assert "helper function" in made and "self.device" in made and "fix --run" in made
    assert "origin" in said("PC201") and said("PC307").startswith(" auto-fixable: ")
    assert said("PC204").startswith(" not auto-fixable")


def test_containers_used_as_a_whole_and_helpers_that_cannot_be_modules_are_refused_with_the_edit() -> None:
    src = ("import torch\nfrom torch import nn\nclass M(nn.Module):\n    def __init__(self):\n"
           "        super().__init__()\n        self.grid = [torch.zeros(2), torch.ones(2)]\n"
           "    def forward(self, x):\n        for g in self.grid:\n            x = x + g\n"
           "        return x\n")
    whole = rewrite(src, Request("PC101", 6, where="grid[0]"))
    assert isinstance(whole, NotFixable) and "used as a whole at line 8" in whole.reason
    assert 'self.register_buffer("grid_<key>", <tensor>, persistent=False)' in whole.reason
    indexed = _rewrite(src.replace("        for g in self.grid:\n            x = x + g\n",
                                   "        x = x + self.grid[1]\n"), Request("PC101", 6, where="grid[0]"))
    assert "self.grid_1" in indexed.source and "self.grid[" not in indexed.source
    helper = ("import torch\nfrom torch import nn\nfrom dataclasses import dataclass\n@dataclass\n"
              "class Kv:\n    k: torch.Tensor\nclass M(nn.Module):\n    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.kv = Kv(torch.zeros(2))\n")
    refused = rewrite(helper, Request("PC101", 10, where="kv.k", fields=("k",)))
    assert isinstance(refused, NotFixable) and "decorators" in refused.reason
    assert "class Helper(nn.Module)" in refused.reason  # the hint shows the edit
    clash = ("import torch\nimport torch.nn as nn\nclass Kv:\n    def __init__(self):\n"
             "        self.k = torch.zeros(2)\n    def to(self, d):\n        return self\n"
             "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.kv = Kv()\n")
    refused = rewrite(clash, Request("PC101", 11, where="kv.k", fields=("k",)))
    assert isinstance(refused, NotFixable) and "defines to" in refused.reason


def test_a_method_without_a_tensor_argument_says_what_to_pass() -> None:
    src = ("import torch\nclass M:\n    def mask(self, n: int):\n        return torch.ones(n, n)\n"
           "    @staticmethod\n    def grid(x):\n        return torch.arange(3)\n")
    refused = rewrite(src, Request("PC202", 4, op="torch.ones"))
    assert isinstance(refused, NotFixable) and "mask() has no tensor argument" in refused.reason
    assert _rewrite(src, Request("PC202", 7, op="torch.arange")).after == \
        "        return torch.arange(3, device=x.device)\n"  # a staticmethod's first argument is an input


def test_a_script_tensor_takes_the_scripts_device_expression() -> None:
    import libcst as cst

    from placecheck.fix.edits import script_device

    moves = "dev = 'cuda'\nm.to(dev)\nx = x.to(device=dev)\ny.to(z)\n"
    assert script_device(cst.parse_module(moves)) == "dev"
    assert script_device(cst.parse_module("m.cuda()\n")) == '"cuda"'
    assert script_device(cst.parse_module("x = 1\n")) == ""
    src = "import torch\ndevice = 'cuda'\nmodel.to(device)\nacc = torch.zeros(3)\n"
    assert _rewrite(src, Request("PC202", 4, script=True)).after == "acc = torch.zeros(3, device=device)\n"
    assert isinstance(rewrite(src, Request("PC202", 4)), NotFixable)  # a model file: no input, no device


def test_an_edit_that_breaks_the_model_fails_the_proof_and_is_not_offered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a plain tensor may be set before Module.__init__, a buffer may not: the edit must not be offered
    (tmp_path / "early.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n    def __init__(self) -> None:\n"
        "        self.mask = torch.ones(4)\n        super().__init__()\n"
        "        self.proj = nn.Linear(4, 4)\n\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        return self.proj(x) * self.mask\n")
    monkeypatch.chdir(tmp_path)
    result = fix("early.py:Model", AuditOptions())
    assert [e.code for e in result.edits] == [] and [e.code for e, _ in result.failed] == ["PC101"]
    assert "re-audit" in result.failed[0][1] and result.diff() == "" and result.exit_code == 1
    assert "1 edit failed its proof" in result.summary()


def test_only_the_users_writable_source_is_edited(tmp_path: Path) -> None:
    from placecheck.fix.plan import why_not_editable

    generated = tmp_path / "gen.py"
    generated.write_text("# @generated by protoc: DO NOT EDIT\nx = 1\n")
    assert "generated" in why_not_editable(str(generated))
    assert "notebook" in why_not_editable("analysis.ipynb")
    assert "installed package" in why_not_editable(torch_file())
    mine = tmp_path / "mine.py"
    mine.write_text("x = 1\n")
    assert why_not_editable(str(mine)) == ""


def test_a_file_the_user_cannot_write_is_not_fixable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from placecheck.fix.plan import why_not_editable

    read_only = tmp_path / "ro.py"
    read_only.write_text("x = 1\n")
    read_only.chmod(0o444)
    # root may write any file (os.access says so): the permission check is what matters here
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
        False if str(path) == str(read_only) and mode & os.W_OK else real_access(path, mode, **kw)))
    assert why_not_editable(str(read_only)) == f"{read_only} is not writable"
    writable = tmp_path / "mine.py"
    writable.write_text("x = 1\n")
    assert why_not_editable(str(writable)) == ""


def torch_file() -> str:
    import torch.nn.modules.linear as linear

    return str(linear.__file__)


def test_cuda_after_a_factory_is_folded_and_a_multiline_call_keeps_its_layout() -> None:
    src = ("import torch\nclass M:\n    def forward(self, x):\n        a = torch.zeros(\n            3,\n"
           "            4,\n        ).cuda()\n        return a\n")
    out = _rewrite(src, Request("PC202", 4, op="torch.zeros"))
    assert out.source == ("import torch\nclass M:\n    def forward(self, x):\n        a = torch.zeros(\n"
                          "            3,\n            4,\n            device=x.device,\n        )\n"
                          "        return a\n")
    assert (out.start, out.end) == (4, 7)
