"""The source rewrites of ``placecheck fix``: one libcst transformer per finding code.

Each transformer changes one statement or call at a known line and nothing
else, so the file keeps its formatting and comments (libcst is a concrete
syntax tree: what is not replaced is written back byte for byte). A
transformer that finds nothing it may rewrite at that line leaves the tree
alone and says why in ``reason``; :func:`rewrite` turns that into a
:class:`NotFixable`. No torch here: the rewrites read only source text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from placecheck.findings.codes import Code
from placecheck.fix.codes import NEVER


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


class _Imports(cst.CSTVisitor):
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


def _has_keyword(call: cst.Call, name: str) -> bool:
    return any(arg.keyword is not None and arg.keyword.value == name for arg in call.args) or \
        any(arg.star == "**" for arg in call.args)


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value=value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def _with_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """``call`` with ``name=value`` appended, keeping a trailing comma's layout."""
    args = list(call.args)
    new = _keyword(name, value)
    if args:
        last = args[-1]
        if isinstance(last.comma, cst.MaybeSentinel):
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        else:  # a trailing comma (a call over several lines): the new argument on a line of its own
            new, args[-1] = _after_trailing_comma(call, new)
    args.append(new)
    return call.with_changes(args=args)


def _after_trailing_comma(call: cst.Call, new: cst.Arg) -> tuple[cst.Arg, cst.Arg]:
    """``new`` laid out as one more line after the last argument, which ends in a comma.

    The last argument keeps its comment and line; the new one is indented like
    the arguments, and the closing parenthesis stays where it was.
    """
    last = call.args[-1]
    comma = last.comma
    assert isinstance(comma, cst.Comma)
    after = comma.whitespace_after
    if not isinstance(after, cst.ParenthesizedWhitespace):  # `f(a, )` on one line
        return new.with_changes(comma=comma), last
    previous = call.args[-2].comma if len(call.args) > 1 else None
    if isinstance(previous, cst.Comma) and isinstance(previous.whitespace_after, cst.ParenthesizedWhitespace):
        indent, last_line = previous.whitespace_after.indent, previous.whitespace_after.last_line
    elif isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        indent, last_line = call.whitespace_before_args.indent, call.whitespace_before_args.last_line
    else:  # `f(a,\n)`: the first argument on the call's line
        return new.with_changes(comma=comma), last.with_changes(comma=cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" ")))
    to_new_line = comma.with_changes(whitespace_after=cst.ParenthesizedWhitespace(
        first_line=after.first_line, empty_lines=after.empty_lines, indent=indent, last_line=last_line))
    closing = comma.with_changes(whitespace_after=after.with_changes(first_line=cst.TrailingWhitespace(),
                                                                     empty_lines=[]))
    return new.with_changes(comma=closing), last.with_changes(comma=to_new_line)


class _AtLine(cst.CSTTransformer):
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


def _self_assignment(statement: cst.SimpleStatementLine, self_name: str, attr: str) -> int:
    """Index in ``statement.body`` of ``<self_name>.<attr> = value``, or -1."""
    for i, small in enumerate(statement.body):
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) \
                    and target.value.value == self_name and target.attr.value == attr:
                return i
    return -1


class RegisterBuffer(_AtLine):
    """PC101: ``self.mask = <expr>`` in ``__init__`` -> a ``register_buffer`` call.

    ``self.register_buffer("mask", <expr>, persistent=False)``: persistent only
    when asked (``--unsafe``), since that adds a ``state_dict()`` key.
    """

    def __init__(self, line: int, attr: str, persistent: bool) -> None:
        super().__init__(line)
        self.attr = attr
        self.persistent = persistent

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
            self.reason = f"line {self.line} is not a plain `{self_name}.{self.attr} = ...` assignment"
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


