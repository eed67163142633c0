"""placecheck.basics.patching: the one way placecheck replaces torch's or a framework's attributes.

Also the rule that keeps it the one way: no ``unittest`` (``mock.patch``) in placecheck, and no
assignment to an attribute of an imported module or class outside ``placecheck/basics/patching.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from placecheck.basics.patching import installed, patch, patched, patched_once_imported

PACKAGE = Path(__file__).resolve().parent.parent / "placecheck"

pytestmark = pytest.mark.cpu_build


class Base:
    def hello(self) -> str:
        return "base"


class Child(Base):
    def own(self) -> str:
        return "own"


def test_a_patch_is_undone_exactly_and_says_why() -> None:
    with patch(Child, "own", lambda self: "patched", "a test"), \
            patch(Child, "hello", lambda self: "patched too", "an inherited attribute"):
        assert Child().own() == "patched" and Child().hello() == "patched too"
        assert [(p.owner, p.name, p.why) for p in installed()] == [
            ("Child", "own", "a test"), ("Child", "hello", "an inherited attribute")]
    assert Child().own() == "own" and Child().hello() == "base"
    assert "hello" not in vars(Child)  # inherited before: removed again, not copied onto the class
    assert installed() == []


def test_a_patch_is_undone_when_the_block_raises() -> None:
    with pytest.raises(KeyError), patch(Child, "own", lambda self: "patched", "a test"):
        raise KeyError("x")
    assert Child().own() == "own" and installed() == []


def test_a_missing_attribute_is_placechecks_error_unless_created() -> None:
    with pytest.raises(AttributeError, match=r"Child\.renamed, which does not exist"), \
            patch(Child, "renamed", None, "a test"):
        pass
    with patch(Child, "added", 1, "a test", create=True):
        assert Child.added == 1  # type: ignore[attr-defined]
    assert not hasattr(Child, "added")


def test_patched_makes_each_replacement_from_its_original() -> None:
    with patched([(Child, "own", lambda original: lambda self: original(self) + "+")], "a test"):
        assert Child().own() == "own+"
    assert Child().own() == "own"


# ---- the rule --------------------------------------------------------------------------------------

ALLOWED = {
    # the proof of a fix runs in a throwaway child process that imports the edited copies of the
    # user's files: the import system's hooks there are never undone, and are not torch's
    ("fix/proof.py", "sys.dont_write_bytecode"), ("fix/proof.py", "SourceFileLoader.get_data"),
    ("fix/proof.py", "SourceFileLoader.path_stats"), ("fix/proof.py", "io.open_code"),
}
"""(file, target): assignments to another module's attribute that are not patches of torch or a
framework."""


def _assignments_to_imported_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and not node.module.startswith("placecheck"):
            imported.update(a.asname or a.name for a in node.names)
    imported.discard("placecheck")
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for target in targets:
            root = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(target, ast.Attribute) and isinstance(root, ast.Name) and root.id in imported:
                found.append(ast.unparse(target))
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "patching.py")


def _module_file(tmp_path: Path, name: str) -> None:
    (tmp_path / f"{name}.py").write_text("def greet():\n    return 'hello'\n", encoding="utf-8")


def test_a_module_not_imported_yet_is_patched_once_imported_and_undone_with_the_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    _module_file(tmp_path, "pc_lazy_target")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pc_lazy_target", raising=False)
    read: list[str] = []

    def patches() -> list[tuple[object, str, object]]:
        read.append("read")
        module = sys.modules["pc_lazy_target"]
        return [(module, "greet", lambda original: lambda: original() + ", patched")]

    with patched_once_imported("pc_lazy_target", patches, "a test"):  # type: ignore[arg-type]
        assert "pc_lazy_target" not in sys.modules and read == []  # nothing imported for it
        module = importlib.import_module("pc_lazy_target")
        assert module.greet() == "hello, patched" and read == ["read"]
        assert [(p.owner, p.name) for p in installed()] == [("pc_lazy_target", "greet")]
    assert module.greet() == "hello" and installed() == []
    assert not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)
    monkeypatch.delitem(sys.modules, "pc_lazy_target")


def test_two_rooms_waiting_for_one_module_both_patch_it(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The scratch area and the fake engine both wait for ``safetensors.torch``: each finder asked the other,
    which asked it back, until Python's recursion limit (a fresh ``run --engine fake`` of any script that
    imports safetensors stopped at its import)."""
    import importlib
    import sys

    _module_file(tmp_path, "pc_shared_target")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pc_shared_target", raising=False)

    def adding(suffix: str):  # type: ignore[no-untyped-def]
        return lambda: [(sys.modules["pc_shared_target"], "greet",
                         lambda original: lambda: original() + suffix)]

    with patched_once_imported("pc_shared_target", adding(", first"), "a test"), \
            patched_once_imported("pc_shared_target", adding(", second"), "a test"):
        module = importlib.import_module("pc_shared_target")
        assert module.greet() in ("hello, first, second", "hello, second, first")
    assert module.greet() == "hello" and installed() == []
    monkeypatch.delitem(sys.modules, "pc_shared_target")


def test_a_module_imported_already_is_patched_at_once(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    _module_file(tmp_path, "pc_eager_target")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("pc_eager_target")
    with patched_once_imported("pc_eager_target",
                               lambda: [(module, "greet", lambda original: lambda: "patched")], "a test"):
        assert module.greet() == "patched"
    assert module.greet() == "hello"
    monkeypatch.delitem(sys.modules, "pc_eager_target")


def test_a_module_never_imported_is_never_patched() -> None:
    with patched_once_imported("pc_never_imported", lambda: pytest.fail("read"), "a test"):  # type: ignore[arg-type]
        pass
    assert installed() == []


def test_the_rule_reads_assignments() -> None:
    # a reader that found nothing would pass the test below vacuously
    assert "SourceFileLoader.get_data" in _assignments_to_imported_names(PACKAGE / "fix" / "proof.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_torch_is_patched_only_through_placecheck_patching(path: Path) -> None:
    relative = path.relative_to(PACKAGE).as_posix()
    text = path.read_text(encoding="utf-8")
    assert "import unittest" not in text and "from unittest" not in text
    sys_state = ("sys.",)  # the process's own streams and argv, set and restored by their owner
    patches = [t for t in _assignments_to_imported_names(path)
               if (relative, t) not in ALLOWED and not t.startswith(sys_state)
               and not t.endswith(("__module__", "__qualname__", "__name__", "__doc__"))]
    assert patches == [], "patch torch through placecheck.basics.patching.patch, with its reason"
