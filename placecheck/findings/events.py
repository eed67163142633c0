"""The events of a traced forward or a run: what happened, on which device, at which line.

The recorders (:mod:`placecheck.checks.trace` for audit, :mod:`placecheck.run.recorder` for run) only
record these; the rule families (:mod:`placecheck.findings.rules`) read them afterwards and turn them
into findings (issue 41: events out, rules in). Plain data, no torch: below both the recorders that
make them and the rules that read them.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from placecheck.basics.values import Device, Site
from placecheck.findings.finding import Finding


@dataclass
class EventSite:
    """Where an event happened: the user's ``file:line`` and the module whose forward ran it."""

    source: Site
    """``file:line`` (``Site()`` when no line of the user's is known)."""
    where: str
    library: str = ""
    """The installed package the line is in, when no frame of the forward's call chain is outside
    installed packages (torchvision's own code called from torchvision's own module)."""
    api: str = ""
    """The function of torch (or of an installed package) that the user's line called and inside which
    the event happened, on a tensor that is none of that call's arguments (``pad_packed_sequence
    (torch)`` syncing on indices it made itself): work the API does by itself, which no change of the
    argument avoids. "" when the event is the user's own call, or acts on a tensor the user passed in
    (a device-side way out: pass it where the API wants it)."""


NOWHERE = EventSite(Site(), "")


@dataclass
class Creation:
    """A tensor created in forward off the target (a factory without ``device=``, ``.cpu()``...)."""

    op: str
    device: Device
    site: EventSite
    dtype: str
    shape: tuple[int, ...] | None
    fed_mismatch: bool = False
    """True once a tensor from here took part in a device mismatch."""
    moved: bool = False
    """True once a tensor from here was moved to the target explicitly (``.to(x.device)``)."""
    met_device: bool = False
    """True once a tensor from here met the device legally: a CPU index copied to it (PC205), or
    returned from forward (PC206). Never met, moved or mismatched, it was CPU-side work: no finding."""
    moved_at: EventSite | None = None
    """The line that first copied a tensor from here to the target."""
    moved_to: Device | None = None
    """The device it was copied to (the target, or the device a hard-coded ``.cuda()`` chose)."""
    merged: list[Creation] = dataclasses.field(default_factory=list)
    """Other creations whose tensors were combined with this one's (``torch.meshgrid(a, b)``):
    what happens to the combination happens to them too."""
    expected: str = ""
    """The device the forward that created it ran for (the target; with ``--device keep``, its
    module's device)."""
    kept_in: str = ""
    """The module attribute (``src_mask``) that held its copy on the device after the forward: a cache
    (built when empty or stale, as pytorch/examples' Transformer builds its mask), not a copy on every
    call."""

    def mark(self, attr: str, seen: set[int] | None = None, at: EventSite | None = None,
             to: Device | None = None) -> None:
        """Set ``moved`` or ``fed_mismatch`` here and on every creation merged into this one."""
        seen = seen if seen is not None else set()
        if id(self) in seen:
            return
        seen.add(id(self))
        setattr(self, attr, True)
        if attr == "moved" and self.moved_at is None:
            self.moved_at, self.moved_to = at, to
        for other in self.merged:
            other.mark(attr, seen, at, to)


@dataclass
class Provenance:
    """Where an off-target tensor came from: an attribute path, or a creation in forward."""

    path: str = ""
    linked: Finding | None = None
    """The walk's finding about that attribute, when there is one."""
    creation: Creation | None = None
    lazy: bool = False
    """The tensor belongs to a module or parameter created during forward."""
    also: tuple[Provenance, ...] = ()
    """The other origins combined into this tensor (``torch.cat((created, self.stray))``)."""
    host_copy: EventSite | None = None
    """Where forward copied the tensor to the host (``.cpu()``, ``.to("cpu")``)."""

    @property
    def origin(self) -> str:
        """The attribute path or the ``file:line`` the tensor came from ("" when unknown)."""
        if self.creation is not None:
            return self.creation.site.source
        if self.host_copy is not None:
            return self.host_copy.source
        return self.linked.where if self.linked else self.path

    @property
    def site(self) -> EventSite:
        """The line in forward that made the tensor, when forward made it."""
        if self.creation is not None:
            return self.creation.site
        return self.host_copy or NOWHERE

    def origins(self) -> list[str]:
        """Every origin combined into a tensor of this provenance, the first first."""
        found: list[str] = []
        pending = [self]
        while pending and len(found) < 16:
            p = pending.pop(0)
            for origin in [p.origin, *(c.site.source for c in (p.creation.merged if p.creation else []))]:
                if origin and origin not in found:
                    found.append(origin)
            pending.extend(p.also)
        return found



