"""What every source rewrite of ``placecheck fix`` shares: the request and its outcome, and reading a file.

:class:`Request` is what one fix must do (taken from a finding); :class:`Rewrite`
the applied edit, :class:`NotFixable` why there is none. :class:`Imports` reads
how a file names torch and torch.nn; :class:`AtLine` is the base of the
transformers that rewrite one statement or call at the finding's line, and
walks only the subtrees around it. No torch here: the rewrites read only
source text.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import PositionProvider


@dataclass(frozen=True)
class Request:
    """What one fix must do, taken from a finding: the code, the line, and the finding's facts."""

    code: str
    line: int
    where: str = ""
    module: str = ""
    op: str = ""
    """PC202: the factory the audit saw (``torch.randn``)."""
    device: str = ""
    """PC301: where the checkpoint should be loaded (``cpu``)."""
    unsafe: bool = False
    """PC101: a persistent buffer (adds ``state_dict()`` keys) instead of ``persistent=False``."""
    batch: str = ""
    """PC201 in ``placecheck run``: the batch element the loop did not move (``batch[1]``)."""
    use: int = 0
    """PC201 of a batch element: the line that used it unmoved (0: not in this file). ``line`` is then
    the line of the loop that produced the batch."""
    fields: tuple[str, ...] = ()
    """PC101 of a helper object: the tensor fields the audit found in it (``k``, ``v``)."""
    script: bool = False
    """The file is the script ``placecheck run`` ran: a tensor made outside a function with a tensor
    argument takes the device the script moves its model and batches to (its ``.to(device)``)."""
    holder: str = ""
    """PC201 in ``placecheck run``: the script's name of a module whose buffer was not moved
    (``criterion`` of ``criterion.weight``)."""
    rebind: str = ""
    """PC201 in ``placecheck run``: the script's name of the tensor used unmoved (``x``), whose
    ``x.to(device)`` before the use threw its result away."""



@dataclass(frozen=True)
class Rewrite:
    """One applied edit: the new source and the replaced lines, before and after."""

    source: str
    start: int
    """First line of the original file the edit replaces (1-based)."""
    end: int
    """Last line of the original file the edit replaces."""
    before: str
    after: str
    note: str = ""
    """What else the change means (``state_dict()`` gains keys)."""



@dataclass(frozen=True)
class NotFixable:
    """Why a finding is left for the user."""

    reason: str


class Imports(cst.CSTVisitor):
    """How the file names torch and torch.nn: ``import torch as th``, ``from torch import nn``, ..."""

    def __init__(self) -> None:
        self.torch: list[str] = []
        self.nn: list[str] = []
        self.torch_names: dict[str, str] = {}
        """local name -> member of torch imported by name (``from torch import randn``)."""
        self.nn_names: dict[str, str] = {}
        """local name -> member of torch.nn imported by name (``from torch.nn import ModuleList``)."""

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            dotted = _dotted(alias.name)
            local = _dotted(alias.asname.name) if alias.asname is not None else ""
            if dotted == "torch":
                self.torch.append(local or "torch")
            elif dotted == "torch.nn":
                if local:
                    self.nn.append(local)
                else:
                    self.torch.append("torch")  # `import torch.nn` binds `torch`

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is None or node.relative or isinstance(node.names, cst.ImportStar):
            return
        source = _dotted(node.module)
        for alias in node.names:
            name = _dotted(alias.name)
            local = _dotted(alias.asname.name) if alias.asname is not None else name
            if source == "torch" and name == "nn":
                self.nn.append(local)
            elif source == "torch":
                self.torch_names[local] = name
            elif source == "torch.nn":
                self.nn_names[local] = name

    def nn_ref(self, member: str) -> str | None:
        """How this file spells ``torch.nn.<member>``, or None when it does not import torch."""
        for local, name in self.nn_names.items():
            if name == member:
                return local
        if self.nn:
            return f"{self.nn[0]}.{member}"
        if self.torch:
            return f"{self.torch[0]}.nn.{member}"
        return None

    def torch_member(self, func: cst.BaseExpression) -> str:
        """``"randn"`` when ``func`` names ``torch.randn`` in this file, else ``""``."""
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) \
                and func.value.value in self.torch:
            return func.attr.value
        if isinstance(func, cst.Name):
            return self.torch_names.get(func.value, "")
        return ""


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


