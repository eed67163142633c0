"""The one interception of torch calls: every call read once into a :class:`Call`, handed to the checks.

One ``TorchFunctionMode`` (:class:`Dispatcher`) sees each torch call and turns it into a :class:`Call`:
the function, its arguments, their tensors and devices, the placement the call asks for (read by
:mod:`placecheck.engines.calls` with PyTorch's own parsers), its name as the user writes it. The checks
subscribe to it (:func:`subscribed`): ``audit``'s forward tracer (:class:`placecheck.checks.trace.Tracer`),
``run``'s recorder (:class:`placecheck.run.recorder.RunRecorder`), the trial forward that finds where a
placed model's inputs go (:mod:`placecheck.placement.placed`), the DTensor mixes of an FSDP2 rank
(:mod:`placecheck.placement.replicas`). Each handler gets the :class:`Call` and returns the call's result,
running it by calling ``call.func`` as torch would (``call.run()``), or not, or again with other arguments.

The engines (fake tensors: :mod:`placecheck.engines.engine`; real values tagged as CUDA:
:mod:`placecheck.engines.tagged`) stay engines: one mode each, entered before (below) the dispatcher, so
that every handler sees a call as the user's code made it and the engine runs what the handlers let through.

Handlers stack as modes do: the one subscribed last sees a call first, and the torch calls a handler makes
itself (``call.run()``, a repair that moves an argument) are seen by the handlers subscribed before it,
exactly as if each were a mode of its own, but with one mode on torch's stack and one reading per call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from placecheck.engines.calls import Destination, read_placement
from placecheck.engines.classify import tensor_arguments
from placecheck.engines.compat import _get_current_function_mode_stack
from placecheck.engines.cudaapi import current_index


def op_name(func: Callable[..., Any]) -> str:
    """``torch.randn``, ``Tensor.add``, ``torch.nn.functional.linear``: how a user would write the call."""
    name = getattr(func, "__name__", repr(func))
    qual = getattr(func, "__qualname__", name)
    if qual.startswith(("TensorBase.", "Tensor.")):
        return "Tensor." + name
    module = getattr(func, "__module__", None) or ""
    if module.startswith("torch._C") or module in ("", "torch") or "VariableFunctions" in qual:
        return "torch." + name
    return f"{module.replace('torch.nn.functional', 'F')}.{name}" if module else name


_UNREAD: Any = object()


class Call:
    """One torch call as the user's code made it, read once and shared by every handler.

    What is derived from the arguments (:attr:`tensors`, :attr:`devices`, :attr:`placement`,
    :attr:`name`) is read on first use and kept, so a call no handler asks about costs nothing more.
    """

    __slots__ = ("_placement", "_tensors", "args", "func", "kwargs")

    def __init__(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self._tensors: list[tuple[int, torch.Tensor]] | None = None
        self._placement: Any = _UNREAD

    @property
    def name(self) -> str:
        """The call as a user writes it (``Tensor.to``, ``torch.zeros``, ``F.linear``)."""
        return op_name(self.func)

    @property
    def tensors(self) -> list[tuple[int, torch.Tensor]]:
        """The tensor arguments, with their positions (:func:`placecheck.engines.classify.tensor_arguments`:
        keyword arguments and nested lists included)."""
        if self._tensors is None:
            self._tensors = list(tensor_arguments(self.args, self.kwargs))
        return self._tensors

    @property
    def devices(self) -> list[torch.device]:
        """The devices of the tensor arguments, in their order."""
        return [t.device for _, t in self.tensors]

    @property
    def placement(self) -> Destination | None:
        """The placement the call asks for (a move, a factory's ``device=``, ``Module.to``'s parse), read
        with PyTorch's own parsers, ``"cuda"`` resolved to the simulated current device; None for any
        other call."""
        if self._placement is _UNREAD:
            self._placement = read_placement(self.func, self.args, self.kwargs, current_index())
        placement: Destination | None = self._placement
        return placement

    def run(self) -> Any:
        """The call itself, seen by the handlers below the caller and then the engine."""
        return self.func(*self.args, **self.kwargs)


Handler = Callable[[Call], Any]
"""A subscriber: gets each call and returns its result (:meth:`Call.run`, or its own)."""


class Dispatcher(TorchFunctionMode):
    """The one torch function mode: each call becomes a :class:`Call` for the handlers, the last
    subscribed first.

    While a handler runs, the handlers subscribed before it still see the torch calls it makes: the
    dispatcher re-enters itself for them (a view from the next handler down), which only a call with
    more than one handler below the top pays for.
    """

    def __init__(self, handlers: tuple[Handler, ...] = (), start: int = 0) -> None:
        super().__init__()
        self.handlers = handlers
        """Outermost (subscribed last) first."""
        self.start = start

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        handlers, start = self.handlers, self.start
        if start >= len(handlers):
            return func(*args, **(kwargs or {}))
        call = Call(func, args, kwargs or {})
        if start + 1 == len(handlers):
            return handlers[start](call)
        with Dispatcher(handlers, start + 1):
            return handlers[start](call)


def active_dispatcher() -> Dispatcher | None:
    """The dispatcher at the top of torch's mode stack (one a handler may join), or None."""
    stack = _get_current_function_mode_stack()  # type: ignore[no-untyped-call]
    top = stack[-1] if stack else None
    return top if isinstance(top, Dispatcher) and top.start == 0 else None


@contextlib.contextmanager
def subscribed(handler: Handler) -> Iterator[Dispatcher]:
    """``handler`` sees every torch call inside, before the handlers subscribed earlier; yields the
    dispatcher it joined (the one at the top of the mode stack) or entered (when another mode is on
    top, so that every mode keeps its place relative to the handler)."""
    dispatcher = active_dispatcher()
    if dispatcher is None:
        with Dispatcher((handler,)) as entered:
            yield entered
        return
    dispatcher.handlers = (handler, *dispatcher.handlers)
    try:
        yield dispatcher
    finally:
        handlers = list(dispatcher.handlers)
        handlers.remove(handler)  # (by equality: a bound method is a new object at each access)
        dispatcher.handlers = tuple(handlers)
