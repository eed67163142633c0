"""Every finding code placecheck can emit, declared in one place.

Each :class:`Rule` holds the code, the stable ``kind`` slug, the default
severity, a one-line title and the explanation that ``placecheck explain``
prints. The texts state PyTorch's real rules (docs/contract.md, "What PyTorch does"), not the
folklore of the seed articles. This module must not import torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from placecheck.basics.devices import human_bytes
from placecheck.findings.finding import Severity


@dataclass(frozen=True)
class Rule:
    """The declaration of one finding code."""

    code: str
    kind: str
    severity: Severity
    title: str
    explanation: str
    wrong: str
    right: str
    phase: str
    """``walk``, ``forward``, ``checkpoint``, or ``run`` (the audit itself did not finish)."""


_RULES: dict[str, Rule] = {}


def _rule(
    code: str, kind: str, severity: Severity, phase: str, title: str, explanation: str,
    wrong: str, right: str,
) -> None:
    if code in _RULES:
        raise ValueError(f"duplicate rule code {code}")
    if any(r.kind == kind for r in _RULES.values()):
        raise ValueError(f"duplicate rule kind {kind}")
    _RULES[code] = Rule(code, kind, severity, title, explanation.strip(), wrong.strip(),
                        right.strip(), phase)


E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO  # noqa: E741 (short names keep the table readable)

_rule("PC101", "stray-tensor", E, "walk", "tensor attribute that .to() does not move", """
nn.Module.to() moves only what is registered: parameters, buffers and
submodules (what named_parameters() and named_buffers() list). A tensor kept
as a plain attribute, or inside a list, dict, tuple, dataclass or helper
object held by the module, stays where it was created. The first op that mixes
it with the moved weights raises "Expected all tensors to be on the same
device" on the GPU, hours into a job. Register it as a buffer
(persistent=False keeps it out of state_dict), or create it in forward() from
the input's device.""", """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.mask = torch.tril(torch.ones(8, 8))   # stays on the CPU
""", """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        mask = torch.tril(torch.ones(8, 8))
        self.register_buffer("mask", mask, persistent=False)
""")

# -- message builders of the walk rules: plain data in, (message, hint) out ------------------------


def stray_tensor(path: str, attr: str, tensor: str, device: str, target: str, *, stale_buffer: str = "",
                 scalar_dtype: str = "", class_level: bool = False, container: str = "",
                 helper: str = "", module: str | None = None) -> tuple[str, str]:
    """PC101: ``tensor`` (``float32[4, 4]``) at ``path``, the attribute ``attr`` of its module, is on
    ``device``. It is a reference to the buffer ``stale_buffer`` as it was before ``.to()``; or a 0-dim
    tensor of ``scalar_dtype``; or defined in the class body (``class_level``); or held in a plain
    ``container`` (``dict``) or a ``helper`` object (its class); else a plain attribute. ``module``
    (``--device keep``: the model placed itself, nothing moved it) is the path of the module holding
    it, whose device is ``target``."""
    if module is not None and not stale_buffer and not scalar_dtype:
        return placed_stray(path, tensor, device, target, module)
    if stale_buffer:
        return (f"{path!r} holds buffer {stale_buffer!r} as it was before .to(): .to() replaced the buffer "
                f"with a moved copy, this reference still points at the old one on {device}",
                f"do not keep references to buffers; read self.{stale_buffer} where it is needed")
    if scalar_dtype:
        # a 0-dim CPU tensor used as a scalar with device tensors does not raise: waste and a
        # state_dict gap, not a crash
        return (f"0-dim tensor {path!r} ({scalar_dtype}) stays on {device}: used as a scalar beside "
                f"{target} tensors it does not raise, but .to() does not move it, state_dict() does not "
                "save it and each use reads it on the host",
                f'self.register_buffer("{attr}", tensor, persistent=False) in __init__ (or a Python '
                "number if it never changes)")
    if class_level:
        return (f"class attribute {attr!r} {tensor} stays on {device}: a tensor defined in the class body "
                "is shared by every instance and .to() never moves it",
                f'create it in __init__ and self.register_buffer("{attr}", tensor, persistent=False), or '
                "create it in forward() on the input's device")
    if container:
        what = f"tensor {tensor} in plain {container} {attr!r}"
        hint = ("register each tensor with self.register_buffer(name, t, persistent=False), or create it "
                f"in forward() on the input's device: .to() does not look inside a plain {container}")
    elif helper:
        what = f"tensor {tensor} inside {helper} object {attr!r}"
        hint = (f"make {helper} an nn.Module and register its tensors with register_buffer(), or create "
                "them in forward() on the input's device: .to() does not look inside plain objects")
    else:
        what = f"tensor attribute {attr!r} {tensor}"
        hint = (f'self.register_buffer("{attr}", tensor, persistent=False) in __init__, or create it in '
                "forward() on the input's device")
    return f"{what} stays on {device}: .to() moves only registered parameters and buffers", hint

_rule("PC102", "unregistered-module", E, "walk", "module kept in a plain list, dict or tuple", """
Submodules are registered only when assigned directly as attributes or held
in nn.ModuleList / nn.ModuleDict / nn.Sequential. Modules in a plain Python
list, dict or tuple are invisible to the parent: .to() does not move their
parameters, state_dict() does not save them, and model.parameters() does not
hand them to the optimizer.""", """
self.heads = [nn.Linear(64, 10) for _ in range(4)]
""", """
self.heads = nn.ModuleList([nn.Linear(64, 10) for _ in range(4)])
""")


def unregistered_module(type_name: str, path: str, count: int, size: str, devices: Sequence[str],
                        target: str, *, container: str = "", object_class: str = "", object_path: str = "",
                        in_dict: bool = False, reported_elsewhere: int = 0) -> tuple[str, str]:
    """PC102: a ``type_name`` module at ``path``, not registered, with ``count`` tensors (``size``) on
    ``devices``; held directly by a helper object (``object_class`` at ``object_path``), or in a plain
    ``container`` (``in_dict`` when its immediate holder is a dict); ``reported_elsewhere`` of its
    tensors were reported where the walk met them first. On the target too it is a bug: state_dict()
    and the optimizer still miss it."""
    if object_class:
        where = f"inside {object_class} object {object_path!r} at {path!r}"
        hint = (f"make {object_class} an nn.Module, or hold the {type_name} on the model itself: .to() "
                "does not look inside plain objects")
    else:
        kind = container or "attribute"
        where = f"in plain {kind} at {path!r}"
        fix = "nn.ModuleDict" if in_dict else "nn.ModuleList"
        hint = f"hold submodules in {fix} (nn.Sequential for a pipeline) instead of a plain {kind}"
    also = f", {reported_elsewhere} more already reported where the walk met them first" \
        if reported_elsewhere else ""
    tensors = f"{count} tensor{'s' if count != 1 else ''}"
    if any(device != target for device in devices):
        unseen = f"stay on {', '.join(devices)}; .to(), state_dict() and the optimizer never see them"
    else:
        unseen = "are not in state_dict() and not handed to the optimizer"
    return f"{type_name} {where}: its {tensors} ({size}{also}) {unseen}", hint

_rule("PC103", "unregistered-parameter", E, "walk", "nn.Parameter kept in a plain container", """
An nn.Parameter assigned as a module attribute is registered; one inside a
plain list or dict is not: .to() does not move it, state_dict() does not save
it and the optimizer never sees it. Use nn.ParameterList / nn.ParameterDict.""", """
self.scales = [nn.Parameter(torch.ones(64)) for _ in range(4)]
""", """
self.scales = nn.ParameterList(
    [nn.Parameter(torch.ones(64)) for _ in range(4)])
