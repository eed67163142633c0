"""The line to edit behind a device mismatch of a script (issue 42 item 8), not only the line that crashed.

The recorder's PC201 names the op's line; what the user changes is often elsewhere, and this room finds
it from what the script did, never from a message's text:

- a tensor move whose result the script threw away (``x.to(device)`` as a statement: a tensor is not
  moved in place), which the later use of ``x`` shows;
- a move to ``"cuda"`` without an index, which lands on the current device (``cuda:0``), not on the
  device of the model it then meets (``cuda:1``);
- the script's own expression for the offending tensor (``batch["y"]``), read from its line, for the
  hint;
- the line inside an installed package where the op crashed, while the finding stays at the user's
  own line (the one they can edit);
- the creation itself (PC202 at the line that made the tensor on the host), built here for the recorder.
"""

from __future__ import annotations

import ast
import linecache
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.values import Device
from placecheck.checks.state import Registry
from placecheck.engines.calls import read_placement
from placecheck.engines.sources import frames, library_package, where_is
from placecheck.findings import rules
from placecheck.findings.events import HeldTensor
from placecheck.findings.finding import Finding
from placecheck.run.origins import Origin


@dataclass(frozen=True)
class Move:
    """A tensor move the script made: where, and whether it named a device index."""

    line: str
    discarded: bool
    """The move was a statement of its own: its result was thrown away."""
    current: bool
    """The device had no index (``"cuda"``, ``.cuda()``): the current device."""


def _discarded(frame: FrameType | None) -> bool:
    """The statement at ``frame``'s line is a bare ``x.to(...)``/``x.cuda(...)`` call: its result unused."""
    if frame is None:
        return False
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    try:
        tree = ast.parse(text)
    except SyntaxError:  # a statement over several lines: not decided
        return False
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return False
    call = tree.body[0].value
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
        and call.func.attr in ("to", "cuda")


class Causes:
    """The script's tensor moves, and the reading of its lines, that name the cause of a mismatch."""

    def __init__(self) -> None:
        self._sources: dict[int, tuple[weakref.ref[torch.Tensor], Move]] = {}
        """``id()`` of a tensor the script moved -> (it, the move): a later use of it is of the original."""
        self._results: dict[int, tuple[weakref.ref[torch.Tensor], Move]] = {}
        """``id()`` of a move's result -> (it, the move): where a tensor on the current device came from."""

    def moved(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
              out: torch.Tensor, line: str, frame: FrameType | None) -> None:
        """The script's ``func(*args, **kwargs)`` at ``line`` moved ``args[0]`` to ``out``'s device."""
        source = args[0]
        if out is source or out.device == source.device or out.device.type != "cuda":
            return
        # the same call read for two current devices: a device without an index follows the current one
        one, other = read_placement(func, args, kwargs, 0), read_placement(func, args, kwargs, 1)
        current = one is not None and other is not None and one.device != other.device
        move = Move(line, _discarded(frame), current)
        self._sources[id(source)] = (weakref.ref(source), move)
        self._results[id(out)] = (weakref.ref(out), move)

    @staticmethod
    def _of(table: dict[int, tuple[weakref.ref[torch.Tensor], Move]], t: torch.Tensor) -> Move | None:
        entry = table.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def discarded_move(self, t: torch.Tensor) -> Move | None:
        """The move of ``t`` whose result the script threw away, when ``t`` itself is used after it."""
        move = self._of(self._sources, t)
        return move if move is not None and move.discarded else None

    def current_device_move(self, t: torch.Tensor) -> Move | None:
        """The move without a device index that put ``t`` on the current device."""
        move = self._of(self._results, t)
        return move if move is not None and move.current else None

    def prune(self) -> None:
        """Forget tensors that no longer exist (their ids may be reused)."""
        self._sources = {k: v for k, v in self._sources.items() if v[0]() is not None}
        self._results = {k: v for k, v in self._results.items() if v[0]() is not None}


def expression_of(t: torch.Tensor, frame: FrameType | None) -> str:
    """The script's own expression for ``t`` on ``frame``'s line, when it is an element of a plain
    container the frame names (``batch["y"]``, ``pair[1]``); "" otherwise. Only dicts, lists and
    tuples are indexed: no code of the script runs."""
    if frame is None:
        return ""
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and isinstance(node.slice, ast.Constant)):
            continue
        name = node.value.id
        container = frame.f_locals[name] if name in frame.f_locals else frame.f_globals.get(name)
        if not isinstance(container, dict | list | tuple):
            continue
        key: Any = node.slice.value
        try:
            value = container[key]
        except (KeyError, IndexError, TypeError):
            continue
        if value is t:
            return ast.get_source_segment(text, node) or ast.unparse(node)
    return ""


def crash_site(frame: FrameType | None) -> tuple[str, str]:
    """``(package, file:line)`` of the innermost installed package's frame, when the op ran there (a loss
    module of a library) rather than in the user's own line; ``("", "")`` otherwise."""
    found = frames(frame)
    inner = found.first_outside
    if inner is None or inner is found.user:
        return "", ""
    package = library_package(inner.f_code)
    return (package, where_is(inner)) if package else ("", "")


def module_owner(t: torch.Tensor, frame: FrameType | None) -> str:
    """``criterion.weight`` when ``t`` is a parameter or buffer of a module the script names (in
    ``frame`` or the frames around it): moving that module is the fix."""
    scopes: list[dict[str, Any]] = []
    scan = frame
    while scan is not None and len(scopes) < 6:
        scopes.append(scan.f_locals)
        scan = scan.f_back
    if frame is not None:
        scopes.append(frame.f_globals)
    for scope in scopes:
        for name, value in list(scope.items()):
            if isinstance(value, nn.Module) and not name.startswith("_"):
                registry = Registry.of(value)
                for tname, owned in [*registry.buffers, *registry.parameters]:
                    if owned is t:
                        return f"{name}.{tname}"
    return ""


def creation_cause(origin: Origin, t: torch.Tensor, device: Device, *, fed: bool) -> Finding:
    """PC202 at the line that made ``t`` on the host without ``device=``, as audit reports a forward's
    creation: the cause, the line to edit. ``fed``: it fed a device mismatch on ``device`` (a tensor the
    script itself made, ``torch.full(...)`` later made a trainable parameter, is reported at its line the
    same way); otherwise a forward's CPU index copied to ``device`` at each call."""
    return rules.creation_in_run(origin.path, host_tensor(t), device, line=origin.line, module=origin.module,
                                 fed=fed)


def host_tensor(t: torch.Tensor) -> HeldTensor:
    """``t``, a tensor made on the host, as plain data for its rule."""
    return HeldTensor(Device("cpu"), str(t.dtype).removeprefix("torch."), tuple(t.shape),
                      t.numel() * t.element_size())
