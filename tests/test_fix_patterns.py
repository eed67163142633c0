"""The rewrites of issue 43 item 1, and for each, a program the edit would break: the proof refuses it.

The buggy/fixed pairs themselves are fixtures under ``tests/fixtures/fix`` (collected by
``tests/test_fix.py``); here are the rewrites alone and the programs no edit may be offered for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("libcst")  # the fix extra

from placecheck.basics.options import AuditOptions
from placecheck.fix import fix
from placecheck.fix.edits import NotFixable, Request, Rewrite, rewrite

pytestmark = pytest.mark.compat

HEAD = "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self) -> None:\n" \
       "        super().__init__()\n        self.stem = nn.Linear(4, 4)\n"


def _rewrite(source: str, request: Request) -> Rewrite:
    out = rewrite(source, request)
    assert isinstance(out, Rewrite), out
    return out


# -- nested containers (PC102/PC103) ------------------------------------------------------------------

def test_nested_literals_are_wrapped_at_every_level() -> None:
    src = "import torch.nn as nn\nclass M:\n    def __init__(self):\n        self.s = [[a, b], (c,)]\n"
    assert _rewrite(src, Request("PC102", 4, where="s[1][0]")).after == \
        "        self.s = nn.ModuleList([nn.ModuleList([a, b]), nn.ModuleList((c,))])\n"
    params = ("from torch import nn\nclass M:\n    def __init__(self):\n"
              "        self.g = {k: {'w': p} for k in ks}\n")
    out = _rewrite(params, Request("PC103", 4, where="g['x']['w']"))
    assert out.after == "        self.g = nn.ModuleDict({k: nn.ParameterDict({'w': p}) for k in ks})\n"
    assert "ModuleDict of ParameterDicts" in out.note and "(g.<key>...," in out.note


def test_nested_containers_not_written_here_are_refused_with_the_reason() -> None:
    built = "import torch.nn as nn\nclass M:\n    def __init__(self):\n        self.s = make_stages()\n"
    refused = rewrite(built, Request("PC102", 4, where="s[0][1]"))
    assert isinstance(refused, NotFixable) and "does not write it as a list or dict literal" in refused.reason
    starred = "import torch.nn as nn\nclass M:\n    def __init__(self):\n        self.s = [*rest, [a]]\n"
    refused = rewrite(starred, Request("PC102", 4, where="s[1][0]"))
    assert isinstance(refused, NotFixable) and "unpacks another container" in refused.reason


def test_an_inner_list_the_forward_uses_as_a_list_fails_the_proof(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `[self.stem] + stage`: list + nn.ModuleList raises; the wrapped program would not run
    (tmp_path / "concat.py").write_text(
        HEAD + "        self.stages = [[nn.Linear(4, 4)], [nn.Linear(4, 4)]]\n\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        for layer in [self.stem] + self.stages[0]:\n            x = layer(x)\n        return x\n")
    monkeypatch.chdir(tmp_path)
    result = fix("concat.py:Model", AuditOptions())
    assert [e.code for e in result.edits] == [] and [e.code for e, _ in result.failed] == ["PC102"], \
        result.summary()
    assert result.failed[0][1].startswith("the re-audit stopped before its end: ") and result.diff() == ""
    assert "TypeError" in result.failed[0][1], result.failed


# -- PC205 / PC206: fixed where the tensor is made ------------------------------------------------------

def test_an_output_off_the_device_selected_alone_is_fixed_at_its_origin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import TESTS

    source = TESTS / "fixtures" / "fix" / "pc206_output_made_on_the_cpu.py"
    (tmp_path / source.name).write_bytes(source.read_bytes())
    monkeypatch.chdir(tmp_path)
    result = fix(f"{source.name}:Model", AuditOptions(), select=["PC206"])
    assert [(e.code, e.start) for e in result.edits] == [("PC202", 13)], result.summary()
    assert not result.failed
    assert [(f.code, fixed, how) for f, fixed, how in result.verdicts()] == [
        ("PC206", True, f"edit at its origin {source.name}:13")]


def test_an_output_the_forward_also_reads_on_the_host_fails_the_proof(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # lengths.tolist() on the host: on the device it becomes a sync per call (PC204), so no edit is offered
    (tmp_path / "host.py").write_text(
        HEAD + "        self.seen: list[int] = []\n\n"
        "    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:\n"
        "        lengths = torch.tensor([x.shape[0]])\n        self.seen += lengths.tolist()\n"
        "        return self.stem(x), lengths\n")
    monkeypatch.chdir(tmp_path)
    result = fix("host.py:Model", AuditOptions())
    assert not result.edits and [e.code for e, _ in result.failed] == ["PC202"], result.summary()
    assert "new finding: PC204 at host.py:13" in result.failed[0][1]
    verdicts = {f.code: how for f, _, how in result.verdicts()}
    assert verdicts["PC206"].startswith("failed proof: the re-audit reports a new finding: PC204")


# -- fix --run: the scripts' pairs audit as expected under both run engines ---------------------------

RUN = Path(__file__).parent / "fixtures" / "fix" / "run"
RUN_PAIRS = {"pc201_discarded_move": "PC201", "pc210_read_before_synchronize": "PC210",
             "pc308_optimizer_before_reload": "PC308"}
"""The run pairs of issue 43: the code the buggy script shows; its .fixed.py shows nothing."""


@pytest.mark.parametrize("engine", ["tagged", "fake"])
@pytest.mark.parametrize("name", sorted(RUN_PAIRS))
def test_run_pair_buggy_reports_and_fixed_is_clean_under_each_engine(
        name: str, engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from placecheck.basics.options import RunOptions
    from placecheck.run import run

    monkeypatch.chdir(tmp_path)
    for suffix in (".py", ".fixed.py"):
        (tmp_path / f"{name}{suffix}").write_bytes((RUN / f"{name}{suffix}").read_bytes())
    options = RunOptions(engine=engine)
    buggy = run(f"{name}.py", ["unused.pt"], options=options)
    assert RUN_PAIRS[name] in {f.code for f in buggy.findings} and not buggy.unfinished, buggy.findings
    fixed = run(f"{name}.fixed.py", ["unused.pt"], options=options)
    assert (fixed.findings, fixed.unfinished) == ((), ""), fixed.findings


def test_a_discarded_move_whose_tensor_is_read_on_the_host_after_fails_the_proof(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from placecheck.fix import fix_run

    # x.numpy() after the loop: with x on the device it raises, so `x = x.to(device)` is not offered
    script = (RUN / "pc201_discarded_move.py").read_text() + "print(float(x.numpy().mean()))\n"
    (tmp_path / "host_after.py").write_text(script)
    monkeypatch.chdir(tmp_path)
    result = fix_run("host_after.py", ["unused.pt"])
    assert not result.edits and [e.code for e, _ in result.failed] == ["PC201"], result.summary()
    assert "can't convert cuda:0 device type tensor to numpy" in result.failed[0][1]
    assert (tmp_path / "host_after.py").read_text() == script


def test_a_discarded_move_is_bound_only_when_nothing_binds_the_name_between() -> None:
    src = "import torch\ndevice = 'cuda'\nx = torch.ones(2).numpy()\nx = torch.from_numpy(x)\nx.cuda()\n" \
          "y = model(x)\n"
    assert _rewrite(src, Request("PC201", 6, where="x", rebind="x", script=True)).after == "x = x.cuda()\n"
    rebound = src.replace("x.cuda()\n", "x.cuda()\nfor x in xs:\n    pass\n")
    refused = rewrite(rebound, Request("PC201", 8, where="x", rebind="x", script=True))
    assert isinstance(refused, NotFixable) and "bound again at line 6" in refused.reason
    none = rewrite(src.replace("x.cuda()\n", ""), Request("PC201", 5, where="x", rebind="x", script=True))
    assert isinstance(none, NotFixable) and "throws its result away" in none.reason
    # a dtype conversion thrown away is not a move: binding it would change the numbers, unseen by a proof
    dtype = rewrite(src.replace("x.cuda()", "x.to(torch.float16)"),
                    Request("PC201", 6, where="x", rebind="x", script=True))
    assert isinstance(dtype, NotFixable), dtype
    for move in ("x.to(device)", "x.to('cuda:0')", "x.to(y.device, non_blocking=True)", "x.to(device=d)",
                 "x.to(torch.device('cuda'))"):
        script = src.replace("x.cuda()", move).replace("x = torch.ones", "model.to(device)\nx = torch.ones")
        moved = _rewrite(script, Request("PC201", 7, where="x", rebind="x", script=True))
        assert moved.after == f"x = {move}\n", move


# -- PC308: the optimizer built after the model it steps is re-created ---------------------------------

OPTIMIZER_FIRST = ("import torch\nimport torch.nn as nn\nmodel = nn.Linear(8, 2)\n"
                   "optimizer = torch.optim.SGD(model.parameters(), lr=lr)\n"
                   "model = nn.Linear(8, 2).cuda()\nfor _ in range(2):\n    optimizer.step()\n")


def test_the_optimizer_goes_below_the_models_re_creation() -> None:
    out = _rewrite(OPTIMIZER_FIRST, Request("PC308", 4, where="SGD", script=True))
    assert out.source == OPTIMIZER_FIRST.replace(
        "optimizer = torch.optim.SGD(model.parameters(), lr=lr)\nmodel = nn.Linear(8, 2).cuda()\n",
        "model = nn.Linear(8, 2).cuda()\noptimizer = torch.optim.SGD(model.parameters(), lr=lr)\n")
    assert (out.start, out.end) == (4, 5)


@pytest.mark.parametrize("between, said", [
    # a scheduler built on the optimizer before the re-creation: moving the optimizer alone breaks it
    ("sched = torch.optim.lr_scheduler.StepLR(optimizer, 1)\n", "`optimizer` is used at line 5, before the "
                                                                 "model is re-created at line 6"),
    # the learning rate changes between: the moved construction would read another value
    ("lr = 0.5\n", "`lr`, which the optimizer at line 4 reads, is bound again before line 6"),
], ids=["used-before", "reads-rebound"])
def test_an_optimizer_move_that_would_change_the_program_is_refused(between: str, said: str) -> None:
    made = "model = nn.Linear(8, 2).cuda()\n"
    src = OPTIMIZER_FIRST.replace(made, between + made)
    refused = rewrite(src, Request("PC308", 4, where="SGD", script=True))
    assert isinstance(refused, NotFixable) and said in refused.reason, refused
    nested = OPTIMIZER_FIRST.replace("model = nn.Linear(8, 2).cuda()\n", "if resume:\n    model = load()\n")
    refused = rewrite(nested, Request("PC308", 4, where="SGD", script=True))
    assert isinstance(refused, NotFixable) and "re-creates or reloads model" in refused.reason


# -- PC210: a synchronize before the host reads a non_blocking copy ------------------------------------

def test_the_synchronize_goes_before_the_reading_statement_guarded_for_machines_without_cuda() -> None:
    src = ("import torch as th\nfor s in range(2):\n    h = loss.to('cpu', non_blocking=True)\n"
           "    if h.item() > 0: print(h)\n")
    out = _rewrite(src, Request("PC210", 4, script=True))
    sync = ("    if th.cuda.is_available():  # the non_blocking copy must land before the host reads it\n"
            "        th.cuda.current_stream().synchronize()\n")
    assert out.source == src.replace("    if h.item()", sync + "    if h.item()")
    refused = rewrite("from torch import ones\nprint(h.item())\n", Request("PC210", 2, script=True))
    assert isinstance(refused, NotFixable) and "does not import torch as a module" in refused.reason


def test_the_synchronized_script_still_runs_where_there_is_no_cuda(tmp_path: Path) -> None:
    # the guard is what keeps a script with a CPU fallback working: torch.cuda.current_stream() raises
    # without CUDA. Plain python, no placecheck: on this machine's CPU (or its GPU, where there is one).
    import subprocess
    import sys

    fixed = RUN / "pc210_read_before_synchronize.fixed.py"
    done = subprocess.run([sys.executable, str(fixed)], capture_output=True, text=True, cwd=tmp_path,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("step 0: loss ") and "step 1: loss " in done.stdout


# -- PC202: the nearest tensor a function without a tensor argument has ---------------------------------

def test_a_factory_in_a_forward_without_a_tensor_argument_takes_the_device_of_the_tensor_it_reads() -> None:
    src = ("import torch\nclass M:\n    def forward(self, batch: dict[str, torch.Tensor]):\n"
           "        h = self.embed(batch['ids'])\n        pos = torch.arange(h.shape[1])\n"
           "        m = torch.ones(h.size(0), 3)\n        z = torch.zeros(3)\n"
           "        return h + pos + m + z\n")

    def after(source: str, line: int) -> str:
        return _rewrite(source, Request("PC202", line)).after.strip()

    # dict[str, Tensor] is not a tensor: batch.device would raise
    assert after(src, 5) == "pos = torch.arange(h.shape[1], device=h.device)"
    assert after(src, 6) == "m = torch.ones(h.size(0), 3, device=h.device)"
    refused = rewrite(src, Request("PC202", 7))  # reads no tensor: nothing says which one is meant
    assert isinstance(refused, NotFixable) and "read no tensor's shape or size" in refused.reason
    optional = src.replace("batch: dict[str, torch.Tensor]", "batch: Optional[torch.Tensor]")
    assert after(optional, 7) == "z = torch.zeros(3, device=batch.device)"