""")


def unregistered_parameter(tensor: str, attr: str, device: str, target: str, *, container: str = "",
                           helper: str = "", object_class: str = "", object_path: str = "",
                           in_dict: bool = False) -> tuple[str, str]:
    """PC103: an nn.Parameter ``tensor`` on ``device`` in the attribute ``attr``: held directly by a
    helper object (``object_class`` at ``object_path``), or in a plain ``container`` or ``helper``
    object (the outermost holder; ``in_dict`` when its immediate holder is a dict). On the target too
    it is a bug: state_dict() and the optimizer still miss it."""
    if object_class:
        where = f"inside {object_class} object {object_path!r}"
        hint = (f"make {object_class} an nn.Module, or hold the parameter on the model itself: .to() "
                "does not look inside plain objects")
    else:
        where = f"in plain {container or helper or 'object'} {attr!r}"
        fix = "nn.ParameterDict" if in_dict else "nn.ParameterList"
        hint = f"hold parameters in {fix} (or assign each as a module attribute)"
    if device != target:
        unseen = f"stays on {device}: .to(), state_dict() and the optimizer never see it"
    else:
        unseen = "is not in state_dict() and not handed to the optimizer"
    return f"nn.Parameter {tensor} {where} {unseen}", hint

_rule("PC104", "param-off-device", E, "walk", "registered parameter still off the target after .to()", """
.to() is recursive and moves every registered parameter. A parameter that is
still elsewhere afterwards means something overrode the move: a custom
_apply() or to() that skips it, or a parameter re-created or re-assigned
after the move.""", """
def _apply(self, fn, recurse=True):
    return self          # custom override that skips the move
""", """
Do not override _apply()/to(); or call super()._apply(fn, recurse) first.
""")


def param_off_device(name: str, device: str, target: str, module: str | None = None) -> tuple[str, str]:
    """PC104: the registered parameter ``name`` (dotted, from the root) is on ``device`` after the move;
    or, with ``module`` (``--device keep``), while the rest of that module's state is on ``target``."""
    if module is not None:
        return _registered_apart("parameter", name, device, target, module)
    return _registered_off_device("parameter", name, device, target)


