"""The forward-pass checks: the events one traced forward recorded, turned into findings PC201-PC210.

The tracer (:mod:`placecheck.checks.trace`) records; this module decides what each
event means (is it a finding, at which severity, what it links to) and takes
the words of each rule from its builder in :mod:`placecheck.findings.rules`. One
finding per code and source line (per output for PC206), other modules that
ran the line listed in ``details["also"]``.

The link a problem is grouped by (see :mod:`placecheck.findings.problems`) is the
``origin`` field: the attribute path of the stray an offending tensor came
from (``blocks.0.mask``), or the ``file:line`` that created it (PC201, PC205,
PC206, and the PC202 itself); a PC204 of a device-to-host copy that forward
returned has the ``origin`` of its PC206 (the copying line).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from placecheck.basics.codes import Code
from placecheck.checks.events import (
    Copy,
    Event,
    ForwardError,
    GradOffDevice,
    HostSync,
    ImplicitTransfer,
    Mismatch,
    OutputOffDevice,
    Registration,
    StaleRead,
)
from placecheck.checks.provenance import Creation, Provenance
from placecheck.engines.sources import NOWHERE, EventSite
from placecheck.findings import rules
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.rules import make_finding

_PERFORMANCE_CODES = frozenset({Code.PC202, Code.PC204, Code.PC205})


@dataclasses.dataclass
class ForwardFindings:
    """The findings of one traced forward."""

    findings: list[Finding]
    library: dict[str, int]
    """Installed package -> performance findings raised entirely inside it (reported at ``info``)."""

    def notes(self) -> list[str]:
        """Remarks for the report's notes (none: library findings are findings of their own)."""
        return []


def forward_findings(events: list[Event], target: str, library_findings: bool = False) -> ForwardFindings:
    """PC201-PC207 from the recorded events, de-duplicated by (code, source line).

    Performance findings (PC202 that fed no mismatch, PC204, PC205) whose
    call chain in the forward has no frame outside installed packages are
    library code: reported at ``info``, naming the package ("in transformers,
    not your code: ..."), since no line of the user's code changes them (the
    user may still act: another attention implementation, no mask without
    padding). ``library_findings`` keeps their rule's severity.
    """
    found: dict[tuple[str, str, str], Finding] = {}
    library: dict[tuple[str, str, str], str] = {}
    apis: dict[tuple[str, str, str], str] = {}
    """Findings made inside a torch (or installed) function the user's line called, on tensors it made
    itself (``EventSite.api``): the API's own work, at ``info``, naming it."""
    crashes: set[tuple[str, str, str]] = set()
    """Creations that fed a mismatch: the cause of an error, never downgraded as library performance."""
    lazy_lines = {e.site.source for e in events if isinstance(e, Registration)}
    returned = {id(e.host_sync): e for e in events if isinstance(e, OutputOffDevice) and e.host_sync}
    for event in events:
        finding = _finding(event, target, lazy_lines, returned)
        if finding is None:
            continue
        # one finding per line; per output for PC206 (two host copies returned from one line)
        key = (finding.code, finding.source,
               finding.module if not finding.source or finding.code == Code.PC206 else "")
        if key in found:
            found[key] = _also_in(found[key], finding.where)
            if finding.code == Code.PC201:
                found[key] = _also_from(found[key], finding.origin)
            continue
        found[key] = finding
        if isinstance(event, Creation) and event.fed_mismatch:
            crashes.add(key)
        site = getattr(event, "site", None)
        if isinstance(site, EventSite) and site.library:
            library[key] = site.library
        elif isinstance(site, EventSite) and site.api \
                and isinstance(event, HostSync | ImplicitTransfer | Creation):
            apis[key] = site.api
        elif isinstance(event, Creation) and event.moved_at is not None and event.moved_at.api:
            apis[key] = event.moved_at.api  # the copy to the device was the API's own
    counted: dict[str, int] = {}
    kept = []
    for key, finding in found.items():
        package = library.get(key, "")
        if package and finding.severity is not Severity.ERROR and finding.code in _PERFORMANCE_CODES \
                and key not in crashes:
            counted[package] = counted.get(package, 0) + 1
            finding = dataclasses.replace(
                finding, message=rules.in_library(package, finding.message),
                severity=finding.severity if library_findings else rules.severity(finding.code, "library"),
                details=(*finding.details, ("library", package)))
        elif key in apis and finding.severity is not Severity.ERROR and key not in crashes:
            finding = dataclasses.replace(
                finding, message=rules.in_library(apis[key], finding.message),
                severity=finding.severity if library_findings else rules.severity(finding.code, "api"),
                hint=rules.made_by_api(apis[key]), details=(*finding.details, ("api", apis[key])))
        kept.append(finding)
    return ForwardFindings(kept, counted)


