"""``placecheck.load``: TARGET parsing, resolution and construction, without the CLI."""

from __future__ import annotations

import pytest
import torch.nn as nn
from conftest import TESTS

from placecheck.errors import LoadError, UsageError
from placecheck.load import build, load_target, parse_kwargs, parse_value, resolve, split_target

TARGETS = TESTS / "fixtures" / "cli" / "targets.py"


@pytest.mark.parametrize("text, value", [
    ("10", 10), ("-3", -3), ("0.5", 0.5), ("1e-3", 1e-3), ("true", True), ("False", False),
    ("None", None), ("null", None), ("relu", "relu"), ("", ""), ("cuda:0", "cuda:0"),
])
def test_parse_value(text: str, value: object) -> None:
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_parse_kwargs_merges_json_and_args_args_win() -> None:
    assert parse_kwargs('{"a": 1, "b": [1, 2]}', ["a=2", "c=x=y"]) == {"a": 2, "b": [1, 2], "c": "x=y"}
    assert parse_kwargs(None) == {}


@pytest.mark.parametrize("bad", ["{", "nope", "[1]", "3", "null"])
def test_parse_kwargs_rejects_non_objects(bad: str) -> None:
    with pytest.raises(UsageError, match="--kwargs"):
        parse_kwargs(bad)


@pytest.mark.parametrize("bad", ["width", "=3", "two words=1"])
def test_parse_kwargs_rejects_bad_args(bad: str) -> None:
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_kwargs(None, [bad])


def test_split_target() -> None:
    assert split_target("a.b:C.d") == ("a.b", "C.d")
    assert split_target("C:/models/net.py:Net") == ("C:/models/net.py", "Net")
    for bad in ("a.b", ":C", "a.b:"):
        with pytest.raises(UsageError, match="MODULE:ATTR"):
            split_target(bad)


def test_resolve_module_and_file_targets() -> None:
    inner = resolve(f"{TARGETS}:Holder.inner")
    assert isinstance(inner, type) and issubclass(inner, nn.Module) and inner.__name__ == "Masked"
    assert resolve("torch.nn:Linear") is nn.Linear
    torchvision = pytest.importorskip("torchvision")  # absent on the CPU-only torch build
    assert resolve("torchvision.models:resnet18") is torchvision.models.resnet18


def test_resolve_missing_attribute_lists_candidates() -> None:
    with pytest.raises(LoadError, match=r"no attribute 'Nope'.*it has: .*NeedsArgs"):
        resolve(f"{TARGETS}:Nope")


def test_build_instance_class_and_factory() -> None:
    instance = resolve(f"{TARGETS}:instance")
    assert build(instance, "instance", {}) is instance
    built = build(resolve(f"{TARGETS}:NeedsArgs"), "NeedsArgs", {"width": 2, "depth": 3})
    assert len(built.layers) == 3
    assert isinstance(build(resolve(f"{TARGETS}:make_clean"), "make_clean", {}), nn.Sequential)


@pytest.mark.parametrize("attr, kwargs, pattern", [
    ("NOT_A_MODEL", {}, "is a int, not an nn.Module"),
    ("NotAModule", {}, "not an nn.Module subclass"),
    ("NeedsArgs", {}, "needs arguments that were not given: width, depth"),
    ("make_clean", {"height": 1}, "takes no argument 'height'; it accepts: width"),
    ("returns_dict", {}, "returned a dict, not an nn.Module"),
    ("Raises", {}, "ValueError: width must be even"),
    ("instance", {"a": 1}, "already a module instance"),
])
def test_build_errors(attr: str, kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(LoadError, match=pattern):
        build(resolve(f"{TARGETS}:{attr}"), attr, kwargs)


def test_load_target_validates_now_and_builds_later() -> None:
    with pytest.raises(LoadError, match="width, depth"):
        load_target(f"{TARGETS}:NeedsArgs")
    factory = load_target(f"{TARGETS}:NeedsArgs", {"width": 2, "depth": 1})
    assert isinstance(factory(), nn.Module)


def test_import_error_is_one_line() -> None:
    with pytest.raises(LoadError) as info:
        resolve(f"{TESTS / 'fixtures' / 'cli' / 'broken_import.py'}:Model")
    assert "\n" not in str(info.value) and "libfoo.so" in str(info.value)


def test_module_whose_dependency_is_missing_is_not_called_missing(tmp_path: object) -> None:
    # a module that exists but imports something absent: say so, not "no module named <target>"
    import sys
    from pathlib import Path

    root = Path(str(tmp_path))
    (root / "pc_needs_dep.py").write_text("import pc_absent_dependency_xyz\n")
    sys.path.insert(0, str(root))
    try:
        with pytest.raises(LoadError, match="importing 'pc_needs_dep' raised ModuleNotFoundError"):
            resolve("pc_needs_dep:Model")
    finally:
        sys.path.remove(str(root))
