"""Which finding codes ``placecheck fix`` rewrites, and what it says about the others.

``placecheck explain CODE`` reads :data:`AUTOFIX`; so do the fixers. No torch,
no libcst here: ``explain`` stays fast.
"""

from __future__ import annotations

from placecheck.basics.codes import Code

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
        "function it is in (forward, another method, or a helper function; a method's self skipped), else "
        "the tensor whose shape or size the factory's arguments read (torch.arange(h.shape[1])); "
        "a device the module captured at construction (device=self.device) becomes <t>.device; a "
        ".to(<t>.device) or .cuda() right after it is folded into the call; in the script of fix --run, "
        "outside such a function, device=<the script's device expression>"),
    Code.PC201: (
        "fixed where the tensor comes from, the origin the finding names: the attribute's PC101/PC102/"
        "PC103 rewrite, or the factory at the origin line given device= as for PC202; in fix --run, a "
        "DataLoader batch element the loop does not move gets `name = name.to(...)` beside the move of "
        "its siblings (an element of a dict batch, batch[\"y\"], gets their .to(...) where it is read), "
        "and a module whose buffer was never moved (criterion.weight) gets .to(device) where it is built"),
    Code.PC203: (
        "a layer or parameter built in a method with sizes it knows without the input "
        "(self.head = nn.Linear(8, 2)) is built in __init__ instead: in place of its `self.head = None` "
        "placeholder, else at the end of __init__ (a guard in forward stays; a device= read from the input "
        "is dropped, since .to() moves it); when only its input size reads the input it is built as its "
        "nn.Lazy* twin without it (nn.Linear(x.shape[-1], 2) -> nn.LazyLinear(2)); one whose other sizes "
        "read the input is left, naming the twin"),
    Code.PC205: (
        "fixed where the index is made, the origin the finding names: the factory there gets device= as for "
        "PC202 (torch.arange(n, device=x.device)), or a tensor attribute becomes a buffer as for PC101"),
    Code.PC206: (
        "fixed where the returned tensor is made, the origin the finding names: the factory there gets "
        "device= as for PC202 (torch.tensor(lengths, device=x.device))"),
    Code.PC210: (
        "just before the statement that reads the non_blocking copy on the host: `if "
        "torch.cuda.is_available(): torch.cuda.current_stream().synchronize()` (guarded: without CUDA the "
        "copy was host to host, and the call would raise)"),
    Code.PC301: (
        "torch.load(path) in your code without map_location gets map_location=\"cpu\" (or the "
        "audit's device)"),
    Code.PC307: (
        "in fix --run: optimizer.load_state_dict(...) before model.to(device) in the same block: the "
        "move goes up, just before the load (load_state_dict casts the state to where the parameters "
        "are at that moment)"),
    Code.PC308: (
        "in fix --run: an optimizer built before the model it steps is re-created or reloaded in the same "
        "block (model = Net(), model = torch.load(...), model.load_state_dict(sd, assign=True)): the "
        "construction goes down, after the last re-creation before the optimizer's first use; refused when "
        "something uses the optimizer before that, or a name it reads is bound again"),
}
"""Auto-fixable codes and what the fix does. Every other code is reported, never rewritten."""

NEVER: dict[str, str] = {
    Code.PC104: (
        "the audit sees the parameter off the device after .to(), not the code that kept it there (a custom "
        "_apply() or to(), a re-assignment after the move): there is no line to rewrite"),
    Code.PC105: (
        "the audit sees the buffer off the device after .to(), not the code that kept it there (a custom "
        "_apply() or to(), a re-assignment after the move): there is no line to rewrite"),
    Code.PC204: (
        "a host sync is legal code whose value the program uses (a branch, a print, a number): removing "
        "or deferring it changes what the program computes, which no re-audit can judge"),
    Code.PC207: (
        "the forward raised an error that is not a placement mistake (a shape, a dtype, a bug): there is "
        "no placement edit to prove"),
    Code.PC208: (
        "each copy is there because an op reads the tensor on that device: removing one moves the op, "
        "so which device each stage computes on is a choice of yours, not a one-line edit"),
    Code.PC209: (
        "moving the data once, before the loop, changes how much device memory the script holds and how "
        "the loop indexes it: not an edit a re-run can show safe"),
    Code.PC302: (
        "the model and the checkpoint disagree about their keys: which one is right (rename, strict=False, "
        "another checkpoint) is a decision about your data, not a placement edit"),
    Code.PC303: (
        "the model and the checkpoint disagree about their keys: which one is right (rename, strict=False, "
        "another checkpoint) is a decision about your data, not a placement edit"),
    Code.PC304: (
        "the model and the checkpoint disagree about a shape: the architecture or the checkpoint is "
        "wrong, a decision about your data, not a placement edit"),
    Code.PC305: (
        "the model and the checkpoint disagree about a dtype: converting either changes the numbers, a "
        "decision about your data, not a placement edit"),
    Code.PC306: (
        "loading with weights_only=True refuses a checkpoint that pickles objects: whether to trust the "
        "file is yours to decide"),
    Code.PC401: (
        "a rank's device comes from how the job is launched (LOCAL_RANK, set_device): the line and the "
        "value depend on your launcher"),
    Code.PC402: (
        "the tensor or the process group may be the one to change (its device, or a cpu:gloo backend): "
        "which is yours to choose"),
    Code.PC901: "not a mistake in your code: the audit did not run through (its note says why)",
}
"""Codes deliberately not rewritten (or not at the finding's line), with the reason ``explain`` and
``placecheck fix`` give: why no edit is safe, in one line."""


def fixable_text(code: str) -> str:
    """One line for ``placecheck explain``: whether and how ``placecheck fix`` rewrites ``code``."""
    if code in AUTOFIX:
        return f"auto-fixable: {AUTOFIX[code]}."
    if code in NEVER:
        return f"not auto-fixable: {NEVER[code]}."
    return "not auto-fixable: it is reported, the change is yours to make."
