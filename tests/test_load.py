"""``placecheck.model.load``: TARGET parsing, resolution and construction, without the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.nn as nn
from conftest import TESTS

from placecheck.basics.errors import LoadError, UsageError
from placecheck.model.load import build, load_target, parse_kwargs, parse_value, resolve, split_target

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


@pytest.mark.parametrize("bad", ["{", "nope", "[1]", "3", "null", "", "  "])
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
    ("NOT_A_MODEL", {}, "is an int, not an nn.Module"),
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


CLI_FIXTURES = TESTS / "fixtures" / "cli"
SCRIPT_LIKE = CLI_FIXTURES / "script_like.py"


@pytest.mark.parametrize("attr, pattern", [
    ("exits_zero", r"constructing exits_zero called sys\.exit\(0\): guard script code"),
    ("exits_with_message", r"called sys\.exit\('no config found'\): guard script code with "
                           r"`if __name__ == '__main__':`"),
])
def test_sys_exit_in_a_factory_is_a_load_error(attr: str, pattern: str) -> None:
    with pytest.raises(LoadError, match=pattern) as info:
        build(resolve(f"{SCRIPT_LIKE}:{attr}"), attr, {})
    assert "\n" not in str(info.value)


def test_keyboard_interrupt_in_a_constructor_is_not_swallowed() -> None:
    with pytest.raises(KeyboardInterrupt):
        build(resolve(f"{SCRIPT_LIKE}:Interrupted"), "Interrupted", {})


def test_argparse_at_import_is_one_load_error_with_its_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(LoadError, match=r"importing .*argparse_at_import\.py' called sys\.exit\(2\) after "
                                        r"printing '.*error: .*': guard script code") as info:
        resolve(f"{CLI_FIXTURES / 'argparse_at_import.py'}:Model")
    assert "\n" not in str(info.value)
    assert capsys.readouterr().err == ""  # argparse's usage lines are in the message, not printed


def test_stderr_of_a_clean_import_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "pc_warns_on_import.py"
    source.write_text("import sys\nimport torch.nn as nn\nprint('careful', file=sys.stderr)\n"
                      "Model = nn.Linear\n")
    resolve(f"{source}:Model")
    assert capsys.readouterr().err == "careful\n"


@pytest.mark.parametrize("relative", ["pkgdemo/net.py", "pkgdemo/relnet.py", "pkgdemo/sub/deep.py"])
def test_file_inside_a_package_imports_by_its_dotted_name(relative: str) -> None:
    model = build(resolve(f"{CLI_FIXTURES / relative}:Net"), "Net", {})
    assert type(model).__module__ == relative.removesuffix(".py").replace("/", ".")
    assert type(model.layer).__module__ == "pkgdemo.layers"


def test_file_inside_a_package_from_the_current_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    # `placecheck audit pkgdemo/net.py:Net` run from the directory holding the package
    monkeypatch.chdir(CLI_FIXTURES)
    assert resolve("pkgdemo/relnet.py:Net").__module__ == "pkgdemo.relnet"


def test_a_file_is_imported_once_however_often_it_is_resolved(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    first = resolve(f"{SCRIPT_LIKE}:Chatty")
    capsys.readouterr()
    assert resolve(f"{SCRIPT_LIKE}:Chatty") is first  # the same class object: not imported again
    assert sys.modules[first.__module__].__file__ == str(SCRIPT_LIKE)
    assert "script_like imported" not in capsys.readouterr().out


def test_a_file_first_imported_under_the_meta_device_keeps_its_tensors_on_the_host(tmp_path: Path) -> None:
    import torch

    source = tmp_path / "pc_class_table.py"
    source.write_text("import torch\nimport torch.nn as nn\nTABLE = torch.ones(2)\n"
                      "class Model(nn.Module):\n    table = torch.arange(3)\n")
    with torch.device("meta"):  # where --init meta/auto builds a factory's model
        model_class = resolve(f"{source}:Model")
    assert model_class.table.device.type == "cpu"


def test_type_names_take_the_right_article() -> None:
    with pytest.raises(UsageError, match="not an int"):
        parse_kwargs("3")
    with pytest.raises(UsageError, match="not a list"):
        parse_kwargs("[1]")
    with pytest.raises(UsageError, match="--kwargs is empty"):
        parse_kwargs("")
