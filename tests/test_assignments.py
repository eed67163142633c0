"""Where each module attribute was assigned (placecheck.checks.assignments): the ``source`` of walk
findings."""

from __future__ import annotations

import gc
import inspect

import pytest
import torch
import torch.nn as nn

import placecheck
from placecheck.checks.assignments import Assignments, build_recorded, static_source
from placecheck.checks.walk import walk


def _line_of(text: str, obj: object) -> int:
    """The line number of the first line of ``obj``'s source containing ``text``."""
    lines, start = inspect.getsourcelines(obj)  # type: ignore[arg-type]
    return start + next(i for i, line in enumerate(lines) if text in line)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)
        self.mask = torch.ones(2)
        self.register_buffer("pos", torch.arange(2))


class _Stack(nn.Module):
    def __init__(self, depth: int = 24) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block() for _ in range(depth)])


def _with_extra() -> nn.Module:
    model = _Block()
    model.extra = torch.zeros(3)  # assigned by the factory, outside the class
    return model


def test_records_the_users_line_of_each_assignment() -> None:
    model, assignments = build_recorded(_Block)
    here = __file__.rsplit("/", 1)[-1]
    assert assignments.recorded(model, "mask").endswith(f"{here}:{_line_of('self.mask =', _Block)}")
    assert assignments.recorded(model, "pos").endswith(f"{here}:{_line_of('register_buffer', _Block)}")
    # nn.Linear assigns its weight in torch's code: the user's line is the one that built the layer
    assert assignments.recorded(model.proj, "weight").endswith(f"{here}:{_line_of('self.proj =', _Block)}")


def test_records_an_assignment_made_by_the_factory_which_the_class_source_cannot_know() -> None:
    model, assignments = build_recorded(_with_extra)
    assert assignments.source(model, "extra").endswith(f":{_line_of('model.extra =', _with_extra)}")
    assert static_source(_Block, "extra") == ""


def test_the_audit_reports_the_line_recorded_while_it_built_the_model() -> None:
    report = placecheck.audit(_with_extra, device="cuda", engine="fake", select=["PC101"], forward=False)
    sources = {f.where: f.source for f in report.findings}
    assert sources["extra"].endswith(f":{_line_of('model.extra =', _with_extra)}")
    assert sources["mask"].endswith(f":{_line_of('self.mask =', _Block)}")


def test_reads_the_class_source_for_a_model_built_before() -> None:
    assert static_source(_Block, "mask").endswith(f":{_line_of('self.mask =', _Block)}")
    assert static_source(_Block, "pos").endswith(f":{_line_of('register_buffer', _Block)}")
    assert static_source(nn.Linear, "weight") == ""  # torch's own classes are not the user's code
    assert Assignments().source(_Block(), "mask") == static_source(_Block, "mask")


def test_stops_at_the_build_and_names_the_library_line_when_the_factory_is_library_code() -> None:
    torchvision = pytest.importorskip("torchvision")
    model, assignments = build_recorded(torchvision.models.resnet18)
    source = assignments.recorded(model, "conv1")
    assert "torchvision" in source and __file__.rsplit("/", 1)[-1] not in source


def test_patches_are_removed_after_the_build_even_when_it_raises() -> None:
    setattr_before = nn.Module.__setattr__

    def failing() -> nn.Module:
        _Block()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_recorded(failing)
    assert nn.Module.__setattr__ is setattr_before
    assert nn.Module.register_buffer is getattr(nn.Module, "register_buffer")  # noqa: B009
    assert "build_recorded" not in repr(nn.Module.register_buffer)


def test_a_record_does_not_keep_its_module_alive_nor_answer_for_a_new_one() -> None:
    model, assignments = build_recorded(_Block)
    assert assignments.recorded(model, "mask")
    ref_count = len(assignments)
    del model
    gc.collect()
    other = _Block()  # built outside the recording: its id may be the dead one's
    assert assignments.recorded(other, "mask") == ""
    assert len(assignments) == ref_count


def test_every_instance_of_a_class_attribute_gets_the_same_line() -> None:
    # the grouping of findings into problems keys on this: 24 blocks, one line of code
    model, assignments = build_recorded(_Stack)
    masks = [f for f in walk(model, "cuda", assignments=assignments).findings if f.code == "PC101"]
    assert [f.where for f in masks] == [f"blocks.{i}.mask" for i in range(24)]
    assert {f.source for f in masks} == {assignments.recorded(model.blocks[0], "mask")}
    assert masks[0].source.endswith(f":{_line_of('self.mask =', _Block)}")
    assert {f.module for f in masks} == {f"blocks.{i}" for i in range(24)}  # attribute: where - module


def test_a_registered_parameter_off_the_device_points_at_the_line_that_built_its_layer() -> None:
    class SkipsMove(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
            return self  # the move never reaches inner

    report = placecheck.audit(SkipsMove, device="cuda", engine="fake", select=["PC104"], forward=False)
    assert report.findings
    assert all(f.source.endswith(f":{_line_of('self.inner =', SkipsMove)}") for f in report.findings)


class _Library(nn.Module):
    """Stands for an installed package's layer: built by a helper, several to a line."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(2, 2)
        self.second = nn.Linear(2, 2)


def _layers(n: int) -> list[nn.Module]:
    made = []
    for _ in range(n):
        made.append(_Library())  # MARK each layer
    return made


class _Many(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_layers(3))  # MARK layers
        self.one = torch.ones(2)  # MARK one
        self.two = torch.ones(2)  # MARK two
        self.size = 3  # a plain value: nothing a finding can be about


def test_each_assignment_gets_its_own_line_and_plain_values_are_not_recorded() -> None:
    model, assignments = build_recorded(_Many)
    here = __file__.rsplit("/", 1)[-1]
    for layer in model.layers:
        assert assignments.recorded(layer, "first").endswith(f"{here}:{_line_of('self.first =', _Library)}")
        assert assignments.recorded(layer.second, "weight").endswith(
            f"{here}:{_line_of('self.second =', _Library)}")
    assert assignments.recorded(model, "layers").endswith(f"{here}:{_line_of('MARK layers', _Many)}")
    assert assignments.recorded(model, "one").endswith(f"{here}:{_line_of('MARK one', _Many)}")
    assert assignments.recorded(model, "two").endswith(f"{here}:{_line_of('MARK two', _Many)}")
    assert assignments.recorded(model, "size") == ""
