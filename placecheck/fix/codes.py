"""Which finding codes ``placecheck fix`` rewrites, and what it says about the others.

``placecheck explain CODE`` reads :data:`AUTOFIX`; so do the fixers. No torch,
no libcst here: ``explain`` stays fast.
"""

from __future__ import annotations

from placecheck.findings.codes import Code

AUTOFIX: dict[str, str] = {
    Code.PC101: (
        "a plain tensor attribute assigned in __init__ becomes "
        "self.register_buffer(\"name\", <expr>, persistent=False) (persistent only with --unsafe: "
        "it adds state_dict() keys); a list or dict literal of tensors (self.cache = {\"k\": ...}) "
        "becomes one such buffer per element (cache_k), and every self.cache[\"k\"] in the class "
        "reads it by name, when the class only ever indexes it with literal keys; a plain helper class "
        "of this file holding tensors (self.rope = RopeCache(...)) becomes an nn.Module "
        "(super().__init__() first) whose tensor fields are such buffers, unless it has bases, "
        "decorators or names nn.Module has"),
    Code.PC102: (
        "a plain list/tuple/dict of modules assigned in __init__ becomes nn.ModuleList / nn.ModuleDict "
        "(never nn.Sequential: it would change how the modules are called); state_dict() gains their "
        "keys, so checkpoints saved before the fix lack them"),
    Code.PC103: (
        "a plain list/tuple/dict of parameters assigned in __init__ becomes nn.ParameterList / "
        "nn.ParameterDict; state_dict() gains their keys"),
    Code.PC202: (
        "a torch factory without device= gets device=<t>.device, <t> the first tensor argument of the "
        "function it is in (forward, another method, or a helper function; a method's self skipped); "
        "a device the module captured at construction (device=self.device) becomes <t>.device; a "
        ".to(<t>.device) or .cuda() right after it is folded into the call; in the script of fix --run, "
        "outside such a function, device=<the script's device expression>"),
    Code.PC201: (
        "fixed where the tensor comes from, the origin the finding names: the attribute's PC101/PC102/"
        "PC103 rewrite, or the factory at the origin line given device= as for PC202; in fix --run, a "
        "DataLoader batch element the loop does not move gets `name = name.to(...)` beside the move of "
        "its siblings, and a module whose buffer was never moved (criterion.weight) gets .to(device) "
        "where it is built"),
    Code.PC301: (
        "torch.load(path) in your code without map_location gets map_location=\"cpu\" (or the "
        "audit's device)"),
    Code.PC307: (
        "in fix --run: optimizer.load_state_dict(...) before model.to(device) in the same block: the "
        "move goes up, just before the load (load_state_dict casts the state to where the parameters "
        "are at that moment)"),
}
"""Auto-fixable codes and what the fix does. Every other code is reported, never rewritten."""

NEVER: dict[str, str] = {
    Code.PC203: (
        "a layer built in forward needs its input shape to be built in __init__; use the nn.Lazy* "
        "equivalent (nn.LazyLinear(out_features)), which infers it on the first call"),
}
"""Codes deliberately not rewritten, with the reason ``explain`` gives."""


def fixable_text(code: str) -> str:
    """One line for ``placecheck explain``: whether and how ``placecheck fix`` rewrites ``code``."""
    if code in AUTOFIX:
        return f"auto-fixable: {AUTOFIX[code]}."
    if code in NEVER:
        return f"not auto-fixable: {NEVER[code]}."
    return "not auto-fixable: it is reported, the change is yours to make."
