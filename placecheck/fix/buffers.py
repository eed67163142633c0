"""The rewrites of what ``.to()`` does not reach (PC101-PC103): tensors and modules held outside
the module's registered state become registered.

A plain tensor attribute becomes ``register_buffer`` (:class:`RegisterBuffer`); a
plain list or dict of modules or parameters is wrapped (:class:`WrapContainer`);
tensors in a literal list or dict become one buffer each, read by name
(:func:`container_buffers`); a plain helper class holding tensors becomes an
nn.Module (:func:`helper_module`). The last two read the whole class, not only
the finding's line.
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from placecheck.basics.codes import Code
from placecheck.fix.syntax import AtLine, Imports, NotFixable, Replace, Request, Rewrite, all_nodes, rewritten


def _self_assignment(statement: cst.SimpleStatementLine, self_name: str, attr: str) -> int:
    """Index in ``statement.body`` of ``<self_name>.<attr> = value``, or -1."""
    for i, small in enumerate(statement.body):
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) \
                    and target.value.value == self_name and target.attr.value == attr:
                return i
    return -1


class RegisterBuffer(AtLine):
    """PC101: ``self.mask = <expr>`` in ``__init__`` -> a ``register_buffer`` call.

    ``self.register_buffer("mask", <expr>, persistent=False)``: persistent only
    when asked (``--unsafe``), since that adds a ``state_dict()`` key.
    """

    def __init__(self, line: int, attr: str, persistent: bool) -> None:
        super().__init__(line)
        self.attr = attr
        self.persistent = persistent
        self.reason = (f"no statement at line {line} assigns the attribute `{attr}`: the tensor reaches it "
                       "some other way (setattr, a loop, another object), so there is no assignment to make "
                       "a register_buffer call")

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        if self.span is not None or not self.covers(original_node):
            return updated_node
        self_name = self.self_name()
        if self_name is None:
            self.reason = f"line {self.line} is not in __init__: a buffer is registered there"
            return updated_node
        index = _self_assignment(updated_node, self_name, self.attr)
        if index < 0:
            self.reason = (f"line {self.line} does not assign `{self_name}.{self.attr} = ...` by itself "
                           "(setattr, unpacking, a chained or annotated assignment): there is no one value "
                           "to register as a buffer")
            return updated_node
        assign = updated_node.body[index]
        assert isinstance(assign, cst.Assign)
        tail = "" if self.persistent else ", persistent=False"
        call = cst.parse_expression(f'{self_name}.register_buffer("{self.attr}", _{tail})')
        assert isinstance(call, cst.Call)
        args = list(call.args)
        args[1] = args[1].with_changes(value=assign.value)
        body = list(updated_node.body)
        body[index] = cst.Expr(value=call.with_changes(args=args), semicolon=assign.semicolon)
        self.mark(original_node)
        if self.persistent:
            self.note = (f"'{self.attr}' becomes a persistent buffer (--unsafe): state_dict() gains the key "
                         f"'{self.attr}', and checkpoints saved before the fix lack it")
        return updated_node.with_changes(body=body)


_WRAPPERS: dict[tuple[str, str], str] = {
    (Code.PC102, "list"): "ModuleList", (Code.PC102, "dict"): "ModuleDict",
    (Code.PC103, "list"): "ParameterList", (Code.PC103, "dict"): "ParameterDict"}


class WrapContainer(AtLine):
    """PC102/PC103: ``self.heads = [...]`` in ``__init__`` -> ``self.heads = nn.ModuleList([...])``.

    The container kind comes from the literal when there is one (``[...]``,
    ``(...)``, ``{...}``, comprehensions), else from how the audit indexed it
    (``heads[0]`` a list, ``heads['a']`` a dict). Containers nested in it
    (``stages[0][1]``: ``indexed_as`` has one kind per level) are wrapped too,
    each inner literal where it is written: ``[[a, b], [c]]`` ->
    ``nn.ModuleList([nn.ModuleList([a, b]), nn.ModuleList([c])])``; parameters
    nested so become an nn.ModuleList / nn.ModuleDict of nn.ParameterLists /
    nn.ParameterDicts (a Parameter container is a module). An inner container
    not written as a literal there (a name, a call) is refused: it is built
    elsewhere.
    """

    def __init__(self, line: int, code: str, attr: str, indexed_as: tuple[str, ...],
                 imports: Imports) -> None:
        super().__init__(line)
        self.code = code
        self.attr = attr
        self.indexed_as = indexed_as
        self.imports = imports
        self.reason = (f"no statement at line {line} assigns the container `{attr}`: it is filled some other "
                       "way (setattr, a loop, another object), so there is no assignment to wrap")

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        if self.span is not None or not self.covers(original_node):
            return updated_node
        self_name = self.self_name()
        if self_name is None:
            self.reason = f"line {self.line} is not in __init__"
            return updated_node
        index = _self_assignment(updated_node, self_name, self.attr)
        if index < 0:
            self.reason = (f"line {self.line} does not assign `{self_name}.{self.attr} = ...` by itself "
                           "(setattr, unpacking, a chained or annotated assignment): there is no one "
                           "container to wrap")
            return updated_node
        assign = updated_node.body[index]
        assert isinstance(assign, cst.Assign)
        wrappers: list[str] = []
        call = self._wrap(assign.value, 0, wrappers)
        if call is None:
            return updated_node
        body = list(updated_node.body)
        body[index] = assign.with_changes(value=call)
        self.mark(original_node)
        inner = sorted(set(wrappers[1:]))
        made = wrappers[0] + (f" of {' and '.join(w + 's' for w in inner)}" if inner else "")
        first_key = "0" if wrappers[0].endswith("List") else "<key>"
        self.note = (f"'{self.attr}' becomes a {made}: state_dict() gains its keys "
                     f"({self.attr}.{first_key}..., which checkpoints saved before the fix lack) and the "
                     "optimizer sees its parameters")
        return updated_node.with_changes(body=body)

    def _wrap(self, value: cst.BaseExpression, level: int, wrappers: list[str]) -> cst.Call | None:
        """``value`` (the container at nesting ``level``) in its nn container, its inner literals wrapped
        first; None (and :attr:`reason`) when an inner container is not a literal written here."""
        if isinstance(value, (cst.List, cst.ListComp, cst.Tuple, cst.GeneratorExp)):
            kind = "list"
        elif isinstance(value, (cst.Dict, cst.DictComp)):
            kind = "dict"
        else:
            kind = self.indexed_as[level]
        innermost = level == len(self.indexed_as) - 1
        wrapper = _WRAPPERS[(self.code if innermost else Code.PC102, kind)]
        spelled = self.imports.nn_ref(wrapper)
        if spelled is None:
            self.reason = "the file does not import torch, so there is no name to reach nn." + wrapper
            return None
        if not innermost:
            inner = self._wrap_inner(value, level, wrappers)
            if inner is None:
                return None
            value = inner
        wrappers.insert(0, wrapper)  # outermost first
        if isinstance(value, cst.Tuple) and not value.lpar:
            value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return cst.Call(func=cst.parse_expression(spelled), args=[cst.Arg(value=value)])

    def _wrap_inner(self, value: cst.BaseExpression, level: int,
                    wrappers: list[str]) -> cst.BaseExpression | None:
        """``value``, a container at ``level``, with each container it holds wrapped."""
        held: list[str] = []
        if isinstance(value, (cst.ListComp, cst.GeneratorExp, cst.DictComp)):
            inner = self._wrap(value.value if isinstance(value, cst.DictComp) else value.elt, level + 1, held)
            if inner is None:
                return None
            wrappers.extend(held)
            return value.with_changes(value=inner) if isinstance(value, cst.DictComp) \
                else value.with_changes(elt=inner)
        if isinstance(value, (cst.List, cst.Tuple, cst.Dict)):
            elements = []
            for element in value.elements:
                if not isinstance(element, (cst.Element, cst.DictElement)):  # *rest, **more
                    self.reason = (f"`{self.attr}` unpacks another container into itself (* or **): its "
                                   "inner containers are built elsewhere; wrap them where they are built")
                    return None
                inner = self._wrap(element.value, level + 1, held)
                if inner is None:
                    return None
                elements.append(element.with_changes(value=inner))
            wrappers.extend(held)
            return value.with_changes(elements=elements)
        self.reason = (f"`{self.attr}` holds containers in containers, and line {self.line} does not write "
                       "it as a list or dict literal (a name, a call): the inner containers are built "
                       "elsewhere; wrap each in nn.ModuleList / nn.ModuleDict where it is built")
        return None


class _Uses(cst.CSTVisitor):
    """Every use of ``self.<attr>`` in a class's methods: ``self.<attr>[<literal>]`` or anything else."""

    def __init__(self, attr: str, keys: dict[str, str]) -> None:
        self.attr = attr
        self.keys = keys
        """The literal key as written in source -> the buffer's name."""
        self.selves: list[str] = []
        self.indexed: dict[int, str] = {}
        """id of each ``self.<attr>[key]`` Subscript -> the buffer's name."""
        self.inner: set[int] = set()
        self.other: list[cst.Attribute] = []
        self.attributes: set[str] = set()
        """Every ``self.<name>`` the class mentions, and its methods' names."""

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        params = node.params.params
        self.attributes.add(node.name.value)
        self.selves.append(params[0].name.value if params and not self.selves else
                           self.selves[-1] if self.selves else "")

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.selves.pop()

    def _is_ours(self, node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and bool(self.selves) \
            and node.value.value == self.selves[-1] and node.attr.value == self.attr

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if not self._is_ours(node.value) or len(node.slice) != 1:
            return
        index = node.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, (cst.Integer, cst.SimpleString)):
            key = _literal_key(index.value)
            if key in self.keys:
                self.indexed[id(node)] = self.keys[key]
                self.inner.add(id(node.value))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if isinstance(node.value, cst.Name) and self.selves and node.value.value == self.selves[-1]:
            self.attributes.add(node.attr.value)
        if self._is_ours(node) and id(node) not in self.inner:
            self.other.append(node)


