"""PC201 in ``placecheck run``: an element of a dict (or list) batch read where the op takes it, unmoved.

``for batch in loader: logits = model(batch["x"].to(device)); loss = crit(logits, batch["y"])``
-> ``crit(logits, batch["y"].to(device))``: the element gets the move its sibling already has
(``batch["x"].to(device)``: the same device expression, the same ``non_blocking``), where it is read,
in the statement the run saw the mismatch at. Without a moved sibling in the loop, the script's own
device expression (:func:`placecheck.fix.devices.script_device`) is used; without one, nothing is
written. The edit is proven by re-running the script, as every ``fix --run`` edit is. No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from placecheck.fix.devices import script_device
from placecheck.fix.syntax import NotFixable, Request, Rewrite, rewritten


def _base(node: cst.BaseExpression) -> str:
    """``batch`` of ``batch["y"]`` (and of ``batch["y"][0]``); "" for anything else."""
    while isinstance(node, cst.Subscript):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""


def _spelled(node: cst.BaseExpression) -> object:
    """``batch["y"]`` as a value that ``batch['y']`` shares: the name and each literal key (a string, an
    integer or a name); None for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if not isinstance(node, cst.Subscript):
        return None
    base = _spelled(node.value)
    keys: list[object] = []
    for element in node.slice:
        index = element.slice
        value = index.value if isinstance(index, cst.Index) else None
        if isinstance(value, (cst.SimpleString, cst.Integer)):
            keys.append(value.evaluated_value)
        elif isinstance(value, cst.Name):
            keys.append(("name", value.value))
        else:
            return None
    return None if base is None else (base, tuple(keys))


class _ItemReads(cst.CSTTransformer):
    """Wraps each read of ``element`` (as the script spells it: quotes and spacing aside) in ``.to(args)``."""

    def __init__(self, element: cst.BaseExpression, args: list[cst.Arg]) -> None:
        super().__init__()
        self.element = _spelled(element)
        self.args = args

    def leave_Subscript(self, original_node: cst.Subscript,
                        updated_node: cst.Subscript) -> cst.BaseExpression:
        if _spelled(original_node) != self.element:
            return updated_node
        return cst.Call(func=cst.Attribute(value=updated_node, attr=cst.Name("to")), args=self.args)

    # a write to the element (batch["y"] = ..., += ..., del) is not a read: its target stays as it is
    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        return updated_node.with_changes(targets=original_node.targets)

    def leave_AugAssign(self, original_node: cst.AugAssign, updated_node: cst.AugAssign) -> cst.AugAssign:
        return updated_node.with_changes(target=original_node.target)

    def leave_AnnAssign(self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign) -> cst.AnnAssign:
        return updated_node.with_changes(target=original_node.target)

    def leave_Del(self, original_node: cst.Del, updated_node: cst.Del) -> cst.Del:
        return updated_node.with_changes(target=original_node.target)


def _sibling_move(loop: cst.For, base: str, before: int, positions: Mapping[cst.CSTNode, CodeRange]
                  ) -> list[cst.Arg] | None:
    """The arguments of the last ``<base>[...].to(...)`` in ``loop`` at or before line ``before``."""
    found: list[cst.Arg] | None = None

    class _SiblingMoves(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "to" and node.args \
                    and isinstance(func.value, cst.Subscript) and _base(func.value) == base \
                    and positions[node].start.line <= before:
                found = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) if i == len(node.args) - 1 else a
                         for i, a in enumerate(node.args)]

    loop.visit(_SiblingMoves())
    return found


def move_batch_item(module: cst.Module, request: Request) -> Rewrite | NotFixable:
    """``batch["y"]`` read unmoved at line ``request.use`` of the loop at ``request.line`` ->
    ``batch["y"].to(<the sibling's arguments>)`` in that statement."""
    try:
        element = cst.parse_expression(request.where)
    except cst.ParserSyntaxError:
        element = None
    base = _base(element) if isinstance(element, cst.Subscript) and _spelled(element) is not None else ""
    if element is None or not base:
        return NotFixable(f"the batch element ({request.batch}) has no name of its own in the loop: move "
                          "the batch to the device where it is unpacked")
    if not request.use:
        return NotFixable(f"the run did not see where the loop reads {request.where}: move it to the "
                          "device there")
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    loops = [n for n in positions if isinstance(n, cst.For) and positions[n].start.line == request.line]
    if not loops:
        return NotFixable(f"no for loop starts at line {request.line}, where the run saw the batches made: "
                          f"move {request.where} to the device where it is read")
    loop = loops[0]
    statements = [n for n in positions if isinstance(n, cst.SimpleStatementLine)
                  and positions[n].start.line <= request.use <= positions[n].end.line]
    if not statements:
        return NotFixable(f"line {request.use} is not a simple statement: move {request.where} to the device "
                          "where it is read")
    statement = statements[-1]
    args = _sibling_move(loop, base, request.use, positions)
    if args is None:
        device = script_device(module)
        if not device:
            return NotFixable(f"nothing in the loop or the script says which device to move {request.where} "
                              "to: move it where it is read")
        args = [cst.Arg(cst.parse_expression(device))]
    reads = _ItemReads(element, args)
    new_statement = statement.visit(reads)
    assert isinstance(new_statement, cst.SimpleStatementLine)
    if new_statement.deep_equals(statement):
        return NotFixable(f"line {request.use} does not read {request.where} as written: move it to the "
                          "device where it is read")
    start, end = positions[statement].start.line, positions[statement].end.line
    new = module.deep_replace(statement, new_statement)
    assert isinstance(new, cst.Module)
    return rewritten(module.code, new.code, start, end, "")