class WrapContainer(_AtLine):
    """PC102/PC103: ``self.heads = [...]`` in ``__init__`` -> ``self.heads = nn.ModuleList([...])``.

    The container kind comes from the literal when there is one (``[...]``,
    ``(...)``, ``{...}``, comprehensions), else from how the audit indexed it
    (``heads[0]`` a list, ``heads['a']`` a dict).
    """

    def __init__(self, line: int, code: str, attr: str, indexed_as: str, imports: _Imports) -> None:
        super().__init__(line)
        self.code = code
        self.attr = attr
        self.indexed_as = indexed_as
        self.imports = imports

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
            self.reason = f"line {self.line} is not a plain `{self_name}.{self.attr} = ...` assignment"
            return updated_node
        assign = updated_node.body[index]
        assert isinstance(assign, cst.Assign)
        value = assign.value
        if isinstance(value, (cst.List, cst.ListComp, cst.Tuple, cst.GeneratorExp)):
            kind = "list"
        elif isinstance(value, (cst.Dict, cst.DictComp)):
            kind = "dict"
        else:
            kind = self.indexed_as
        wrapper = _WRAPPERS[(self.code, kind)]
        spelled = self.imports.nn_ref(wrapper)
        if spelled is None:
            self.reason = "the file does not import torch, so there is no name to reach nn." + wrapper
            return updated_node
        if isinstance(value, cst.Tuple) and not value.lpar:
            value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        call = cst.Call(func=cst.parse_expression(spelled), args=[cst.Arg(value=value)])
        body = list(updated_node.body)
        body[index] = assign.with_changes(value=call)
        self.mark(original_node)
        self.note = (f"'{self.attr}' becomes a {wrapper}: state_dict() gains its keys ({self.attr}.0..., "
                     "which checkpoints saved before the fix lack) and the optimizer sees its parameters")
        return updated_node.with_changes(body=body)


_FOLDED = ("to", "cuda")

FACTORIES = frozenset({"arange", "as_tensor", "empty", "eye", "full", "linspace", "logspace", "ones", "rand",
                       "randint", "randn", "randperm", "range", "tensor", "tril_indices", "triu_indices",
                       "zeros", "empty_strided", "scalar_tensor", "bartlett_window", "blackman_window",
                       "hamming_window", "hann_window", "kaiser_window"})
"""torch functions that create a tensor and take ``device=``: the ones a PC201 origin line may hold."""


def _is_static(function: cst.FunctionDef) -> bool:
    return any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod"
               for d in function.decorators)


def _may_be_tensor(param: cst.Param) -> bool:
    """Whether ``param`` may hold a tensor: annotated ``Tensor`` (or ``Tensor | None``), or not annotated
    and without a default that is a number, a string or a bool."""
    if param.annotation is not None:
        spelled = cst.Module([]).code_for_node(param.annotation.annotation)
        return any(part.strip().split(".")[-1] == "Tensor" for part in re.split(r"[|\[\],]", spelled))
    default = param.default
    return not isinstance(default, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString,
                                    cst.UnaryOperation)) and not (isinstance(default, cst.Name)
                                                                  and default.value in ("True", "False"))


