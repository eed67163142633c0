"""PC203: a layer or parameter built during ``forward`` is built in ``__init__`` instead (issue 43).

``self.head = nn.Linear(4, 2)`` in a method other than ``__init__`` (under a guard, ``if self.head is
None:`` / ``if not hasattr(self, "head"):``, or on every call) goes to ``__init__``, where ``.to()`` and
an optimizer built before the first forward see it: it replaces ``self.head = None`` there when
``__init__`` has that placeholder, else it ends ``__init__``. A guard stays (it is never true again); a
construction on every call leaves the method. Only when the construction reads nothing of the method:
literals, names of the module (imports, constants), builtins and attributes ``__init__`` sets before it;
a ``device=`` read from the input is dropped, since ``.to()`` moves the layer with the model. When only
the input size (the first argument of a layer with an ``nn.Lazy*`` twin) reads the input, the layer is
built as that twin without it (``nn.Linear(x.shape[-1], 2)`` -> ``nn.LazyLinear(2)``); any other size read
from the input is refused, naming the twin when torch has one. No torch here.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from placecheck.fix.syntax import NotFixable, Request, Rewrite, all_nodes, rewritten

_BUILTINS = frozenset(dir(builtins))

_Lines = Callable[[cst.CSTNode], tuple[int, int]]
"""A node's first and last line in the file."""

_LAZY = frozenset({"Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                   "ConvTranspose3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d",
                   "InstanceNorm2d", "InstanceNorm3d"})
"""torch.nn's layers with an ``nn.Lazy*`` twin (torch 2.4 and later)."""


_INPUT_SIZE = frozenset({"in_features", "in_channels", "num_features"})
"""The keyword of the first argument of those layers: the size their ``nn.Lazy*`` twin infers."""


def lazy_equivalent(created: str) -> str:
    """``Linear`` -> ``LazyLinear``: the torch.nn class that infers its input size, or ``""``."""
    return f"Lazy{created}" if created in _LAZY else ""


