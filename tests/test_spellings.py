"""The spellings matrix: every way PyTorch code places a tensor or a module, through the one reading of a
placement call (:mod:`placecheck.engines.calls`), in ``run`` and ``audit``, under both simulating engines.

GENERATED, not hand-listed: each spelling is a few lines of code put into one program template; the
matrix crosses the spellings with {fake, tagged}. For each, the correct program gives no finding at all
and its twin with the placement taken out gives the expected finding at the expected line (the line
marked ``# <-`` in the template). ``run`` programs are whole training scripts; ``audit`` spellings
live in a model's ``__init__``/``forward``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import placecheck
from placecheck.basics.values import Device
from placecheck.engines.calls import Kind, read_module_move, read_placement, takes_device
from placecheck.run import run

pytestmark = [pytest.mark.compat]

ENGINES = [
    pytest.param("fake", marks=pytest.mark.skipif(
        torch.version.cuda is None, reason="run refuses --engine fake on a CPU-only torch build")),
    "tagged",
]
AUDIT_ENGINES = ["fake", "tagged"]
"""audit's fake engine runs on a CPU-only build too (its moves made by hand there: engine.FakeCuda)."""


# -- run: whole training scripts -------------------------------------------------------------------

RUN_TEMPLATE = """\
import copy
import torch
import torch.nn as nn
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
{prelude}
{build}
{model}
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for _ in range(2):
    {batch}
    loss = {loss}  # <-
    opt.zero_grad()
    loss.backward()
    opt.step()
{after}
"""
NET = "net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))"
RUN_FIELDS = {"prelude": "", "build": NET, "model": "net.to(device)",
              "batch": "x = torch.randn(5, 4, device=device)", "loss": "net(x).sum()", "after": ""}


@dataclasses.dataclass(frozen=True)
class Spelling:
    """One placement spelling: the template's fields in the correct program, and what the twin with the
    placement taken out changes; ``code``: the twin's finding at the marked line."""

    name: str
    correct: dict[str, str]
    buggy: dict[str, str]
    expected: tuple[tuple[str, str], ...] = (("PC201", "mark"),)
    """The twin's findings: (code, where): ``mark``, the template's marked line, or a field's line."""


def _model(line: str) -> Spelling:
    """A ``Module`` placement: taken out, the parameters stay on the CPU (the op mixing them: PC201)."""
    return Spelling(f"module: {line}", {"model": line}, {"model": "net.train()"})


def _batch(line: str) -> Spelling:
    """A batch placement: taken out, the batch stays on the CPU. The run names the line to edit as audit
    names a forward's creation: PC202 at ``torch.randn``'s line (the cause), beside the op it crashed."""
    return Spelling(f"batch: {line}", {"batch": line}, {"batch": "x = torch.randn(5, 4)"},
                    (("PC201", "mark"), ("PC202", "batch")))


