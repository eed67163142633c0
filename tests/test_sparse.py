"""Sparse tensors and legacy aliasing constructors on the simulated GPU (issue 40 item 6, issue 42 item 12).

A GCN trained on a sparse adjacency (``to_sparse().to(device)``, ``torch.sparse_coo_tensor(...,
device=)``, CSR, ``torch.spmm``, ``@``) runs clean under both engines of ``placecheck run``, and its twin
with the adjacency left on the CPU is found at each sparse product; ``placecheck audit`` of a model
holding its adjacency as a sparse buffer is clean, and as a plain attribute is found. An old-style
script holding its inputs as ``Variable``s runs clean; its twin with a CPU ``Variable`` is found.

The verdicts of the sparse products with one operand on the CPU are a real GPU's: an NVIDIA H200, torch
2.11.0+cu130, 2026-11-27 (each raised "Expected all tensors to be on the same device", COO and CSR,
adjacency or dense operand on the CPU; all on CUDA ran). So are the devices of the aliasing constructors
(every one gave a ``cuda:0`` tensor of a ``cuda:0`` one).
"""

from __future__ import annotations

import importlib.util
import os
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from expect_comments import expected_at, serious
from torch.autograd import Variable

import placecheck
from placecheck.basics.values import Device
from placecheck.engines.engine import Engine
from placecheck.run import run

pytestmark = [pytest.mark.compat]

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PAIR_DIRECTORY = {"gcn": "sparse", "variable": "legacy"}
ENGINES = ("tagged", "fake")
PAIRS = ("gcn", "variable")


def script(name: str) -> str:
    """A fixture's path (``gcn_fixed.py``: in ``sparse/``) as the user would type it from the working
    directory."""
    return os.path.relpath(FIXTURES / PAIR_DIRECTORY[name.partition("_")[0]] / name)


def expected(name: str, command: str = "run") -> set[tuple[str, str]]:
    """(code, source) of every ``# expect PCnnn`` comment of fixture ``name`` (tests/expect_comments.py)."""
    return expected_at(script(name), command)


