"""PC1xx, what the walk after ``.to()`` finds: tensors and modules that ``.to()`` does not move
(PC101-PC103), and registered state something kept off the target (PC104, PC105).

Each rule's declaration (code, kind, default severity, title, explanation, wrong and right
code) comes first, then the builders of its messages: plain data in, (message, hint) out; last, the
judge of what the walk found (:func:`walk_finding`: its events in, findings out). Shared machinery
(the rule table, the severity policy) is :mod:`.registry`'s. No torch here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from placecheck.basics.codes import Code
from placecheck.basics.devices import human_bytes
from placecheck.findings.events import RegisteredOffTarget, UnregisteredModuleFound, WalkEvent
from placecheck.findings.finding import Finding
from placecheck.findings.rules.forward import in_library
from placecheck.findings.rules.registry import E, declare, make_finding, severity

declare(Code.PC101, "stray-tensor", E, "walk", "tensor attribute that .to() does not move", """
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

declare(Code.PC102, "unregistered-module", E, "walk", "module kept in a plain list, dict or tuple", """
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

declare(Code.PC103, "unregistered-parameter", E, "walk", "nn.Parameter kept in a plain container", """
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

declare(Code.PC104, "param-off-device", E, "walk",
        "registered parameter still off the target after .to()", """
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

declare(Code.PC105, "buffer-off-device", E, "walk", "registered buffer still off the target after .to()", """
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


def left_out_of_sharding(what: str, name: str, device: str, target: str) -> tuple[str, str]:
    """PC104/PC105 on an FSDP2 rank audited as placed: registered state that no ``fully_shard`` placed."""
    return (f"registered {what} {name!r} is on {device}, not on this rank's {target}: no fully_shard "
            "manages its module and nothing moved it",
            "call fully_shard on the root as well (after its blocks), so that it manages every module "
            "left over, or move the model to the rank's GPU before sharding it")


def stray_verdict(finding: Finding, how: str | None, target: str, package: str = "") -> Finding:
    """A stray (PC101) the forward handles: an ``info`` finding saying how, decided from what the
    forward (``audit``) or the whole script (``run``, ``how`` ``unused-run``) did with it, never from
    the library or attribute names: .to() still leaves it behind.

    A stray never used stays as it is, unless ``package``, the installed package defining the class of
    the module holding it, is not "" (transformers' rotary embedding keeps a stale alias of a buffer
    that only some configurations read): then it is ``info`` naming the package, as library findings
    are.
    """
    if how is None:
        return finding
    message = f"{finding.message}; {stray_handled_by_forward(how, target)}"
    if how in ("unused", "unused-run"):
        if not package:
            return finding
        return dataclasses.replace(finding, severity=severity(finding.code, "library-unused"),
                                   message=in_library(package, message), hint=library_state_hint(package),
                                   details=(*finding.details, ("forward", how)))
    return dataclasses.replace(finding, severity=severity(finding.code, "handled"), message=message,
                               details=(*finding.details, ("forward", how)))


# -- the judge: what the walk found, turned into findings -------------------------------------------


def walk_finding(event: WalkEvent) -> Finding:
    """The finding of one thing the walk found: its code, severity and words are decided here."""
    if isinstance(event, UnregisteredModuleFound):
        message, hint = unregistered_module(
            event.type_name, event.path, event.count, human_bytes(event.nbytes), event.devices,
            event.expected, container=event.container, object_class=event.object_class,
            object_path=event.object_path, in_dict=event.in_dict, reported_elsewhere=event.reported_elsewhere)
        return make_finding(Code.PC102, where=event.path, module=event.owner, source=event.source,
                            device=", ".join(event.devices), expected=event.expected, nbytes=event.nbytes,
                            count=event.count, message=message, hint=hint)
    t = event.tensor
    changed = None
    if isinstance(event, RegisteredOffTarget):
        code = Code.PC104 if event.parameter else Code.PC105
        words = param_off_device if event.parameter else buffer_off_device
        message, hint = words(event.name, t.device, event.expected,
                              module=event.owner if event.keep else None)
        where = event.name
    elif event.parameter and not event.stale_buffer:
        code = Code.PC103
        message, hint = unregistered_parameter(
            t.text, event.attr, t.device, event.expected, container=event.container, helper=event.helper,
            object_class=event.object_class, object_path=event.object_path, in_dict=event.in_dict)
        where = event.path
    else:
        code = Code.PC101
        # a 0-dim CPU tensor is read as a scalar beside device tensors: no crash
        scalar = t.shape == () and t.device == "cpu" and not event.class_level and not event.stale_buffer
        message, hint = stray_tensor(
            event.path, event.attr, t.text, t.device, event.expected, stale_buffer=event.stale_buffer,
            scalar_dtype=t.dtype if scalar else "", class_level=event.class_level,
            container=event.container, helper=event.helper, module=event.owner if event.keep else None)
        changed = severity(code, "scalar") if scalar else None
        where = event.path
    return make_finding(code, severity=changed, where=where, module=event.owner, source=event.source,
                        device=t.device, expected=event.expected, dtype=t.dtype, shape=t.shape,
                        nbytes=t.nbytes, count=1, message=message, hint=hint)