RUN_SPELLINGS = [
    *(_model(line) for line in (
        "net.to(device)", "net.to(device=device)", "net = net.to(device=device)",
        "net.to(dtype=torch.float32, device=device)", "net.to(device, torch.float32)", "net.to(device=0)",
        "net.to(0)", 'net.to(device="cuda:0")', 'net.to("cuda")', 'net.to(torch.device("cuda", 0))',
        "net.to(device, non_blocking=True)", "net.to(torch.empty(0, device=device))",
        "net.to(memory_format=torch.channels_last).to(device=device)", "net.cuda()", "net.cuda(0)",
        "net.cuda(device=0)", "net.cuda(device)", "net.to_empty(device=device)",
        "torch.cuda.set_device(0); net.cuda()", "net = net.half().to(device).float()",
        "net.load_state_dict({k: v.to(device) for k, v in net.state_dict().items()}, assign=True)",
        "net.to_empty(device=device).apply(lambda m: getattr(m, 'reset_parameters', lambda: None)())")),
    *(_batch(line) for line in (
        "x = torch.randn(5, 4).to(device)", "x = torch.randn(5, 4).to(device=device)",
        "x = torch.randn(5, 4).to(device, non_blocking=True)", "x = torch.randn(5, 4).to(0)",
        'x = torch.randn(5, 4).to("cuda:0", torch.float32, False, True)',
        "x = torch.randn(5, 4).to(dtype=torch.float32, device=device, copy=True)",
        "x = torch.randn(5, 4).to(next(net.parameters()))", "x = torch.randn(5, 4).cuda()",
        "x = torch.randn(5, 4).cuda(device)", "x = torch.randn(5, 4).type(torch.cuda.FloatTensor)",
        'x = torch.randn(5, 4).type("torch.cuda.FloatTensor")',
        "x = torch.randn(5, 4).type(net[0].weight.type())",
        "x = torch.randn(5, 4).type_as(net[0].weight)", "x = torch.randn(5, 4, device=0)",
        'x = torch.randn(5, 4, device="cuda")', "x = torch.rand_like(torch.empty(5, 4, device=device))",
        "x = net[0].weight.new_empty(5, 4).normal_()", "x = net[0].weight.new_tensor([[1.0] * 4] * 5)",
        "x = torch.tensor([[1.0] * 4] * 5, device=device)",
        "x = torch.as_tensor([[1.0] * 4] * 5, device=device)",
        "x = torch.asarray([[1.0] * 4] * 5, device=device)", "x = torch.cuda.FloatTensor(5, 4).normal_()",
        # (non_blocking: a blocking copy_ between host and device is a host sync, PC204 info)
        "x = torch.zeros(5, 4, device=device).copy_(torch.randn(5, 4), non_blocking=True)",
        "x = torch.empty(1, device=device); x.resize_(torch.Size([5, 4])).copy_(torch.randn(5, 4), True)")),
    Spelling("batch: with torch.device(device)",
             {"batch": "with torch.device(device):\n        x = torch.randn(5, 4)"},
             {"batch": "with torch.device('cpu'):\n        x = torch.randn(5, 4)"}),
    Spelling("batch: with torch.cuda.device(0)",
             {"batch": "with torch.cuda.device(0):\n        x = torch.randn(5, 4).cuda()"},
             {"batch": "with torch.cuda.device(0):\n        x = torch.randn(5, 4)"},
             (("PC201", "mark"), ("PC202", "batch:1"))),
    Spelling("module built in with torch.device(device)",
             {"build": f"with torch.device(device):\n    {NET}", "model": ""}, {"build": NET}),
    Spelling("torch.set_default_device(device)",
             {"prelude": "torch.set_default_device(device)", "model": "", "batch": "x = torch.randn(5, 4)"},
             {"prelude": "", "batch": "x = torch.randn(5, 4, device=device)"}),
    *(Spelling(f"torch.load(map_location={where})", {
        "prelude": 'torch.save(torch.randn(5, 4), __file__ + ".pt")',
        "batch": f'x = torch.load(__file__ + ".pt", map_location={where})'},
        {"batch": 'x = torch.load(__file__ + ".pt", map_location="cpu")'})
      for where in ('"cuda:0"', "device", '{"cpu": "cuda:0"}', "lambda storage, location: storage.cuda(0)",
                    "lambda storage, location: storage.cuda()")),
    Spelling("copy.deepcopy(model) after the move",
             {"model": "net.to(device)\nema = copy.deepcopy(net)", "loss": "net(x).sum() + ema(x).sum()"},
             {"model": "ema = copy.deepcopy(net)\nnet.to(device)", "loss": "net(x).sum() + ema(x).sum()"}),
    Spelling("copy.deepcopy(model.state_dict()) loaded back",
             {"after": "best = copy.deepcopy(net.state_dict())\nnet.load_state_dict(best)\nnet(x)"},
             {"model": "net.train()", "after": "best = copy.deepcopy(net.state_dict())"}),
    Spelling("copy.deepcopy of a tensor and of an optimizer",
             {"batch": "x = copy.deepcopy(torch.randn(5, 4, device=device))",
              "after": "saved = copy.deepcopy(opt)\nsaved.step()"},
             {"batch": "x = copy.deepcopy(torch.randn(5, 4))"}, (("PC201", "mark"), ("PC202", "batch"))),
]