@dataclass
class Mismatch:
    """An op whose arguments mixed devices (PC201); the tracer moved the offending one and went on."""

    op: str
    devices: tuple[Device, ...]
    device: Device
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
    device: Device
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
    devices: tuple[Device, ...]
    """The devices its tensors are on (a module's may span several)."""
    site: EventSite
    on_target: bool = False
    """Built on the target (``device=x.device``): placed right, still unknown to an earlier optimizer."""
    expected: str = ""
    """The device it belonged on (the target; with ``--device keep``, its module's device)."""


@dataclass
class OutputOffDevice:
    """A tensor of the forward's output off the target (PC206)."""

    path: str
    device: Device
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

    src: Device
    dst: Device
    nbytes: int
    site: EventSite
    from_stage: str
    """The stage whose forward produced the copied tensor ("" for the root or the inputs)."""
    to_stage: str = ""
    """The stage whose forward first used the copy ("" while none has: the root, or the output)."""
    route: tuple[Device, ...] = ()
    """The devices the tensor's data went through up to this copy, its destination last."""
    weights: str = ""
    """The path of the registered parameter or buffer this copy moves, when it moves one."""
    ping_pong: bool = False
    """The copy brought data back to a device it had left, and a stage computed on it there again."""


@dataclass
class StaleRead:
    """A host read of a CPU tensor that a non-blocking device-to-host copy was still filling (PC210)."""

    op: str
    device: Device
    """The device the copy came from."""
    site: EventSite
    """Where the host read it."""
    copied_at: EventSite
    """Where the non-blocking copy was made."""


@dataclass
class GradOffDevice:
    """A parameter whose gradient the backward left off the target (PC201)."""

    path: str
    device: Device


# -- what the walk after .to() finds ---------------------------------------------------------------


@dataclass(frozen=True)
class HeldTensor:
    """A tensor the walk met, as plain data."""

    device: Device
    dtype: str
    shape: tuple[int, ...] | None
    """None for a lazy parameter not initialised yet."""
    nbytes: int

    @property
    def text(self) -> str:
        """``float32[4, 4]``."""
        return f"{self.dtype}{list(self.shape or [])}"


@dataclass(frozen=True)
class RegisteredOffTarget:
    """A registered parameter or buffer that is not where it belongs after ``.to()`` (PC104, PC105)."""

    name: str
    """Its dotted path in the model."""
    owner: str
    """The path of the module registering it."""
    parameter: bool
    tensor: HeldTensor
    expected: str
    source: str
    """Where the user's code assigned it (or the module holding it)."""
    keep: bool = False
    """``--device keep``: the model placed itself; the message names the module."""


@dataclass(frozen=True)
class StrayTensor:
    """A tensor ``.to()`` does not move: a plain attribute, an item of a container or helper object
    (PC101), an ``nn.Parameter`` held there (PC103), or a reference to a buffer as it was before the
    move (PC101)."""

    path: str
    attr: str
    """The attribute of its module that holds it (or holds its container)."""
    owner: str
    tensor: HeldTensor
    expected: str
    source: str
    parameter: bool = False
    stale_buffer: str = ""
    """The buffer this is a reference to, as it was before ``.to()`` replaced it."""
    class_level: bool = False
    """Defined in the class body: shared by every instance."""
    container: str = ""
    """The plain container holding it (``list``, ``dict``), when one does."""
    helper: str = ""
    """The class of the helper object holding it, when one does."""
    object_class: str = ""
    """The class of the object its parameter's last step is held by (PC103)."""
    object_path: str = ""
    in_dict: bool = False
    keep: bool = False


@dataclass(frozen=True)
class UnregisteredModuleFound:
    """A module held outside the registry, whose tensors ``.to()`` does not move (PC102)."""

    type_name: str
    path: str
    owner: str
    source: str
    count: int
    """Its tensors that this finding counts (not reported elsewhere first)."""
    nbytes: int
    devices: tuple[Device, ...]
    expected: str
    container: str = ""
    object_class: str = ""
    object_path: str = ""
    in_dict: bool = False
    reported_elsewhere: int = 0


WalkEvent = typing.Union[RegisteredOffTarget, StrayTensor, UnregisteredModuleFound]


TensorSpec = tuple[tuple[int, ...], str]
"""``(shape, dtype)`` of one state_dict entry, as a checkpoint or a model holds it; dtype without
``torch.``."""


Event = typing.Union[Creation, Mismatch, HostSync, ImplicitTransfer, Registration, OutputOffDevice,
                     ForwardError, GradOffDevice, Copy, StaleRead]