def placed_stray(path: str, tensor: str, device: str, target: str, module: str) -> tuple[str, str]:
    """PC101 under ``--device keep``: ``tensor`` at ``path`` is on ``device`` while ``module`` (the module
    holding it) computes on ``target``."""
    return (f"{tensor} at {path!r} is on {device}, but its module {module or '(root)'!r} is on {target}: the "
            "first op mixing it with that module's tensors raises 'Expected all tensors to be on the same "
            "device'",
            f"create it on its module's device ({target}: device=<a parameter>.device), or register it with "
            "register_buffer() before the module is moved to its stage, so that .to() takes it along")


def _registered_apart(what: str, name: str, device: str, target: str, module: str) -> tuple[str, str]:
    return (f"registered {what} {name!r} is on {device}, while the rest of its module {module or '(root)'!r} "
            f"is on {target}",
            f"move the whole module to its stage at once ({module or 'model'}.to({target!r})), or create "
            "the replacement on the existing tensors' device")


def _registered_off_device(what: str, name: str, device: str, target: str) -> tuple[str, str]:
    attr = name.rpartition(".")[2]
    return (f"registered {what} {name!r} is on {device} after .to({target!r})",
            f"something overrode the move: a custom _apply()/to() that skips it, or {attr!r} re-assigned "
            "after .to(); keep the default _apply and create replacements on the existing tensor's device")

_rule("PC105", "buffer-off-device", E, "walk", "registered buffer still off the target after .to()", """
.to() moves every registered buffer. A buffer left elsewhere means a custom
_apply()/to() skipped it or code re-assigned it after the move (for example a
cache rebuilt on the CPU).""", """
model.to("cuda")
model.pos.cache = torch.zeros(16)  # re-assigned on the CPU after the move
""", """
model.pos.cache = torch.zeros(16, device=model.pos.cache.device)
""")


def buffer_off_device(name: str, device: str, target: str, module: str | None = None) -> tuple[str, str]:
    """PC105: the registered buffer ``name`` (dotted, from the root) is on ``device`` after the move; or,
    with ``module`` (``--device keep``), while the rest of that module's state is on ``target``."""
    if module is not None:
        return _registered_apart("buffer", name, device, target, module)
    return _registered_off_device("buffer", name, device, target)

_rule("PC201", "device-mismatch", E, "forward", "an op mixed tensors on different devices", """
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


def library_state_hint(package: str) -> str:
    """The hint of a stray an installed ``package``'s class keeps and nothing used."""
    return f"state of {package}, unused here: nothing to change in your code"


def stray_handled_by_forward(how: str, target: str) -> str:
    """What the forward did with a stray tensor (PC101) that it never let meet a device tensor, for the
    finding's message; ``how`` is ``replaced``, ``removed``, ``moved-copies``, ``cpu-only``, ``scalar``,
    ``unused`` or ``unused-run`` (never used in the whole ``run``)."""
    return {
        "replaced": "moved lazily by forward: .to() leaves it behind; the first forward copies it",
        "removed": "removed by forward before use: .to() leaves it behind until then",
        "moved-copies": f"forward uses it only in CPU work whose results it copies to {target}: legal, but a "
                        "host computation and a copy on every call",
        "cpu-only": f"forward uses it only in CPU work that never meets a {target} tensor: legal, while it "
                    "stays so",
        "scalar": "forward uses it only as a 0-dim scalar, which PyTorch reads on the host: legal and cheap, "
                  "while it stays a scalar",
        "unused": "the forward never uses it",
        "unused-run": "the script never used it in the run",
    }[how]


def landed_on(device: str) -> str:
    """Why a tensor created in forward is on ``device``: the default device, or a hard-coded one."""
    if device.startswith(("cpu", "meta")):
        return "tensors created in forward land on the default device, the CPU"
    return f"a hard-coded device (.cuda(), device=\"cuda\") put it on {device}, whatever the input's device"


def device_mismatch(op: str, devices: Sequence[str], device: str, tensor: str, origin_text: str, *,
                    created_on: str = "", lazy: bool = False, linked_hint: str = "",
                    attribute: str = "", stages: tuple[str, str, str] | None = None) -> tuple[str, str]:
    """PC201: ``op`` mixed ``devices``; its ``tensor`` argument was on ``device``. The hint follows where
    that tensor came from: created in forward on ``created_on``, a lazily built layer, a walk finding
    (its hint), or a plain ``attribute``. ``stages`` (``--device keep``) is (the stage that produced the
    tensor, the stage that received it, that stage's device): the two sides of a model-parallel mix."""
    if stages is not None and not (created_on or lazy or linked_hint or attribute):
        produced_by, used_by, used_on = stages
        side = ("the forward's input" if produced_by == "(input)" else
                f"stage {produced_by!r}" if produced_by else "the root module's forward")
        message = (f"{op} mixed {' and '.join(devices)}: its {tensor} argument comes from {side} on "
                   f"{device}, and {f'stage {used_by!r}' if used_by else 'the root module'} runs on "
                   f"{used_on}; on the GPUs this raises 'Expected all tensors to be on the same device'")
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
               "on a GPU this raises 'Expected all tensors to be on the same device'")
    return message, hint