def _program(fields: dict[str, str]) -> str:
    values = {**RUN_FIELDS, **fields}
    text = RUN_TEMPLATE.format(**values)
    return "\n".join(line for line in text.splitlines() if line.strip()) + "\n"


def _marked_line(text: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith("# <-"))


def _expected(spelling: Spelling, text: str, fields: dict[str, str], name: str) -> set[tuple[str, str]]:
    """The twin's expected findings as (code, ``file:line``)."""
    lines = text.splitlines()
    found = set()
    for code, where in spelling.expected:
        if where == "mark":
            line = _marked_line(text)
        else:  # a field's first line, or its line n (``make:1``)
            field, _, n = where.partition(":")
            wanted = fields[field].splitlines()[int(n or 0)].strip()
            line = next(i for i, text_line in enumerate(lines, 1) if text_line.strip() == wanted)
        found.add((code, f"{name}:{line}"))
    return found


def _found(report: Any) -> set[tuple[str, str]]:
    return {(f.code, f.source.replace(os.sep, "/").rpartition("/")[2]) for f in report.findings}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spellings")


@functools.cache
def _ran(folder: str, index: int, variant: str, engine: str) -> tuple[Any, int, str]:
    """One program of the matrix run once (the correct and buggy twins, per engine)."""
    spelling = RUN_SPELLINGS[index]
    fields = spelling.correct if variant == "correct" else {**spelling.correct, **spelling.buggy}
    text = _program(fields)
    path = Path(folder) / f"spelling_{index}_{variant}.py"
    path.write_text(text, encoding="utf-8")
    report = run(os.path.relpath(path), engine=engine, steps=0)  # to its end: the lines after the loop too
    return report, _expected(spelling, text, fields, path.name), path.name


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("index", range(len(RUN_SPELLINGS)), ids=[s.name for s in RUN_SPELLINGS])
def test_run_correct_spelling_is_clean(programs: Path, index: int, engine: str) -> None:
    report, _, name = _ran(str(programs), index, "correct", engine)
    assert report.findings == (), [(f.code, f.source, f.message) for f in report.findings]
    assert not [n for n in report.notes if n.startswith("run: stopped at")], report.notes
    assert dict(report.stats)["optimizer_steps"] >= 2, (name, report.notes)
    assert any(n.startswith("run: the script ran to its end") for n in report.notes), report.notes


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("index", range(len(RUN_SPELLINGS)), ids=[s.name for s in RUN_SPELLINGS])
def test_run_spelling_taken_out_is_found_at_its_line(programs: Path, index: int, engine: str) -> None:
    report, expected, _ = _ran(str(programs), index, "buggy", engine)
    assert _found(report) == expected


# -- audit: placements inside a model ----------------------------------------------------------------

AUDIT_TEMPLATE = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        {init}

    def forward(self, x):
        {make}
        return self.lin(x) + {use}  # <-
"""
AUDIT_FIELDS = {"init": "", "make": "m = torch.ones(4, device=x.device)", "use": "m"}


MADE_ON_THE_CPU = (("PC201", "mark"), ("PC202", "make"))
"""A tensor made on the CPU in forward: the op mixing it (PC201), and the line that made it (PC202)."""


def _made(line: str, cpu: str = "m = torch.ones(4)") -> Spelling:
    """A tensor made in forward on the input's device: made without it, it is on the CPU."""
    return Spelling(f"forward: {line}", {"make": line}, {"make": cpu}, MADE_ON_THE_CPU)