def _tensor(dtype: str, shape: tuple[int, ...] | None) -> str:
    return f"{dtype}{list(shape or [])}"


def _came_from(prov: Provenance) -> str:
    creation = prov.creation
    return rules.came_from(created_by=creation.op if creation else "",
                           created_at=creation.site.source if creation else "",
                           host_copy_at=prov.host_copy.source if prov.host_copy else "",
                           attribute=prov.path, lazy=prov.lazy)


def _finding(event: Event, target: str, lazy_lines: set[str],
             returned: dict[int, OutputOffDevice]) -> Finding | None:
    # with --device keep each event carries the device of the module whose forward ran it
    target = getattr(event, "expected", "") or target
    if isinstance(event, Copy):
        return _copy(event) if event.weights or event.ping_pong else None
    if isinstance(event, Mismatch):
        return _mismatch(event, target)
    if isinstance(event, Creation):
        if event.site.source in lazy_lines:
            return None  # the parameters of a layer built in forward: that is PC203
        if event.fed_mismatch or event.moved or (event.met_device and event.shape != ()):
            return _creation(event, target)
        # CPU-side work never copied to the device, or a 0-dim scalar PyTorch reads on the host
        return None
    if isinstance(event, HostSync):
        output = returned.get(id(event))
        message, hint = rules.host_sync(event.op, event.device, returned_as=output.path if output else "")
        # a copy forward returns goes to the host: its device column reads cuda:0 -> cpu
        return _make(Code.PC204, event.site, None, device=event.device,
                     expected=output.device if output else target,
                     origin=output.provenance.origin if output else "",
                     message=message, hint=hint, details=(("op", event.op),))
    if isinstance(event, ImplicitTransfer):
        if event.scalar and not event.provenance.path:
            # a scalar made in forward is a Python number to PyTorch; a stored one could be a buffer
            return None
        message, hint = rules.implicit_transfer(event.op, event.scalar, _tensor(event.dtype, event.shape),
                                                target, _came_from(event.provenance))
        return _make(Code.PC205, event.site, rules.severity(Code.PC205, "scalar") if event.scalar else None,
                     device="cpu",
                     expected=target, dtype=event.dtype, shape=event.shape, origin=event.provenance.origin,
                     message=message, hint=hint, details=(("op", event.op),))
    if isinstance(event, Registration):
        message, hint = rules.created_in_forward(event.what, event.path, event.type_name, event.device,
                                                 event.on_target)
        # on the target it cannot crash the job: only the optimizer misses it
        # where: the created module or parameter, as a walk finding's; source: the line that created it
        return _make(Code.PC203, event.site,
                     rules.severity(Code.PC203, "on-target") if event.on_target else None, where=event.path,
                     device=event.device, expected=target, module=event.path, message=message, hint=hint)
    if isinstance(event, OutputOffDevice):
        prov = event.provenance
        message, hint = rules.output_off_device(event.path, _tensor(event.dtype, event.shape), event.device,
                                                target, _came_from(prov))
        return _make(Code.PC206, prov.site, None, device=event.device, expected=target, dtype=event.dtype,
                     shape=event.shape, origin=prov.origin, module=event.path, message=message, hint=hint,
                     details=(("output", event.path),))
    if isinstance(event, ForwardError):
        if event.mismatch:
            message, hint = rules.device_mismatch_untraced(event.phase, event.message)
            return _make(Code.PC201, event.site, None, expected=target, message=message, hint=hint)
        message, hint = rules.forward_error(event.phase, event.message, after_repair=event.after_repair)
        return _make(Code.PC207, event.site, None, expected=target, message=message, hint=hint,
                     details=(("phase", event.phase),))
    if isinstance(event, StaleRead):
        message, hint = rules.unsynchronized_read(event.op, event.device, event.copied_at.source)
        # the copy's direction in the device columns (cuda:0 -> cpu), as a returned host copy's PC204
        return _make(Code.PC210, event.site, None, device=event.device, expected="cpu",
                     origin=event.copied_at.source, message=message, hint=hint,
                     details=(("op", event.op), ("copied_at", event.copied_at.source)))
    if isinstance(event, GradOffDevice):
        message, hint = rules.gradient_off_device(event.path, event.device, target)
        return _make(Code.PC201, NOWHERE, None, device=event.device, expected=target, module=event.path,
                     origin=event.path, message=message, hint=hint, details=(("op", "backward"),))
    return None


