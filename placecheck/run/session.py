"""What the rooms of ``placecheck run`` know of the session that calls them: narrow protocols.

The recorder (:mod:`placecheck.run.recorder`) owns the session and delegates to rooms of its own
(moves, optimizers, loaders, checkpoints, ranks) and to the engine switch (:mod:`placecheck.run.auto`).
A room never knows the recorder's class: it sees the :class:`Recording` protocol, the few
attributes and methods it uses; the recorder sees the rank checks and the engine probe through
:class:`RankPlacement` and :class:`EngineProbe`. So no import runs from a room back up to the
recorder, not even for type checking (``tests/test_architecture.py`` reads those imports too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn as nn

from placecheck.basics.values import Device
from placecheck.findings.finding import Finding
from placecheck.run.origins import Origins

if TYPE_CHECKING:
    from placecheck.run.fastforward import FastForward


class StopRun(BaseException):
    """Raised into the script to end the run early (``--timeout``; ``--steps`` reached when the run cannot
    fast-forward, or still steps the optimizer long after the budget; the watchdog).

    A ``BaseException``, so the script's own ``except Exception`` does not swallow it. ``unfinished``: the
    stop means the script did not run through (the watchdog's: exit code 2), not an ordinary early end.
    """

    def __init__(self, reason: str, unfinished: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unfinished = unfinished


class RankPlacement(Protocol):
    """One rank's checks of where the script puts its state (:class:`placecheck.run.ranks.RankChecks`)."""

    def session(self) -> contextlib.AbstractContextManager[None]:
        """The rank's process group, collectives and wrappers, patched for the run."""

    def placed(self, func: Any, out: torch.Tensor) -> None:
        """A tensor created or moved by the script."""

    def findings(self) -> list[Finding]:
        """The rank's findings (PC401)."""

    def limit_of(self, exc: BaseException) -> str:
        """The note for ``exc`` when it is a limit of the rank's simulation ("" if not)."""

    def placed_at(self, device: torch.device, what: str, line: str, where: str) -> None:
        """``what`` put state on ``device`` at ``line``."""

    def loaded(self, obj: Any, line: str) -> None:
        """``torch.load``'s result, loaded at ``line``."""


class EngineProbe(Protocol):
    """The real-valued attempt's size watch (:class:`placecheck.run.auto.Probe`)."""

    decided: str

    def registered(self, t: Any, buffer: bool) -> None:
        """A parameter or buffer was registered."""

    def made(self, out: Any) -> None:
        """A forward made ``out``."""

    def done(self, at: str = "") -> None:
        """A step (or the first forward) ended at ``line``."""


class Recording(Protocol):
    """What a room uses of the session that records the script."""

    gpus: int
    target: Device
    notes: dict[str, None]
    limit: str
    origins: Origins
    roots: dict[int, nn.Module]
    reported_errors: set[int]
    host_data: Callable[[], contextlib.AbstractContextManager[Any]]
    loaders_in_process: bool
    ranks: RankPlacement | None
    fastforward: FastForward | None

    def add(self, finding: Finding, key_extra: str = "") -> None:
        """Record ``finding``, once per code, line and ``key_extra``."""

    def quiet(self) -> contextlib.AbstractContextManager[None]:
        """placecheck's own torch calls, not recorded, inside the block."""

    @property
    def quieted(self) -> bool:
        """Inside :meth:`quiet`."""

    def step_done(self) -> None:
        """One more optimizer step."""

    def is_host_tensor(self, t: torch.Tensor) -> bool:
        """``t`` is one of the engine's host tensors."""

    def no_such_gpu(self, device: torch.device) -> RuntimeError:
        """What CUDA raises for a device index the machine lacks."""
