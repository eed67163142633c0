"""What only a whole script asks of its frames: which call the user made, which library made one, and
which of the script's variables name a tensor.

Which frame is the user's, and how its line is written, is :mod:`placecheck.engines.sources`' one decision,
shared with ``audit``; this module builds on it.
"""

from __future__ import annotations

import os
import sys
from types import FrameType

import torch

from placecheck.engines.sources import frames, library_of_file, own_file, where_is

# torch's own dispatch of a Tensor method to a torch function mode (Tensor.__format__ -> overrides):
# the call is still the caller's
_DISPATCH_FILES = frozenset(os.path.join(os.path.dirname(torch.__file__), name)
                            for name in ("overrides.py", "_tensor.py"))


def called_from_user() -> str:
    """``file:line`` when the torch call being handled was made by the user's code itself (not by
    torch or a library on its behalf, as ``nn.Linear.__init__`` calls ``torch.empty``); else ""."""
    found = frames(sys._getframe(2))
    if found.caller is None or found.caller is not found.user:
        return ""
    return where_is(found.user)


def library_caller() -> str:
    """The function (``GradScaler.step (torch)``) that made the torch call being handled, when it is not
    the user's own code but torch's or a library's called from it; "" when the user made the call. When
    torch's function was itself called by another installed package, that package's function is named
    too (``Module.cpu (torch) in Strategy.teardown (lightning)``): the framework made the call."""
    found = frames(sys._getframe(2))
    frame = found.caller
    while frame is not None and (os.path.abspath(frame.f_code.co_filename) in _DISPATCH_FILES
                                 or own_file(frame.f_code.co_filename)):
        frame = frame.f_back  # torch's dispatch of a Tensor method: the call is still its caller's
    if frame is None or frame is found.user:
        return ""
    caller = _function(frame)
    if library_of_file(frame.f_code.co_filename) == "torch":
        scan = frame.f_back
        while scan is not None and scan is not found.user:
            package = library_of_file(scan.f_code.co_filename)
            if package and package != "torch":
                return f"{caller} in {_function(scan)}"
            scan = scan.f_back
    return caller


def _function(frame: FrameType) -> str:
    """``Strategy.teardown (lightning)``: a library frame's function and package."""
    name: str = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    name = name.split(".<locals>", 1)[0]
    package = library_of_file(frame.f_code.co_filename)
    return f"{name} ({package})" if package else name


def names_of(value: object, frame: FrameType | None) -> list[str]:
    """The names ``frame``'s locals (then globals) bind to ``value`` itself (identity)."""
    if frame is None:
        return []
    found = [name for name, v in frame.f_locals.items() if v is value and not name.startswith("_")]
    if not found and frame.f_globals is not frame.f_locals:
        found = [name for name, v in frame.f_globals.items() if v is value and not name.startswith("_")]
    return found


def fake_tolist() -> str | None:
    """When the call being handled is the fake engine's own ``FakeTensor.tolist`` reading each element
    with ``.item()`` for a ``.tolist()`` (torch implements it so on fake tensors): who called that
    ``.tolist()``, as :func:`library_caller` names it ("" for the user's own line); None otherwise.
    Decided by the identity of torch's code, below the user's frame."""
    from placecheck.engines.compat import FakeTensor

    code = getattr(FakeTensor.tolist, "__code__", None)
    user = frames(sys._getframe(1)).user
    scan: FrameType | None = sys._getframe(1)
    outermost: FrameType | None = None
    while scan is not None and scan is not user:
        if scan.f_code is code:
            outermost = scan
        scan = scan.f_back
    if outermost is None:
        return None
    caller = outermost.f_back
    return "" if caller is None or caller is user else _function(caller)
