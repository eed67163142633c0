"""PC3xx, checkpoints and optimizers: a checkpoint's devices, keys, shapes, dtypes and pickled
code (PC301-PC306), and an optimizer whose state or parameters are not the model's
(PC307, PC308).

Each rule's declaration (code, kind, default severity, title, explanation, wrong and right
code) comes first, then its builders: plain data in, the finding out, so that ``placecheck.checkpoint``
and ``placecheck.run.optimizers`` only gather the evidence (issue 41 item 4: a finding is built by its
rule; ``tests/test_codes.py`` counts the rooms that still build their own). Shared machinery (the rule
table, the severity policy) is :mod:`.registry`'s. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

from placecheck.basics.codes import Code
from placecheck.basics.devices import human_bytes
from placecheck.basics.values import Device
from placecheck.findings.events import TensorSpec
from placecheck.findings.finding import Finding
from placecheck.findings.rules.registry import E, W, declare, make_finding

declare(Code.PC301, "checkpoint-device", E, "checkpoint", "checkpoint saved on devices the target lacks", """
torch.save records the device of every storage ("cuda:1"). torch.load without
map_location restores them there and fails on a machine without that device;
a checkpoint mixing devices loads its tensors on different devices. Load with
map_location set to the target device.""", """
state = torch.load("ckpt.pt")                 # saved on cuda:3
""", """
state = torch.load("ckpt.pt", map_location="cuda:0", weights_only=True)
""")

declare(Code.PC302, "missing-key", E, "checkpoint", "model expects a key the checkpoint lacks", """
load_state_dict(strict=True) fails on keys the model has and the checkpoint
lacks; with strict=False those weights silently stay at their initial values.
A prefix mismatch (module., _orig_mod., model.) is the usual cause.""", """
model.load_state_dict(torch.load("ddp.pt"))   # keys start with "module."
""", """
state = {k.removeprefix("module."): v for k, v in state.items()}
""")

declare(Code.PC303, "unexpected-key", W, "checkpoint", "checkpoint has a key the model lacks", """
load_state_dict(strict=True) fails on keys the checkpoint has and the model
lacks; with strict=False they are silently dropped.""", """
model.load_state_dict(state)   # state has "classifier.1.weight"
""", """
Drop or rename the extra keys, or build the model that matches the
checkpoint.
""")

declare(Code.PC304, "shape-mismatch", E, "checkpoint", "same key, different shape", """
load_state_dict raises "size mismatch" for a key whose shape differs between
checkpoint and model, even with strict=False.""", """
resnet18(num_classes=10).load_state_dict(imagenet_state)
""", """
Build the model with the checkpoint's shapes, or drop the key and
re-initialise it.
""")

declare(Code.PC305, "dtype-mismatch", W, "checkpoint", "same key, different dtype", """
load_state_dict copies into the model's tensors and casts silently: a bf16
checkpoint loaded into an fp32 model (or the reverse) changes precision and
memory use without a word.""", """
model.load_state_dict(bf16_state)      # model is float32
""", """
model.to(torch.bfloat16).load_state_dict(bf16_state)
""")

declare(Code.PC306, "unsafe-checkpoint", E, "checkpoint", "loading would execute pickled code", """
torch.load(weights_only=True), the default since torch 2.6, refuses pickles
that name arbitrary globals; loading such a file with weights_only=False runs
whatever code the file names. placecheck never does so unless asked with
--trust. Save a state_dict (or safetensors) instead of a pickled module.""", """
torch.save(model, "model.pt")  # pickles the class and its code path
""", """
torch.save(model.state_dict(), "model.pt")
""")


# ---- PC301-PC306: a checkpoint, from what placecheck.checkpoint read of it --------------------------

def _spec(spec: TensorSpec) -> str:
    shape, dtype = spec
    return f"{dtype}{list(shape)}"


def _saved(tensors: int, nbytes: int) -> str:
    return f"{tensors} tensor ({human_bytes(nbytes)}) was" if tensors == 1 else \
        f"{tensors} tensors ({human_bytes(nbytes)}) were"


def _machine(gpus: int) -> str:
    return f"{gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "no GPU"


def checkpoint_load_hint(loader: str, load_call: str, target: str) -> str:
    """PC301's hint: the ``loader`` call that restores the tensors on ``target`` (``load_call``), or, for
    torch.export's loader, which has no map_location, how to export for ``target``."""
    if loader == "torch.export.load":
        return (f"torch.export.load has no map_location: export the program from a model on {target} "
                "(or on the CPU and move the loaded module)")
    return f"load with map_location: {load_call}"


