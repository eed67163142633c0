"""The events one traced forward records: what happened, on which device, at which line.

The tracer (:mod:`placecheck.checks.trace`) only records these; the checks
(:mod:`placecheck.checks.forward_checks`) read them afterwards and turn them into
findings with the words of each rule (:mod:`placecheck.findings.rules`).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from placecheck.checks.provenance import Creation, Provenance
from placecheck.engines.sources import EventSite


@dataclass
class Mismatch:
    """An op whose arguments mixed devices (PC201); the tracer moved the offending one and went on."""

    op: str
    devices: tuple[str, ...]
    device: str
    site: EventSite
    provenance: Provenance
    dtype: str
    shape: tuple[int, ...] | None
    expected: str = ""
    """The device the op ran for (the target; with ``--device keep``, its module's device)."""
    stages: tuple[str, str] | None = None
    """``--device keep``: (the stage whose forward produced the offending tensor, the stage whose forward
    received it); ``"(input)"`` names the forward's inputs, ``""`` the root."""
    refused: str = ""
    """Not two tensors' devices but one argument a GPU refuses there: ``generator`` (a ``torch.Generator``
    on ``device``, another device type than the op's ``expected``), or the name of an argument the op
    needs on the CPU (``lengths``), which is on ``device``."""
    argument: int | None = None
    """The position in the call of the argument holding the offending tensor (None: not known): which
    text PyTorch raises depends on it in some op families (``placecheck.basics.gpu_errors``)."""


@dataclass
class HostSync:
    """A call that made the host wait for the device (PC204)."""

    op: str
    device: str
    site: EventSite


@dataclass
class ImplicitTransfer:
    """A legal CPU argument of a device op: an index copied per call, or a 0-dim scalar (PC205)."""

    op: str
    scalar: bool
    site: EventSite
    provenance: Provenance
    dtype: str
    shape: tuple[int, ...] | None
    expected: str = ""
    """The device the op ran for (the target; with ``--device keep``, its module's device)."""


@dataclass
class Registration:
    """A module or parameter registered on the model during forward."""

    what: str
    """``module`` or ``parameter``."""
    path: str
    type_name: str
    device: str
    site: EventSite
    on_target: bool = False
    """Built on the target (``device=x.device``): placed right, still unknown to an earlier optimizer."""
    expected: str = ""
    """The device it belonged on (the target; with ``--device keep``, its module's device)."""


@dataclass
class OutputOffDevice:
    """A tensor of the forward's output off the target (PC206)."""

    path: str
    device: str
    dtype: str
    shape: tuple[int, ...] | None
    provenance: Provenance
    host_sync: HostSync | None = None
    """The device-to-host copy (``.cpu()``) that made this output, when one did."""
    expected: str = ""
    """Where the output belonged (the target; with ``--device keep``, the devices the model uses)."""


@dataclass
class ForwardError:
    """What the forward or backward raised (PC207, or PC201 for an untraced mismatch)."""

    phase: str
    """``forward`` or ``backward``."""
    message: str
    site: EventSite
    mismatch: bool = False
    """The error is a device mismatch the tracer could not repair (PC201)."""
    after_repair: bool = False
    """The call raised it once its arguments had been put on one device: a GPU raises the call's device
    mismatch first (its PC201), and with the devices fixed the call still fails (PC207)."""


@dataclass
class Copy:
    """A copy of a tensor between two devices in forward (``--device keep``'s cross-device traffic).

    Not a finding by itself: copies between stages are how a model-parallel
    forward works. It is a PC208 when ``weights`` (a registered parameter or
    buffer copied on every call) or ``ping_pong`` (the tensor went back to a
    device its data had left, and was computed on there again) is set.
    """

    src: str
    dst: str
    nbytes: int
    site: EventSite
    from_stage: str
    """The stage whose forward produced the copied tensor ("" for the root or the inputs)."""
    to_stage: str = ""
    """The stage whose forward first used the copy ("" while none has: the root, or the output)."""
    route: tuple[str, ...] = ()
    """The devices the tensor's data went through up to this copy, its destination last."""
    weights: str = ""
    """The path of the registered parameter or buffer this copy moves, when it moves one."""
    ping_pong: bool = False
    """The copy brought data back to a device it had left, and a stage computed on it there again."""


@dataclass
class StaleRead:
    """A host read of a CPU tensor that a non-blocking device-to-host copy was still filling (PC210)."""

    op: str
    device: str
    """The device the copy came from."""
    site: EventSite
    """Where the host read it."""
    copied_at: EventSite
    """Where the non-blocking copy was made."""


@dataclass
class GradOffDevice:
    """A parameter whose gradient the backward left off the target (PC201)."""

    path: str
    device: str


Event = typing.Union[Creation, Mismatch, HostSync, ImplicitTransfer, Registration, OutputOffDevice,
                     ForwardError, GradOffDevice, Copy, StaleRead]