def _creation(event: Creation, target: str) -> Finding:
    fed = event.fed_mismatch
    if event.kept_in and event.moved and event.moved_at is not None and not fed:
        # a cache: the forward kept the device copy in a module attribute, to reuse it
        message, hint = rules.created_then_cached(
            event.op, _tensor(event.dtype, event.shape), event.device, event.moved_to or target,
            event.moved_at.source, kept_in=event.kept_in)
        return _make(Code.PC202, event.site, rules.severity(Code.PC202, "cache"), device=event.device,
                     expected=target, dtype=event.dtype, shape=event.shape, origin=event.site.source,
                     message=message, hint=hint, details=(("op", event.op), ("kept_in", event.kept_in)))
    copied_at = event.moved_at.source if event.moved and event.moved_at else ""
    scalar = bool(copied_at) and not fed and event.shape == ()
    message, hint = rules.created_off_device(
        event.op, _tensor(event.dtype, event.shape), event.device, target, fed=fed,
        copied_to=event.moved_to, copied_at=copied_at, scalar=scalar)
    # the rule's severity (one truth with the rule table): the mismatch it fed is its own PC201 error; a
    # 0-dim tensor copied to the device is one scalar copy per call (issue 42 item 11)
    return _make(Code.PC202, event.site, rules.severity(Code.PC202, "scalar") if scalar else None,
                 device=event.device, expected=target,
                 dtype=event.dtype, shape=event.shape, origin=event.site.source, message=message, hint=hint,
                 details=(("op", event.op),))


def _copy(event: Copy) -> Finding:
    """PC208: weights copied on every call, or data sent back and forth between two devices."""
    boundary = f"{event.from_stage or '(root)'} -> {event.to_stage or '(root)'}"
    message, hint = rules.ping_pong(event.src, event.dst, event.nbytes, boundary, weights=event.weights,
                                    route=event.route)
    details = [("boundary", boundary), ("route", " -> ".join(event.route or (event.src, event.dst)))]
    if event.weights:
        details.append(("weights", event.weights))
    return _make(Code.PC208, event.site, None, device=event.src, expected=event.dst, nbytes=event.nbytes,
                 origin=event.weights or event.site.source, message=message, hint=hint,
                 details=tuple(details))


def _mismatch(event: Mismatch, target: str) -> Finding:
    prov = event.provenance
    if event.refused:
        if event.refused == "generator":
            message, hint = rules.generator_off_device(event.op, event.device, target)
        else:
            message, hint = rules.host_argument_on_device(event.op, event.refused,
                                                          _tensor(event.dtype, event.shape), event.device)
        return _make(Code.PC201, event.site, None, device=event.device, expected=target, dtype=event.dtype,
                     shape=event.shape, origin=prov.origin, message=message, hint=hint,
                     details=(("op", event.op), ("devices", ", ".join(event.devices)),
                              ("argument", event.refused)))
    from_stage, to_module = event.stages if event.stages is not None else ("", "")
    message, hint = rules.device_mismatch(
        event.op, event.devices, event.device, _tensor(event.dtype, event.shape), _came_from(prov),
        created_on=event.device if prov.creation else "", lazy=prov.lazy,
        linked_hint=prov.linked.hint if prov.linked else "", attribute=prov.path,
        stages=(from_stage, to_module, target) if event.stages is not None else None,
        argument=event.argument, dtype=event.dtype)
    details = [("op", event.op), ("devices", ", ".join(event.devices))]
    if event.stages is not None:
        details.append(("stages", f"{from_stage or '(root)'} ({event.device}) -> {to_module or '(root)'} "
                                  f"({target})"))
    origins = prov.origins()
    if len(origins) > 1:
        details.append(("origins", ", ".join(origins)))
    return _make(Code.PC201, event.site, None, device=event.device, expected=target, dtype=event.dtype,
                 shape=event.shape, origin=prov.origin, message=message, hint=hint, details=tuple(details))


def _also_from(first: Finding, origin: str) -> Finding:
    """``first`` listing one more origin of an offending tensor on the same line (``origins``)."""
    details = dict(first.details)
    origins = [o for o in details.get("origins", first.origin).split(", ") if o]
    if not origin or origin in origins:
        return first
    details["origins"] = ", ".join([*origins, origin])
    return dataclasses.replace(first, details=tuple(details.items()))


def _also_in(first: Finding, where: str) -> Finding:
    """``first`` noting that the same line also ran in module ``where`` (one finding per line)."""
    details = dict(first.details)
    also = [w for w in details.get("also", "").split(", ") if w]
    shown = where or "''"
    if where == first.where or shown in also:
        return first
    details["also"] = ", ".join([*also, shown])
    return dataclasses.replace(first, details=tuple(details.items()))


def _make(code: str, site: EventSite, severity: Severity | None, where: str | None = None,
          **fields: Any) -> Finding:
    """A finding of rule ``code`` at ``site``; ``where`` defaults to the module whose forward ran the line."""
    fields.setdefault("module", site.where)
    return make_finding(code, severity=severity,
                        where=site.where if where is None else where, source=site.source, **fields)
