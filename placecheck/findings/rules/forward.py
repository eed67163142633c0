"""PC2xx, the forward: an op mixing devices (PC201), tensors and layers created in ``forward()``
off the target (PC202, PC203), host syncs (PC204), implicit copies (PC205), outputs off the
target (PC206), a forward's own error (PC207), copies back and forth between devices (PC208),
a non-blocking copy read too early (PC210); and the message parts every check shares (where a
tensor came from, a finding inside a library or on some replicas only).

Each rule's declaration (code, kind, default severity, title, explanation, wrong and right
code) comes first, then the builders of its messages: plain data in, (message, hint) out; last, the
judge of a traced forward's events (:func:`forward_findings`; :func:`event_finding` for one event that
``run`` recorded). Shared machinery (the rule table, the severity policy) is :mod:`.registry`'s. No
torch here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from placecheck.basics.codes import Code
from placecheck.basics.devices import human_bytes
from placecheck.basics.gpu_errors import gpu_error
from placecheck.basics.values import Device, Site
from placecheck.findings.events import (
    NOWHERE,
    Copy,
    Creation,
    Event,
    EventSite,
    ForwardError,
    GradOffDevice,
    HostSync,
    ImplicitTransfer,
    Mismatch,
    OutputOffDevice,
    Provenance,
    Registration,
    StaleRead,
)
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.rules.registry import E, W, declare, make_finding, severity

declare(Code.PC201, "device-mismatch", E, "forward", "an op mixed tensors on different devices", """
An operation received tensors on two devices. On a GPU this raises
"Expected all tensors to be on the same device" (or "Input type ... and
weight type ... should be the same" for convolutions). Mixing never silently
returns a CPU result; the only legal mixes are a 0-dim CPU tensor used as a
scalar and a CPU index tensor. placecheck names the module, the line and,
when it can, where the offending tensor came from. On an FSDP2 rank
(--wrap fsdp) a plain tensor meeting a DTensor is this mistake too: one
operand on the rank's device, the other sharded over the mesh; the ranks
raise "got mixed torch.Tensor and DTensor".""", """
def forward(self, x):
    return x + self.bias_table     # plain attribute left on the CPU
""", """
self.register_buffer("bias_table", table, persistent=False)
""")


# -- message builders of the forward rules: plain data in, (message, hint) out ------------------------


def came_from(*, created_by: str = "", created_at: str = "", host_copy_at: str = "", attribute: str = "",
              lazy: bool = False) -> str:
    """`` (created by torch.randn at net.py:12)``: where an offending tensor came from, for a message."""
    if created_by:
        return f" (created by {created_by} at {created_at})"
    if host_copy_at:
        return f" (copied to the host at {host_copy_at})"
    if lazy:
        return f" (from {attribute!r}, created during forward)"
    if attribute:
        return f" (from attribute {attribute!r}, which .to() did not move)"
    return ""


def in_library(package: str, message: str) -> str:
    """A performance finding raised entirely inside an installed ``package``: its message, saying so."""
    return f"in {package}, not your code: {message}"


def made_by_api(api: str) -> str:
    """The hint of a performance finding that ``api`` (``pad_packed_sequence (torch)``), called from the
    user's line, made by itself on tensors of its own."""
    return f"{api} does this by itself in its documented use; nothing to change in this line"


def on_replicas(labels: Sequence[str], message: str) -> str:
    """A finding only some replicas (or ranks) of a replicated model have: its message, naming them
    (``on replica 1 (cuda:1), Tensor.add mixed ...``; its headline, up to the first ": ", stays whole)."""
    return f"on {', '.join(labels)}, {message}"


def landed_on(device: str) -> str:
    """Why a tensor created in forward is on ``device``: the default device, or a hard-coded one."""
    if device.startswith(("cpu", "meta")):
        return "tensors created in forward land on the default device, the CPU"
    return f"a hard-coded device (.cuda(), device=\"cuda\") put it on {device}, whatever the input's device"


def device_mismatch(op: str, devices: Sequence[str], device: str, tensor: str, origin_text: str, *,
                    created_on: str = "", lazy: bool = False, linked_hint: str = "",
                    attribute: str = "", stages: tuple[str, str, str] | None = None,
                    argument: int | None = None, dtype: str = "") -> tuple[str, str]:
    """PC201: ``op`` mixed ``devices``; its ``tensor`` argument (at position ``argument`` of the call, of
    ``dtype``) was on ``device``. The message quotes what PyTorch raises there on a GPU
    (:func:`placecheck.basics.gpu_errors.gpu_error`). The hint follows where
    that tensor came from: created in forward on ``created_on``, a lazily built layer, a walk finding
    (its hint), or a plain ``attribute``. ``stages`` (``--device keep``) is (the stage that produced the
    tensor, the stage that received it, that stage's device): the two sides of a model-parallel mix."""
    other = next((d for d in devices if d != device), device)
    says = gpu_error(op, device, other, argument=argument, dtype=dtype)
    if stages is not None and not (created_on or lazy or linked_hint or attribute):
        produced_by, used_by, used_on = stages
        side = ("the forward's input" if produced_by == "(input)" else
                f"stage {produced_by!r}" if produced_by else "the root module's forward")
        message = (f"{op} mixed {' and '.join(devices)}: its {tensor} argument comes from {side} on "
                   f"{device}, and {f'stage {used_by!r}' if used_by else 'the root module'} runs on "
                   f"{used_on}; on the GPUs this raises '{says}'")
        where = f"where it enters stage {used_by!r}" if used_by else "before the call"
        return message, (f"move the activation between the stages, {where}: h = h.to({used_on!r}) "
                         "(or h.to(<a parameter of that stage>.device))")
    if created_on:
        hint = ("create it on the input's device: device=x.device (or torch.zeros_like / x.new_zeros); "
                + landed_on(created_on))
    elif lazy:
        hint = "build the layer or parameter in __init__, so that .to() moves it"
    elif linked_hint:
        hint = linked_hint
    elif attribute:
        attr = attribute.rpartition(".")[2]
        hint = (f'register it: self.register_buffer("{attr}", tensor, persistent=False) in __init__ '
                "(.to() moves only registered parameters and buffers), or create it in forward on the "
                "input's device")
    else:
        hint = "move the tensor to the input's device where it is created"
    message = (f"{op} mixed {' and '.join(devices)}: its {tensor} argument is on {device}{origin_text}; "
               f"on a GPU this raises '{says}'")
    return message, hint


declare(Code.PC208, "cross-device-ping-pong", W, "forward", "data copied back and forth between devices", """
A model placed across GPUs copies activations from one stage to the next:
that traffic is expected (placecheck audit --device keep lists it). Two kinds
of copy are waste on every forward: data a stage sends to another device and
takes back to compute on again in the same top-level module (cuda:1 -> cuda:0
-> cuda:1: two trips over the interconnect where none was needed), and a
registered parameter or buffer copied to another device inside forward (the
weights cross the bus on every call instead of living where they are used).
Put each module on the device of the stage that uses it. A pipeline whose
third stage sits on the first one's device, and a result copied back to the
input's device at the end, are not ping-pongs. Under --device-map, an entry
the map offloads to the CPU or disk is one PC208: accelerate's hooks copy its
weights to the GPU on every forward (more GPU memory, or more GPUs, keeps them
there).""", """
class Block(nn.Module):  # the stage on cuda:1; its norm left on cuda:0
    def forward(self, x):
        h = self.norm(self.fc(x).to("cuda:0")).to("cuda:1")
        return self.out(h)
""", """
model.s2 = Block().to("cuda:1")   # the whole stage, its norm included
class Block(nn.Module):
    def forward(self, x):
        return self.out(self.norm(self.fc(x)))
""")


def ping_pong(src: str, dst: str, nbytes: int, boundary: str, *, weights: str = "",
              route: Sequence[str] = ()) -> tuple[str, str]:
    """PC208: a copy ``src`` -> ``dst`` of ``nbytes`` across ``boundary`` (``s1 -> s2``) moves the
    registered tensor ``weights`` (every call), or sends data back along ``route`` (the devices it went
    through, this copy's destination last)."""
    size = human_bytes(nbytes)
    if weights:
        return (f"registered tensor {weights!r} ({size}) is copied from {src} to {dst} on every forward "
                f"({boundary}): its weights cross the interconnect each call",
                f"place the module holding {weights!r} on {dst}, where it is used, instead of copying it")
    trip = " -> ".join(route) if route else f"{src} -> {dst}"
    return (f"{size} goes back and forth between devices ({trip}) and is computed on again on {dst} "
            f"({boundary}): each trip is a copy over the interconnect on every forward",
            f"put the module that runs on {src} on {dst} with its neighbours (or move it to the "
            "activations' device), so the data crosses once")


def offloaded_weights(module: str, device: str, execution: str, weights: list[str], nbytes: int,
                      source: str) -> Finding:
    """PC208 under a device map: the entry ``module`` is offloaded to ``device`` (``cpu`` or ``disk``), so
    accelerate's hooks copy its ``weights`` (``nbytes`` in all) to ``execution`` on every forward (seen in
    the forward's copies, the first at ``source``)."""
    read = "read from disk and " if device == "disk" else ""
    plural = "s" if len(weights) != 1 else ""
    return make_finding(
        Code.PC208, where=module, module=module, source=source, device=device, expected=execution,
        nbytes=nbytes, count=len(weights), origin=module,
        message=f"{module or '(root)'!r} is offloaded to {device} by the device map: accelerate's hooks "
                f"{read}copy its {len(weights)} weight tensor{plural} ({human_bytes(nbytes)}) to {execution} "
                "on every forward",
        hint="give it room on a GPU (more GPUs or GPU memory: --gpus, --gpu-memory; or a map that puts it on "
             "one): offloading saves GPU memory at the price of this copy on every call",
        details=(("offloaded", device), ("weights", ", ".join(weights))))


def dtensor_mixed(op: str, plain: str, dtensor: str, placements: str, *, where: str, source: str,
                  device: Device, expected: str, origin: str = "") -> Finding:
    """PC201 on an FSDP2/DTensor rank: ``op`` mixed a plain tensor (``plain``: dtype, shape, device) with
    a DTensor (``dtensor``: what it is, its ``placements`` and mesh). Not a device mix: a placement mix,
    which raises on the ranks as a device mismatch does on one GPU, and is fixed the same way (put the
    operands where the op's others are)."""
    return make_finding(
        Code.PC201, where=where, module=where, source=source, device=device, expected=expected, origin=origin,
        message=f"{op} mixed a plain tensor ({plain}) with a DTensor ({dtensor}): on the ranks this raises "
                "'got mixed torch.Tensor and DTensor'",
        hint="a sharded parameter is gathered only inside its own module's forward: call that module (or "
             "F.* with the module's output), gather it with .full_tensor(), or make the other operand a "
             "DTensor (DTensor.from_local / distribute_tensor)",
        details=(("op", op), ("dtensor", placements)))


def generator_off_device(op: str, generator_device: str, device: str) -> tuple[str, str]:
    """PC201 of a ``torch.Generator`` on ``generator_device`` given to ``op``, which runs on ``device``."""
    kind, gen_kind = Device.of(device).type, Device.of(generator_device).type
    return (f"{op} runs on {device} with a torch.Generator on {generator_device}: a GPU raises \"Expected a "
            f"'{kind}' device type for generator but found '{gen_kind}'\"",
            f"create the generator on the op's device (torch.Generator(device={device!r})"
            ".manual_seed(seed)), or leave generator= out to draw from the device's default generator")


def host_argument_on_device(op: str, argument: str, tensor: str, device: str) -> tuple[str, str]:
    """PC201 of an ``argument`` (``lengths``) that ``op`` needs on the CPU, given on ``device``."""
    return (f"{op} needs its {argument} argument ({tensor}) on the CPU, but it is on {device}: a GPU raises "
            "here (the data may be on the device; this argument may not)",
            f"keep {argument} on the CPU ({argument}.cpu(), or a list of ints): PyTorch reads it on the host"
            + (" to lay out the packed batch" if argument in ("lengths", "batch_sizes") else ""))


def device_mismatch_untraced(phase: str, error: str) -> tuple[str, str]:
    """PC201 for a mismatch an engine raised that no op's arguments showed."""
    return (f"the {phase} raised a device mismatch placecheck could not trace to an argument: {error}",
            "look for tensors held outside the call's arguments on another device")


def gradient_off_device(path: str, device: str, target: str) -> tuple[str, str]:
    """PC201 found by the backward: a parameter's gradient is off the target."""
    return (f"the gradient of parameter {path!r} lands on {device}, not {target}: optimizer.step() will "
            "mix devices",
            "the parameter itself is off the target: create it in __init__ and register it so that .to() "
            "moves it")


declare(Code.PC202, "created-off-device", W, "forward",
        "tensor created in forward() off the target device", """
Factory calls (torch.zeros, randn, arange, tensor, from_numpy, ...) inside
forward() create tensors on the default device (the CPU unless
torch.set_default_device says otherwise), not on the input's device. Pass
device=x.device, or use x.new_zeros / torch.zeros_like. Created on the CPU
and then copied with .to(x.device)/.cuda()/.type_as(x), it is correct but
allocates on the host and pays a blocking copy on every call (PyTorch's
performance tuning guide: create tensors on the target directly). A warning
on its own; when the tensor then feeds a device mismatch, that crash (PC201,
an error) is grouped under this problem, which is then an error. A cache is
not "every call": a copy the forward keeps in a module attribute for later
calls, or that placecheck run saw made in fewer forwards than its module ran,
is info.""", """
noise = torch.randn(x.shape)
""", """
# or torch.randn_like(x)
noise = torch.randn(x.shape, device=x.device, dtype=x.dtype)
""")


def created_then_cached(op: str, tensor: str, device: str, copied_to: str, copied_at: str, *,
                        kept_in: str = "", made: int = 0, calls: int = 0) -> tuple[str, str]:
    """PC202 at info: ``op`` in forward made ``tensor`` on ``device`` and copied it to ``copied_to`` at
    ``copied_at``, but as a cache: the forward kept the copy in ``kept_in``, or the run saw it made
    ``made`` times in ``calls`` forwards."""
    if kept_in:
        how = f"the forward keeps the copy in {kept_in} for later calls"
    else:
        how = f"made {made} time{'s' if made != 1 else ''} in {calls} forward{'s' if calls != 1 else ''}"
    return (f"{op} in forward creates {tensor} on {device}, then copies it to {copied_to} at {copied_at}; "
            f"{how}: a cache, not a copy on every call",
            "fine for a cache rebuilt rarely; to skip even that host allocation, create it on the device "
            "(device=x.device)")


def created_off_device(op: str, tensor: str, device: str, target: str, *, fed: bool = False,
                       copied_to: str | None = None, copied_at: str = "",
                       scalar: bool = False) -> tuple[str, str]:
    """PC202: ``op`` in forward made ``tensor`` on ``device``; it then fed a mismatch (``fed``), or was
    copied to ``copied_to`` at ``copied_at`` (correct, but a host allocation and a copy per call; for a
    0-dim ``scalar``, one small copy, as PyTorch's own code makes)."""
    if copied_at and not fed and scalar:
        return (f"{op} in forward creates the 0-dim {tensor} on {device}, then copies it to "
                f"{copied_to or target} at {copied_at}: one scalar copy per call, as PyTorch's own code "
                "makes; correct, and cheap",
                "nothing required; to skip the copy, build it on the device (x.new_tensor(value), or "
                "torch.tensor(value, device=x.device))")
    if copied_at and not fed:
        return (f"{op} in forward creates {tensor} on {device}, then copies it to {copied_to or target} at "
                f"{copied_at}: a host allocation and a blocking host-to-device copy on every call",
                "create it on the device: pass device=x.device to the factory (torch.arange(n, "
                "device=x.device)), or, for a constant, build it once in __init__ with "
                "register_buffer(..., persistent=False)")
    message = f"{op} in forward creates {tensor} on {device}, not {target}" + (
        ": it then fed a device mismatch" if fed else "")
    if copied_to and copied_to != target:
        device = copied_to  # a hard-coded .cuda() put it there: that is what to fix
    if device.startswith(("cpu", "meta")):
        where = "tensors created in forward land on the default device (the CPU), not the input's"
    else:
        where = f"a hard-coded device (.cuda(), device=\"cuda\") put it on {device}, not the input's"
    return message, f"{where}: pass device=x.device (and dtype=x.dtype), or use torch.zeros_like/x.new_zeros"


declare(Code.PC203, "lazy-module", E, "forward", "module or parameter created during forward()", """
A layer built in forward() (self.proj = nn.Linear(...) on first call) is
created on the default device, the CPU, not on the input's device: it does
not inherit anything from the input, and the earlier model.to() never saw it.
Its parameters are also missing from an optimizer built before the first
forward, even when it is built on the input's device (device=x.device): that
layer is reported too, as a warning (it cannot crash the job; a layer off the
target is an error). Build layers in __init__, or use torch.nn.Lazy*
modules, which follow .to() correctly.""", """
def forward(self, x):
    if self.proj is None:
        self.proj = nn.Linear(x.shape[-1], 64)
    return self.proj(x)
""", """
self.proj = nn.LazyLinear(64)      # in __init__
""")


def created_in_forward(what: str, path: str, type_name: str, device: str, on_target: bool) -> tuple[str, str]:
    """PC203: a ``module`` or ``parameter`` registered at ``path`` during forward, on ``device``."""
    message = (f"{what} {path!r} ({type_name}) is created during forward"
               + (f" on {device}" if device else "")
               + (": it is on the right device, but unregistered when an optimizer is built before the "
                  "first forward, which then never trains it" if on_target else
                  ": the earlier .to() never saw it and an optimizer built before the first forward does "
                  "not train it"))
    if on_target:
        hint = ("build layers and parameters in __init__ (or use nn.Lazy* modules), so that an optimizer "
                "made before the first forward trains them")
    else:
        hint = ("build layers and parameters in __init__ (or use nn.Lazy* modules, which follow .to()); "
                + ("a layer built in forward lands on the default device, the CPU, whatever the input's "
                   "device" if device.startswith(("cpu", "meta")) or not device else
                   f"this one landed on {device}, not on the target"))
    return message, hint


declare(Code.PC204, "host-sync", W, "forward", "device-to-host synchronisation in forward()", """
.item(), .tolist(), .cpu() and bool()/if on a device tensor wait for the GPU
to finish and copy to the host: legal, but a stall per call that serialises
the pipeline. So does everything torch.cuda.set_sync_debug_mode("warn")
reports: `x in t`, int()/float()/an index, nonzero/argwhere and
torch.where(condition), boolean-mask indexing and masked_select, unique,
repeat_interleave without output_size, printing a device tensor, and
torch.equal/allclose.
(.numpy() on a CUDA tensor does not sync: it raises TypeError
"can't convert cuda:0 device type tensor to numpy"; the sync is the .cpu() in
.cpu().numpy().) Keep the value on the device (torch.where, masks) or move the
check out of the hot path.""", """
if (x.abs().max() > 10).item():
    x = x.clamp(-10, 10)
""", """
x = x.clamp(-10, 10)
""")


def host_sync(op: str, device: str, *, returned_as: str = "") -> tuple[str, str]:
    """PC204: ``op`` on a ``device`` tensor made the host wait; ``returned_as`` names the output a
    device-to-host copy became (then the copy, not a check, is what to move)."""
    message = f"{op} on a {device} tensor in forward waits for the device and copies to the host"
    if returned_as:
        return (message + f" ({returned_as} is returned on the host)",
                "return the tensor on the device and let the caller copy it to the host when it needs to "
                "(one .cpu() outside forward, ideally after the step)")
    return message, ("keep the value on the device (torch.where, masks, clamp) or move the check out of "
                     "forward")


declare(Code.PC205, "implicit-transfer", W, "forward",
        "CPU index copied to the device each call, or CPU scalar", """
Two mixes of a CPU tensor with device tensors do not raise. Indexing a device
tensor with a CPU index tensor copies the index to the device on every call:
a hidden, blocking host-to-device transfer (a warning). A 0-dim CPU tensor
used as a scalar is not copied: PyTorch reads its value on the host and passes
it to the kernel like a Python number (no device copy, no GPU sync).
placecheck notes that case (info) only for a 0-dim tensor stored on the model:
.to() did not move it, which is harmless while it is a scalar and a device
mismatch once it is used as more (reshaped, concatenated). Create the index on
the device once (register_buffer, device=x.device); keep a scalar as a Python
number or a registered buffer.""", """
idx = torch.arange(4)
return x[:, idx]
""", """
idx = torch.arange(4, device=x.device)
return x[:, idx]
""")


def implicit_transfer(op: str, scalar: bool, tensor: str, target: str, origin_text: str) -> tuple[str, str]:
    """PC205: a CPU index tensor copied to ``target`` per call, or a stored 0-dim CPU scalar."""
    what = "0-dim CPU tensor used as a scalar" if scalar else f"CPU index tensor {tensor}"
    rest = (": PyTorch reads it on the host and passes the value to the kernel (legal, no device copy), "
            "but .to() did not move it" if scalar else
            f" is copied to {target} on every call (a blocking host-to-device transfer)")
    return (f"{op}: {what}{rest}{origin_text}",
            "use a Python number" if scalar else
            "create the index on the device once (register_buffer or device=x.device)")


declare(Code.PC206, "output-off-device", E, "forward",
        "forward() returned a tensor off the target device", """
A tensor in the model's output is not on the target device. The caller's next
op with it (a loss, a metric, the next stage) will mix devices.""", """
return logits, torch.tensor(lengths)
""", """
return logits, torch.tensor(lengths, device=logits.device)
""")


def output_off_device(path: str, tensor: str, device: str, target: str, origin_text: str) -> tuple[str, str]:
    """PC206: the output at ``path`` (``tensor``) is on ``device``."""
    return (f"{path} ({tensor}) is on {device}, not {target}{origin_text}",
            "create every returned tensor on the input's device (device=x.device)")


declare(Code.PC207, "forward-error", E, "forward", "forward() raised an error unrelated to placement", """
The sample forward pass raised something other than a device mismatch (a
shape error, an unsupported op, a bug in the model). placecheck reports it
with its line and keeps every other finding; check the input spec
(--input) first.""", """
placecheck audit net:Net --input float32[1,3,32,32]  # expects 224x224
""", """
placecheck audit net:Net --input float32[1,3,224,224]
""")


def forward_error(phase: str, error: str, after_repair: bool = False) -> tuple[str, str]:
    """PC207: the ``phase`` (forward or backward) raised ``error``, not a placement error;
    ``after_repair``: a call raised it once its devices agreed, after its device mismatch (PC201)."""
    if after_repair:
        return (f"the {phase} raised {error} at a call whose devices placecheck had made agree: a GPU raises "
                f"the device mismatch there first, and once that is fixed the call still fails; the rest of "
                f"the {phase} did not run",
                "check the input (--input, --example-inputs) and the call's shapes; findings before this "
                "point are still reported")
    return (f"the {phase} raised {error}",
            "check the input (--input, --example-inputs); findings before this point are still reported")


declare(Code.PC210, "unsynchronized-read", E, "forward",
        "a non-blocking device-to-host copy read on the host before a synchronize", """
x.to("cpu", non_blocking=True) and cpu_buffer.copy_(x, non_blocking=True)
only queue the copy on the CUDA stream and return at once: the CPU tensor
(pinned memory) is filled by the GPU later. Reading it on the host before
the stream is synchronised (.item(), .tolist(), .numpy(), printing, bool(),
an op on the CPU tensor) may see stale or half-written values, silently:
nothing raises. PyTorch's guide "A guide on good usage of non_blocking and
pin_memory()" warns of exactly this. Synchronise between the copy and the
read (torch.cuda.synchronize(), torch.cuda.current_stream().synchronize(),
or an event recorded after the copy and its synchronize()), or copy with
non_blocking=False (.cpu(), .to("cpu")), which waits. Anything that waits
for the stream in between (.item() of a device tensor, a blocking copy)
synchronises it too. A copy that is never read on the host (sent back to the
device, returned to the caller) needs no synchronize there.""", """
loss_host = loss.detach().to("cpu", non_blocking=True)
print(loss_host.item())              # the copy may not have finished
""", """
loss_host = loss.detach().to("cpu", non_blocking=True)
torch.cuda.current_stream().synchronize()
print(loss_host.item())
""")


def unsynchronized_read(op: str, device: str, copied_at: str) -> tuple[str, str]:
    """PC210: ``op`` read on the host a CPU tensor that a non-blocking copy from ``device`` (at
    ``copied_at``) was still filling: no synchronize came between the copy and the read."""
    return (f"{op} reads on the host a tensor copied from {device} with non_blocking=True at {copied_at}, "
            "before any synchronize: the copy may not have finished, so the values read may be stale",
            "synchronise between the copy and the read (torch.cuda.current_stream().synchronize(), or an "
            "event recorded after the copy and its synchronize()), or copy with non_blocking=False "
            "(.cpu()), which waits for the data")


# -- the judge: the events one traced forward recorded, turned into findings -------------------------
#
# One finding per code and source line (per output for PC206), other modules that ran the line listed
# in ``details["also"]``. The link a problem is grouped by (see :mod:`placecheck.findings.problems`) is
# the ``origin`` field: the attribute path of the stray an offending tensor came from
# (``blocks.0.mask``), or the ``file:line`` that created it (PC201, PC205, PC206, and the PC202 itself);
# a PC204 of a device-to-host copy that forward returned has the ``origin`` of its PC206 (the copying
# line).

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


def forward_findings(events: list[Event], target: Device, library_findings: bool = False) -> ForwardFindings:
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
                finding, message=in_library(package, finding.message),
                severity=finding.severity if library_findings else severity(finding.code, "library"),
                details=(*finding.details, ("library", package)))
        elif key in apis and finding.severity is not Severity.ERROR and key not in crashes:
            finding = dataclasses.replace(
                finding, message=in_library(apis[key], finding.message),
                severity=finding.severity if library_findings else severity(finding.code, "api"),
                hint=made_by_api(apis[key]), details=(*finding.details, ("api", apis[key])))
        kept.append(finding)
    return ForwardFindings(kept, counted)


