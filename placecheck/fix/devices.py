"""The rewrites of where tensors are made, moved and loaded (PC202, PC201, PC301, PC307).

A factory gets ``device=`` (:class:`AddDevice`, PC202 and a PC201 whose origin is
one); ``torch.load`` gets ``map_location=`` (:class:`MapLocation`); in the script
``placecheck run`` ran, a batch element the loop does not move gets its
siblings' move (:class:`MoveBatchElement`), a module whose buffer was not moved
gets ``.to(device)`` where it is built (:func:`move_holder`), and
``model.to(device)`` goes up before ``optimizer.load_state_dict``
(:func:`move_model_up`). :func:`script_device` reads the device expression a
script moves its tensors with.
"""

from __future__ import annotations

import re

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from placecheck.fix.syntax import AtLine, Imports, NotFixable, Replace, Request, Rewrite, all_nodes, rewritten


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
        # Tensor, torch.Tensor | None, Optional[Tensor]; not dict[str, Tensor] or list[Tensor]
        spelled = cst.Module([]).code_for_node(param.annotation.annotation)
        parts = [re.sub(r"^(typing\.)?Optional\[(.*)\]$", r"\2", p.strip()) for p in spelled.split("|")]
        return any(part.strip().split(".")[-1] == "Tensor" for part in parts)
    default = param.default
    return not isinstance(default, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString,
                                    cst.UnaryOperation)) and not (isinstance(default, cst.Name)
                                                                  and default.value in ("True", "False"))


_TENSOR_FACTS = frozenset({"shape", "device", "dtype", "ndim"})
_TENSOR_METHODS = frozenset({"size", "dim", "numel"})


def _tensor_read(call: cst.Call) -> str:
    """The first plain name whose tensor facts the call's arguments read (``h.shape[1]``,
    ``h.size(1)``: ``h``), or ``""``: the nearest tensor a function with no tensor argument has."""
    for node in all_nodes(cst.Module([]).with_changes(body=[cst.SimpleStatementLine([cst.Expr(
            cst.Tuple([cst.Element(a.value) for a in call.args]))])])):
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) \
                and node.attr.value in _TENSOR_FACTS:
            return node.value.value
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and isinstance(node.func.value, cst.Name) and node.func.attr.value in _TENSOR_METHODS:
            return node.func.value.value
    return ""


class AddDevice(AtLine):
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

    def __init__(self, line: int, factory: str, imports: Imports, script_device: str = "") -> None:
        super().__init__(line)
        self.factory = factory
        self.imports = imports
        self.script_device = script_device
        self.made: set[int] = set()
        named = f"torch.{factory}" if factory else "torch factory (torch.zeros, torch.arange, ...)"
        self.reason = (f"no {named} call at line {line} as this file imports torch: the tensor is made some "
                       "other way (torch.from_numpy, an op on another tensor, a library call), which "
                       "device= cannot be added to")

    def _device_source(self, call: cst.Call) -> str | None:
        """``"x.device"`` for the enclosing function's first tensor argument, else for a tensor the
        factory's own arguments read (``torch.arange(h.shape[1])``: ``h``), or the script's device."""
        if self.functions:
            function = self.functions[-1]
            params = [*function.params.posonly_params, *function.params.params]
            if self.methods[-1] and not _is_static(function):
                params = params[1:]
            for param in params:
                if _may_be_tensor(param):
                    return f"{param.name.value}.device"
            read = _tensor_read(call)
            if read:
                return f"{read}.device"
        if self.script_device:
            return self.script_device
        if not self.functions:
            self.reason = (f"line {self.line} is outside any function: there is no input to take a device "
                           "from")
        elif self.functions[-1].name.value == "forward":
            self.reason = ("the forward has no tensor argument, and the factory's arguments read no tensor's "
                           "shape or size, to take the device from")
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
                named = f"torch.{self.factory}" if self.factory else "the torch factory"
                spelled = cst.Module([]).code_for_node(given.value) if given is not None else "**kwargs"
                self.reason = (f"{named} at line {self.line} already passes device= ({spelled}): the code "
                               "chose that device, or moves the tensor after (.cpu()), on purpose as far as "
                               "placecheck fix can tell")
                return updated_node
            device = self._device_source(updated_node)
            if device is None:
                return updated_node
            new = updated_node.with_changes(args=[a.with_changes(value=cst.parse_expression(device))
                                                  if a is given else a for a in updated_node.args])
        else:
            device = self._device_source(updated_node)
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