class AddDevice(_AtLine):
    """PC202 (and a PC201 whose origin is a factory): ``torch.randn(shape)`` -> ``torch.randn(shape,
    device=x.device)``.

    ``x`` is the first tensor argument of the function the line is in: the
    forward's input, a helper function's or another method's tensor argument
    (a method's ``self`` is skipped). In the script ``placecheck run`` ran, a
    line outside such a function takes the device expression the script moves
    its tensors with (``device``). A ``.to(y.device)`` or ``.cuda()`` called
    on the factory's result is folded into the call. A device the module
    captured at construction (``device=self.device``, which ``.to()`` does not
    change) is replaced by the input's. ``factory`` empty: the one torch
    factory on the line that creates off the device.
    """

    def __init__(self, line: int, factory: str, imports: _Imports, script_device: str = "") -> None:
        super().__init__(line)
        self.factory = factory
        self.imports = imports
        self.script_device = script_device
        self.made: set[int] = set()

    def _device_source(self) -> str | None:
        """``"x.device"`` for the enclosing function's first tensor argument, or the script's device."""
        if self.functions:
            function = self.functions[-1]
            params = [*function.params.posonly_params, *function.params.params]
            if self.methods[-1] and not _is_static(function):
                params = params[1:]
            for param in params:
                if _may_be_tensor(param):
                    return f"{param.name.value}.device"
        if self.script_device:
            return self.script_device
        if not self.functions:
            self.reason = (f"line {self.line} is outside any function: there is no input to take a device "
                           "from")
        elif self.functions[-1].name.value == "forward":
            self.reason = "the forward has no tensor argument to take the device from"
        else:
            name = self.functions[-1].name.value
            self.reason = (f"{name}() has no tensor argument to take the device from: pass the input (or "
                           f"its device) to {name}() and create the tensor with device=<input>.device")
        return None

    def _captured(self, value: cst.BaseExpression) -> bool:
        """``self.device`` (or ``self.cfg.device``): a device read from the module, set at construction."""
        if not self.functions or not self.methods[-1]:
            return False
        params = self.functions[-1].params.params
        root = value
        while isinstance(root, cst.Attribute):
            root = root.value
        return isinstance(value, cst.Attribute) and bool(params) and isinstance(root, cst.Name) \
            and root.value == params[0].name.value

    def _wanted(self, call: cst.Call) -> bool:
        member = self.imports.torch_member(call.func)
        return member == self.factory if self.factory else member in FACTORIES

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _FOLDED and id(func.value) in self.made:
            return self._fold(updated_node, func)
        if (self.span is not None and not self.factory) or not self.covers(original_node) \
                or not self._wanted(updated_node):
            return updated_node
        device = None
        if _has_keyword(updated_node, "device"):
            given = next((a for a in updated_node.args if a.keyword is not None
                          and a.keyword.value == "device"), None)
            if given is None or not self._captured(given.value):
                self.reason = f"torch.{self.factory or 'factory'} at line {self.line} already passes device="
                return updated_node
            device = self._device_source()
            if device is None:
                return updated_node
            new = updated_node.with_changes(args=[a.with_changes(value=cst.parse_expression(device))
                                                  if a is given else a for a in updated_node.args])
        else:
            device = self._device_source()
            if device is None:
                return updated_node
            new = _with_keyword(updated_node, "device", cst.parse_expression(device))
        self.made.add(id(new))
        self.mark(original_node)
        return new

    def _fold(self, call: cst.Call, func: cst.Attribute) -> cst.BaseExpression:
        """``factory(..., device=x.device).to(y.device)`` -> ``factory(..., device=y.device)``; a move to a
        device captured by the module (``.to(self.device)``) is dropped."""
        inner = func.value
        assert isinstance(inner, cst.Call)
        if func.attr.value == "cuda" and not call.args:
            return inner
        if func.attr.value == "to" and len(call.args) == 1:
            arg = call.args[0]
            target = arg.value
            by_keyword = arg.keyword is not None and arg.keyword.value == "device"
            if (by_keyword or (arg.keyword is None and not arg.star)) and self._captured(target):
                return inner
            if (by_keyword or (arg.keyword is None and not arg.star)) and \
                    isinstance(target, cst.Attribute) and target.attr.value == "device":
                args = [a.with_changes(value=target) if a.keyword is not None and a.keyword.value == "device"
                        else a for a in inner.args]
                return inner.with_changes(args=args)
        return call


class MapLocation(_AtLine):
    """PC301: ``torch.load(path)`` -> ``torch.load(path, map_location="cpu")``."""

    def __init__(self, line: int, location: str, imports: _Imports) -> None:
        super().__init__(line)
        self.location = location
        self.imports = imports

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.span is not None or not self.covers(original_node) \
                or self.imports.torch_member(updated_node.func) != "load":
            return updated_node
        positional = [a for a in updated_node.args if a.keyword is None]  # map_location is the second
        if _has_keyword(updated_node, "map_location") or len(positional) > 1 \
                or any(a.star for a in positional):
            self.reason = f"torch.load at line {self.line} already says where to load"
            return updated_node
        self.mark(original_node)
        return _with_keyword(updated_node, "map_location", cst.SimpleString(f'"{self.location}"'))


