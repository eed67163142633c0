"""The source rewrites of ``placecheck fix``: one libcst transformer per finding code.

Each transformer changes one statement or call at a known line and nothing
else, so the file keeps its formatting and comments (libcst is a concrete
syntax tree: what is not replaced is written back byte for byte). A
transformer that finds nothing it may rewrite at that line leaves the tree
alone and says why in ``reason``; :func:`rewrite` turns that into a
:class:`NotFixable`. No torch here: the rewrites read only source text.

This module picks the rewrite for a request and runs it; the rewrites live by
what they fix: :mod:`.buffers` (state ``.to()`` does not reach, PC101-PC103),
:mod:`.devices` (where tensors are made, moved and loaded: PC202, PC201, PC301,
PC307), :mod:`.layers` (a layer built in forward, PC203), on :mod:`.syntax` (the
request, the outcome, reading a file).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst
from libcst.metadata import MetadataWrapper

from placecheck.basics.codes import Code
from placecheck.fix.batches import move_batch_item
from placecheck.fix.buffers import RegisterBuffer, WrapContainer, container_buffers, helper_module
from placecheck.fix.codes import NEVER
from placecheck.fix.devices import (
    AddDevice,
    MapLocation,
    MoveBatchElement,
    bind_discarded_move,
    build_optimizer_later,
    move_holder,
    move_model_up,
    script_device,
    synchronize_before,
)
from placecheck.fix.layers import build_in_init, lazy_equivalent
from placecheck.fix.syntax import AtLine, Imports, NotFixable, Request, Rewrite, rewritten

_HOST_MEMORY = frozenset({"from_numpy", "frombuffer"})
"""torch functions that wrap host memory: they take no ``device=``."""

_KEY = re.compile(r"^\[(\d+|'[^']*'|\"[^\"]*\")\]$")
_KEYS = re.compile(r"\[(\d+|'[^']*'|\"[^\"]*\")\]")
"""Each literal index of ``stages[0][1]`` / ``gains['a'][0]``: one per container level."""


def _attribute(where: str, module: str) -> str:
    """``blocks.0.mask`` under module ``blocks.0`` -> ``mask``."""
    if module and where.startswith(module + "."):
        return where[len(module) + 1:]
    return where


_WholeFile = Callable[[cst.Module], "Rewrite | NotFixable"]
"""A rewrite that reads more than the finding's line (a class's every use of an attribute, a helper's
class, the statements around a line of a script)."""


def _transformer(request: Request, imports: Imports) -> AtLine | _WholeFile | NotFixable:
    code = request.code
    if code == Code.PC101:
        attr = _attribute(request.where, request.module)
        base = re.split(r"[.\[]", attr, maxsplit=1)[0]
        if "[" in attr and base.isidentifier() and _KEY.match(attr[len(base):]):
            return lambda module: container_buffers(module, request, base)
        if "." in attr and base.isidentifier() and request.fields \
                and all(f.isidentifier() for f in request.fields):
            return lambda module: helper_module(module, request, base, imports)
        if not attr.isidentifier():
            return NotFixable("a tensor nested deeper than one container or helper object: register it as "
                              "a buffer of a module (self.register_buffer(\"name\", <tensor>, "
                              "persistent=False)), or create it in forward() on the input's device")
        return RegisterBuffer(request.line, attr, persistent=request.unsafe)
    if code in (Code.PC102, Code.PC103):
        base, bracket, key = request.where.partition("[")
        attr = _attribute(base, request.module)
        keys = _KEYS.findall(bracket + key)
        if not attr.isidentifier() or not keys or "".join(f"[{k}]" for k in keys) != bracket + key:
            return NotFixable(f"`{request.where}` is not held in containers indexed by literal keys under a "
                              "module attribute (an object's field, a set?): hold the "
                              f"{'modules' if code == Code.PC102 else 'parameters'} in nn.ModuleList / "
                              "nn.ModuleDict (nn.ParameterList / nn.ParameterDict) where they are built")
        kinds = tuple("list" if k.isdigit() else "dict" for k in keys)
        return WrapContainer(request.line, code, attr, kinds, imports)
    if code == Code.PC202:
        factory = request.op.removeprefix("torch.")
        if request.op and (not request.op.startswith("torch.") or not factory.isidentifier()):
            return NotFixable(f"{request.op} is not a torch factory function")
        if factory in _HOST_MEMORY:
            # torch.from_numpy, torch.frombuffer: no device= to add; torch.as_tensor(a, device=...) copies,
            # and a proof compares findings, not values: a later write to the array would go unseen
            return NotFixable(f"{request.op} takes no device= and shares the array's memory: a copy on the "
                              "device (torch.as_tensor(array, device=x.device)) would not see later writes "
                              "to the array, which no re-audit can check; make that choice by hand")
        if request.script:
            return lambda module: _visit(module, AddDevice(request.line, factory, imports,
                                                           script_device(module)))
        return AddDevice(request.line, factory, imports)
    if code == Code.PC201:
        if request.holder:
            return lambda module: move_holder(module, request)
        if request.rebind:
            return lambda module: bind_discarded_move(module, request)
        if not request.batch:
            return NotFixable("the audit names no origin of the mismatched tensor that placecheck fix can "
                              "rewrite: fix it where the tensor comes from")
        if not request.where.isidentifier():  # batch["y"]: moved where the loop reads it
            return lambda module: move_batch_item(module, request)
        return MoveBatchElement(request.line, request.use, request.where)
    if code == Code.PC203:
        return lambda module: build_in_init(module, request)
    if code == Code.PC301:
        location = request.device if request.device in ("cpu", "meta") else "cpu"
        return MapLocation(request.line, location, imports)
    if code == Code.PC307:
        return lambda module: move_model_up(module, request)
    if code == Code.PC308:
        return lambda module: build_optimizer_later(module, request)
    if code == Code.PC210:
        return lambda module: synchronize_before(module, request, imports)
    if code in NEVER:
        return NotFixable(NEVER[code])
    return NotFixable(f"{code} has no rewrite in placecheck fix yet")


def _visit(module: cst.Module, transformer: AtLine) -> Rewrite | NotFixable:
    new_module = MetadataWrapper(module, unsafe_skip_copy=True).visit(transformer)  # parsed just now
    if transformer.span is None:
        return NotFixable(transformer.reason)
    start, end = transformer.span
    return rewritten(module.code, new_module.code, start, end, transformer.note)


def rewrite(source: str, request: Request) -> Rewrite | NotFixable:
    """Apply the fix ``request`` asks for to ``source``; the whole new text and the replaced lines."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return NotFixable(f"the file does not parse ({exc.message})")
    imports = Imports()
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
    if isinstance(transformer, AtLine):
        return _visit(module, transformer)
    return transformer(module)


__all__ = ["NotFixable", "Request", "Rewrite", "lazy_equivalent", "rewrite", "script_device"]