def event_finding(event: Event, target: Device) -> Finding | None:
    """The finding of one event on its own (None: the event is no problem): what ``run`` records as it
    goes is judged as audit's forward judges it."""
    return _finding(event, target, set(), {})


def _tensor(dtype: str, shape: tuple[int, ...] | None) -> str:
    return f"{dtype}{list(shape or [])}"


def _came_from(prov: Provenance) -> str:
    creation = prov.creation
    return came_from(created_by=creation.op if creation else "",
                           created_at=creation.site.source if creation else "",
                           host_copy_at=prov.host_copy.source if prov.host_copy else "",
                           attribute=prov.path, lazy=prov.lazy)


def _finding(event: Event, target: Device, lazy_lines: set[Site],
             returned: dict[int, OutputOffDevice]) -> Finding | None:
    # with --device keep each event carries the device of the module whose forward ran it: ``expected``,
    # a label (``cuda:0 or cuda:1``), as the finding's ``expected`` field says it
    expected: str = getattr(event, "expected", "") or target
    if isinstance(event, Copy):
        return _copy(event) if event.weights or event.ping_pong else None
    if isinstance(event, Mismatch):
        return _mismatch(event, expected)
    if isinstance(event, Creation):
        if event.site.source in lazy_lines:
            return None  # the parameters of a layer built in forward: that is PC203
        if event.fed_mismatch or event.moved or (event.met_device and event.shape != ()):
            return _creation(event, expected)
        # CPU-side work never copied to the device, or a 0-dim scalar PyTorch reads on the host
        return None
    if isinstance(event, HostSync):
        output = returned.get(id(event))
        message, hint = host_sync(event.op, event.device, returned_as=output.path if output else "")
        # a copy forward returns goes to the host: its device column reads cuda:0 -> cpu
        return _make(Code.PC204, event.site, None, device=event.device,
                     expected=output.device if output else expected,
                     origin=output.provenance.origin if output else "",
                     message=message, hint=hint, details=(("op", event.op),))
    if isinstance(event, ImplicitTransfer):
        if event.scalar and not event.provenance.path:
            # a scalar made in forward is a Python number to PyTorch; a stored one could be a buffer
            return None
        message, hint = implicit_transfer(event.op, event.scalar, _tensor(event.dtype, event.shape),
                                                expected, _came_from(event.provenance))
        return _make(Code.PC205, event.site, severity(Code.PC205, "scalar") if event.scalar else None,
                     device="cpu",
                     expected=expected, dtype=event.dtype, shape=event.shape, origin=event.provenance.origin,
                     message=message, hint=hint, details=(("op", event.op),))
    if isinstance(event, Registration):
        devices = ", ".join(event.devices)
        message, hint = created_in_forward(event.what, event.path, event.type_name, devices, event.on_target)
        # on the target it cannot crash the job: only the optimizer misses it
        # where: the created module or parameter, as a walk finding's; source: the line that created it
        return _make(Code.PC203, event.site,
                     severity(Code.PC203, "on-target") if event.on_target else None, where=event.path,
                     device=devices, expected=expected, module=event.path, message=message, hint=hint)
    if isinstance(event, OutputOffDevice):
        prov = event.provenance
        message, hint = output_off_device(event.path, _tensor(event.dtype, event.shape), event.device,
                                                expected, _came_from(prov))
        return _make(Code.PC206, prov.site, None, device=event.device, expected=expected, dtype=event.dtype,
                     shape=event.shape, origin=prov.origin, module=event.path, message=message, hint=hint,
                     details=(("output", event.path),))
    if isinstance(event, ForwardError):
        if event.mismatch:
            message, hint = device_mismatch_untraced(event.phase, event.message)
            return _make(Code.PC201, event.site, None, expected=expected, message=message, hint=hint)
        message, hint = forward_error(event.phase, event.message, after_repair=event.after_repair)
        return _make(Code.PC207, event.site, None, expected=expected, message=message, hint=hint,
                     details=(("phase", event.phase),))
    if isinstance(event, StaleRead):
        message, hint = unsynchronized_read(event.op, event.device, event.copied_at.source)
        # the copy's direction in the device columns (cuda:0 -> cpu), as a returned host copy's PC204
        return _make(Code.PC210, event.site, None, device=event.device, expected="cpu",
                     origin=event.copied_at.source, message=message, hint=hint,
                     details=(("op", event.op), ("copied_at", event.copied_at.source)))
    if isinstance(event, GradOffDevice):
        message, hint = gradient_off_device(event.path, event.device, expected)
        return _make(Code.PC201, NOWHERE, None, device=event.device, expected=expected, module=event.path,
                     origin=event.path, message=message, hint=hint, details=(("op", "backward"),))
    return None


