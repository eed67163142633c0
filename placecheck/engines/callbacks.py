"""The script's code that autograd calls back during a backward, run as the script's other code runs.

A backward runs inside the engine's dispatch of ``loss.backward()``: torch function handling is off
there and no mode is active, so a gradient hook (``param.register_hook(lambda g: g * mask)``), a custom
``autograd.Function``'s backward or a DDP comm hook of the script would run unsimulated and unrecorded.
Each engine wraps such code in :func:`called_back`, which turns subclass handling on and re-enters the
session's modes (registered with :func:`in_callbacks` by whoever entered them: the real-valued engine's
tagging mode, the dispatcher ``run``'s recorder subscribed to), in the order they were registered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.overrides import TorchFunctionMode

from placecheck.engines.compat import _EnableTorchFunction, _get_current_function_mode_stack

_CALLBACK_MODES: list[TorchFunctionMode] = []
"""The session's modes, in the order they were entered (the tagging mode, then ``run``'s recorder):
re-entered for the script's code that autograd calls back (:func:`called_back`)."""


@contextlib.contextmanager
def in_callbacks(mode: TorchFunctionMode) -> Iterator[None]:
    """``mode`` (entered by the caller) is re-entered, after those registered before it, in the code of
    :func:`called_back`."""
    _CALLBACK_MODES.append(mode)
    try:
        yield
    finally:
        _CALLBACK_MODES.remove(mode)


@contextlib.contextmanager
def called_back() -> Iterator[None]:
    """The script's code that autograd calls during a backward (a tensor's gradient hook, a DDP comm
    hook): the engine runs the backward inside its dispatch, where subclass handling is off and no mode
    is active; this code runs under the session's modes again, as the script's other code does, so that
    its calls are simulated and checked alike."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_EnableTorchFunction())
        active = list(_get_current_function_mode_stack())  # type: ignore[no-untyped-call]
        for mode in _CALLBACK_MODES:
            if not any(mode is other for other in active):
                stack.enter_context(mode)
                active.append(mode)  # (registered twice: a handler that joined a dispatcher registered it)
        yield