def _literal_key(node: cst.BaseExpression) -> str:
    """``0`` -> ``"0"``, ``'k'`` / ``"k"`` -> ``"k"``; ``""`` for anything else."""
    if isinstance(node, cst.Integer):
        return node.value
    if isinstance(node, cst.SimpleString) and not node.prefix.strip("rR"):
        value = node.evaluated_value
        return value if isinstance(value, str) else ""
    return ""


def _register(self_name: str, name: str, value: cst.BaseExpression, persistent: bool,
              like: cst.SimpleStatementLine | None = None, first: bool = True,
              last: bool = True) -> cst.SimpleStatementLine:
    """``self.register_buffer("name", value, persistent=False)`` as a line laid out like ``like``."""
    tail = "" if persistent else ", persistent=False"
    call = cst.parse_expression(f'{self_name}.register_buffer("{name}", _{tail})')
    assert isinstance(call, cst.Call)
    args = list(call.args)
    args[1] = args[1].with_changes(value=value)
    line = cst.SimpleStatementLine([cst.Expr(call.with_changes(args=args))])
    if like is not None:
        line = line.with_changes(leading_lines=like.leading_lines if first else [],
                                 trailing_whitespace=like.trailing_whitespace if last
                                 else cst.TrailingWhitespace())
    return line


