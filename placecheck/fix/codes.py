"""Which finding codes ``placecheck fix`` rewrites, and what it says about the others.

``placecheck explain CODE`` reads :data:`AUTOFIX`; so do the fixers. No torch,
no libcst here: ``explain`` stays fast.
"""

from __future__ import annotations

AUTOFIX: dict[str, str] = {
    "PC101": "a plain tensor attribute assigned in __init__ becomes "
             "self.register_buffer(\"name\", <expr>, persistent=False) (persistent only with --unsafe: "
             "it adds state_dict() keys); a tensor inside a dict, list or helper object is not rewritten",
    "PC102": "a plain list/tuple/dict of modules assigned in __init__ becomes nn.ModuleList / nn.ModuleDict "
             "(never nn.Sequential: it would change how the modules are called); state_dict() gains their "
             "keys, so checkpoints saved before the fix lack them",
    "PC103": "a plain list/tuple/dict of parameters assigned in __init__ becomes nn.ParameterList / "
             "nn.ParameterDict; state_dict() gains their keys",
    "PC202": "a torch factory in forward() without device= gets device=<t>.device, <t> the forward's "
             "first tensor argument; a .to(<t>.device) or .cuda() right after it is folded into the call",
    "PC201": "only in placecheck run (fix --run): a DataLoader batch element the loop does not move gets "
             "`name = name.to(...)` beside the move of its siblings, with their device expression and "
             "non_blocking; any other mismatch is fixed where the tensor comes from (its origin)",
    "PC301": "torch.load(path) in your code without map_location gets map_location=\"cpu\" (or the "
             "audit's device)",
}
"""Auto-fixable codes and what the fix does. Every other code is reported, never rewritten."""

NEVER: dict[str, str] = {
    "PC203": "a layer built in forward needs its input shape to be built in __init__; use the nn.Lazy* "
             "equivalent (nn.LazyLinear(out_features)), which infers it on the first call",
}
"""Codes deliberately not rewritten, with the reason ``explain`` gives."""


def fixable_text(code: str) -> str:
    """One line for ``placecheck explain``: whether and how ``placecheck fix`` rewrites ``code``."""
    if code in AUTOFIX:
        return f"auto-fixable: {AUTOFIX[code]}."
    if code in NEVER:
        return f"not auto-fixable: {NEVER[code]}."
    return "not auto-fixable: it is reported, the change is yours to make."
