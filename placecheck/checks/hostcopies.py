"""Non-blocking device-to-host copies, and the host reads that come before their synchronize (PC210).

``x.to("cpu", non_blocking=True)`` and ``host.copy_(x, non_blocking=True)``
queue a copy on the CUDA stream and return at once; the CPU tensor (pinned
memory) is filled later. Until something waits for the stream, a read on the
host may see stale values. :class:`PendingCopies` follows those CPU tensors
(and their views) from the copy to the first thing that either synchronises
the stream or reads one of them on the host:

- a **copy** is decided from the call's arguments and result: a device
  tensor in, a CPU tensor out (or written, for ``copy_``), ``non_blocking``
  true (:func:`nonblocking_host_copy`);
- a **synchronize** is ``torch.cuda.synchronize()``, a stream's or an event's
  ``synchronize()`` (seen by :meth:`PendingCopies.synchronizations_seen`),
  or any call that makes the host wait for the device (the host syncs of
  PC204: ``.item()`` of a device tensor, a blocking copy), which the caller
  reports with :meth:`PendingCopies.synchronized`;
- a **read** is any call that takes a pending tensor and does not return a
  device tensor or a view of it: ``.item()``, ``.tolist()``, ``.numpy()``,
  printing, ``bool()``, an op on the CPU. Sending it back to the device is
  ordered on the stream after the copy: not a read.

The fake engine has no values, but the calls are the same, so both engines
(and a real GPU) find it alike. The tracer of :mod:`placecheck.checks.trace` owns
one; ``placecheck run`` can hold one for a whole script the same way.

Not reentrant: one :meth:`synchronizations_seen` at a time per process (it patches ``torch.cuda``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from placecheck.basics.patching import patch
from placecheck.basics.values import Device
from placecheck.engines.calls import device_of
from placecheck.engines.classify import in_place, tensor_arguments

_METADATA = frozenset({torch.Tensor.dim, torch.Tensor.size, torch.Tensor.numel, torch.Tensor.stride,
                       torch.Tensor.is_contiguous, torch.Tensor.__len__, torch.Tensor.__hash__,
                       torch.Tensor.element_size, torch.Tensor.get_device, torch.Tensor.is_floating_point,
                       torch.Tensor.is_complex, torch.Tensor.storage_offset, torch.Tensor.is_pinned,
                       torch.Tensor.nelement, torch.Tensor.ndimension, torch.Tensor.requires_grad_,
                       torch.Tensor.record_stream})
"""Calls that look at a tensor without reading its values."""


def reads_values(func: Callable[..., Any]) -> bool:
    """False for the calls that only look at a tensor's metadata (its shape, dtype, an attribute)."""
    return func not in _METADATA and getattr(func, "__name__", "") not in ("__get__", "__set__")