class _Calls(cst.CSTVisitor):
    """Every ``<name>.to(...)`` / ``<name>.cuda(...)`` call and every name assigned, in one statement."""

    def __init__(self) -> None:
        self.moves: list[tuple[str, cst.Call]] = []
        self.assigned: set[str] = set()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _FOLDED \
                and isinstance(func.value, cst.Name) and (func.attr.value == "cuda" or node.args):
            self.moves.append((func.value.value, node))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.assigned.update(_bound_names(node.target))


def _bound_names(target: cst.BaseExpression) -> set[str]:
    """``inputs, (labels, mask)`` -> ``{"inputs", "labels", "mask"}``."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for element in target.elements for n in _bound_names(element.value)}
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    return set()


def _scan(statement: cst.CSTNode) -> _Calls:
    calls = _Calls()
    statement.visit(calls)
    return calls


class MoveBatchElement(_AtLine):
    """PC201 in ``placecheck run``: a batch element the loop does not move gets the siblings' move.

    ``for inputs, labels in loader: inputs = inputs.to(device)`` -> a line
    ``labels = labels.to(device)`` after the sibling's, with the sibling's
    arguments (its device expression, its ``non_blocking``); before the line
    that uses it when the sibling is moved inline there. ``line`` is the
    loop's line.
    """

    def __init__(self, loop: int, use: int, name: str) -> None:
        super().__init__(loop)
        self.use = use
        self.name = name

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        if self.span is not None \
                or self.get_metadata(PositionProvider, original_node).start.line != self.line:
            return updated_node
        body = original_node.body
        if not isinstance(body, cst.IndentedBlock):
            self.reason = f"the loop at line {self.line} is on one line: give it an indented body first"
            return updated_node
        statements = list(body.body)
        use = next((i for i, s in enumerate(statements) if self.use and self.covers_line(s, self.use)),
                   len(statements))
        bound = _bound_names(original_node.target)
        in_loop = bound.union(*(_scan(s).assigned for s in statements))  # a batch element has a name here
        for index in reversed(range(min(use + 1, len(statements)))):
            scanned = _scan(statements[index])
            moves = [call for name, call in scanned.moves if name != self.name and name in in_loop]
            if moves:
                break
        else:
            self.reason = (f"no other element of the batch is moved in the loop at line {self.line}: nothing "
                           f"says which device expression to use; move {self.name} to the device there")
            return updated_node
        at = index + 1 if index < use else index  # after the sibling's line, or before the inline use
        for earlier in statements[:at]:
            bound |= _scan(earlier).assigned
        if self.name not in bound:
            self.reason = (f"`{self.name}` is not bound by the loop at line {self.line} before its "
                           "siblings move")
            return updated_node
        sibling = moves[-1]
        assert isinstance(sibling.func, cst.Attribute)
        moved = sibling.with_changes(func=sibling.func.with_changes(value=cst.Name(self.name)))
        line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(self.name))], moved)])
        self.mark(statements[index])
        kept = list(updated_node.body.body)
        return updated_node.with_changes(body=updated_node.body.with_changes(
            body=[*kept[:at], line, *kept[at:]]))

    def covers_line(self, node: cst.CSTNode, line: int) -> bool:
        pos = self.get_metadata(PositionProvider, node)
        return bool(pos.start.line <= line <= pos.end.line)


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


class _Replace(cst.CSTTransformer):
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
        return NotFixable(f"nothing at line {located.line} that placecheck fix knows how to rewrite")
    statement, stack = located.found
    if len(stack) < 2 or not isinstance(stack[-1], cst.FunctionDef) or stack[-1].name.value != "__init__" \
            or not isinstance(stack[-2], cst.ClassDef) or not stack[-1].params.params:
        return NotFixable(f"line {located.line} is not in __init__: tensors are registered there")
    return statement, stack[-2], stack[-1].params.params[0].name.value


def _span(positions: Any, nodes: list[cst.CSTNode]) -> tuple[int, int]:
    lines = [(positions[n].start.line, positions[n].end.line) for n in nodes]
    return min(a for a, _ in lines), max(b for _, b in lines)


def _container_buffers(module: cst.Module, request: Request, attr: str) -> Rewrite | NotFixable:
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
    subscripts = [n for n in _all_nodes(owner) if id(n) in uses.indexed]
    new = module.visit(_Replace(statement, statements, uses.indexed))
    start, end = _span(positions, [statement, *subscripts])
    note = ("" if not persistent else f"'{attr}' becomes persistent buffers (--unsafe): state_dict() gains "
            f"the keys {', '.join(names.values())}, and checkpoints saved before the fix lack them")
    return _rewritten(module.code, new.code, start, end, note)


def _all_nodes(root: cst.CSTNode) -> list[cst.CSTNode]:
    nodes: list[cst.CSTNode] = []

    class _All(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nodes.append(node)
            return True

    root.visit(_All())
    return nodes


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


def _helper_module(module: cst.Module, request: Request, attr: str,
                   imports: _Imports) -> Rewrite | NotFixable:
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
        found = [s for s in _all_nodes(init) if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
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
    return _rewritten(module.code, new.code, start, end, note)


def script_device(module: cst.Module) -> str:
    """The device expression a script moves its model and tensors with: the name most passed to
    ``.to(...)`` (``device``) among those the script assigns at its top level; ``"cuda"`` when it moves
    with ``.cuda()`` only; ``""`` when it moves nothing."""
    top = set()
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign):
                    top |= {n for t in small.targets for n in _bound_names(t.target)}
    counts: dict[str, int] = {}
    cuda = 0

    class _Moves(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal cuda
            func = node.func
            if not isinstance(func, cst.Attribute):
                return
            if func.attr.value == "cuda" and not node.args:
                cuda += 1
            elif func.attr.value == "to" and node.args:
                first = node.args[0]
                positional = first.value if first.keyword is None else None
                value = next((a.value for a in node.args if a.keyword is not None
                              and a.keyword.value == "device"), positional)
                if isinstance(value, cst.Name) and value.value in top:
                    counts[value.value] = counts.get(value.value, 0) + 1

    module.visit(_Moves())
    if counts:
        return max(counts, key=lambda name: counts[name])
    return '"cuda"' if cuda else ""


def _statement_lines(module: cst.Module) -> list[tuple[cst.SimpleStatementLine, int, int]]:
    """Every simple statement of ``module`` with its first and last line."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    return [(n, positions[n].start.line, positions[n].end.line) for n in _all_nodes(module)
            if isinstance(n, cst.SimpleStatementLine)]


