"""What only ``placecheck run`` sees, a whole script: the same host tensor copied at every step
(PC209), and the script's own messages of the forward's codes (PC201, PC203, PC204, PC207):
its DataLoader's batches, its loop, its own error.

Each rule's declaration (code, kind, default severity, title, explanation, wrong and right
code) comes first, then its builders: plain data in, the finding out (the message parts
``sync_in_installed_forward``, ``loop_sync`` and ``created_in_script`` aside). A problem of a model's
forward has the words ``audit`` uses (:mod:`.forward`'s). Shared machinery (the rule table, the severity
policy) is :mod:`.registry`'s. No torch here.
"""

from __future__ import annotations

import dataclasses

from placecheck.basics.codes import Code
from placecheck.basics.devices import human_bytes
from placecheck.basics.gpu_errors import gpu_error
from placecheck.basics.values import Device
from placecheck.findings.events import HeldTensor
from placecheck.findings.finding import Finding
from placecheck.findings.rules.forward import (
    created_in_forward,
    created_off_device,
    created_then_cached,
    host_sync,
    implicit_transfer,
)
from placecheck.findings.rules.registry import W, declare, make_finding, severity

declare(Code.PC209, "repeated-transfer", W, "run", "the same host tensor copied to the device every step", """
placecheck run saw one host tensor copied to the device at the same line in
several optimizer steps: the whole dataset (or a constant) moved inside the
loop. The tensor's bytes cross the bus again at every step for data that does
not change; a GPU job spends that time waiting. Move it once, before the loop,
and index the device copy; or move only each batch.""", """
for step in range(steps):
    x = images.to(device)[idx]        # all of `images`, every step
""", """
images = images.to(device)            # once
for step in range(steps):
    x = images[idx]
""")


# -- message builders of what only placecheck run sees (a whole script: its loop, optimizers, loaders) --
# A problem of a model's forward has the builder ``audit`` uses (host_sync, created_off_device,
# implicit_transfer above); these are the script's own.


def script_device_mismatch(op: str, reference: Device, device: Device, tensor: str, *, where: str, line: str,
                           dtype: str, shape: tuple[int, ...], nbytes: int, origin: str,
                           details: tuple[tuple[str, str], ...], batch: str = "",
                           loader_at: str = "", name: str = "", owner: str = "", created_by: str = "",
                           created_at: str = "", in_forward: bool = False, discarded_at: str = "",
                           current_at: str = "", library: str = "", crashes_at: str = "") -> Finding:
    """PC201 in a script: ``op`` mixed ``reference`` and ``device``; its argument, ``tensor`` (the
    script's variable or expression ``name`` when one names it), is the batch element ``batch`` of the
    DataLoader iterated at ``loader_at``, or the buffer or parameter ``owner`` (``criterion.weight``) of a
    module the script holds, or was created by ``created_by`` at ``created_at`` (``in_forward``: in a
    module's forward). The line to edit, when it is another (issue 42 item 8): ``discarded_at``, a move
    of it whose result the script threw away; ``current_at``, a move to ``"cuda"`` without an index (the
    current device, not the model's). ``crashes_at``: the line inside the installed ``library`` where the
    op ran. The finding is at ``line``, for the argument at ``where`` (``dtype``, ``shape``, ``nbytes``),
    whose ``origin`` is the line (or owner) the script should edit; ``details`` as the recorder gathered
    them."""
    named = f"`{name}`" if name else tensor
    variable = name or "x"
    element = "[" in name  # the script's expression for it (batch["y"]): move it where the op takes it
    if batch:
        what = f"{named} ({batch}, from the DataLoader at {loader_at})"
        hint = ("move every tensor of the batch to the device, not only the inputs: "
                + (f"{name}.to(device)" if element else f"{variable} = {variable}.to(device)"))
    elif owner:
        what = f"`{owner}`"
        hint = (f"call {owner.rsplit('.', 1)[0]}.to(device) as for the model: .to() moves a module's "
                "registered buffers, a loss's weight and pos_weight included")
    elif created_by:
        what = f"{named} (created by {created_by} at {created_at})"
        hint = (f"create it on the input's device in forward ({created_by}(..., device=x.device))"
                if in_forward else
                f"create it on the device ({created_by}(..., device=device)), or move it once before "
                "the loop; a metric can also accumulate Python numbers")
        if element:
            hint = f"move it to the device where the op takes it: {name}.to(device); or {hint}"
    else:
        what = named
        hint = (f"move it to the device where the op takes it: {name}.to(device)" if element
                else f"move it to {reference} before this op (tensor.to(device))")
    if discarded_at:
        what += (f", moved at {discarded_at} but that result was thrown away (a tensor's .to() returns a "
                 "moved copy: it does not move the tensor in place),")
        hint = f"at {discarded_at}, keep the moved copy: {variable} = {variable}.to(device)"
    if current_at:
        what += (f", sent to \"cuda\" at {current_at}, which means the current device ({device}), not the "
                 f"model's ({reference}),")
        hint = (f"at {current_at}, move it to the model's device: .to({reference!r}) or "
                f".to(next(model.parameters()).device); or make {reference} the current device first "
                f"(torch.cuda.set_device({reference!r}))")
    inside = f"; it crashes inside {library} at {crashes_at}" if crashes_at else ""
    return make_finding(
        Code.PC201, where=where, source=line, device=device, expected=reference, dtype=dtype, shape=shape,
        nbytes=nbytes, count=1, origin=origin, details=details, hint=hint,
        message=f"{op} mixed {reference} and {device}: {what} is on {device}{inside}; on a GPU this raises "
                f"'{gpu_error(op, device, reference)}'")