_rule("PC208", "cross-device-ping-pong", W, "forward", "data copied back and forth between devices", """
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


def offloaded_weights(module: str, device: str, execution: str, nbytes: int,
                      tensors: int) -> tuple[str, str]:
    """PC208 under a device map: the entry ``module`` is offloaded to ``device`` (``cpu`` or ``disk``), so
    accelerate's hooks copy its ``tensors`` weight tensors (``nbytes`` in all) to ``execution`` on every
    forward (seen in the forward's copies)."""
    read = "read from disk and " if device == "disk" else ""
    plural = "s" if tensors != 1 else ""
    return (f"{module or '(root)'!r} is offloaded to {device} by the device map: accelerate's hooks "
            f"{read}copy its {tensors} weight tensor{plural} ({human_bytes(nbytes)}) to {execution} on every "
            "forward",
            "give it room on a GPU (more GPUs or GPU memory: --gpus, --gpu-memory; or a map that puts it on "
            "one): offloading saves GPU memory at the price of this copy on every call")


def dtensor_mixed(op: str, plain: str, dtensor: str) -> tuple[str, str]:
    """PC201 on an FSDP2/DTensor rank: ``op`` mixed a plain tensor (``plain``: dtype, shape, device) with
    a DTensor (``dtensor``: what it is, its placements and mesh). Not a device mix: a placement mix,
    which raises on the ranks as a device mismatch does on one GPU, and is fixed the same way (put the
    operands where the op's others are)."""
    return (f"{op} mixed a plain tensor ({plain}) with a DTensor ({dtensor}): on the ranks this raises "
            "'got mixed torch.Tensor and DTensor'",
            "a sharded parameter is gathered only inside its own module's forward: call that module (or "
            "F.* with the module's output), gather it with .full_tensor(), or make the other operand a "
            "DTensor (DTensor.from_local / distribute_tensor)")


def left_out_of_sharding(what: str, name: str, device: str, target: str) -> tuple[str, str]:
    """PC104/PC105 on an FSDP2 rank audited as placed: registered state that no ``fully_shard`` placed."""
    return (f"registered {what} {name!r} is on {device}, not on this rank's {target}: no fully_shard "
            "manages its module and nothing moved it",
            "call fully_shard on the root as well (after its blocks), so that it manages every module "
            "left over, or move the model to the rank's GPU before sharding it")


def generator_off_device(op: str, generator_device: str, device: str) -> tuple[str, str]:
    """PC201 of a ``torch.Generator`` on ``generator_device`` given to ``op``, which runs on ``device``."""
    kind, gen_kind = device.split(":")[0], generator_device.split(":")[0]
    return (f"{op} runs on {device} with a torch.Generator on {generator_device}: a GPU raises \"Expected a "
            f"'{kind}' device type for generator but found '{gen_kind}'\"",
            f"create the generator on the op's device (torch.Generator(device={device!r})"
            ".manual_seed(seed)), or leave generator= out to draw from the device's default generator")


def host_argument_on_device(op: str, argument: str, tensor: str, device: str) -> tuple[str, str]:
    """PC201 of an ``argument`` (``lengths``) that ``op`` needs on the CPU, given on ``device``."""
    return (f"{op} needs its {argument} argument ({tensor}) on the CPU, but it is on {device}: a GPU raises "
            "here (the data may be on the device; this argument may not)",
            f"keep {argument} on the CPU ({argument}.cpu(), or a list of ints): PyTorch reads it on the host "
            "to lay out the packed batch")


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


_rule("PC202", "created-off-device", W, "forward", "tensor created in forward() off the target device", """
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
                       copied_to: str = "", copied_at: str = "") -> tuple[str, str]:
    """PC202: ``op`` in forward made ``tensor`` on ``device``; it then fed a mismatch (``fed``), or was
    copied to ``copied_to`` at ``copied_at`` (correct, but a host allocation and a copy per call)."""
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


_rule("PC203", "lazy-module", E, "forward", "module or parameter created during forward()", """
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


_rule("PC204", "host-sync", W, "forward", "device-to-host synchronisation in forward()", """
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


_rule("PC205", "implicit-transfer", W, "forward",
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


_rule("PC206", "output-off-device", E, "forward", "forward() returned a tensor off the target device", """
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


_rule("PC207", "forward-error", E, "forward", "forward() raised an error unrelated to placement", """
The sample forward pass raised something other than a device mismatch (a
shape error, an unsupported op, a bug in the model). placecheck reports it
with its line and keeps every other finding; check the input spec
(--input) first.""", """
placecheck audit net:Net --input float32[1,3,32,32]  # expects 224x224
""", """
placecheck audit net:Net --input float32[1,3,224,224]
""")


def forward_error(phase: str, error: str) -> tuple[str, str]:
    """PC207: the ``phase`` (forward or backward) raised ``error``, not a placement error."""
    return (f"the {phase} raised {error}",
            "check the input (--input, --example-inputs); findings before this point are still reported")


_rule("PC210", "unsynchronized-read", E, "forward",
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

_rule("PC301", "checkpoint-device", E, "checkpoint", "checkpoint saved on devices the target lacks", """
torch.save records the device of every storage ("cuda:1"). torch.load without
map_location restores them there and fails on a machine without that device;
a checkpoint mixing devices loads its tensors on different devices. Load with
map_location set to the target device.""", """
state = torch.load("ckpt.pt")                 # saved on cuda:3
""", """
state = torch.load("ckpt.pt", map_location="cuda:0", weights_only=True)
""")

_rule("PC302", "missing-key", E, "checkpoint", "model expects a key the checkpoint lacks", """
load_state_dict(strict=True) fails on keys the model has and the checkpoint
lacks; with strict=False those weights silently stay at their initial values.
A prefix mismatch (module., _orig_mod., model.) is the usual cause.""", """
model.load_state_dict(torch.load("ddp.pt"))   # keys start with "module."
""", """
state = {k.removeprefix("module."): v for k, v in state.items()}
""")

_rule("PC303", "unexpected-key", W, "checkpoint", "checkpoint has a key the model lacks", """
load_state_dict(strict=True) fails on keys the checkpoint has and the model
lacks; with strict=False they are silently dropped.""", """
model.load_state_dict(state)   # state has "classifier.1.weight"
""", """
Drop or rename the extra keys, or build the model that matches the
checkpoint.
""")

_rule("PC304", "shape-mismatch", E, "checkpoint", "same key, different shape", """
load_state_dict raises "size mismatch" for a key whose shape differs between
checkpoint and model, even with strict=False.""", """
resnet18(num_classes=10).load_state_dict(imagenet_state)
""", """
Build the model with the checkpoint's shapes, or drop the key and
re-initialise it.
""")

_rule("PC305", "dtype-mismatch", W, "checkpoint", "same key, different dtype", """
load_state_dict copies into the model's tensors and casts silently: a bf16
checkpoint loaded into an fp32 model (or the reverse) changes precision and
memory use without a word.""", """
model.load_state_dict(bf16_state)      # model is float32
""", """
model.to(torch.bfloat16).load_state_dict(bf16_state)
""")

_rule("PC306", "unsafe-checkpoint", E, "checkpoint", "loading would execute pickled code", """
torch.load(weights_only=True), the default since torch 2.6, refuses pickles
that name arbitrary globals; loading such a file with weights_only=False runs
whatever code the file names. placecheck never does so unless asked with
--trust. Save a state_dict (or safetensors) instead of a pickled module.""", """
torch.save(model, "model.pt")  # pickles the class and its code path
""", """
torch.save(model.state_dict(), "model.pt")
""")

_rule("PC209", "repeated-transfer", W, "run", "the same host tensor copied to the device every step", """
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

_rule("PC307", "optimizer-state-off-device", E, "run", "optimizer state not on its parameter's device", """
Optimizer.load_state_dict casts each state tensor (Adam's exp_avg and
exp_avg_sq, SGD's momentum_buffer) to the device its parameter is on at that
moment. Resumed before the model is moved, the state stays on the CPU (or on
the GPU it was saved from) while the parameters move: the first
optimizer.step() mixes devices. Move the model first, then load the
optimizer's state (or build the optimizer after the move).""", """
optimizer.load_state_dict(ckpt["optimizer"])
model.to(device)
""", """
model.to(device)
optimizer.load_state_dict(ckpt["optimizer"])
""")

_rule("PC308", "optimizer-stale-params", E, "run", "optimizer holds parameters the model no longer uses", """
An optimizer steps the Parameter objects it was given when it was built. If
the script then re-creates or re-loads the model (model = Net(), model =
torch.load(...)), or moves it with
torch.__future__.set_overwrite_module_params_on_conversion(True), the forward
uses new Parameter objects: the loss goes down nowhere, nothing crashes.
Build the optimizer from the model the script actually trains, after it is
created, loaded and moved.""", """
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model = Net().to(device)  # a new model: the optimizer holds the old one
""", """
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
""")

_rule("PC401", "rank-device", E, "run", "a rank's tensors or module on a GPU other than its own", """
torchrun starts one process per GPU and tells each its GPU in LOCAL_RANK;
nothing else does: torch.cuda.current_device() is 0 in every process until the
script calls torch.cuda.set_device(local_rank). A rank that moves its model or
creates its tensors with device="cuda" before set_device, a hard-coded
"cuda:0", or a torch.load whose map_location (or saved location) is cuda:0,
puts its work on GPU 0. Then every rank computes on one GPU (N copies of the
model and optimizer state: out of memory), and NCCL refuses two ranks on one
GPU at DistributedDataParallel(...) or the first collective ("Duplicate GPU
detected: rank 1 and rank 0 both on CUDA device"). Call
torch.cuda.set_device(local_rank) first and use torch.device("cuda",
local_rank); load checkpoints with map_location=f"cuda:{local_rank}" (or
"cpu").""", """
dist.init_process_group("nccl")
model = DDP(Net().to("cuda"))                 # cuda:0 on every rank
state = torch.load("ckpt.pt", map_location="cuda:0")
""", """
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(Net().to(local_rank), device_ids=[local_rank])
state = torch.load("ckpt.pt", map_location=f"cuda:{local_rank}")
""")

_rule("PC402", "collective-off-device", E, "run", "a CPU tensor in an NCCL collective", """
NCCL moves data between GPUs only: with init_process_group("nccl") a
collective (all_reduce, broadcast, all_gather, reduce_scatter, ...) given a
CPU tensor raises ("No backend type associated with device type cpu") at that
line, on every rank that reaches it; a DistributedDataParallel of a model left
on the CPU fails the same way at its construction. Put the tensor on the
rank's GPU before the collective (a loss accumulated on the host, a metric
built with torch.tensor(...) without device=), or initialise the process group
for both ("cuda:nccl,cpu:gloo", the default when no backend is given).""", """
total = torch.tensor([correct, seen])
dist.all_reduce(total)                        # CPU tensor, NCCL group
""", """
total = torch.tensor([correct, seen], device=device)
dist.all_reduce(total)
""")

_rule("PC901", "audit-incomplete", E, "run", "the audit of this model did not finish", """
The model's audit ran in its own process (placecheck audit --config) and did
not finish: the interpreter crashed (a segfault in an extension), it ran past
--timeout, it ran out of memory (MemoryError, or SIGKILL from the kernel's
out-of-memory killer), or the model could not be loaded at all. Nothing is
known about this model's placement; the other models' results are complete.
The finding's details keep the reason and the end of the process's stderr
(--format json, junit and markdown show them).
Not a placement rule, so --select PC1 does not hide it; --ignore PC901 does.""", """
[[models]]
target = "big.py:Model"     # builds 300 GB of weights on the CPU runner
""", """
[[models]]
target = "big.py:Model"
init = "meta"               # or a larger timeout = 1800
""")

# -- message builders of what only placecheck run sees (a whole script: its loop, optimizers, loaders) --
# A problem of a model's forward has the builder ``audit`` uses (host_sync, created_off_device,
# implicit_transfer above); these are the script's own.


def script_device_mismatch(op: str, reference: str, device: str, tensor: str, *, batch: str = "",
                           loader_at: str = "", name: str = "", owner: str = "", created_by: str = "",
                           created_at: str = "", in_forward: bool = False) -> tuple[str, str]:
    """PC201 in a script: ``op`` mixed ``reference`` and ``device``; its argument, ``tensor`` (the
    script's variable ``name`` when one names it), is the batch element ``batch`` of the DataLoader
    iterated at ``loader_at``, or the buffer or parameter ``owner`` (``criterion.weight``) of a module the
    script holds, or was created by ``created_by`` at ``created_at`` (``in_forward``: in a module's
    forward)."""
    named = f"`{name}`" if name else tensor
    if batch:
        what = f"{named} ({batch}, from the DataLoader at {loader_at})"
        variable = name or "x"
        hint = (f"move every tensor of the batch to the device, not only the inputs: "
                f"{variable} = {variable}.to(device)")
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
    else:
        what = named
        hint = f"move it to {reference} before this op (tensor.to(device))"
    return (f"{op} mixed {reference} and {device}: {what} is on {device}; on a GPU this raises 'Expected "
            "all tensors to be on the same device'", hint)


def layer_built_in_forward(type_name: str, name: str, owner: str, devices: str,
                           on_target: bool) -> tuple[str, str]:
    """PC203 in a script: a ``type_name`` layer ``name`` built during ``owner``'s forward on ``devices``."""
    return (f"{type_name} {name!r} is built during {owner}.forward on {devices}: " + (
                "an optimizer built before the first forward does not hold its parameters"
                if on_target else "the earlier .to() never saw it, and no optimizer holds it"),
            "build layers in __init__ (or use an nn.Lazy* module), then move the model and build the "
            "optimizer")


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


def repeated_copy(nbytes: int, device: str, steps: int) -> tuple[str, str]:
    """PC209: the same host tensor of ``nbytes`` copied to ``device`` at each of ``steps`` steps."""
    size = human_bytes(nbytes)
    return (f"the same {size} host tensor is copied to {device} at every step ({steps} steps seen): {size} "
            "per step over the bus for data that does not change",
            "move it to the device once, before the loop, and index the device copy")


def optimizer_state_off_device(count: int, nbytes: int, group: int, state_on: str,
                               params_on: str) -> tuple[str, str]:
    """PC307: ``count`` state tensors of param group ``group`` on ``state_on``, its parameters on
    ``params_on``."""
    plural = count != 1
    return (f"{count} state tensor{'s' if plural else ''} ({human_bytes(nbytes)}) of param group {group} "
            f"{'are' if plural else 'is'} on {state_on} while the parameters are on {params_on}: the first "
            "step mixes devices",
            "load_state_dict casts the state to where the parameters are at that moment: move the model to "
            "the device before optimizer.load_state_dict (or build the optimizer after the move)")


def stale_optimizer(optimizer: str, built_at: str, held: int, model: str, unstepped: int,
                    shown: str) -> tuple[str, str]:
    """PC308: ``optimizer`` built at ``built_at`` holds ``held`` parameters no live module registers any
    more; the ``model`` the script runs has ``unstepped`` (``shown``) no optimizer steps (when
    ``unstepped`` is 0, ``shown`` names the replaced parameters)."""
    replaced = (f"{optimizer} built at {built_at or 'an unknown line'} holds {held} "
                f"parameter{'s' if held != 1 else ''} that no module registers any more (the model was "
                f"re-created, reloaded or given new Parameter objects after the optimizer was built)")
    if unstepped:
        message = (f"{replaced}; the {model} the script runs has {unstepped} that no optimizer steps "
                   f"({shown})")
    else:
        message = f"{replaced}: {shown}"
    return (message,
            "build the optimizer from the model the script trains, after the model is re-created, reloaded "
            "or moved: optimizer = Optim(model.parameters()) last")


def script_error(error: str, *, mismatch: bool = False) -> tuple[str, str]:
    """PC207 (PC201 when ``mismatch``): the script stopped on ``error``, which it did not catch."""
    if mismatch:
        return (f"the script stopped on a device mismatch: {error}",
                "move every tensor of this op to one device")
    return f"the script raised {error}", "fix the error at this line; the findings before it stand"


# -- the severity policy: each rule's default above, and every change a report may make -------------
#
# A finding takes its rule's severity unless one of the changes below applies; the checks ask
# severity(code, change) for it, so a change not declared here cannot be made (tests/test_rules.py
# also scans the package for a severity written anywhere else). `placecheck rules`, `placecheck
# explain` and docs/audit.md ("Severity") print these declarations.


@dataclass(frozen=True)
class SeverityChange:
    """One declared exception to a rule's default severity."""

    name: str
    """What the checks pass to :func:`severity` (``scalar``, ``library``)."""
    severity: Severity
    when: str
    """The condition, as ``placecheck rules`` and ``explain`` print it after "when"."""


RAISED_BY_EVIDENCE = ("a problem takes the worst severity of its instances and of the findings it "
                      "caused (its evidence): a cause whose tensor crashed an op (PC201) is an error")
"""The one change every rule shares (:func:`placecheck.findings.problems.group` makes it)."""

_LIBRARY = SeverityChange("library", I, "raised entirely inside an installed package (named; "
                                        "--library-findings keeps the default)")
_API = SeverityChange("api", I, "a torch or installed function the line called made it by itself, from none "
                                "of its arguments (named: pack_padded_sequence's lengths)")

SEVERITY_CHANGES: dict[str, tuple[SeverityChange, ...]] = {
    "PC101": (
        SeverityChange("scalar", W, "it is a 0-dim CPU tensor (used as a scalar beside device tensors, it "
                                    "does not raise)"),
        SeverityChange("handled", I, "the forward never lets it meet a device tensor (it replaces it with "
                                     "a moved copy, or uses it only on the CPU or as a scalar)"),
        SeverityChange("library-unused", I, "it is never used and a class an installed package defines "
                                            "holds it (named)"),
    ),
    "PC202": (
        _LIBRARY, _API,
        SeverityChange("cache", I, "a cache: the forward keeps the device copy in a module attribute, or "
                                   "placecheck run saw it made in fewer forwards than its module ran"),
    ),
    "PC203": (SeverityChange("on-target", W, "created on the target device (it cannot crash; only an "
                                             "optimizer built before misses it)"),),
    "PC204": (
        _LIBRARY, _API,
        SeverityChange("loop", I, "placecheck run finds it in the script's own code outside any forward "
                                  "(a loss read for logging), with its rate per optimizer step"),
    ),
    "PC205": (
        _LIBRARY, _API,
        SeverityChange("scalar", I, "it is a 0-dim CPU tensor stored on the model and used as a scalar "
                                    "(read on the host, no copy)"),
    ),
}
"""Every exception to a rule's default severity, by code (:func:`severity` hands them out)."""

del E, W, I

RULES: dict[str, Rule] = dict(sorted(_RULES.items()))
"""Every rule, by code, in code order."""


def rule(code: str) -> Rule:
    """The rule for ``code`` (case-insensitive); ``KeyError`` if unknown."""
    return RULES[code.upper()]


def severity(code: str, change: str | None = None) -> Severity:
    """The severity of a ``code`` finding: its rule's default, or that of the declared ``change``.

    Raises ``KeyError`` for a change :data:`SEVERITY_CHANGES` does not declare for ``code``: a check
    cannot give a finding a severity the rule table does not show.
    """
    if change is None:
        return rule(code).severity
    for declared in SEVERITY_CHANGES.get(code.upper(), ()):
        if declared.name == change:
            return declared.severity
    raise KeyError(f"{code} declares no severity change {change!r} (rules.SEVERITY_CHANGES)")


def severity_changes(code: str) -> tuple[SeverityChange, ...]:
    """The declared exceptions to ``code``'s default severity (none for most rules)."""
    return SEVERITY_CHANGES.get(code.upper(), ())


_SELECTOR = re.compile(r"^(ALL|PC\d{0,3})$")


def expand(selectors: Iterable[str]) -> set[str]:
    """Expand code prefixes (``PC2``, ``PC204``, ``ALL``) to the codes they name.

    Raises ``ValueError`` naming a selector that matches no rule.
    """
    codes: set[str] = set()
    for raw in selectors:
        sel = raw.strip().upper()
        if not sel:
            continue
        if not _SELECTOR.match(sel):
            raise ValueError(f"invalid code selector {raw!r}: use a code prefix such as PC2, PC204 or ALL")
        matched = set(RULES) if sel == "ALL" else {c for c in RULES if c.startswith(sel)}
        if not matched:
            raise ValueError(f"code selector {raw!r} matches no rule (see `placecheck rules`)")
        codes |= matched
    return codes


def selected(select: Iterable[str] | None, ignore: Iterable[str] | None) -> frozenset[str]:
    """The codes left after ``--select`` (default ``ALL``) minus ``--ignore``."""
    chosen = expand(select) if select else set(RULES)
    return frozenset(chosen - expand(ignore or ()))


# -- message builders of the ranks of a torchrun launch (placecheck run --nproc-per-node) -----------------

_SET_DEVICE = ("call torch.cuda.set_device(local_rank) (local_rank = int(os.environ['LOCAL_RANK'])) "
               "before placing anything, and use torch.device('cuda', local_rank)")


def rank_off_device(what: str, device: str, own: str, later: Sequence[str]) -> tuple[str, str]:
    """PC401: ``what`` (``Linear.to put the model``, ``randn made float32[16, 8]``) on ``device``, not on
    the rank's own GPU ``own``; ``later``: the other lines that put tensors there."""
    also = f"; also at {', '.join(later[:3])}{' and more' if len(later) > 3 else ''}" if later else ""
    return (f"{what} on {device}, not on the rank's own GPU ({own}, LOCAL_RANK){also}: 'cuda' means "
            "the current device, which is cuda:0 in every process until torch.cuda.set_device(local_rank), "
            "and a hard-coded 'cuda:0' is GPU 0 on every rank: the ranks share one GPU (N copies of the "
            "model there; NCCL refuses two ranks on one GPU at DDP or the first collective)", _SET_DEVICE)


def rank_loaded_off_device(devices: str, own: str) -> tuple[str, str]:
    """PC401: ``torch.load`` put a rank's state on ``devices``, not on its own GPU ``own``."""
    return (f"torch.load puts the checkpoint's tensors on {devices}, not on the rank's own GPU ({own}, "
            "LOCAL_RANK): every rank loads its copy onto that GPU (a map_location of cuda:0, or the GPU it "
            "was saved from), N copies on one GPU while the rank's own stays idle",
            "load with map_location=f'cuda:{local_rank}' (or 'cpu', then move the model)")


def ranks_share_gpu(label: str, call: str, device: str, ranks: Sequence[int], later: int) -> tuple[str, str]:
    """PC401: the ranks ``ranks`` (``label``: ``ranks 0-1``) ran ``call`` (a collective, DDP's construction,
    FSDP's all-gather) on one GPU, ``device``; ``later`` more calls shared a GPU after it."""
    off = [k for k in ranks if device != f"cuda:{k}"]
    first, other = ranks[0], off[0] if off else ranks[1]
    more = f"; {later} later call{'s' if later > 1 else ''} share a GPU too" if later else ""
    own = ", ".join(f"rank {k}: cuda:{k}" for k in off)
    # FSDP places the model on the current GPU itself: set_device is the whole fix there
    ddp = "" if call.startswith("FSDP") else "; DistributedDataParallel(model, device_ids=[local_rank])"
    return (f"on {label}, {call} runs on {device} on each of them: NCCL refuses two ranks on one GPU; on "
            f"a GPU machine this raises 'Duplicate GPU detected : rank {other} and rank {first} both on CUDA "
            f"device {device.partition(':')[2]}' here; each rank's own GPU is cuda:LOCAL_RANK ({own}){more}",
            "call torch.cuda.set_device(local_rank) first and put the model and tensors on "
            f"torch.device('cuda', local_rank){ddp}")


def collective_on_host(call: str, what: str, backend: str) -> tuple[str, str]:
    """PC402: ``call`` got a CPU tensor (``what``) in a process group of ``backend`` (NCCL)."""
    return (f"{call} got a CPU tensor ({what}) in a process group initialised for NCCL ('{backend}'): NCCL "
            "moves data between GPUs only; on a GPU machine this raises 'No backend type associated with "
            "device type cpu' here",
            "put the tensor on the rank's GPU before the collective (device=torch.device('cuda', "
            "local_rank)), or init_process_group('cuda:nccl,cpu:gloo') for CPU tensors too")