def _move_holder(module: cst.Module, request: Request) -> Rewrite | NotFixable:
    """PC201 in a script: a module whose buffer was not moved (``criterion.weight``): ``.to(device)`` on the
    line that builds it (``criterion = nn.CrossEntropyLoss(weight=w).to(device)``)."""
    device = script_device(module)
    name = request.holder
    if not device:
        return NotFixable(f"the script moves nothing to a device: call {name}.to(device) as for the model")
    built = [(s, line, end) for s, line, end in _statement_lines(module) if line < request.line
             and len(s.body) == 1
             and isinstance(s.body[0], cst.Assign) and len(s.body[0].targets) == 1
             and isinstance(s.body[0].targets[0].target, cst.Name)
             and s.body[0].targets[0].target.value == name]
    if not built:
        return NotFixable(f"no `{name} = ...` before line {request.line} in this file: call "
                          f"{name}.to({device}) where it is built")
    statement, line, end = built[-1]
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign)
    value = assign.value
    if not isinstance(value, (cst.Call, cst.Name, cst.Attribute, cst.Subscript)):
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    moved = cst.Call(func=cst.Attribute(value=value, attr=cst.Name("to")),
                     args=[cst.Arg(cst.parse_expression(device))])
    new_statement = statement.with_changes(body=[assign.with_changes(value=moved)])
    new = module.visit(_Replace(statement, [new_statement], {}))
    return _rewritten(module.code, new.code, line, end, "")


