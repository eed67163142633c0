"""``placecheck run``'s fast-forward (issue 31): after the ``--steps`` budget the rest of the training
loop is skipped, not the rest of the script, so the code after training is checked with the default
settings; and the report says which lines of the script ran.

Fixtures: ``tests/fixtures/run/fastforward/`` (a buggy script and its correct twin per kind of later
code) and ``tests/fixtures/run/ranks/metric_after_loop_*.py``. Each buggy one is found at its line under
both engines, its twin is clean (its real host syncs are info).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_runner import CliRunner
from kept_scratch import kept, remove_kept
from report_schema import validate_report

from placecheck.cli import app
from placecheck.engines import cudaapi
from placecheck.findings.finding import Severity
from placecheck.findings.report import Report
from placecheck.run import run
from placecheck.run.fastforward import MAX_BATCHES, compile_script

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run"
FAST = FIXTURES / "fastforward"
ENGINES = ["tagged", pytest.param("fake", marks=pytest.mark.skipif(
    cudaapi.CPU_ONLY_BUILD, reason="the fake engine of run needs torch built with CUDA support"))]


def script(path: Path) -> str:
    return os.path.relpath(path)


def failing(report: Report) -> list[tuple[str, str]]:
    """``(code, line)`` of every finding above info."""
    return sorted((f.code, f.source.rsplit(":", 1)[1]) for f in report.findings
                  if f.severity is not Severity.INFO)


CASES = {
    # name: the findings of the buggy script, with the default --steps 2: the op that crashed (PC201)
    # and, for a tensor the script made on the CPU, its creation's line (PC202: the line to edit)
    "validation": [("PC201", "23")],  # per-epoch validation: the labels stay on the CPU
    "periodic": [("PC201", "27"), ("PC202", "24")],  # validation every second epoch: a CPU accumulator
    "testpass": [("PC201", "26"), ("PC202", "25")],  # the test pass after training: its input made on the CPU
    "export": [("PC207", "22")],  # .numpy() of a device tensor: a GPU raises TypeError there
    "early_stop": [("PC201", "31"), ("PC202", "30")],  # after early stopping: a CPU probe meets the model
    "sparse": [("PC201", "31"), ("PC202", "30")],  # a test pass in the last of 30 epochs only: a CPU probe
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_code_after_the_steps_is_found_at_its_line_and_its_twin_is_clean(name: str, engine: str) -> None:
    buggy = run(script(FAST / f"{name}_buggy.py"), engine=engine)
    assert failing(buggy) == CASES[name]
    assert buggy.unfinished == "" and dict(buggy.stats)["optimizer_steps"] >= 2
    fixed = run(script(FAST / f"{name}_fixed.py"), engine=engine)
    assert failing(fixed) == []
    assert fixed.coverage is not None and fixed.coverage.run == fixed.coverage.lines  # every line ran
    [ending] = [n for n in fixed.notes if n.startswith("run: the script ran to its end")]
    assert "a fast-forward from" in ending


def test_the_export_is_the_error_a_gpu_raises() -> None:
    [finding] = run(script(FAST / "export_buggy.py")).findings
    assert "TypeError" in finding.message and "numpy" in finding.message


def test_the_training_loop_ends_after_the_step_and_validation_runs_a_batch_or_two() -> None:
    report = run(script(FAST / "validation_fixed.py"))
    notes = "\n".join(report.notes)
    path = script(FAST / "validation_fixed.py")
    assert dict(report.stats)["optimizer_steps"] == 2  # no step after the budget
    assert f"the loop at {path}:28-33 (`for x, y in train_loader:`) ended early: 6 iterations skipped" \
        in notes
    assert f"the loop at {path}:26-34 (`for epoch in range(10):`) ended early: 9 iterations skipped" \
        in notes
    # the validation DataLoader (4 batches) gives a batch or two
    assert f"the loop at {path}:20-22 (`for x, y in val_loader:`) ended early: {4 - MAX_BATCHES} " \
           "iterations skipped" in notes
    [sync] = report.findings
    assert sync.count == MAX_BATCHES


def test_the_epoch_loop_runs_once_more_to_reach_a_validation_it_has_not_run() -> None:
    report = run(script(FAST / "periodic_fixed.py"))
    path = script(FAST / "periodic_fixed.py")
    notes = "\n".join(report.notes)
    # epoch 0 stepped twice and skipped its validation; epoch 1 runs it (one step of its training loop)
    assert f"the loop at {path}:16-27 (`for epoch in range(30):`) ended early: 28 iterations skipped" \
        in notes
    assert dict(report.stats)["optimizer_steps"] == 3


def test_steps_0_runs_every_iteration_and_finds_the_same() -> None:
    path = script(FAST / "testpass_buggy.py")
    whole = run(path, steps=0)
    assert failing(whole) == CASES["testpass"]
    assert dict(whole.stats)["optimizer_steps"] == 1000
    assert not any("fast-forward" in n for n in whole.notes)


def test_a_light_loop_after_the_budget_runs_whole_and_a_heavy_one_sets_its_variables(
        tmp_path: Path) -> None:
    train = tmp_path / "train.py"
    train.write_text(
        "import torch\n"                                                        # 1
        "import torch.nn as nn\n"                                               # 2
        "\n"                                                                    # 3
        "def build(n):\n"                                                       # 4
        "    layers = []\n"                                                     # 5
        "    for _ in range(n):\n"                                              # 6
        "        layers.append(nn.Linear(4, 4))\n"                              # 7
        "    return nn.Sequential(*layers)\n"                                   # 8
        "\n"                                                                    # 9
        "model = build(6).cuda()\n"                                             # 10
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"                   # 11
        "for _ in range(50):\n"                                                 # 12
        "    model(torch.randn(2, 4, device='cuda')).sum().backward()\n"        # 13
        "    opt.step()\n"                                                      # 14
        "for _ in range(10):\n"                                                 # 15
        "    last = model(torch.randn(2, 4, device='cuda'))\n"                  # 16
        "again = build(6).cuda()\n"                                             # 17
        "again.load_state_dict(model.state_dict())\n"                           # 18
        "print(last.shape)\n")                                                  # 19
    report = run(str(train))
    assert report.findings == ()  # the copy has its six layers: load_state_dict found every key
    notes = "\n".join(report.notes)
    assert f"{train}:15-16 (`for _ in range(10):`) ended early: {10 - MAX_BATCHES} iterations skipped" \
        in notes
    assert f"{train}:6-7" not in notes


def test_a_training_loop_the_script_does_not_own_ends_through_its_dataloader() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    seen: list[int] = []

    def fit(model: torch.nn.Module, loader: DataLoader) -> None:  # a library's loop: not rewritten
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            for (x,) in loader:
                model(x.cuda()).sum().backward()
                opt.step()

    def main() -> None:
        model = torch.nn.Linear(4, 1).cuda()
        fit(model, DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4))
        seen.append(1)
        model(torch.randn(2, 4))  # after training: a CPU input

    report = run(main)
    # the crash, and the CPU input's creation at its line (the line to edit)
    assert sorted(f.code for f in report.findings) == ["PC201", "PC202"] and seen == [1]
    assert any("the iterators of the DataLoader iterated at" in n for n in report.notes)


def test_coverage_names_the_blocks_that_never_ran_and_why(tmp_path: Path) -> None:
    train = tmp_path / "train.py"
    train.write_text(
        "import torch\n"                                                        # 1
        "\n"                                                                    # 2
        "def unused():\n"                                                       # 3
        "    return 1\n"                                                        # 4
        "\n"                                                                    # 5
        "model = torch.nn.Linear(4, 1).cuda()\n"                                # 6
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"                   # 7
        "for epoch in range(3):\n"                                              # 8
        "    model(torch.randn(2, 4, device='cuda')).sum().backward()\n"        # 9
        "    opt.step()\n"                                                      # 10
        "    if epoch % 10 == 9:\n"                                             # 11
        "        print('checkpoint')\n"                                         # 12
        "try:\n"                                                                # 13
        "    done = True\n"                                                     # 14
        "except ValueError:\n"                                                  # 15
        "    done = False\n")                                                   # 16
    report = run(str(train), steps=0)
    coverage = report.coverage
    assert coverage is not None
    assert (coverage.lines, coverage.run, coverage.not_run) == (13, 10, (4, 12, 16))
    assert coverage.blocks == ("line 4 (unused() never called)", "line 12 (`if epoch % 10 == 9` never true)",
                               "line 16 (`except ValueError:` never caught)")
    assert coverage.line().startswith(f"checked 10 of 13 lines of {train}; never ran: line 4")


def test_the_table_and_the_json_carry_the_coverage() -> None:
    path = script(FAST / "validation_fixed.py")
    table = CliRunner().invoke(app, ["run", path])
    assert f"checked 27 of 27 lines of {path}" in table.output
    result = CliRunner().invoke(app, ["run", "--format", "json", path])
    data = json.loads(result.stdout)
    validate_report(data)
    assert data["coverage"] == {"file": path, "lines": 27, "lines_run": 27, "lines_not_run": [],
                                "blocks_not_run": []}


def test_the_rewrite_keeps_every_line_number() -> None:
    import dis

    path = str(FAST / "testpass_buggy.py")
    compiled = compile_script(path)
    assert compiled is not None
    code, sites = compiled
    assert [(s.kind, s.first, s.last) for s in sites] == [("while", 14, 21), ("for", 15, 21)]
    with open(path, encoding="utf-8") as handle:
        plain = compile(handle.read(), path, "exec")
    lines = {i.positions.lineno for i in dis.get_instructions(code) if i.positions and i.positions.lineno}
    assert lines <= {i.positions.lineno for i in dis.get_instructions(plain)
                     if i.positions and i.positions.lineno} | {14, 15}


def test_every_rank_fast_forwards_to_its_metric_reduction_after_the_loop() -> None:
    report = run(script(FIXTURES / "ranks" / "metric_after_loop_buggy.py"), nproc_per_node=2)
    [reduce] = [f for f in report.findings if f.severity is not Severity.INFO]
    assert (reduce.code, reduce.source.rsplit(":", 1)[1], dict(reduce.details)["ranks"]) == (
        "PC402", "31", "0-1")
    assert report.coverage is not None and report.coverage.run == report.coverage.lines
    fixed = run(script(FIXTURES / "ranks" / "metric_after_loop_fixed.py"), nproc_per_node=2)
    assert failing(fixed) == []


_LOOPS = '''
out = []
for i in range(5):
    if i == 3:
        break
    out.append(i)
else:
    out.append("no break")
for i in range(2):
    continue
else:
    out.append("for else")
n = 0
while (m := n + 1) < 4:
    n = m
else:
    out.append(("while else", n))
while True:
    n += 1
    if n > 6:
        break


class Table:
    rows = []
    for k in range(3):
        rows.append(k * k)
    while len(rows) < 5:
        rows.append(0)


def gen():
    for x in "ab":
        yield x
    k = 0
    while k < 2:
        yield k
        k += 1


out += [n, Table.rows, list(gen()), [j for j in range(3) for _ in range(2)]]
'''


def test_the_rewritten_loops_behave_as_the_plain_ones_until_the_budget(tmp_path: Path) -> None:
    from placecheck.run.fastforward import FastForward

    path = tmp_path / "loops.py"
    path.write_text(_LOOPS)
    plain: dict[str, object] = {}
    exec(compile(_LOOPS, str(path), "exec"), plain)
    ff = FastForward(str(path))
    assert ff.code is not None and len(ff.sites) == 8
    rewritten: dict[str, object] = dict(ff.script_globals())
    exec(ff.code, rewritten)
    assert rewritten["out"] == plain["out"] == [0, 1, 2, "for else", ("while else", 3), 7, [0, 1, 4, 0, 0],
                                                ["a", "b", 0, 1], [0, 0, 1, 1, 2, 2]]


def test_the_epoch_loop_passes_over_the_epochs_between_to_reach_each_guarded_block() -> None:
    report = run(script(FAST / "sparse_fixed.py"))
    path = script(FAST / "sparse_fixed.py")
    # epoch 0 spends the budget; then epoch 9 (validation) and epoch 29 (the test pass), one step each
    assert dict(report.stats)["optimizer_steps"] == 4
    assert (f"the loop at {path}:20-31 (`for epoch in range(config.epochs):`) ended early: 27 iterations "
            "skipped, unchecked (27 iterations passed over to reach `if epoch % config.val_every == "
            "config.val_every - 1` and `if epoch == config.epochs - 1`)") in " ".join(report.notes)


def test_a_guard_that_calls_is_never_evaluated_ahead(tmp_path: Path) -> None:
    source = tmp_path / "calls.py"
    source.write_text("for epoch in range(30):\n"
                      "    if should_validate(epoch):\n"
                      "        pass\n"
                      "    if epoch % 10 == 9:\n"
                      "        pass\n")
    compiled = compile_script(str(source))
    assert compiled is not None
    [site] = compiled[1]
    assert [guard.text for guard in site.guards] == ["epoch % 10 == 9"]


def test_a_guard_is_read_ahead_on_plain_values_only_never_calling_the_script_s_code(tmp_path: Path) -> None:
    # `probe > 100` would call the script's __gt__ (a tensor's would be a torch op, a host sync at the
    # guard's line): never read ahead, so the loop runs on an iteration at a time for it; `epoch % 20 == 19`
    # is read ahead and reached at once
    source = tmp_path / "probe.py"
    source.write_text(
        "import sys\n"
        "import torch\n"
        "model = torch.nn.Linear(4, 2).to('cuda')\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "class Probe:\n"
        "    calls = 0\n"
        "    def __gt__(self, other):\n"
        "        Probe.calls += 1\n"
        "        return False\n"
        "probe, epochs = Probe(), []\n"
        "for epoch in range(50):\n"
        "    for _ in range(3):\n"
        "        optimizer.zero_grad()\n"
        "        model(torch.randn(8, 4, device='cuda')).sum().backward()\n"
        "        optimizer.step()\n"
        "    epochs.append(epoch)\n"
        "    if probe > 100:\n"
        "        print('never')\n"
        "    if epoch % 20 == 19:\n"
        "        pass\n"
        f"open({str(tmp_path / 'out.txt')!r}, 'w').write(f'{{Probe.calls}} {{epochs}}')\n")
    report = run(script(source), keep_scratch=True)
    # epoch 0 spends the budget; 19 is reached by reading its guard ahead; 20 and 21 try `probe > 100`
    try:  # written in the scratch area (placecheck run never changes the user's files)
        assert kept(report.writes or (), tmp_path / "out.txt").read_text() == "4 [0, 19, 20, 21]"
    finally:
        remove_kept(report.writes or ())