def created_in_script(op: str, tensor: str, device: str, target: str) -> tuple[str, str]:
    """PC202 in a script: the script's own ``op`` (outside any forward) made ``tensor`` on ``device`` without
    ``device=``, and it then fed a device mismatch on ``target`` (the cause: the line to edit)."""
    return (f"{op} creates {tensor} on {device}, not {target}: it then fed a device mismatch",
            f"create it on the device ({op}(..., device=device)), or move it once before the loop "
            "(nn.Parameter keeps the device of its data); a metric can also accumulate Python numbers")


def layer_built_in_forward(type_name: str, name: str, owner: str, devices: str, target: str,
                           line: str) -> Finding:
    """PC203 in a script: a ``type_name`` layer ``name`` built at ``line`` during ``owner``'s forward on
    ``devices``, the model running on ``target``; on the target it cannot crash, only the optimizer
    misses it (the rule's on-target severity)."""
    on_target = devices == target
    return make_finding(
        Code.PC203, severity=severity(Code.PC203, "on-target" if on_target else None),
        where=f"{owner}.{name}", source=line, device=devices, expected=target,
        message=f"{type_name} {name!r} is built during {owner}.forward on {devices}: " + (
            "an optimizer built before the first forward does not hold its parameters"
            if on_target else "the earlier .to() never saw it, and no optimizer holds it"),
        hint="build layers in __init__ (or use an nn.Lazy* module), then move the model and build the "
             "optimizer")


def creation_in_run(op: str, tensor: HeldTensor, target: Device, *, line: str, module: str, fed: bool = False,
                    copied_at: str = "") -> Finding:
    """PC202 at ``line``, where ``op`` made ``tensor`` on the host without ``device=``: in ``module``'s
    forward ("" for the script's own code, outside any forward). It fed a device mismatch on ``target``
    (``fed``: the cause, the line to edit), or was copied to ``target`` at ``copied_at`` on every call (a
    0-dim one is a scalar copy: the rule's scalar severity), or is a CPU index copied there per call."""
    scalar = bool(copied_at) and not fed and tensor.shape == ()
    if module or not fed:
        message, hint = created_off_device(op, tensor.text, tensor.device, target, fed=fed,
                                           copied_to=target if copied_at else None, copied_at=copied_at,
                                           scalar=scalar)
    else:
        message, hint = created_in_script(op, tensor.text, tensor.device, target)
    return make_finding(Code.PC202, severity=severity(Code.PC202, "scalar") if scalar else None,
                        where=module, source=line, device=tensor.device, expected=target, dtype=tensor.dtype,
                        shape=tensor.shape, nbytes=tensor.nbytes, count=1, origin=line, message=message,
                        hint=hint, details=(("op", op),))


def cached_in_run(finding: Finding, op: str, tensor: str, copied_to: str, copied_at: str, *, made: int,
                  calls: int) -> Finding:
    """``finding``, a PC202 of a forward's creation copied to the device, as the whole run shows it: made
    in ``made`` of the ``calls`` forwards its module ran. Fewer than all, it is a cache (built once, or
    when the length changes): ``info``, with both counts; else it stands."""
    if not 0 < made < calls:
        return finding
    message, hint = created_then_cached(op, tensor, finding.device, copied_to, copied_at, made=made,
                                        calls=calls)
    return dataclasses.replace(finding, severity=severity(Code.PC202, "cache"), message=message, hint=hint,
                               count=made,
                               details=(*finding.details, ("made", str(made)), ("forwards", str(calls))))