class AtLine(cst.CSTTransformer):
    """Base of the fixers: the enclosing functions, and whether a node spans the finding's line."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.functions: list[cst.FunctionDef] = []
        self.methods: list[bool] = []
        """For each of :attr:`functions`: whether it is defined directly in a class body."""
        self.classes: list[cst.ClassDef] = []
        self._class_depth: list[int] = []
        self.span: tuple[int, int] | None = None
        """Lines of the original file the fix replaced; None while nothing was replaced."""
        self.reason = f"nothing at line {line} that placecheck fix knows how to rewrite"
        self.note = ""

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node)
        self._class_depth.append(len(self.functions))

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.classes.pop()
        self._class_depth.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.methods.append(bool(self._class_depth) and self._class_depth[-1] == len(self.functions))
        self.functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef,
                          updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.functions.pop()
        self.methods.pop()
        return updated_node

    def on_visit(self, node: cst.CSTNode) -> bool:
        # only the subtrees around the finding's line are walked: a file's other lines are left whole
        visit_children = super().on_visit(node)
        pos = self.get_metadata(PositionProvider, node, None)
        return visit_children and (pos is None or pos.start.line <= self.line <= pos.end.line)

    def covers(self, node: cst.CSTNode) -> bool:
        pos = self.get_metadata(PositionProvider, node)
        return bool(pos.start.line <= self.line <= pos.end.line)

    def mark(self, node: cst.CSTNode) -> None:
        pos = self.get_metadata(PositionProvider, node)
        start, end = pos.start.line, pos.end.line
        if self.span is not None:
            start, end = min(start, self.span[0]), max(end, self.span[1])
        self.span = (start, end)

    def self_name(self) -> str | None:
        """The first parameter of the innermost function (``self``), when it is ``__init__``."""
        if not self.functions or self.functions[-1].name.value != "__init__":
            return None
        params = self.functions[-1].params.params
        return params[0].name.value if params else None


class Replace(cst.CSTTransformer):
    """Puts ``statements`` in place of one statement, and ``self.<name>`` in place of indexed uses."""

    def __init__(self, statement: cst.CSTNode, statements: list[cst.BaseStatement],
                 indexed: dict[int, str]) -> None:
        super().__init__()
        self.statement = statement
        self.statements = statements
        self.indexed = indexed

    def leave_Subscript(self, original_node: cst.Subscript,
                        updated_node: cst.Subscript) -> cst.BaseExpression:
        name = self.indexed.get(id(original_node))
        if name is None:
            return updated_node
        holder = updated_node.value
        assert isinstance(holder, cst.Attribute)
        return holder.with_changes(attr=cst.Name(name))

    def leave_SimpleStatementLine(
            self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if original_node is self.statement:
            return cst.FlattenSentinel(self.statements)
        return updated_node


def all_nodes(root: cst.CSTNode) -> list[cst.CSTNode]:
    nodes: list[cst.CSTNode] = []

    class _All(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nodes.append(node)
            return True

    root.visit(_All())
    return nodes


def rewritten(source: str, new_source: str, start: int, end: int, note: str) -> Rewrite:
    old_lines = source.splitlines(keepends=True)
    new_lines = new_source.splitlines(keepends=True)
    new_end = end + len(new_lines) - len(old_lines)
    return Rewrite(new_source, start, end, "".join(old_lines[start - 1:end]),
                   "".join(new_lines[start - 1:new_end]), note)