def _move_target(statement: cst.BaseStatement) -> str:
    """``model.to(device)`` / ``model.cuda()`` / ``model = model.to(device)`` -> ``"model"``; else ``""``."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return ""
    small = statement.body[0]
    call = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute) \
            or call.func.attr.value not in _FOLDED or not isinstance(call.func.value, cst.Name):
        return ""
    name = call.func.value.value
    if isinstance(small, cst.Assign) and _bound_names(small.targets[0].target) != {name}:
        return ""
    return name


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)


def _move_model_up(module: cst.Module, request: Request) -> Rewrite | NotFixable:
    """PC307: ``optimizer.load_state_dict(...)`` before ``model.to(device)``: the move goes up, just before
    the load (``load_state_dict`` casts the state to where the parameters are at that moment)."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    blocks: list[list[cst.BaseStatement]] = [list(module.body)]
    blocks += [list(n.body) for n in _all_nodes(module) if isinstance(n, cst.IndentedBlock)]
    for block in blocks:
        at = next((i for i, s in enumerate(block)
                   if positions[s].start.line <= request.line <= positions[s].end.line
                   and isinstance(s, cst.SimpleStatementLine)), None)
        if at is not None:
            break
    else:
        return NotFixable(f"line {request.line} is not a statement placecheck fix can move the model before")
    trained = set(re.findall(r"\b(\w+)\.parameters\(", module.code))
    later = next((j for j in range(at + 1, len(block)) if _move_target(block[j]) in trained), None)
    if later is None:
        return NotFixable(f"no `model.to(device)` of a model whose parameters an optimizer holds follows "
                          f"line {request.line} in the same block: move the model to the device before "
                          "optimizer.load_state_dict")
    moved = block[later]
    names = _Names()
    moved.visit(names)
    between = set().union(*(_scan(s).assigned for s in block[at:later]))
    if names.names & between:
        return NotFixable(f"the move at line {positions[moved].start.line} uses "
                          f"{sorted(names.names & between)[0]}, assigned after line {request.line}: move the "
                          "model to the device before optimizer.load_state_dict")
    load = block[at]
    assert isinstance(moved, cst.SimpleStatementLine) and isinstance(load, cst.SimpleStatementLine)
    # blank lines above the load go above the move; the load keeps the comments that describe it
    lines = list(load.leading_lines)
    split = next((i for i, e in enumerate(lines) if e.comment), len(lines))
    comments = [e for e in moved.leading_lines if e.comment]
    first = moved.with_changes(leading_lines=[*lines[:split], *comments])
    new = module.visit(_Reorder(load, moved, [first, load.with_changes(leading_lines=lines[split:])]))
    start, end = positions[load].start.line, positions[moved].end.line
    return _rewritten(module.code, new.code, start, end, "")