def checkpoint_on_absent_device(location: str, tensors: int, nbytes: int, first_key: str, *, loader: str,
                                gpus: int, target: str, hint: str) -> Finding:
    """PC301: ``tensors`` saved on ``location``, a device the target machine (``gpus`` GPUs) lacks;
    ``where`` is the key of the one tensor, or what the finding covers, never one key for many."""
    have = _machine(gpus)
    if loader == "torch.export.load":  # no map_location: each tensor goes .to(saved)
        why = f"torch.export.load puts each tensor back on {location}, which fails on a machine with {have}"
    elif location.startswith("cuda"):
        ordinal = Device.of(location).ordinal
        why = (f"{loader} without map_location raises 'Attempting to deserialize object on a CUDA "
               "device but torch.cuda.is_available() is False'" if not gpus else
               f"{loader} without map_location raises 'Attempting to deserialize object on CUDA "
               f"device {ordinal} but torch.cuda.device_count() is {gpus}'")
    else:
        why = f"{loader} without map_location cannot restore tensors on {location}"
    return make_finding(
        Code.PC301, where=first_key if tensors == 1 else f"<{tensors} tensors on {location}>",
        message=f"{_saved(tensors, nbytes)} saved on {location} and the target machine has {have}: {why}",
        hint=hint, device=location, expected=target, nbytes=nbytes, count=tensors)


def checkpoint_on_several_devices(usage: Sequence[tuple[str, int, int]], *, loader: str, target: str,
                                  hint: str) -> Finding:
    """PC301: tensors saved on several devices, each of which the target has; ``usage``: (location,
    tensors, bytes) per device."""
    spread = ", ".join(f"{location}: {tensors}" for location, tensors, _ in usage)
    tensors = sum(t for _, t, _ in usage)
    return make_finding(
        Code.PC301, where=f"<{tensors} tensors on {len(usage)} devices>",
        message=f"tensors were saved on {len(usage)} devices ({spread}): without map_location "
                f"{loader} puts each back where it was saved, so the loaded state mixes devices",
        hint=hint, device=", ".join(location for location, _, _ in usage), expected=target,
        nbytes=sum(b for _, _, b in usage), count=tensors)


def key_prefix(prefix: str, origin: str, affected: int, nbytes: int, *, strip: bool, model: str,
               fix_code: str) -> Finding:
    """PC302: ``affected`` checkpoint keys carry ``prefix`` where the ``model``'s do not (``strip``), or
    the reverse; ``fix_code`` is the one line that fixes the state_dict."""
    if strip:
        message = (f"{affected} checkpoint keys start with {prefix!r} and {model}'s do not ({origin}): "
                   "load_state_dict(strict=True) fails with every key missing and unexpected")
        hint = (f"strip the prefix before loading: {fix_code} (or "
                f"torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, {prefix!r}))")
    else:
        message = (f"{model}'s keys start with {prefix!r} and the checkpoint's {affected} keys do not "
                   f"({origin}): load_state_dict(strict=True) fails with every key missing and unexpected")
        hint = (f"load into the unwrapped model (model.{prefix.rstrip('.').split('.')[0]}), "
                f"or add the prefix: {fix_code}")
    return make_finding(Code.PC302, where=f"<prefix {prefix}>", message=message, hint=hint, count=affected,
                        nbytes=nbytes, details=(("prefix", prefix), ("action", "strip" if strip else "add")))


_MISSING_HINT = ("with strict=False it keeps its initial values; check that the checkpoint belongs to this "
                 "model and configuration")
_UNEXPECTED_HINT = ("drop it before load_state_dict(strict=True), or build the model the checkpoint was "
                    "saved from")


def missing_key(key: str, spec: TensorSpec, *, model: str) -> Finding:
    """PC302: the ``model`` expects ``key`` and the checkpoint lacks it."""
    return make_finding(Code.PC302, where=key, message=f"{model} expects {key!r} ({_spec(spec)}) and the "
                        "checkpoint lacks it", hint=_MISSING_HINT, shape=spec[0], dtype=spec[1])


def missing_module(module: str, keys: Sequence[str], nbytes: int, *, model: str) -> Finding:
    """PC302: every key of the ``model``'s ``module`` is missing from the checkpoint."""
    return make_finding(
        Code.PC302, where=f"{module}.*", message=f"{model} expects {len(keys)} keys under {module!r} "
        f"({keys[0]}, ...) and the checkpoint has none of them: {model} has a module the checkpoint's model "
        "did not", hint=_MISSING_HINT, count=len(keys), nbytes=nbytes)


def unexpected_key(key: str, spec: TensorSpec, *, model: str) -> Finding:
    """PC303: the checkpoint has ``key`` and the ``model`` has no such key."""
    return make_finding(Code.PC303, where=key, message=f"the checkpoint has {key!r} ({_spec(spec)}) and "
                        f"{model} has no such key", hint=_UNEXPECTED_HINT, shape=spec[0], dtype=spec[1])