class MapLocation(AtLine):
    """PC301: ``torch.load(path)`` -> ``torch.load(path, map_location="cpu")``."""

    def __init__(self, line: int, location: str, imports: Imports) -> None:
        super().__init__(line)
        self.location = location
        self.imports = imports
        self.reason = (f"no torch.load call at line {line} (a helper that loads for you?): map_location "
                       "belongs where torch.load is called")

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


class MoveBatchElement(AtLine):
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
        self.reason = (f"no for loop starts at line {loop}, where the audit saw the batches made: the batch "
                       f"is not unpacked in a loop of this file, so there is no sibling's move to copy for "
                       f"{name}")

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
    return [(n, positions[n].start.line, positions[n].end.line) for n in all_nodes(module)
            if isinstance(n, cst.SimpleStatementLine)]


def move_holder(module: cst.Module, request: Request) -> Rewrite | NotFixable:
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
    new = module.visit(Replace(statement, [new_statement], {}))
    return rewritten(module.code, new.code, line, end, "")


def _discards_move(statement: cst.SimpleStatementLine, name: str, device: str) -> bool:
    """Whether ``statement`` is ``name.to(<a device>)`` / ``name.cuda(...)`` alone, its result thrown away.

    A device is ``device=...``, a string, ``<t>.device``, ``torch.device(...)`` or the script's device
    expression (``device``): ``x.to(torch.float16)`` thrown away is left alone, as binding it would change
    the dtype, which a proof of placement does not check."""
    if len(statement.body) != 1 or not isinstance(statement.body[0], cst.Expr):
        return False
    call = statement.body[0].value
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute) \
            or call.func.attr.value not in _FOLDED or not isinstance(call.func.value, cst.Name) \
            or call.func.value.value != name:
        return False
    if call.func.attr.value == "cuda" or any(a.keyword is not None and a.keyword.value == "device"
                                             for a in call.args):
        return True
    given = call.args[0] if call.args else None
    first = given.value if given is not None and given.keyword is None and not given.star else None
    spelled = cst.Module([]).code_for_node(first) if first is not None else ""
    return isinstance(first, (cst.SimpleString, cst.FormattedString)) or spelled == device \
        or (isinstance(first, cst.Attribute) and first.attr.value == "device") \
        or (isinstance(first, cst.Call) and cst.Module([]).code_for_node(first.func).endswith("device"))


def bind_discarded_move(module: cst.Module, request: Request) -> Rewrite | NotFixable:
    """PC201 in a script: ``x.to(device)`` alone on its line (Tensor.to returns a moved copy and leaves
    ``x`` where it is) before a use of ``x`` unmoved -> ``x = x.to(device)``.

    The last such statement before the use, when nothing binds ``x`` again between them. On a module
    the edit changes nothing (Module.to moves in place and returns the module)."""
    name = request.rebind
    lines = _statement_lines(module)
    device = script_device(module)
    moves = [(s, line, end) for s, line, end in lines
             if end < request.line and _discards_move(s, name, device)]
    if not moves:
        return NotFixable(f"`{name}` is used unmoved at line {request.line} and no `{name}.to(device)` "
                          f"before it throws its result away: move {name} to the device where it is made")
    statement, line, end = moves[-1]
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    for node in all_nodes(module):
        bound: set[str] = set()
        if isinstance(node, cst.SimpleStatementLine):
            bound = _scan(node).assigned
        elif isinstance(node, (cst.For, cst.With)):
            targets = [node.target] if isinstance(node, cst.For) else \
                [item.asname.name for item in node.items if item.asname is not None]
            bound = set().union(*(_bound_names(t) for t in targets))
        at = positions[node].start.line if node in positions else 0
        if name in bound and end < at < request.line:
            return NotFixable(f"`{name}` is bound again at line {at}, between its `{name}.to(...)` at line "
                              f"{line} and its use at line {request.line}: move it where that value is made")
    small = statement.body[0]
    assert isinstance(small, cst.Expr)
    assign = cst.Assign([cst.AssignTarget(cst.Name(name))], small.value, semicolon=small.semicolon)
    new = module.visit(Replace(statement, [statement.with_changes(body=[assign])], {}))
    return rewritten(module.code, new.code, line, end, "")


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