def _non_blocking(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    if func is torch.Tensor.copy_:
        return len(args) > 2 and bool(args[2])
    # Tensor.to(device, dtype, non_blocking, copy) / to(dtype, non_blocking, copy) / to(other, non_blocking)
    rest = list(args[1:])
    while rest and not isinstance(rest[0], bool):
        rest.pop(0)
    return bool(rest[0]) if rest else False


def _on_device(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "meta")


def nonblocking_host_copy(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                          out: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(device tensor, CPU tensor)`` when the call ``func(*args, **kwargs)`` that returned ``out`` was a
    non-blocking copy from a device to the host; None otherwise."""
    if func is torch.Tensor.to:
        source, host = (args[0] if args else None), out
    elif func is torch.Tensor.copy_ and len(args) > 1:
        source, host = args[1], args[0]
    else:
        return None
    if not (isinstance(source, torch.Tensor) and _on_device(source) and isinstance(host, torch.Tensor)
            and host.device.type == "cpu"):
        return None
    return (source, host) if _non_blocking(func, args, kwargs) else None


@dataclass(frozen=True)
class PendingCopy:
    """A CPU tensor a non-blocking copy is still filling."""

    device: Device
    """The device the copy came from."""
    copied_at: Any
    """Where the copy was made (a :class:`~placecheck.findings.events.EventSite`)."""


class PendingCopies:
    """The CPU tensors of non-blocking device-to-host copies that no synchronize has covered yet."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[weakref.ref[torch.Tensor], PendingCopy]] = {}

    def __bool__(self) -> bool:
        return bool(self._pending)

    def copied(self, host: torch.Tensor, device: Device, copied_at: Any) -> None:
        """``host`` is now filled by a non-blocking copy from ``device``, made at ``copied_at``."""
        self._pending[id(host)] = (weakref.ref(host), PendingCopy(device, copied_at))

    def synchronized(self) -> None:
        """The host waited for the device: every copy so far has landed."""
        self._pending.clear()

    def _of(self, t: torch.Tensor) -> PendingCopy | None:
        entry = self._pending.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return entry[1]

    def pending_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[torch.Tensor,
                                                                                              PendingCopy]]:
        """The pending tensors among a call's arguments."""
        if not self._pending:
            return []
        found = []
        for _, t in tensor_arguments(args, kwargs):
            copy = self._of(t)
            if copy is not None:
                found.append((t, copy))
        return found

    def still_pending(self, pending: list[tuple[torch.Tensor, PendingCopy]]) -> list[tuple[torch.Tensor,
                                                                                          PendingCopy]]:
        """Those of ``pending`` that no synchronize has covered since (the call itself may have waited)."""
        return [(t, copy) for t, copy in pending if self._of(t) is not None]

    def after_call(self, func: Callable[..., Any], pending: list[tuple[torch.Tensor, PendingCopy]],
                   out: Any) -> PendingCopy | None:
        """What ``func``, which took the ``pending`` tensors and returned ``out``, did with them: the copy
        it read on the host; None when it did not read (it asked for metadata, sent them to the device,
        or made a view or an alias, which stays pending)."""
        pending = self.still_pending(pending)
        if not pending or not reads_values(func):
            return None
        if isinstance(out, torch.Tensor):
            if _on_device(out):
                return None  # a host-to-device copy (or an op on the device): ordered after the copy
            if not in_place(func):
                for t, copy in pending:
                    if out is t or func is torch.Tensor.detach or _views_of(out, t):
                        self._pending[id(out)] = (weakref.ref(out), copy)
                        return None
        return pending[0][1]

    def watched(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                call: Callable[[], Any], stale: Callable[[PendingCopy], None],
                copied_at: Callable[[], Any]) -> Any:
        """Run ``call()`` (the torch call ``func(*args, **kwargs)`` as its caller runs it) and follow it:
        ``stale(copy)`` when it read a pending copy on the host (also when it raised: a read the engine
        cannot run, the fake engine's ``.numpy()``, is a read all the same), and a new non-blocking
        device-to-host copy it made is pending from ``copied_at()`` on. The one sequence both the
        tracer (``audit``) and ``placecheck run``'s recorder follow."""
        pending = self.pending_arguments(args, kwargs) if self._pending else []
        try:
            out = call()
        except Exception:
            if pending and self.still_pending(pending):
                stale(pending[0][1])
            raise
        if pending:
            copy = self.after_call(func, pending, out)
            if copy is not None:
                stale(copy)
        elif func is torch.Tensor.to or func is torch.Tensor.copy_:
            copied = nonblocking_host_copy(func, args, kwargs, out)
            if copied is not None:
                self.copied(copied[1], device_of(copied[0]), copied_at())
        return out

    @contextlib.contextmanager
    def synchronizations_seen(self) -> Iterator[None]:
        """Inside: ``torch.cuda.synchronize()``, ``torch.accelerator.synchronize()`` and the
        ``synchronize()`` of CUDA streams and events end every pending copy.

        They are Python functions, which no torch function mode sees, so they are wrapped for the block
        (the simulated ones of :mod:`placecheck.engines.cudaapi` as well as torch's: whichever ``torch.cuda``
        holds when the block starts)."""
        targets: list[tuple[Any, str]] = [(torch.cuda, "synchronize")]
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and hasattr(accelerator, "synchronize"):
            targets.append((accelerator, "synchronize"))
        classes = (torch.cuda.Stream, torch.cuda.Event, torch.cuda.streams.Stream, torch.cuda.streams.Event)
        for owner in dict.fromkeys(classes):
            if isinstance(owner, type) and "synchronize" in vars(owner):
                targets.append((owner, "synchronize"))
        with contextlib.ExitStack() as stack:
            for owner, name in targets:
                stack.enter_context(patch(owner, name, self._waiting(getattr(owner, name)),
                                          "a synchronize is no torch function a mode sees; it ends the "
                                          "wait of the non-blocking copies before it (PC210)"))
            yield

    def _waiting(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def synchronize(*args: Any, **kwargs: Any) -> Any:
            self.synchronized()
            return original(*args, **kwargs)

        synchronize.__name__ = getattr(original, "__name__", "synchronize")
        synchronize.__doc__ = getattr(original, "__doc__", None)
        return synchronize


def _views_of(out: torch.Tensor, t: torch.Tensor) -> bool:
    """``out`` is a view of ``t``'s memory (``t[0]``, ``t.view(-1)``): a read of it comes later."""
    try:
        base = out._base
    except (AttributeError, RuntimeError):
        return False
    return base is not None and (base is t or base is t._base)