def _creation(event: Creation, target: str) -> Finding:
    fed = event.fed_mismatch
    if event.kept_in and event.moved and event.moved_at is not None and not fed:
        # a cache: the forward kept the device copy in a module attribute, to reuse it
        message, hint = created_then_cached(
            event.op, _tensor(event.dtype, event.shape), event.device, event.moved_to or target,
            event.moved_at.source, kept_in=event.kept_in)
        return _make(Code.PC202, event.site, severity(Code.PC202, "cache"), device=event.device,
                     expected=target, dtype=event.dtype, shape=event.shape, origin=event.site.source,
                     message=message, hint=hint, details=(("op", event.op), ("kept_in", event.kept_in)))
    copied_at = event.moved_at.source if event.moved and event.moved_at else ""
    scalar = bool(copied_at) and not fed and event.shape == ()
    message, hint = created_off_device(
        event.op, _tensor(event.dtype, event.shape), event.device, target, fed=fed,
        copied_to=event.moved_to, copied_at=copied_at, scalar=scalar)
    # the rule's severity (one truth with the rule table): the mismatch it fed is its own PC201 error; a
    # 0-dim tensor copied to the device is one scalar copy per call (issue 42 item 11)
    return _make(Code.PC202, event.site, severity(Code.PC202, "scalar") if scalar else None,
                 device=event.device, expected=target,
                 dtype=event.dtype, shape=event.shape, origin=event.site.source, message=message, hint=hint,
                 details=(("op", event.op),))


def _copy(event: Copy) -> Finding:
    """PC208: weights copied on every call, or data sent back and forth between two devices."""
    boundary = f"{event.from_stage or '(root)'} -> {event.to_stage or '(root)'}"
    message, hint = ping_pong(event.src, event.dst, event.nbytes, boundary, weights=event.weights,
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
            message, hint = generator_off_device(event.op, event.device, target)
        else:
            message, hint = host_argument_on_device(event.op, event.refused,
                                                          _tensor(event.dtype, event.shape), event.device)
        return _make(Code.PC201, event.site, None, device=event.device, expected=target, dtype=event.dtype,
                     shape=event.shape, origin=prov.origin, message=message, hint=hint,
                     details=(("op", event.op), ("devices", ", ".join(event.devices)),
                              ("argument", event.refused)))
    from_stage, to_module = event.stages if event.stages is not None else ("", "")
    message, hint = device_mismatch(
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