class _Located(cst.CSTVisitor):
    """The statement at a line, with its enclosing classes and functions."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.stack: list[cst.CSTNode] = []
        self.found: tuple[cst.SimpleStatementLine, list[cst.CSTNode]] | None = None
        self.classes: dict[str, cst.ClassDef] = {}
        """Classes defined at module level, by name."""

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.ClassDef) and not self.stack:
            self.classes[node.name.value] = node
        pos = self.get_metadata(PositionProvider, node, None)
        if pos is not None and not pos.start.line <= self.line <= pos.end.line:
            return False
        if isinstance(node, cst.SimpleStatementLine) and self.found is None:
            self.found = (node, list(self.stack))
            return False
        if isinstance(node, (cst.ClassDef, cst.FunctionDef)):
            self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if self.stack and self.stack[-1] is original_node:
            self.stack.pop()


def _in_init(located: _Located) -> tuple[cst.SimpleStatementLine, cst.ClassDef, str] | NotFixable:
    """The statement at the line, its class and the name of ``self``, when the line is in ``__init__``."""
    if located.found is None:
        return NotFixable(f"no statement of this file spans line {located.line}, the line the audit names: "
                          "the file changed since the audit, or the line is generated")
    statement, stack = located.found
    if len(stack) < 2 or not isinstance(stack[-1], cst.FunctionDef) or stack[-1].name.value != "__init__" \
            or not isinstance(stack[-2], cst.ClassDef) or not stack[-1].params.params:
        return NotFixable(f"line {located.line} is not in __init__: tensors are registered there")
    return statement, stack[-2], stack[-1].params.params[0].name.value


def _span(positions: Any, nodes: list[cst.CSTNode]) -> tuple[int, int]:
    lines = [(positions[n].start.line, positions[n].end.line) for n in nodes]
    return min(a for a, _ in lines), max(b for _, b in lines)


def container_buffers(module: cst.Module, request: Request, attr: str) -> Rewrite | NotFixable:
    """PC101 of tensors in a plain list or dict: one registered buffer each, read by name.

    ``self.cache = {"k": a, "v": b}`` -> ``self.register_buffer("cache_k", a,
    persistent=False)`` and the same of ``v``; every ``self.cache["k"]`` in
    the class becomes ``self.cache_k``. Only when the container is a literal
    and every use in the class indexes it with a literal key: otherwise the
    reason names the first other use.
    """
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    located = _Located(request.line)
    wrapper.visit(located)
    where = _in_init(located)
    if isinstance(where, NotFixable):
        return where
    statement, owner, self_name = where
    index = _self_assignment(statement, self_name, attr)
    if index < 0 or len(statement.body) != 1:
        return NotFixable(f"line {request.line} is not a plain `{self_name}.{attr} = ...` assignment of its "
                          "own")
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign)
    value = assign.value
    pairs: list[tuple[str, cst.BaseExpression]] = []
    if isinstance(value, (cst.List, cst.Tuple)) and all(isinstance(e, cst.Element) for e in value.elements):
        pairs = [(str(i), e.value) for i, e in enumerate(value.elements)]
    elif isinstance(value, cst.Dict) and all(isinstance(e, cst.DictElement) and _literal_key(e.key)
                                             for e in value.elements):
        pairs = [(_literal_key(e.key), e.value) for e in value.elements if isinstance(e, cst.DictElement)]
    shown = f'{self_name}.register_buffer("{attr}_<key>", <tensor>, persistent=False)'
    if not pairs or not all(re.fullmatch(r"\w+", key) for key, _ in pairs):
        return NotFixable(f"`{self_name}.{attr}` is not a list or dict literal with simple keys: register "
                          f"each tensor as a buffer ({shown}) and read it by name, or create the tensors in "
                          "forward() on the input's device")
    names = {key: f"{attr}_{key}" for key, _ in pairs}
    uses = _Uses(attr, {key: name for key, name in names.items()})
    owner.visit(uses)
    others = [n for n in uses.other if n is not assign.targets[0].target]
    if others:
        line = positions[others[0]].start.line
        return NotFixable(f"`{self_name}.{attr}` is used as a whole at line {line}, not only by literal "
                          f"keys: register each tensor as a buffer ({shown}) and read it by name there, or "
                          "create the tensors in forward() on the input's device")
    taken = sorted(set(names.values()) & uses.attributes)
    if taken:
        return NotFixable(f"the class already has an attribute `{taken[0]}`, the buffer's name: register "
                          f"the tensors under names of your choice ({shown})")
    persistent = request.unsafe
    statements: list[cst.BaseStatement] = [
        _register(self_name, names[key], item, persistent, statement, i == 0, i == len(pairs) - 1)
        for i, (key, item) in enumerate(pairs)]
    subscripts = [n for n in all_nodes(owner) if id(n) in uses.indexed]
    new = module.visit(Replace(statement, statements, uses.indexed))
    start, end = _span(positions, [statement, *subscripts])
    note = ("" if not persistent else f"'{attr}' becomes persistent buffers (--unsafe): state_dict() gains "
            f"the keys {', '.join(names.values())}, and checkpoints saved before the fix lack them")
    return rewritten(module.code, new.code, start, end, note)


_MODULE_NAMES = frozenset({
    "to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type", "train", "eval", "training", "apply",
    "state_dict", "load_state_dict", "parameters", "buffers", "modules", "children", "named_parameters",
    "named_buffers", "named_modules", "named_children", "register_buffer", "register_parameter",
    "add_module", "zero_grad", "requires_grad_", "__getattr__", "__setattr__", "__delattr__", "__slots__",
    "__getstate__", "__setstate__", "__dir__", "_apply", "_buffers", "_parameters", "_modules"})
"""nn.Module names a helper class must not define for it to become an nn.Module unchanged."""


class _Helper(cst.CSTTransformer):
    """Makes a plain class an nn.Module: the base, ``super().__init__()`` first in ``__init__``, and each
    tensor field a registered buffer."""

    def __init__(self, target: cst.ClassDef, base: str, init: cst.FunctionDef,
                 fields: dict[int, tuple[cst.SimpleStatementLine, str]], persistent: bool) -> None:
        super().__init__()
        self.target = target
        self.base = base
        self.init = init
        self.fields = fields
        self.persistent = persistent

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.BaseStatement:
        found = self.fields.get(id(original_node))
        if found is None:
            return updated_node
        assign = updated_node.body[0]
        assert isinstance(assign, cst.Assign)
        return _register(found[1], _target_attr(assign), assign.value, self.persistent, updated_node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef,
                          updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if original_node is not self.init:
            return updated_node
        body = updated_node.body
        assert isinstance(body, cst.IndentedBlock)
        statements = list(body.body)
        at = 1 if statements and _is_docstring(statements[0]) else 0
        call = cst.parse_statement("super().__init__()\n")
        return updated_node.with_changes(body=body.with_changes(
            body=[*statements[:at], call, *statements[at:]]))

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node is not self.target:
            return updated_node
        return updated_node.with_changes(bases=[cst.Arg(cst.parse_expression(self.base))],
                                         lpar=cst.LeftParen(), rpar=cst.RightParen())


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 \
        and isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.SimpleString)


def _target_attr(assign: cst.Assign) -> str:
    target = assign.targets[0].target
    return target.attr.value if isinstance(target, cst.Attribute) else ""


def helper_module(module: cst.Module, request: Request, attr: str,
                   imports: Imports) -> Rewrite | NotFixable:
    """PC101 of tensors in a helper object (``self.rope = RopeCache(...)``): the helper's class becomes an
    nn.Module whose tensor fields are registered buffers, so ``.to()`` reaches them and every read
    (``self.rope.cos``) keeps working."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    located = _Located(request.line)
    wrapper.visit(located)
    where = _in_init(located)
    if isinstance(where, NotFixable):
        return where
    statement, _, self_name = where
    index = _self_assignment(statement, self_name, attr)
    value = statement.body[index].value if index >= 0 else None  # type: ignore[attr-defined]
    shown = ("make the helper's class an nn.Module (class Helper(nn.Module), super().__init__() first in its "
             "__init__) and register its tensors as buffers (self.register_buffer(\"name\", <tensor>, "
             "persistent=False))")
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
        return NotFixable(f"line {request.line} does not build `{self_name}.{attr}` by calling a class of "
                          f"this file: {shown}")
    name = value.func.value
    target = located.classes.get(name)
    if target is None:
        return NotFixable(f"{name} is not a class defined at the top level of this file: {shown}")
    plain = not target.bases or (len(target.bases) == 1 and isinstance(target.bases[0].value, cst.Name)
                                 and target.bases[0].value.value == "object" and not target.bases[0].keyword)
    if not plain or target.decorators or target.keywords:
        return NotFixable(f"{name} has base classes, a metaclass or decorators (a dataclass?): {shown}")
    body = target.body.body if isinstance(target.body, cst.IndentedBlock) else []
    defined = {s.name.value for s in body if isinstance(s, cst.FunctionDef)}
    for s in body:
        if isinstance(s, cst.SimpleStatementLine):
            defined |= {t.target.value for small in s.body if isinstance(small, (cst.Assign,))
                        for t in small.targets if isinstance(t.target, cst.Name)}
    init = next((s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
    clash = sorted(defined & _MODULE_NAMES)
    if clash or init is None or not init.params.params:
        why = f"it defines {clash[0]}, which nn.Module has" if clash else "it has no __init__(self, ...)"
        return NotFixable(f"{name} cannot become an nn.Module unchanged ({why}): {shown}")
    base = imports.nn_ref("Module")
    if base is None:
        return NotFixable("the file does not import torch, so there is no name to reach nn.Module")
    helper_self = init.params.params[0].name.value
    fields: dict[int, tuple[cst.SimpleStatementLine, str]] = {}
    for field_name in request.fields:
        found = [s for s in all_nodes(init) if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                 and _self_assignment(s, helper_self, field_name) == 0]
        if len(found) != 1:
            return NotFixable(f"{name}.__init__ does not assign `{helper_self}.{field_name} = ...` once: "
                              f"{shown}")
        fields[id(found[0])] = (found[0], helper_self)
    new = module.visit(_Helper(target, base, init, fields, request.unsafe))
    start, end = _span(positions, [target.name, *(s for s, _ in fields.values())])
    note = (f"{name} becomes an nn.Module: .to() reaches its tensors, registered as non-persistent buffers "
            "(state_dict() keys do not change)" if not request.unsafe else
            f"{name} becomes an nn.Module with persistent buffers (--unsafe): state_dict() gains "
            f"{', '.join(f'{attr}.{f}' for f in request.fields)}")
    return rewritten(module.code, new.code, start, end, note)
