"""The one traversal of module state (placecheck.checks.state) that the walk, the copy and the meta build
share."""

from __future__ import annotations

import collections
import types
from dataclasses import dataclass
from typing import NamedTuple

import pytest
import torch
import torch.nn as nn

from placecheck.checks import state


class _Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


@dataclass(frozen=True)
class _Frozen:
    table: torch.Tensor


class _Slotted:
    __slots__ = ("value",)

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class _Everything(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)
        shared = torch.zeros(1)
        self.shared_a = shared
        self.pair = _Pair(torch.zeros(2), torch.zeros(3))
        self.tup = (shared, 1, "x")
        self.items = {"k": [torch.zeros(4)], "proxy": types.MappingProxyType({"p": torch.zeros(5)})}
        self.members = frozenset({torch.zeros(6)})
        self.queue = collections.deque([torch.zeros(7)])
        self.frozen = _Frozen(torch.zeros(8))
        self.slotted = _Slotted(torch.zeros(9))
        self.heads = [nn.Linear(2, 3)]
        loop: list[object] = []
        loop.append(loop)
        self.loop = loop


def test_internals_are_listed_once_and_include_the_rnn_weak_references() -> None:
    assert "_flat_weight_refs" in state.MODULE_INTERNALS
    assert {"_parameters", "_buffers", "_modules", "_forward_hooks"} <= state.MODULE_INTERNALS
    lstm = nn.LSTM(2, 2)
    names = [name for name, _ in state.attributes(lstm)]
    assert "_flat_weight_refs" not in names and "_parameters" not in names
    assert "_flat_weights" in names  # a plain list of the registered parameters: state the walk reads


def test_held_yields_every_tensor_and_module_with_its_holders() -> None:
    model = _Everything()
    seen: set[int] = set()
    found = {h.path: h for name, value in state.attributes(model)
             for h in state.held(value, name, "", name, seen)}
    assert set(found) == {
        "shared_a", "pair.first", "pair.second", "tup[0]", "items['k'][0]", "items['proxy']['p']",
        "members{0}", "queue[0]", "frozen.table", "slotted.value", "heads[0]"}
    deep = found["items['k'][0]"]
    assert (deep.owner, deep.attr) == ("", "items")
    assert deep.outer == state.Holder("dict", "dict") and deep.parent == state.Holder("list", "list")
    assert found["frozen.table"].parent == state.Holder("object", "_Frozen")
    assert found["pair.first"].outer == state.Holder("namedtuple", "_Pair")
    assert found["shared_a"].outer is None
    assert isinstance(found["heads[0]"].value, nn.Linear)


def test_held_stops_at_max_depth_and_names_the_path() -> None:
    value: object = torch.zeros(1)
    for _ in range(state.MAX_DEPTH + 3):
        value = [value]
    too_deep: list[str] = []
    assert list(state.held(value, "chain", "", "chain", set(), too_deep)) == []
    assert too_deep == ["chain" + "[0]" * state.MAX_DEPTH]


def test_reachable_tensors_sees_registered_plain_and_hook_derived_tensors_once() -> None:
    model = _Everything()
    with pytest.warns(FutureWarning):
        model.norm = nn.utils.weight_norm(nn.Linear(2, 2))  # .weight: a plain, non-leaf attribute
    found = list(state.reachable_tensors(model))
    ids = [id(t) for t in found]
    assert len(ids) == len(set(ids))
    expected = [model.proj.weight, model.shared_a, model.pair.second, model.items["k"][0],
                model.items["proxy"]["p"], model.frozen.table, model.slotted.value,
                model.heads[0].weight, model.norm.weight, model.norm.weight_v]
    assert all(any(t is e for t in found) for e in expected)


def test_replace_tensors_rebuilds_immutable_holders_and_keeps_sharing() -> None:
    model = _Everything()
    old_pair, old_items, old_members = model.pair, model.items, model.members
    new: dict[int, torch.Tensor] = {}

    def replace(t: torch.Tensor) -> torch.Tensor:
        made = new.setdefault(id(t), torch.full_like(t, 7.0))
        return nn.Parameter(made) if isinstance(t, nn.Parameter) else made

    state.replace_tensors(model, replace)
    assert all(bool((t == 7).all()) for t in state.reachable_tensors(model))
    assert model.items is old_items  # mutable: changed in place
    assert model.pair is not old_pair and isinstance(model.pair, _Pair)  # a namedtuple, rebuilt
    assert model.members is not old_members and isinstance(model.members, frozenset)
    assert isinstance(model.items["proxy"], types.MappingProxyType)
    assert model.tup[0] is model.shared_a and model.tup[1:] == (1, "x")
    assert isinstance(model.proj.weight, nn.Parameter)


class _Shared(nn.Module):
    """A module registered twice, a parameter tied between two modules, a None parameter and buffer."""

    def __init__(self) -> None:
        super().__init__()
        block = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        self.a = block
        self.b = nn.ModuleList([nn.Linear(2, 2), block])
        self.head = nn.Linear(2, 2, bias=False)
        self.head.weight = self.b[0].weight  # tied
        self.register_parameter("nothing", None)
        self.register_buffer("empty", None)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))


def test_registry_reads_what_named_modules_parameters_and_buffers_give_in_one_traversal() -> None:
    model = _Shared()
    registry = state.Registry.of(model)

    def named(pairs: object) -> list[tuple[str, int]]:
        return [(name, id(value)) for name, value in pairs]  # type: ignore[attr-defined]

    assert named(registry.modules) == named(model.named_modules())
    assert named(registry.parameters) == named(model.named_parameters())
    assert named(registry.buffers) == named(model.named_buffers())
    assert registry.ids() == {id(t) for t in (*model.parameters(), *model.buffers())}
    assert "head.weight" not in dict(registry.parameters)  # the tied weight under its first name only