def unexpected_module(module: str, keys: Sequence[str], nbytes: int, *, model: str) -> Finding:
    """PC303: the checkpoint has a whole ``module`` the ``model`` lacks."""
    return make_finding(
        Code.PC303, where=f"{module}.*", message=f"the checkpoint has {len(keys)} keys under {module!r} "
        f"({keys[0]}, ...) and {model} has none of them: the checkpoint's model had a module {model} has "
        "not", hint=_UNEXPECTED_HINT, count=len(keys), nbytes=nbytes)


def shape_mismatch(key: str, saved: TensorSpec, wanted: TensorSpec, *, model: str) -> Finding:
    """PC304: ``key``'s shape in the checkpoint (``saved``) differs from the ``model``'s (``wanted``)."""
    return make_finding(
        Code.PC304, where=key, message=f"checkpoint shape {list(saved[0])} for {key!r}, {model} has "
        f"{list(wanted[0])}: load_state_dict raises 'size mismatch' even with strict=False",
        hint="build the model with the checkpoint's configuration, or drop the key and re-initialise it",
        shape=saved[0], dtype=saved[1],
        details=(("checkpoint_shape", str(list(saved[0]))), ("model_shape", str(list(wanted[0])))))


def dtype_mismatch(key: str, saved: TensorSpec, wanted: TensorSpec, *, model: str) -> Finding:
    """PC305: ``key``'s dtype in the checkpoint (``saved``) differs from the ``model``'s (``wanted``)."""
    return make_finding(
        Code.PC305, where=key, message=f"checkpoint dtype {saved[1]} for {key!r}, {model} has {wanted[1]}: "
        "load_state_dict casts silently", hint=f"convert the model first (model.to(torch.{saved[1]})) if the "
        "checkpoint's precision is intended", shape=saved[0], dtype=saved[1],
        details=(("checkpoint_dtype", saved[1]), ("model_dtype", wanted[1])))


def unsafe_globals_text(unsafe_globals: Sequence[str]) -> str:
    """The globals a pickle names outside torch's weights_only allowlist, the first eight, for one line."""
    return ", ".join(unsafe_globals[:8]) + (", ..." if len(unsafe_globals) > 8 else "")


def unsafe_checkpoint(unsafe_globals: Sequence[str], *, trusted: bool, loaded: bool) -> Finding:
    """PC306: a pickle naming ``unsafe_globals``, outside torch's weights_only allowlist; ``trusted``:
    --trust was given; ``loaded``: placecheck then loaded it."""
    names = unsafe_globals_text(unsafe_globals)
    if not trusted:
        done = "placecheck did not load it"
    elif loaded:
        done = "loaded with weights_only=False because --trust was given: its code ran"
    else:
        done = "--trust was given, but placecheck did not need to load it"
    return make_finding(
        Code.PC306, where="",
        message=f"loading needs weights_only=False, which runs code named in the file ({names}); {done}",
        hint="if you trust the file, pass --trust; better, re-save it as a state_dict "
             "(torch.save(model.state_dict(), ...)) or as safetensors",
        details=tuple(("global", g) for g in unsafe_globals))


declare(Code.PC307, "optimizer-state-off-device", E, "run",
        "optimizer state not on its parameter's device", """
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

declare(Code.PC308, "optimizer-stale-params", E, "run",
        "optimizer holds parameters the model no longer uses", """
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


def optimizer_state_off_device(optimizer: str, group: int, count: int, nbytes: int, state_on: str,
                               params_on: str, *, line: str) -> Finding:
    """PC307: ``count`` state tensors of ``optimizer``'s param group ``group`` on ``state_on``, its
    parameters on ``params_on``; ``line``: where the state was loaded (or the optimizer built)."""
    plural = count != 1
    return make_finding(
        Code.PC307, where=f"{optimizer}.param_groups[{group}]",
        message=f"{count} state tensor{'s' if plural else ''} ({human_bytes(nbytes)}) of param group "
                f"{group} {'are' if plural else 'is'} on {state_on} while the parameters are on "
                f"{params_on}: the first step mixes devices",
        hint="load_state_dict casts the state to where the parameters are at that moment: move the model to "
             "the device before optimizer.load_state_dict (or build the optimizer after the move)",
        source=line, device=state_on, expected=params_on, nbytes=nbytes, count=count,
        details=(("optimizer", optimizer),))


def stale_optimizer(optimizer: str, built_at: str, held: int, model: str, unstepped: int,
                    shown: str) -> Finding:
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
    return make_finding(
        Code.PC308, where=optimizer, message=message,
        hint="build the optimizer from the model the script trains, after the model is re-created, reloaded "
             "or moved: optimizer = Optim(model.parameters()) last",
        source=built_at, count=held, module=model,
        details=(("optimizer", optimizer), ("parameters", shown)))