def index_in_run(op: str, tensor: HeldTensor, target: Device, *, line: str, module: str, came_from: str = "",
                 origin: str = "") -> Finding:
    """PC205 at ``line``: a CPU index ``tensor`` indexing a ``target`` tensor in ``module``'s forward (a copy
    to the device per call); ``came_from`` (:func:`came_from`'s words) and ``origin`` (the line) name the
    forward's creation it came from, when it did."""
    message, hint = implicit_transfer(op, False, tensor.text, target, came_from)
    return make_finding(Code.PC205, where=module, source=line, device=tensor.device, expected=target,
                        dtype=tensor.dtype, shape=tensor.shape, nbytes=tensor.nbytes, count=1, origin=origin,
                        message=message, hint=hint)


def parameter_built_in_forward(path: str, device: Device, target: Device | None, *, line: str) -> Finding:
    """PC203 at ``line``: a parameter ``path`` (``Net.scale``) registered on ``device`` during a forward on
    ``target``, as audit reports it; on the target only the optimizer misses it (the on-target
    severity)."""
    on_target = device == target
    message, hint = created_in_forward("parameter", path, "Parameter", device, on_target)
    return make_finding(Code.PC203, severity=severity(Code.PC203, "on-target" if on_target else None),
                        where=path, source=line, device=device, expected=target or "", message=message,
                        hint=hint)


def script_host_sync(call: str, device: Device, *, module: str, line: str, count: int, rate: str) -> Finding:
    """PC204 at ``line``, whose ``call`` (``.item() in torch.nn.utils.clip_grad_norm_`` when a library
    function made it) waited for ``device`` ``count`` times over the run: in ``module``'s forward, as
    audit says it (info when installed code made it); outside any forward (``module`` "") ``rate`` times
    (``1 per optimizer step``), info: a loop's sync is a choice, not a mistake."""
    inside = call.split(" in ", 1)[1] if " in " in call else ""
    if module and inside:
        message, hint = sync_in_installed_forward(call, device, module, inside)
        changed = severity(Code.PC204, "library")
    elif module:
        message, hint = host_sync(call, device)
        changed = None
    else:
        message, hint = loop_sync(call, device, rate, inside)
        changed = severity(Code.PC204, "loop")
    return make_finding(Code.PC204, severity=changed, where=module, source=line, device=device,
                        expected=device, count=count, message=message, hint=hint,
                        details=(("call", call), ("calls", str(count))))


def sync_in_installed_forward(call: str, device: str, module: str, inside: str) -> tuple[str, str]:
    """PC204 (info): ``call`` made by installed code (``inside``) in ``module``'s forward."""
    return (f"{call} of a {device} tensor in {module}.forward: a host sync inside installed code, on every "
            "call",
            f"{inside} syncs there by itself; nothing to change in this line")


def loop_sync(call: str, device: str, rate: str, inside: str = "") -> tuple[str, str]:
    """PC204 (info): ``call`` outside any forward, ``rate`` times (``once``, ``1 per optimizer step``);
    ``inside`` names the library function that made it."""
    return (f"{call} of a {device} tensor outside the model's forward: a host sync, {rate}; each waits for "
            "the GPU to finish the queued work",
            f"{inside} syncs by design; nothing to change here" if inside
            else "fine once per step for logging; accumulate on the device (loss.detach()) and read it "
                 "every N steps when steps are short")


def repeated_copy(nbytes: int, device: Device, steps: int, line: str) -> Finding:
    """PC209: the same host tensor of ``nbytes`` copied to ``device`` at ``line`` at each of ``steps``
    steps."""
    size = human_bytes(nbytes)
    return make_finding(
        Code.PC209, where="", source=line, device="cpu", expected=device, nbytes=nbytes, count=steps,
        message=f"the same {size} host tensor is copied to {device} at every step ({steps} steps seen): "
                f"{size} per step over the bus for data that does not change",
        hint="move it to the device once, before the loop, and index the device copy",
        details=(("bytes per step", str(nbytes)),))


def script_error(error: str, exception: str, line: str, *, mismatch: bool = False) -> Finding:
    """PC207 (PC201 when ``mismatch``): the script stopped at ``line`` on ``error``, an ``exception`` it did
    not catch."""
    if mismatch:
        return make_finding(Code.PC201, where="", source=line,
                            message=f"the script stopped on a device mismatch: {error}",
                            hint="move every tensor of this op to one device")
    return make_finding(Code.PC207, where="", source=line, message=f"the script raised {error}",
                        hint="fix the error at this line; the findings before it stand",
                        details=(("exception", exception),))