def move_model_up(module: cst.Module, request: Request) -> Rewrite | NotFixable:
    """PC307: ``optimizer.load_state_dict(...)`` before ``model.to(device)``: the move goes up, just before
    the load (``load_state_dict`` casts the state to where the parameters are at that moment)."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    blocks: list[list[cst.BaseStatement]] = [list(module.body)]
    blocks += [list(n.body) for n in all_nodes(module) if isinstance(n, cst.IndentedBlock)]
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
    return rewritten(module.code, new.code, start, end, "")


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


def _reloads(statement: cst.BaseStatement, models: set[str]) -> str:
    """The model ``statement`` re-creates or reloads (``model = Net()``, ``model =
    torch.load(...)``, ``model.load_state_dict(sd, assign=True)``: new Parameter objects), or ``""``."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return ""
    assigned = _scan(statement).assigned & models
    if assigned:
        return sorted(assigned)[0]
    for small in statement.body:
        call = small.value if isinstance(small, cst.Expr) else None
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) \
                and call.func.attr.value == "load_state_dict" and isinstance(call.func.value, cst.Name) \
                and call.func.value.value in models \
                and any(a.keyword is not None and a.keyword.value == "assign"
                        and isinstance(a.value, cst.Name) and a.value.value == "True" for a in call.args):
            return call.func.value.value
    return ""


def build_optimizer_later(module: cst.Module, request: Request) -> Rewrite | NotFixable:
    """PC308: ``optimizer = SGD(model.parameters(), ...)`` before ``model = Net()`` (or ``torch.load``, or
    ``model.load_state_dict(sd, assign=True)``) in the same block: the construction goes down, just after
    the last re-creation before the optimizer's first use, so it holds the Parameters the script trains.

    Refused when the optimizer is used before the model is re-created (a scheduler built on it, a
    ``load_state_dict``: moving the construction alone would break them), or when a name the construction
    reads is bound again in between (``lr = ...``: the optimizer would change)."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    owners: list[cst.Module | cst.IndentedBlock] = [module]
    owners += [n for n in all_nodes(module) if isinstance(n, cst.IndentedBlock)]
    for owner in owners:
        block = list(owner.body)
        at = next((i for i, s in enumerate(block) if isinstance(s, cst.SimpleStatementLine)
                   and positions[s].start.line <= request.line <= positions[s].end.line), None)
        if at is not None:
            break
    else:
        return NotFixable(f"line {request.line}, where the optimizer is built, is not a statement of its own")
    built = block[at]
    assert isinstance(built, cst.SimpleStatementLine)
    small = built.body[0] if len(built.body) == 1 else None
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 \
            or not isinstance(small.targets[0].target, cst.Name):
        return NotFixable(f"line {request.line} does not build the optimizer as `name = Optimizer(...)` by "
                          "itself: build it after the model is re-created or reloaded")
    name = small.targets[0].target.value
    code = module.code_for_node(small.value)
    models = set(re.findall(r"\b(\w+)\.(?:named_)?parameters\(", code))
    if not models:
        return NotFixable(f"the optimizer at line {request.line} is not built from `model.parameters()`: "
                          "build it from the model the script trains, after that model is made")
    used = next((j for j in range(at + 1, len(block)) if name in _names(block[j])), len(block))
    again = [j for j in range(at + 1, used) if _reloads(block[j], models)]
    if not again:
        later = next((j for j in range(used, len(block)) if _reloads(block[j], models)), None)
        if later is not None:
            use_line, made_line = positions[block[used]].start.line, positions[block[later]].start.line
            return NotFixable(f"`{name}` is used at line {use_line}, before the model is re-created at line "
                              f"{made_line}: build the optimizer (and what uses it) after that line")
        return NotFixable(f"no statement after line {request.line} in the same block re-creates or reloads "
                          f"{' or '.join(sorted(models))}: build the optimizer after the model is made")
    last = again[-1]
    read = _names(built) - models - {name}
    rebound = sorted(read & set().union(*(_scan(block[j]).assigned for j in range(at + 1, last + 1))))
    if rebound:
        return NotFixable(f"`{rebound[0]}`, which the optimizer at line {request.line} reads, is bound again "
                          f"before line {positions[block[last]].start.line}: moving the construction there "
                          "would change the optimizer")
    comments = [e for e in built.leading_lines if e.comment]
    blanks = [e for e in built.leading_lines if not e.comment]
    moved = built.with_changes(leading_lines=comments)
    new_block = [*block[:at], *block[at + 1:last + 1], moved, *block[last + 1:]]
    follower = new_block[at]
    new_block[at] = follower.with_changes(leading_lines=[*blanks, *_leading(follower)])
    new = module.visit(_NewBody(owner, new_block))
    start, end = positions[built].start.line, positions[block[last]].end.line
    return rewritten(module.code, new.code, start, end, "")


def _leading(statement: cst.BaseStatement) -> list[cst.EmptyLine]:
    """The blank and comment lines above ``statement`` (every statement has them; BaseStatement does not
    say so)."""
    return list(getattr(statement, "leading_lines", ()))


def _names(node: cst.CSTNode) -> set[str]:
    names = _Names()
    node.visit(names)
    return names.names


class _NewBody(cst.CSTTransformer):
    """``body`` in place of ``owner``'s statements."""

    def __init__(self, owner: cst.Module | cst.IndentedBlock, body: list[cst.BaseStatement]) -> None:
        super().__init__()
        self.owner = owner
        self.body = body

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self.body) if original_node is self.owner else updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self.body) if original_node is self.owner else updated_node