def graph_net(name: str) -> type:
    """``GraphNet`` of fixture ``name``, imported (its ``__main__`` part does not run)."""
    spec = importlib.util.spec_from_file_location(f"sparse_{name.removesuffix('.py')}", script(name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return typing.cast(type, module.GraphNet)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pair", PAIRS)
def test_the_correct_script_is_clean(pair: str, engine: str) -> None:
    report = run(script(f"{pair}_fixed.py"), engine=engine, steps=3)
    assert serious(report) == set()
    assert report.unfinished == "", report.notes  # ran through: no stop of the simulation either
    assert dict(report.stats)["optimizer_steps"] == 3


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pair", PAIRS)
def test_the_buggy_script_is_found_at_its_lines(pair: str, engine: str) -> None:
    report = run(script(f"{pair}_buggy.py"), engine=engine, steps=3)
    assert serious(report) == expected(f"{pair}_buggy.py")


@pytest.mark.parametrize("engine", ENGINES)
def test_audit_of_a_model_with_a_sparse_buffer_is_clean(engine: str) -> None:
    report = placecheck.audit(graph_net("gcn_fixed.py"), "cuda", engine=engine, inputs=["float32[20,8]"])
    assert serious(report) == set()
    assert not report.incomplete


@pytest.mark.parametrize("engine", ENGINES)
def test_audit_finds_a_sparse_attribute_left_on_the_cpu(engine: str) -> None:
    report = placecheck.audit(graph_net("gcn_buggy.py"), "cuda", engine=engine, inputs=["float32[20,8]"])
    found = {(code, source.removeprefix(os.path.abspath(".") + os.sep)) for code, source in serious(report)}
    assert found == expected("gcn_buggy.py", "audit")


SAVES = """
import sys, torch
sys.path.insert(0, {fixtures!r})
from gcn_fixed import GraphNet
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = GraphNet().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(2):
    loss = model(torch.randn(20, 8, device=device)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
torch.save(model.state_dict(), {path!r})
state = torch.load({path!r}, map_location=device)
assert (state["adj"].layout, state["adj"].device.type) == (torch.sparse_coo, device.type), state["adj"]
model.load_state_dict(state)
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_a_checkpoint_with_a_sparse_buffer_saves_and_loads_back_sparse(engine: str, tmp_path: Path) -> None:
    saving = tmp_path / "saves.py"
    saving.write_text(SAVES.format(fixtures=str(FIXTURES / "sparse"), path=str(tmp_path / "graph.pt")))
    report = run(str(saving), engine=engine, steps=2)
    assert report.unfinished == "", report.notes  # ran through: the assert on the loaded layout held
    assert serious(report) == set()


# -- the ops one by one, against the GPU's verdicts -----------------------------------------------------

def _session(engine: str) -> typing.ContextManager[object]:
    tagged = engine == "tagged"
    return Engine(name=engine, device=Device("cuda", 0), simulated=True, gpus=1, real_values=tagged).session()


LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "coo": lambda t: t.to_sparse(), "csr": lambda t: t.to_sparse_csr()}
PRODUCTS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sparse.mm": torch.sparse.mm, "spmm": torch.spmm, "mm": torch.mm, "matmul": lambda a, b: a @ b}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("product", PRODUCTS)
def test_a_sparse_product_raises_where_the_gpu_raises(engine: str, layout: str, product: str) -> None:
    make, op = LAYOUTS[layout], PRODUCTS[product]
    with _session(engine):
        adjacency = make(torch.eye(4))
        on_gpu = adjacency.to("cuda")
        assert (on_gpu.device.type, on_gpu.layout) == ("cuda", adjacency.layout)
        dense = torch.ones(4, 2)
        out = op(on_gpu, dense.cuda())  # all on the GPU: a dense result there
        assert (out.device.type, out.layout, tuple(out.shape)) == ("cuda", torch.strided, (4, 2))
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            op(adjacency, dense.cuda())  # the adjacency left on the CPU
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            op(on_gpu, dense)  # the dense operand left on the CPU


@pytest.mark.parametrize("engine", ENGINES)
def test_sparse_tensors_are_made_and_moved_on_the_gpu_as_there(engine: str) -> None:
    with _session(engine):
        indices, values = torch.tensor([[0, 1], [1, 0]]), torch.ones(2)
        made = {"sparse_coo_tensor(device=)": torch.sparse_coo_tensor(indices, values, (4, 4), device="cuda"),
                "cuda()": torch.eye(3).to_sparse().cuda(),
                "to_sparse() of a GPU tensor": torch.ones(3, 3, device="cuda").to_sparse(),
                "to_sparse_csr() of a GPU COO": torch.eye(3).to_sparse().cuda().to_sparse_csr(),
                "coalesce()": torch.eye(3).to_sparse().cuda().coalesce(),
                "times a 0-dim CPU scalar": torch.eye(3).to_sparse().cuda() * torch.tensor(2.0)}
        assert {name: t.device.type for name, t in made.items()} == dict.fromkeys(made, "cuda")
        assert torch.eye(3).to_sparse().cuda().cpu().device.type == "cpu"


def test_a_sparse_tensor_made_from_a_weight_passes_its_gradient_back() -> None:
    # the real-valued engine's backward (the fake engine's gives every leaf reached a fake gradient)
    with _session("tagged"):
        weight = torch.eye(3, device="cuda").requires_grad_()
        torch.sparse.mm(weight.to_sparse(), torch.ones(3, 2, device="cuda")).sum().backward()
        assert weight.grad is not None and weight.grad.device.type == "cuda"


# -- aliasing constructors keep their input's device ------------------------------------------------------

ALIASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Variable(t)": lambda t: Variable(t),
    "Variable(t, requires_grad=True)": lambda t: Variable(t, requires_grad=True),
    "torch.Tensor(t)": lambda t: torch.Tensor(t), "torch.tensor(t)": lambda t: torch.tensor(t),
    "torch.as_tensor(t)": torch.as_tensor, "torch.asarray(t)": torch.asarray, "nn.Parameter(t)": nn.Parameter,
    "t.detach()": lambda t: t.detach(), "t.data": lambda t: t.data, "t.view_as(t)": lambda t: t.view_as(t),
    "t.new(t)": lambda t: t.new(t), "Variable(t).data": lambda t: Variable(t).data}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("alias", ALIASES)
def test_an_aliasing_constructor_keeps_the_device(engine: str, alias: str) -> None:
    with _session(engine):
        t = torch.ones(2, 3, device="cuda")
        assert ALIASES[alias](t).device == torch.device("cuda:0")


def test_variable_and_tensor_are_torchs_own_again_after_the_session() -> None:
    with _session("tagged"):
        pass
    assert "__new__" not in vars(Variable) and "__new__" not in vars(torch.Tensor)
    assert Variable(torch.ones(2), requires_grad=True).requires_grad
