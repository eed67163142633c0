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
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

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
        self.span: tuple[int, int] | None = None
        """Lines of the original file the fix replaced; None while nothing was replaced."""
        self.reason = f"nothing at line {line} that placecheck fix knows how to rewrite"
        self.note = ""

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef,
                          updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.functions.pop()
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


_WRAPPERS = {("PC102", "list"): "ModuleList", ("PC102", "dict"): "ModuleDict",
             ("PC103", "list"): "ParameterList", ("PC103", "dict"): "ParameterDict"}


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


class AddDevice(_AtLine):
    """PC202: ``torch.randn(shape)`` in forward -> ``torch.randn(shape, device=x.device)``.

    ``x`` is the forward's first tensor argument; a ``.to(y.device)`` or
    ``.cuda()`` called on the factory's result is folded into the call.
    """

    def __init__(self, line: int, factory: str, imports: _Imports) -> None:
        super().__init__(line)
        self.factory = factory
        self.imports = imports
        self.made: set[int] = set()

    def _device_source(self) -> str | None:
        """``"x.device"`` for the enclosing ``forward``'s first tensor argument."""
        if not self.functions or self.functions[-1].name.value != "forward":
            self.reason = f"line {self.line} is not in forward(), so there is no input to take a device from"
            return None
        params = self.functions[-1].params
        for param in [*params.posonly_params, *params.params][1:]:
            annotation = param.annotation
            spelled = cst.Module([]).code_for_node(annotation.annotation) if annotation is not None else ""
            if not annotation or spelled.split(".")[-1] == "Tensor":
                return f"{param.name.value}.device"
        self.reason = "the forward has no tensor argument to take the device from"
        return None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _FOLDED and id(func.value) in self.made:
            return self._fold(updated_node, func)
        if not self.covers(original_node) or self.imports.torch_member(func) != self.factory:
            return updated_node
        if _has_keyword(updated_node, "device"):
            self.reason = f"torch.{self.factory} at line {self.line} already passes device="
            return updated_node
        device = self._device_source()
        if device is None:
            return updated_node
        new = _with_keyword(updated_node, "device", cst.parse_expression(device))
        self.made.add(id(new))
        self.mark(original_node)
        return new

    def _fold(self, call: cst.Call, func: cst.Attribute) -> cst.BaseExpression:
        """``factory(..., device=x.device).to(y.device)`` -> ``factory(..., device=y.device)``."""
        inner = func.value
        assert isinstance(inner, cst.Call)
        if func.attr.value == "cuda" and not call.args:
            return inner
        if func.attr.value == "to" and len(call.args) == 1:
            arg = call.args[0]
            target = arg.value
            by_keyword = arg.keyword is not None and arg.keyword.value == "device"
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


_KEY = re.compile(r"^\[(\d+|'[^']*'|\"[^\"]*\")\]$")


def _attribute(where: str, module: str) -> str:
    """``blocks.0.mask`` under module ``blocks.0`` -> ``mask``."""
    if module and where.startswith(module + "."):
        return where[len(module) + 1:]
    return where


def _transformer(request: Request, imports: _Imports) -> _AtLine | NotFixable:
    code = request.code
    if code == "PC101":
        attr = _attribute(request.where, request.module)
        if "[" in attr:
            return NotFixable("a tensor inside a plain container: placecheck fix does not invent an "
                              "nn.Module to hold it; register each tensor as a buffer, or create it in "
                              "forward()")
        if not attr.isidentifier():
            return NotFixable("a tensor inside a helper object: make the helper an nn.Module with buffers, "
                              "or create the tensors in forward() on the input's device")
        return RegisterBuffer(request.line, attr, persistent=request.unsafe)
    if code in ("PC102", "PC103"):
        base, bracket, key = request.where.partition("[")
        attr = _attribute(base, request.module)
        matched = _KEY.match(bracket + key)
        if not attr.isidentifier() or matched is None:
            return NotFixable("not a plain container held directly by a module attribute")
        indexed_as = "list" if matched.group(1).isdigit() else "dict"
        return WrapContainer(request.line, code, attr, indexed_as, imports)
    if code == "PC202":
        factory = request.op.removeprefix("torch.")
        if not request.op.startswith("torch.") or not factory.isidentifier():
            return NotFixable(f"{request.op or 'this call'} is not a torch factory function")
        return AddDevice(request.line, factory, imports)
    if code == "PC201":
        if not request.batch:
            return NotFixable("PC201 is rewritten only for a batch element a placecheck run loop did not "
                              "move: fix it where the tensor comes from (its origin)")
        if not request.where.isidentifier():
            return NotFixable(f"the batch element ({request.batch}) has no name of its own in the loop: move "
                              "the batch to the device where it is unpacked")
        return MoveBatchElement(request.line, request.use, request.where)
    if code == "PC301":
        location = request.device if request.device in ("cpu", "meta") else "cpu"
        return MapLocation(request.line, location, imports)
    if code in NEVER:
        return NotFixable(NEVER[code])
    return NotFixable(f"{code} is not rewritten automatically")


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
    new_module = MetadataWrapper(module, unsafe_skip_copy=True).visit(transformer)  # parsed just now
    if transformer.span is None:
        return NotFixable(transformer.reason)
    new_source = new_module.code
    start, end = transformer.span
    old_lines = source.splitlines(keepends=True)
    new_lines = new_source.splitlines(keepends=True)
    new_end = end + len(new_lines) - len(old_lines)
    return Rewrite(new_source, start, end, "".join(old_lines[start - 1:end]),
                   "".join(new_lines[start - 1:new_end]), transformer.note)


def lazy_equivalent(created: str) -> str:
    """``Linear`` -> ``LazyLinear``: the torch.nn class that infers its input size, or ``""``."""
    return f"Lazy{created}" if created in _LAZY else ""


_LAZY = frozenset({"Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                   "ConvTranspose3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d",
                   "InstanceNorm2d", "InstanceNorm3d"})
"""torch.nn's layers with an ``nn.Lazy*`` twin (torch 2.4 and later)."""