_SYNCHRONIZE = """if {torch}.cuda.is_available():  # the non_blocking copy must land before the host reads it
    {torch}.cuda.current_stream().synchronize()
"""
"""PC210's statement. Guarded: on a machine without CUDA the copy was host to host, and
torch.cuda.current_stream() would raise there (a script with a CPU fallback would break)."""


def synchronize_before(module: cst.Module, request: Request, imports: Imports) -> Rewrite | NotFixable:
    """PC210: a host read of a tensor a ``non_blocking=True`` copy from the GPU is still filling: the
    stream is synchronised just before the statement that reads it (the read comes after the copy, so
    anything before the read's statement waits for it)."""
    if not imports.torch:
        return NotFixable("the file does not import torch as a module, so there is no name to reach "
                          "torch.cuda.current_stream()")
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    owners: list[cst.Module | cst.IndentedBlock] = [module]
    owners += [n for n in all_nodes(module) if isinstance(n, cst.IndentedBlock)]
    found: tuple[int, cst.Module | cst.IndentedBlock, int] | None = None
    for owner in owners:
        for index, statement in enumerate(owner.body):
            pos = positions[statement]
            span = pos.end.line - pos.start.line
            if pos.start.line <= request.line <= pos.end.line and (found is None or span < found[0]):
                found = (span, owner, index)
    if found is None:
        return NotFixable(f"no statement of this file spans line {request.line}, where the host reads the "
                          "copy: the file changed since the audit")
    _, owner, index = found
    block = list(owner.body)
    read = block[index]  # a compound statement when the read is in its header: the sync goes before it
    lines = _leading(read)
    split = next((i for i, e in enumerate(lines) if e.comment), len(lines))
    sync = cst.parse_statement(_SYNCHRONIZE.format(torch=imports.torch[0]))
    sync = sync.with_changes(leading_lines=lines[:split])
    new_block = [*block[:index], sync, read.with_changes(leading_lines=lines[split:]), *block[index + 1:]]
    new = module.visit(_NewBody(owner, new_block))
    line = positions[read].start.line
    return rewritten(module.code, new.code, line, line, "")