class _Reorder(cst.CSTTransformer):
    """``statements`` in place of ``at``; ``drop`` removed."""

    def __init__(self, at: cst.CSTNode, drop: cst.CSTNode, statements: list[cst.BaseStatement]) -> None:
        super().__init__()
        self.at = at
        self.drop = drop
        self.statements = statements

    def leave_SimpleStatementLine(
            self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        if original_node is self.at:
            return cst.FlattenSentinel(self.statements)
        if original_node is self.drop:
            return cst.RemovalSentinel.REMOVE
        return updated_node


def _rewritten(source: str, new_source: str, start: int, end: int, note: str) -> Rewrite:
    old_lines = source.splitlines(keepends=True)
    new_lines = new_source.splitlines(keepends=True)
    new_end = end + len(new_lines) - len(old_lines)
    return Rewrite(new_source, start, end, "".join(old_lines[start - 1:end]),
                   "".join(new_lines[start - 1:new_end]), note)


_KEY = re.compile(r"^\[(\d+|'[^']*'|\"[^\"]*\")\]$")


def _attribute(where: str, module: str) -> str:
    """``blocks.0.mask`` under module ``blocks.0`` -> ``mask``."""
    if module and where.startswith(module + "."):
        return where[len(module) + 1:]
    return where


_WholeFile = Callable[[cst.Module], "Rewrite | NotFixable"]
"""A rewrite that reads more than the finding's line (a class's every use of an attribute, a helper's
class, the statements around a line of a script)."""


def _transformer(request: Request, imports: _Imports) -> _AtLine | _WholeFile | NotFixable:
    code = request.code
    if code == Code.PC101:
        attr = _attribute(request.where, request.module)
        base = re.split(r"[.\[]", attr, maxsplit=1)[0]
        if "[" in attr and base.isidentifier() and _KEY.match(attr[len(base):]):
            return lambda module: _container_buffers(module, request, base)
        if "." in attr and base.isidentifier() and request.fields \
                and all(f.isidentifier() for f in request.fields):
            return lambda module: _helper_module(module, request, base, imports)
        if not attr.isidentifier():
            return NotFixable("a tensor nested deeper than one container or helper object: register it as "
                              "a buffer of a module (self.register_buffer(\"name\", <tensor>, "
                              "persistent=False)), or create it in forward() on the input's device")
        return RegisterBuffer(request.line, attr, persistent=request.unsafe)
    if code in (Code.PC102, Code.PC103):
        base, bracket, key = request.where.partition("[")
        attr = _attribute(base, request.module)
        matched = _KEY.match(bracket + key)
        if not attr.isidentifier() or matched is None:
            return NotFixable("not a plain container held directly by a module attribute")
        indexed_as = "list" if matched.group(1).isdigit() else "dict"
        return WrapContainer(request.line, code, attr, indexed_as, imports)
    if code == Code.PC202:
        factory = request.op.removeprefix("torch.")
        if request.op and (not request.op.startswith("torch.") or not factory.isidentifier()):
            return NotFixable(f"{request.op} is not a torch factory function")
        if request.script:
            return lambda module: _visit(module, AddDevice(request.line, factory, imports,
                                                           script_device(module)))
        return AddDevice(request.line, factory, imports)
    if code == Code.PC201:
        if request.holder:
            return lambda module: _move_holder(module, request)
        if not request.batch:
            return NotFixable("the audit names no origin of the mismatched tensor that placecheck fix can "
                              "rewrite: fix it where the tensor comes from")
        if not request.where.isidentifier():
            return NotFixable(f"the batch element ({request.batch}) has no name of its own in the loop: move "
                              "the batch to the device where it is unpacked")
        return MoveBatchElement(request.line, request.use, request.where)
    if code == Code.PC301:
        location = request.device if request.device in ("cpu", "meta") else "cpu"
        return MapLocation(request.line, location, imports)
    if code == Code.PC307:
        return lambda module: _move_model_up(module, request)
    if code in NEVER:
        return NotFixable(NEVER[code])
    return NotFixable(f"{code} is not rewritten automatically")


def _visit(module: cst.Module, transformer: _AtLine) -> Rewrite | NotFixable:
    new_module = MetadataWrapper(module, unsafe_skip_copy=True).visit(transformer)  # parsed just now
    if transformer.span is None:
        return NotFixable(transformer.reason)
    start, end = transformer.span
    return _rewritten(module.code, new_module.code, start, end, transformer.note)


def rewrite(source: str, request: Request) -> Rewrite | NotFixable:
    """Apply the fix ``request`` asks for to ``source``; the whole new text and the replaced lines."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return NotFixable(f"the file does not parse ({exc.message})")
    imports = _Imports()
    for statement in module.body:  # module-level imports: how the file names torch
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Import):
                    imports.visit_Import(small)
                elif isinstance(small, cst.ImportFrom):
                    imports.visit_ImportFrom(small)
    transformer = _transformer(request, imports)
    if isinstance(transformer, NotFixable):
        return transformer
    if isinstance(transformer, _AtLine):
        return _visit(module, transformer)
    return transformer(module)


def lazy_equivalent(created: str) -> str:
    """``Linear`` -> ``LazyLinear``: the torch.nn class that infers its input size, or ``""``."""
    return f"Lazy{created}" if created in _LAZY else ""


_LAZY = frozenset({"Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                   "ConvTranspose3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d",
                   "InstanceNorm2d", "InstanceNorm3d"})
"""torch.nn's layers with an ``nn.Lazy*`` twin (torch 2.4 and later)."""