LEFT_BEHIND = (("PC101", "init"), ("PC201", "mark"))
"""A plain tensor attribute ``.to()`` does not move: the walk (PC101 at its line) and the op (PC201)."""

AUDIT_SPELLINGS = [
    *(_made(line) for line in (
        "m = torch.ones(4, device=x.device)", "m = torch.zeros(4, dtype=x.dtype, device=x.device)",
        "m = torch.full((4,), 2.0, device=x.device)", "m = torch.arange(4, device=x.device).float()",
        "m = torch.linspace(0, 1, 4, device=x.device)", "m = torch.eye(4, device=x.device)[0]",
        "m = torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)", "m = torch.randn(4, device=x.device)",
        "m = torch.empty(4, device=x.device).fill_(1.0)", "m = torch.ones(4, device=x.get_device())",
        'm = torch.ones(4, device=f"cuda:{x.get_device()}")', "m = x.new_ones(4)", "m = x.new_zeros(4)",
        "m = x.new_full((4,), 3.0)", "m = x.new_empty(4).fill_(0.5)",
        "m = x.new_tensor([1.0, 2.0, 3.0, 4.0])",
        "m = torch.ones_like(x[0])", "m = torch.zeros_like(x[0], device=x.device)",
        "m = torch.full_like(x[0], 2.0)", "m = torch.ones(4, device=self.lin.weight.device)")),
    Spelling("forward: with torch.device(x.device)",
             {"make": "with torch.device(x.device):\n            m = torch.ones(4)"},
             {"make": "with torch.device('cpu'):\n            m = torch.ones(4)"},
             (("PC201", "mark"), ("PC202", "make:1"))),
    Spelling("__init__: register_buffer", {"init": 'self.register_buffer("m", torch.ones(4))', "make": "",
                                           "use": "self.m"},
             {"init": "self.m = torch.ones(4)", "make": "", "use": "self.m"}, LEFT_BEHIND),
    Spelling("__init__: register_buffer(persistent=False)",
             {"init": 'self.register_buffer("m", torch.ones(4), persistent=False)', "make": "",
              "use": "self.m"},
             {"init": "self.m = torch.ones(4)", "make": "", "use": "self.m"}, LEFT_BEHIND),
    Spelling("__init__: nn.Parameter", {"init": "self.m = nn.Parameter(torch.ones(4))", "make": "",
                                        "use": "self.m"},
             {"init": "self.m = [nn.Parameter(torch.ones(4))]", "make": "", "use": "self.m[0]"},
             (("PC103", "init"), ("PC201", "mark"))),
]


def _model_file(fields: dict[str, str]) -> str:
    values = {**AUDIT_FIELDS, **fields}
    text = AUDIT_TEMPLATE.format(**values)
    return "\n".join(line for line in text.splitlines() if line.strip() or line == "") + "\n"


@functools.cache
def _audited(folder: str, index: int, variant: str, engine: str) -> tuple[Any, int, str]:
    spelling = AUDIT_SPELLINGS[index]
    fields = spelling.correct if variant == "correct" else {**spelling.correct, **spelling.buggy}
    text = _model_file(fields)
    path = Path(folder) / f"model_{index}_{variant}.py"
    path.write_text(text, encoding="utf-8")
    name = f"_pc_spelling_{index}_{variant}"
    sys.modules.pop(name, None)
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    report = placecheck.audit(module.Model, "cuda", engine=engine, inputs=["float32[2,4]"])
    return report, _expected(spelling, text, fields, path.name), path.name


@pytest.mark.parametrize("engine", AUDIT_ENGINES)
@pytest.mark.parametrize("index", range(len(AUDIT_SPELLINGS)), ids=[s.name for s in AUDIT_SPELLINGS])
def test_audit_correct_spelling_is_clean(programs: Path, index: int, engine: str) -> None:
    report, _, _ = _audited(str(programs), index, "correct", engine)
    assert report.findings == (), [(f.code, f.source, f.message) for f in report.findings]


