"""The repair of a call whose arguments mixed devices: one loop for audit's tracer and run's recorder.

A GPU raises at such a call; the simulation records the mismatch, moves the offending arguments to one
device and runs the call again, so that the rest of the forward (or the script) is checked too. What
counts as a mix is :func:`placecheck.engines.classify.mixes_devices`'s decision, from the devices of the
arguments; which arguments move where, and what is recorded, is the driver's (``fix``). This loop is the
part both share: how often it retries, and what an error after the repair means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from placecheck.engines import classify

if TYPE_CHECKING:
    import torch

MAX_RETRIES = 8
"""Repairs of one call before its error propagates: a call can need one per argument it mixes (a
``torch.cat`` of tensors on three devices). audit's tracer allowed 8 and run's recorder 4 when each had
its own loop; the larger is kept."""

Fix = Callable[[list[tuple[int, "torch.Tensor"]], Exception], dict[int, "torch.Tensor"]]
"""A driver's repair of one attempt: given the call's tensor arguments (position, tensor) and the error
it raised, it records the mismatch and returns ``id(tensor) -> moved tensor`` for each argument to move;
empty when it cannot repair the call (the error is then the call's own, or beyond repair)."""


def repaired(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], exc: Exception,
             fix: Fix, gave_up: Callable[[Exception, bool], None] = lambda exc, after: None) -> Any:
    """``func``'s result once ``fix`` has moved the arguments that mixed devices, retried at most
    :data:`MAX_RETRIES` times; else the last error propagates, after ``gave_up(error, after_repair)``:
    ``after_repair`` is True when a retry's arguments no longer mixed devices and the call still failed
    (a shape the input does not fit: the call's own error, after the mismatch a GPU raises first)."""
    for attempt in range(MAX_RETRIES):
        tensors = list(classify.tensor_arguments(args, kwargs))
        if not classify.mixes_devices(func, tensors, args):
            gave_up(exc, attempt > 0)
            raise exc
        moved = fix(tensors, exc)
        if not moved:
            gave_up(exc, False)
            raise exc
        args, kwargs = classify.replace_tensors(args, moved), classify.replace_tensors(kwargs, moved)
        try:
            return func(*args, **kwargs)
        except Exception as again:
            exc = again
    gave_up(exc, False)
    raise exc