def build_in_init(module: cst.Module, request: Request) -> Rewrite | NotFixable:
    """The PC203 rewrite of the construction at ``request.line`` (see the module docstring)."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    module = wrapper.module

    def lines(node: cst.CSTNode) -> tuple[int, int]:
        return positions[node].start.line, positions[node].end.line

    found = _method_at(module, request.line, lines)
    if found is None:
        return NotFixable(f"line {request.line} is not in a method of a class of this file")
    cls, method = found
    init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"),
                None)
    if method.name.value == "__init__":
        return NotFixable(f"line {request.line} is in __init__ already")
    statement = _statement_at(method, request.line, lines)
    me = _self_name(method)
    assign = statement.body[0] if statement is not None and len(statement.body) == 1 else None
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1 \
            or not _is_self_attr(assign.targets[0].target, me) or not isinstance(assign.value, cst.Call):
        return NotFixable(f"line {request.line} does not build it as `self.name = Layer(...)` by itself: "
                          "build it in __init__")
    target = assign.targets[0].target
    assert isinstance(target, cst.Attribute)
    attr = target.attr.value
    call = assign.value
    if init is not None and _self_name(init) != me:
        return NotFixable(f"__init__ and {method.name.value} of class {cls.name.value} name self "
                          "differently: build it in __init__ by hand")
    placeholder = _placeholder(init, attr, me) if init is not None else None
    before = list(init.body.body) if init is not None else []
    before_attrs = _assigned_attrs(before[:before.index(placeholder)] if placeholder is not None else before,
                                   me)
    module_names = _module_names(module)
    func = call.func
    created = (func.attr.value if isinstance(func, cst.Attribute)
               else func.value if isinstance(func, cst.Name) else "")
    lazy = lazy_equivalent(created)
    kind = "parameter" if created == "Parameter" else "layer"
    kept: list[cst.Arg] = []
    inferred = False  # the input size, left to the layer's nn.Lazy* twin
    for index, arg in enumerate(call.args):
        reads = _reads(arg.value, me)
        local = sorted(n for n in reads.names if n not in module_names and n not in _BUILTINS)
        unknown = sorted(a for a in reads.attrs if a not in before_attrs)
        if arg.keyword is not None and arg.keyword.value == "device" and (local or unknown):
            continue  # .to() moves the layer with the model
        if local and not unknown and "lambda" not in local and lazy and isinstance(func, cst.Attribute) \
                and not inferred \
                and (arg.keyword.value in _INPUT_SIZE if arg.keyword is not None else index == 0):
            inferred = True  # nn.Linear(x.shape[-1], 2) -> nn.LazyLinear(2): the first call gives it
            continue
        if local or unknown:
            what = ("make a function (a lambda)" if local and local[0] == "lambda"  # _Reads' mark for one
                    else f"read `{local[0]}`" if local
                    else f"read `self.{unknown[0]}`, which __init__ does not set first,")
            instead = (f"build it there as nn.{lazy}, which infers the input size on the first call" if lazy
                       else "build it there from sizes __init__ knows")
            return NotFixable(f"a {kind} built in {method.name.value} whose arguments {what} cannot "
                              f"move to __init__ as it is: {instead}")
        kept.append(arg)
    if kept and kept[-1].comma is not cst.MaybeSentinel.DEFAULT:
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    if init is None:
        return NotFixable(f"class {cls.name.value} has no __init__ of its own to build the {kind} in: add "
                          "one (super().__init__() first) that builds it")
    built = call.with_changes(args=kept)
    if inferred:
        assert isinstance(func, cst.Attribute)
        built = built.with_changes(func=func.with_changes(attr=cst.Name(lazy)))
    new_init_body = list(init.body.body)
    if placeholder is not None:
        small = placeholder.body[0]
        assert isinstance(small, cst.Assign | cst.AnnAssign)
        # (its comment spoke of the placeholder: "deferred initialisation")
        new_init_body[new_init_body.index(placeholder)] = placeholder.with_changes(
            body=[small.with_changes(value=built)], trailing_whitespace=cst.TrailingWhitespace())
        span = [lines(placeholder)]
    else:
        line = cst.SimpleStatementLine(body=[cst.Assign(
            targets=[cst.AssignTarget(cst.Attribute(value=cst.Name(me), attr=cst.Name(attr)))],
            value=built)])
        new_init_body.append(line)
        span = [lines(init.body.body[-1])]
    new_init = init.with_changes(body=init.body.with_changes(body=new_init_body))
    new_method = method
    if statement is not None and statement in method.body.body:  # built on every call: it leaves the method
        rest = [s for s in method.body.body if s is not statement]
        if not rest:
            rest = [cst.SimpleStatementLine(body=[cst.Pass()])]
        new_method = method.with_changes(body=method.body.with_changes(body=rest))
        span.append(lines(statement))
    cls_body = [new_init if s is init else new_method if s is method else s for s in cls.body.body]
    new_cls = cls.with_changes(body=cls.body.with_changes(body=cls_body))
    new = module.deep_replace(cls, new_cls)
    assert isinstance(new, cst.Module)
    start, end = min(s for s, _ in span), max(e for _, e in span)
    lazily = f" as nn.{lazy}, whose first call gives it the input size" if inferred else ""
    return rewritten(module.code, new.code, start, end,
                     f"self.{attr} is built in __init__{lazily}: state_dict() holds its keys from "
                     "construction on, not only after the first forward")


def _method_at(module: cst.Module, line: int, lines: _Lines) -> tuple[cst.ClassDef, cst.FunctionDef] | None:
    """The class and method (a function right in the class body) holding ``line``, the innermost class."""
    found = None
    for node in all_nodes(module):
        if isinstance(node, cst.ClassDef):
            for s in node.body.body:
                if isinstance(s, cst.FunctionDef):
                    start, end = lines(s)
                    if start <= line <= end:
                        found = (node, s)
    return found


def _statement_at(method: cst.FunctionDef, line: int, lines: _Lines) -> cst.SimpleStatementLine | None:
    for node in all_nodes(method.body):
        if isinstance(node, cst.SimpleStatementLine):
            start, end = lines(node)
            if start <= line <= end:
                return node
    return None


def _self_name(method: cst.FunctionDef) -> str:
    params = method.params.params
    return params[0].name.value if params else "self"


def _is_self_attr(node: cst.BaseExpression, me: str) -> bool:
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == me


class _Reads(cst.CSTVisitor):
    """The plain names an expression reads, and the attributes of ``self`` it reads."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.names: set[str] = set()
        self.attrs: set[str] = set()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if isinstance(node.value, cst.Name) and node.value.value == self.me:
            self.attrs.add(node.attr.value)
            return False
        node.value.visit(self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # (a keyword's name is not a read)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self.names.add("lambda")  # a function made here (its parameters): not judged, refused
        return False


def _reads(node: cst.CSTNode, me: str) -> _Reads:
    reads = _Reads(me)
    node.visit(reads)
    return reads


def _module_names(module: cst.Module) -> set[str]:
    """The names the module binds at its top level: imports, assignments, functions, classes."""
    names: set[str] = set()
    for s in module.body:
        if isinstance(s, cst.FunctionDef | cst.ClassDef):
            names.add(s.name.value)
        elif isinstance(s, cst.SimpleStatementLine):
            for small in s.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        top: cst.BaseExpression = alias.asname.name if alias.asname else alias.name
                        while isinstance(top, cst.Attribute):
                            top = top.value
                        if isinstance(top, cst.Name):
                            names.add(top.value)
                elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        bound = alias.asname.name if alias.asname else alias.name
                        if isinstance(bound, cst.Name):
                            names.add(bound.value)
                elif isinstance(small, cst.Assign):
                    for t in small.targets:
                        if isinstance(t.target, cst.Name):
                            names.add(t.target.value)
                elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                    names.add(small.target.value)
    return names


def _assigned_attrs(statements: Sequence[cst.CSTNode], me: str) -> set[str]:
    """The attributes of ``self`` that ``statements`` (of ``__init__``'s own body) assign."""
    found: set[str] = set()
    for s in statements:
        if isinstance(s, cst.SimpleStatementLine):
            for small in s.body:
                targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
                    [small.target] if isinstance(small, cst.AnnAssign) else []
                found.update(t.attr.value for t in targets
                             if isinstance(t, cst.Attribute) and _is_self_attr(t, me))
    return found


def _placeholder(init: cst.FunctionDef, attr: str, me: str) -> cst.SimpleStatementLine | None:
    """``self.<attr> = None`` (annotated or not) in ``__init__``'s own body."""
    for s in init.body.body:
        if not isinstance(s, cst.SimpleStatementLine) or len(s.body) != 1:
            continue
        small = s.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target: cst.BaseExpression = small.targets[0].target
        elif isinstance(small, cst.AnnAssign):
            target = small.target
        else:
            continue
        value = small.value
        if isinstance(target, cst.Attribute) and _is_self_attr(target, me) and target.attr.value == attr \
                and isinstance(value, cst.Name) and value.value == "None":
            return s
    return None