@pytest.mark.parametrize("engine", AUDIT_ENGINES)
@pytest.mark.parametrize("index", range(len(AUDIT_SPELLINGS)), ids=[s.name for s in AUDIT_SPELLINGS])
def test_audit_spelling_taken_out_is_found(programs: Path, index: int, engine: str) -> None:
    report, expected, _ = _audited(str(programs), index, "buggy", engine)
    assert _found(report) == expected


# -- the one reading itself ------------------------------------------------------------------------

_CUDA0, _CUDA1, _CPU = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")
_T = torch.zeros(2)
_HALF = torch.zeros(1, dtype=torch.half)

TENSOR_SPELLINGS = [
    ((torch.Tensor.to, (_T, "cuda"), {}), (_CUDA1, None, False)),  # "cuda": the current device (1 here)
    ((torch.Tensor.to, (_T,), {"device": "cuda:0"}), (_CUDA0, None, False)),
    ((torch.Tensor.to, (_T, 0), {}), (_CUDA0, None, False)),
    ((torch.Tensor.to, (_T,), {"device": 1}), (_CUDA1, None, False)),
    ((torch.Tensor.to, (_T, torch.device("cuda", 0), torch.half), {}), (_CUDA0, torch.half, False)),
    ((torch.Tensor.to, (_T, "cuda:0", torch.half, True, True), {}), (_CUDA0, torch.half, True)),
    ((torch.Tensor.to, (_T,), {"dtype": torch.half, "device": "cuda:0", "copy": True}),
     (_CUDA0, torch.half, True)),
    ((torch.Tensor.to, (_T, _HALF), {}), (_CPU, torch.half, False)),
    ((torch.Tensor.to, (_T,), {"tensor": _HALF}), (_CPU, torch.half, False)),
    ((torch.Tensor.to, (_T, torch.half), {}), (None, torch.half, False)),
    ((torch.Tensor.to, (_T,), {"memory_format": torch.contiguous_format}), (None, None, False)),
    ((torch.Tensor.cuda, (_T,), {}), (_CUDA1, None, False)),
    ((torch.Tensor.cuda, (_T, 0), {}), (_CUDA0, None, False)),
    ((torch.Tensor.cuda, (_T,), {"device": "cuda:0"}), (_CUDA0, None, False)),
    ((torch.Tensor.cpu, (_T,), {}), (_CPU, None, False)),
    ((torch.Tensor.type, (_T, "torch.cuda.HalfTensor"), {}), (_CUDA1, torch.half, False)),
    ((torch.Tensor.type, (_T, torch.cuda.DoubleTensor), {}), (_CUDA1, torch.double, False)),
    ((torch.Tensor.type, (_T, "torch.HalfTensor"), {}), (_CPU, torch.half, False)),
    ((torch.Tensor.type_as, (_T, _HALF), {}), (_CPU, torch.half, False)),
]


@pytest.mark.parametrize(("call", "expected"), TENSOR_SPELLINGS, ids=[
    f"{c[0].__name__}{c[1][1:]}{c[2]}" for c, _ in TENSOR_SPELLINGS])
def test_every_tensor_move_spelling_is_read_with_torchs_own_parser(call: Any, expected: Any) -> None:
    func, args, kwargs = call
    placement = read_placement(func, args, kwargs, current=1)
    assert placement is not None and placement.kind is Kind.MOVE and placement.source is _T
    assert (placement.device, placement.dtype, placement.copy) == expected


def test_a_refused_spelling_is_no_placement_and_torch_raises_its_own_error() -> None:
    assert read_placement(torch.Tensor.to, (_T, "cuda", "cpu"), {}) is None
    with pytest.raises(TypeError):
        _T.to("cpu", "cpu")  # type: ignore[call-overload]


