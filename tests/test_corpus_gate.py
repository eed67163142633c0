"""The corpus gate's own parts (``tests/corpus_gate.py``, ``make test-corpus``): each mutation
transform on a small snippet gives the expected code at the expected line, the README's table is read
into the commands it gives, and a mutant counts as found only by a new finding at its lines."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest.importorskip("libcst")

import corpus_gate as gate  # tests/ is on sys.path (conftest), as cli_runner is


def _only(mutants: list[gate.Mutant]) -> gate.Mutant:
    assert len(mutants) == 1, [m.said for m in mutants]
    return mutants[0]


SNIPPET = textwrap.dedent('''\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch import optim

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.register_buffer("scale", torch.ones(2))

    model = Net().to(device)
    model.to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.BCELoss()
    moved = nn.BCELoss().to(device)
    for x, y in loader:
        x, y = x.to(device), y.cuda()
        noise = torch.randn(2, 4,
                            device=device)
        loss = F.nll_loss(model(x) + noise, y)
        out = model(x)
        loss = F.nll_loss(out, y)
''')


def _line_of(code: str, text: str) -> int:
    return next(i + 1 for i, line in enumerate(code.splitlines()) if text in line)


def _changed(mutant: gate.Mutant) -> list[tuple[str, str]]:
    """The lines the mutant changed, (before, after); every other line is kept where it was."""
    before, after = SNIPPET.splitlines(), mutant.code.splitlines()
    assert len(before) == len(after)
    return [(b, a) for b, a in zip(before, after, strict=True) if b != a]


def test_drop_move_removes_one_used_move_at_a_time_never_a_statement_of_its_own() -> None:
    mutants = gate.drop_move(SNIPPET)
    # Net().to(device) has a call as receiver, model.to(device) on its own moves in place, the loss's
    # .to() is a call's: only the batch's two moves, each in a mutant of its own
    assert [m.said for m in mutants] == ["x.to(device) -> x", "y.cuda() -> y"]
    line = _line_of(SNIPPET, "x, y = x.to(device)")
    assert [(m.line, m.last) for m in mutants] == [(line, line)] * 2
    assert _changed(mutants[0]) == [("    x, y = x.to(device), y.cuda()", "    x, y = x, y.cuda()")]
    assert _changed(mutants[1]) == [("    x, y = x.to(device), y.cuda()", "    x, y = x.to(device), y")]
    assert mutants[0].names == {"x", "y"}  # what it binds and reads: `model(x)` later is its line too


def test_drop_device_keeps_the_call_and_its_lines() -> None:
    mutant = _only(gate.drop_device(SNIPPET))
    first = _line_of(SNIPPET, "noise = torch.randn(2, 4,")
    assert (mutant.line, mutant.last, mutant.names) == (first, first + 1, {"noise"})
    assert _changed(mutant) == [("                        device=device)", "                        )")]
    assert "torch.randn(2, 4,\n                        )" in mutant.code
    compile(mutant.code, "mutant.py", "exec")
    # on one line, no comma is left behind
    one = _only(gate.drop_device("import torch\nx = torch.full((2,), 1.0, device=d, dtype=t)\n"))
    assert one.code == "import torch\nx = torch.full((2,), 1.0, dtype=t)\n"
    last = _only(gate.drop_device("import torch\nx = torch.randn(2, 4, device=d)\n"))
    assert last.code == "import torch\nx = torch.randn(2, 4)\n"
    assert gate.drop_device("import torch\nx = torch.randn(2, 4)\ny = other.randn(2, device=d)\n") == []


def test_plain_buffer_makes_the_buffer_a_plain_attribute_on_its_line() -> None:
    mutant = _only(gate.plain_buffer(SNIPPET))
    assert mutant.line == _line_of(SNIPPET, "register_buffer")
    assert _changed(mutant) == [('        self.register_buffer("scale", torch.ones(2))',
                                 "        self.scale = torch.ones(2)")]
    assert mutant.names == {"self.scale"}


def test_cpu_loss_weight_on_unmoved_loss_modules_and_functional_losses_of_a_name() -> None:
    mutants = gate.cpu_loss_weight(SNIPPET)
    # nn.BCELoss().to(device) moves its weight buffer; F.nll_loss(model(x) + noise, y) has no name to
    # size the weight by: neither is a site
    assert [m.said for m in mutants] == [
        "nn.BCELoss() -> nn.BCELoss(weight=torch.ones(1))",
        "F.nll_loss(out, y) -> F.nll_loss(out, y, weight=torch.ones(out.size(1)))"]
    assert _changed(mutants[0]) == [("criterion = nn.BCELoss()",
                                     "criterion = nn.BCELoss(weight=torch.ones(1))")]
    assert mutants[0].names == {"criterion"}
    assert mutants[1].line == _line_of(SNIPPET, "loss = F.nll_loss(out, y)")
    # a file that does not import torch by its name gets no torch.ones
    assert gate.cpu_loss_weight(SNIPPET.replace("import torch\n", "import torch as T\n", 1)) == []


def test_stale_optimizer_recreates_the_model_on_the_optimizers_line() -> None:
    mutant = _only(gate.stale_optimizer(SNIPPET))
    assert mutant.line == _line_of(SNIPPET, "optimizer = optim.SGD")
    assert _changed(mutant) == [("optimizer = optim.SGD(model.parameters(), lr=0.1)",
                                 "optimizer = optim.SGD(model.parameters(), lr=0.1); "
                                 "model = Net().to(device)")]
    # no earlier statement of the block made the model: no site
    assert gate.stale_optimizer("optimizer = optim.SGD(model.parameters(), lr=0.1)\n") == []


def test_every_transform_is_in_the_table_and_keeps_every_line_where_it_was() -> None:
    assert set(gate.TRANSFORMS) == {"drop-move", "drop-device", "plain-buffer", "cpu-loss-weight",
                                    "stale-optimizer"}
    for transform in gate.TRANSFORMS.values():
        for mutant in transform(SNIPPET):
            assert len(mutant.code.splitlines()) == len(SNIPPET.splitlines()) and mutant.code != SNIPPET
            compile(mutant.code, "mutant.py", "exec")


def test_a_site_counts_when_the_run_reached_its_statement_and_a_later_use() -> None:
    noise = _only(gate.drop_device(SNIPPET))  # noise = torch.randn(..., device=device), used a line later
    used = _line_of(SNIPPET, "F.nll_loss(model(x) + noise, y)")
    assert gate.reached(noise, SNIPPET, {noise.line, used})
    assert not gate.reached(noise, SNIPPET, {noise.line})  # made, never used in the part that ran
    assert not gate.reached(noise, SNIPPET, {used})
    stale = _only(gate.stale_optimizer(SNIPPET))  # binds nothing it changes: its line is enough
    assert gate.reached(stale, SNIPPET, {stale.line})


def test_sample_is_deterministic_and_spread() -> None:
    assert gate.sample(list(range(10)), 3) == [0, 4, 9] == gate.sample(list(range(10)), 3)
    assert gate.sample([1, 2], 3) == [1, 2] and gate.sample(list(range(5)), 0) == list(range(5))


README = textwrap.dedent('''\
    | program | command, from its folder |
    | --- | --- |
    | word_language_model (LSTM) | `placecheck run main.py -- --data ./d --epochs 1` |
    | time_sequence_prediction | `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 placecheck run train.py -- --steps 1` |
    | ddp | `placecheck run --nproc-per-node 2 multigpu_torchrun.py -- 1 1 --batch_size 32` |
    | regression | `placecheck run main.py` |
''')


def test_the_readme_table_gives_each_programs_command() -> None:
    lstm, tsp, ddp, regression = gate.parse_readme(README)
    assert (lstm.name, lstm.folder, lstm.script, lstm.args) == (
        "word_language_model (LSTM)", "word_language_model", "main.py", ("--data", "./d", "--epochs", "1"))
    assert tsp.env == (("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1"),) and tsp.args == ("--steps", "1")
    assert ddp.options == ("--nproc-per-node", "2") and ddp.script == "multigpu_torchrun.py"
    assert ddp.command() == ["run", "--steps", "2", "--format", "json", "--nproc-per-node", "2",
                             "multigpu_torchrun.py", "--", "1", "1", "--batch_size", "32"]
    assert regression.args == () and regression.options == ()


def _run(*findings: dict[str, str]) -> gate.Run:
    return gate.Run(1, {"findings": [{"severity": "error", **f} for f in findings]}, "", 0.0)


def test_a_mutant_is_found_only_by_a_new_finding_at_its_lines() -> None:
    mutant = gate.drop_move(SNIPPET)[0]  # x.to(device) -> x
    clean = _run({"code": "PC308", "source": "train.py:14"})
    loop = _line_of(SNIPPET, "for x, y in loader")
    used = _line_of(SNIPPET, "out = model(x)")
    # the finding in the model's forward, its origin the loader line that bound `x`
    assert gate.found(mutant, "train.py", SNIPPET, clean,
                      _run({"code": "PC201", "source": "model.py:9", "origin": f"train.py:{loop}"}))
    def found(**finding: str) -> bool:
        return gate.found(mutant, "train.py", SNIPPET, clean, _run(finding))

    assert found(code="PC201", source=f"dir/train.py:{used}")
    # another file's line, an unrelated line, a finding the clean program has too: not found
    assert not found(code="PC201", source=f"model.py:{used}")
    assert not found(code="PC201", source="train.py:2")
    assert not found(code="PC308", source="train.py:14")
    info = gate.Run(0, {"findings": [{"severity": "info", "code": "PC204", "source": f"train.py:{used}"}]},
                    "", 0)
    assert not gate.found(mutant, "train.py", SNIPPET, clean, info)


def test_an_equivalent_mutant_must_stay_clean() -> None:
    clean = _run({"code": "PC308", "source": "train.py:14"})
    assert gate.new_failing(clean, _run({"code": "PC308", "source": "train.py:14"})) == []
    new = {"code": "PC201", "source": "train.py:9"}
    assert gate.new_failing(clean, _run(new)) == [{"severity": "error", **new}]
    # each equivalent mutant names its program, file, line and transform, and says why it is no bug
    for (folder, file, line, transform), why in gate.EQUIVALENT.items():
        assert transform in gate.TRANSFORMS and file.endswith(".py") and line > 0 and folder and why


def test_no_corpus_is_a_skipped_line_and_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gate.main(["--corpus", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out.startswith("test-corpus: SKIPPED: no corpus at ")


def test_each_engine_is_named_with_the_options_the_gate_gives_a_program_under_it() -> None:
    *_, regression = gate.parse_readme(README)
    assert regression.command(engine="tagged") == ["run", "--steps", "2", "--format", "json",
                                                   "--engine", "tagged", "main.py", "--"]
    assert regression.command(engine="fake")[5:8] == ["--engine", "fake", "--timeout"]
    # every entry says why, for an engine the gate runs
    for (folder, engine), (options, why) in gate.ENGINE_OPTIONS.items():
        assert engine in gate.ENGINES and folder and options and why


def test_an_engine_placecheck_refuses_for_a_program_is_skipped_with_its_words() -> None:
    said = ("placecheck: error: --engine fake and --nproc-per-node cannot be combined yet: "
            "DistributedDataParallel reads ...")
    refused = gate.Run(2, None, said + "\n", 0.0)
    skipped, problems = gate.check_clean(gate.Program("ddp", "ddp", "x.py"), refused)
    assert skipped.startswith("placecheck refuses it: --engine fake and --nproc-per-node") and problems == []
    # any other usage error is a failure, not a skip
    skipped, problems = gate.check_clean(gate.Program("ddp", "ddp", "x.py"),
                                         gate.Run(2, None, "placecheck: error: no such option\n", 0.0))
    assert skipped == "" and problems
