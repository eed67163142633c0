"""placecheck.basics.patching: the one way placecheck replaces torch's or a framework's attributes.

Also the rule that keeps it the one way: no ``unittest`` (``mock.patch``) in placecheck, and no
assignment to an attribute of an imported module or class outside ``placecheck/basics/patching.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from placecheck.basics.patching import installed, patch, patched

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