@pytest.mark.parametrize(("func", "args", "kwargs", "device"), [
    (torch.nn.Module.to, (), {"device": "cuda"}, _CUDA1),
    (torch.nn.Module.to, (0,), {}, _CUDA0),
    (torch.nn.Module.to, (), {"dtype": torch.half, "device": 0}, _CUDA0),
    (torch.nn.Module.to, (torch.zeros(1, device="meta"),), {}, torch.device("meta")),
    (torch.nn.Module.to, (), {"memory_format": torch.channels_last}, None),
    (torch.nn.Module.cuda, (), {}, _CUDA1),
    (torch.nn.Module.cuda, (0,), {}, _CUDA0),
    (torch.nn.Module.cuda, (), {"device": torch.device("cuda", 0)}, _CUDA0),
    (torch.nn.Module.cpu, (), {}, _CPU),
])
def test_every_module_move_spelling(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                                    device: Any) -> None:
    net = torch.nn.Linear(1, 1)
    placement = read_module_move(func, (net, *args), kwargs, current=1)
    assert placement is not None and placement.kind is Kind.MODULE_MOVE and placement.device == device


def test_factories_are_read_from_the_schema_and_parse_to_is_not_one() -> None:
    for factory in (torch.zeros, torch.arange, torch.tensor, torch.asarray, torch.Tensor.new_zeros,
                    torch.zeros_like, torch.randint_like, torch.fft.fftfreq, torch.Tensor.new_tensor):
        assert takes_device(factory), factory
    for other in (torch._C._nn._parse_to, torch.nn.functional.linear, torch.add, torch.Tensor.to):
        assert not takes_device(other), other
    placement = read_placement(torch.zeros, (2,), {"device": 1})
    assert placement is not None and placement.kind is Kind.FACTORY and placement.device == _CUDA1
    parsed = read_placement(torch._C._nn._parse_to, (), {"device": "cuda"}, current=1)
    assert parsed is not None and parsed.kind is Kind.PARSE and parsed.device == _CUDA1


def test_in_place_writes_keep_the_holders_device() -> None:
    holder = torch.zeros(1, device="meta")
    for func in (torch.Tensor.copy_, torch.Tensor.resize_, torch.Tensor.set_):
        placement = read_placement(func, (holder, _T), {})
        assert placement is not None and placement.kind is Kind.INTO and placement.device == holder.device


@pytest.mark.parametrize("engine", ENGINES)
def test_a_default_device_the_script_sets_ends_with_its_run(engine: str) -> None:
    def main() -> None:
        torch.set_default_device("cuda")
        assert torch.zeros(1).device == torch.device("cuda", 0)
        assert torch.nn.Linear(2, 2).weight.device == torch.device("cuda", 0)

    report = run(main, engine=engine)
    assert report.findings == () and not [n for n in report.notes if n.startswith("run: stopped at")]
    assert torch.get_default_device() == _CPU and torch.zeros(1).device == _CPU


@pytest.mark.parametrize("engine", AUDIT_ENGINES)
def test_legacy_cuda_types_are_the_moves_they_stand_for(engine: str) -> None:
    from placecheck.engines.engine import EngineChoice, choose_engine

    original = torch.cuda.FloatTensor
    with choose_engine(Device("cuda", 0), EngineChoice(engine)).session():
        made = torch.cuda.FloatTensor(2, 3)
        assert made.device == _CUDA0 and made.shape == (2, 3) and made.dtype == torch.float32
        assert isinstance(made, torch.cuda.FloatTensor) and not isinstance(made, torch.cuda.HalfTensor)
        assert made.type() == "torch.cuda.FloatTensor" and torch.zeros(1).type() == "torch.FloatTensor"
        cast = torch.zeros(2).type("torch.cuda.HalfTensor")
        assert cast.device == _CUDA0 and cast.dtype == torch.half
        assert cast.type(torch.FloatTensor).device == _CPU
    assert torch.cuda.FloatTensor is original
