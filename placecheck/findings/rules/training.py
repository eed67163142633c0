"""PC3xx, checkpoints and optimizers: a checkpoint's devices, keys, shapes, dtypes and pickled
code (PC301-PC306), and an optimizer whose state or parameters are not the model's
(PC307, PC308).

Each rule's declaration (code, kind, default severity, title, explanation, wrong and right
code) comes first, then the builders of its messages: plain data in, (message, hint) out.
Shared machinery (the rule table, the severity policy) is :mod:`.registry`'s. No torch here.
"""

from __future__ import annotations

from placecheck.basics.codes import Code
from placecheck.basics.devices import human_bytes
from placecheck.findings.rules.registry import E, W, declare

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
