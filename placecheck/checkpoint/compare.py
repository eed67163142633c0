"""A checkpoint's state_dict against a model's: PC302 missing, PC303 unexpected, PC304 shape, PC305 dtype.

The model side is ``model.state_dict()``, so non-persistent buffers
(``register_buffer(..., persistent=False)``) are never "missing": the model
does not save them and ``load_state_dict`` does not ask for them.

Prefix mismatches are recognised before keys are compared: a checkpoint saved
from ``DistributedDataParallel``/``DataParallel`` (``module.``), from a
``torch.compile``d model (``_orig_mod.``) or from a wrapper holding the
network as ``.model`` (``model.``) has every key off by the same prefix.
Rather than hundreds of missing+unexpected pairs, that is reported as ONE
PC302 finding naming the prefix to strip or add, and the remaining keys are
compared after the fix, so what is left is what the fix does not cure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from placecheck.basics.codes import Code
from placecheck.findings import rules
from placecheck.findings.events import TensorSpec
from placecheck.findings.finding import Finding

# Known prefixes, and where they come from (for the message).
KNOWN_PREFIXES: dict[str, str] = {
    "module.": "DataParallel/DistributedDataParallel wraps the model as .module",
    "_orig_mod.": "torch.compile wraps the model as ._orig_mod",
    "model.": "a wrapper (Lightning, an EMA or task module) holds the network as .model",
    "module._orig_mod.": "a compiled model wrapped in DDP",
    "_orig_mod.module.": "a DDP model passed to torch.compile",
}


@dataclass(frozen=True)
class PrefixFix:
    """Strip or add one prefix to every checkpoint key."""

    prefix: str
    strip: bool
    """True: the checkpoint's keys carry ``prefix`` and the model's do not."""

    def apply(self, key: str) -> str:
        if self.strip:
            return key.removeprefix(self.prefix)
        return self.prefix + key

    def code(self) -> str:
        """The one line that fixes the state_dict, for the hint."""
        if self.strip:
            return f'state = {{k.removeprefix("{self.prefix}"): v for k, v in state.items()}}'
        return f'state = {{"{self.prefix}" + k: v for k, v in state.items()}}'


@dataclass(frozen=True)
class Comparison:
    """The outcome: findings, and how each checkpoint key maps to a model key after any prefix fix."""

    findings: tuple[Finding, ...]
    fix: PrefixFix | None
    key_map: dict[str, str]
    """Checkpoint key -> model key, for keys that load cleanly (same shape)."""
    missing: int = 0
    """The model's keys the checkpoint lacks (after the prefix fix)."""
    unexpected: int = 0
    """The checkpoint's keys the model has not (after the prefix fix)."""

    @property
    def architecture_note(self) -> str:
        """One line for a checkpoint whose keys miss or add whole modules (a PC302 or PC303 under
        ``module.*``): it was most likely saved from another architecture; "" otherwise."""
        if not any(f.where.endswith(".*") for f in self.findings if f.code in (Code.PC302, Code.PC303)):
            return ""
        return (f"state_dict: {self.missing} keys missing, {self.unexpected} unexpected: the checkpoint is "
                "probably of another architecture (whole modules differ)")


def _first_component(keys: list[str]) -> str | None:
    """The dotted first component every key shares (``"backbone."``), if any."""
    if not keys:
        return None
    heads = {k.split(".", 1)[0] for k in keys if "." in k}
    if len(heads) == 1 and all("." in k for k in keys):
        return heads.pop() + "."
    return None


def find_prefix_fix(ckpt_keys: list[str], model_keys: list[str]) -> PrefixFix | None:
    """The prefix fix that makes the most keys match, when one clearly helps.

    "Clearly": it matches more keys than the keys as they are, and at least
    half of the smaller side. Candidates are the known prefixes and the first
    component all keys of one side share.
    """
    model_set = set(model_keys)
    base = sum(k in model_set for k in ckpt_keys)
    candidates = set(KNOWN_PREFIXES)
    for shared in (_first_component(ckpt_keys), _first_component(model_keys)):
        if shared:
            candidates.add(shared)
    best: tuple[int, PrefixFix] | None = None
    for prefix in sorted(candidates):
        for strip in (True, False):
            fix = PrefixFix(prefix, strip)
            if strip and not any(k.startswith(prefix) for k in ckpt_keys):
                continue
            matched = sum(fix.apply(k) in model_set for k in ckpt_keys)
            if best is None or matched > best[0]:
                best = (matched, fix)
    if best is None or best[0] <= base or best[0] * 2 < min(len(ckpt_keys), len(model_keys)):
        return None
    return best[1]


def whole_modules(keys: list[str], others: list[str]) -> list[tuple[str | None, list[str]]]:
    """``keys`` (missing or unexpected), in order, gathered by the outermost module all of whose keys are
    among them (``layer3.2`` when ``layer3.2.conv1.weight`` ... are all missing and no other key is under
    it): ``(module, its keys)``; a key that no such module of two or more keys holds is ``(None, [key])``.
    ``others``: the keys of the same side that are not among them."""
    taken: set[str] = set()
    for key in others:
        parts = key.split(".")
        taken.update(".".join(parts[:n]) for n in range(1, len(parts)))
    gathered: dict[str | None, list[str]] = {}
    singles: list[tuple[str | None, list[str]]] = []
    order: list[str | None] = []
    for key in keys:
        parts = key.split(".")
        module = next((p for p in (".".join(parts[:n]) for n in range(1, len(parts))) if p not in taken),
                      None)
        if module is None:
            singles.append((None, [key]))
            order.append(None)
            continue
        if module not in gathered:
            order.append(module)
        gathered.setdefault(module, []).append(key)
    out: list[tuple[str | None, list[str]]] = []
    single = iter(singles)
    for module in order:
        if module is None:
            out.append(next(single))
        elif len(gathered[module]) == 1:
            out.append((None, gathered[module]))
        else:
            out.append((module, gathered[module]))
    return out


def nbytes(spec: TensorSpec) -> int:
    """Bytes of one entry, from its shape and the bit width in its dtype's name (``bfloat16``: 2)."""
    shape, dtype = spec
    bits = re.search(r"(\d+)", dtype)
    itemsize = max(1, int(bits.group(1)) // 8) if bits else 1  # bool, and unknown types: 1
    numel = 1
    for d in shape:
        numel *= d
    return numel * itemsize


def compare_state_dicts(ckpt: Mapping[str, TensorSpec], model: Mapping[str, TensorSpec],
                        model_name: str = "the model") -> Comparison:
    """Compare a checkpoint's state_dict with a model's, keys in their original order."""
    ckpt_keys, model_keys = list(ckpt), list(model)
    fix = find_prefix_fix(ckpt_keys, model_keys)
    findings: list[Finding] = []
    if fix is not None:
        affected = sum(fix.apply(k) != k for k in ckpt_keys)
        origin = KNOWN_PREFIXES.get(fix.prefix, "the model was wrapped differently when saved")
        findings.append(rules.key_prefix(fix.prefix, origin, affected,
                                         sum(nbytes(ckpt[k]) for k in ckpt_keys if fix.apply(k) != k),
                                         strip=fix.strip, model=model_name, fix_code=fix.code()))
    mapped = {k: (fix.apply(k) if fix else k) for k in ckpt_keys}
    present = set(mapped.values())
    missing = [key for key in model_keys if key not in present]
    for module, keys in whole_modules(missing, [k for k in model_keys if k in present]):
        findings.append(rules.missing_key(keys[0], model[keys[0]], model=model_name) if module is None else
                        rules.missing_module(module, keys, sum(nbytes(model[k]) for k in keys),
                                             model=model_name))
    unexpected = [ckey for ckey, mkey in mapped.items() if mkey not in model]
    for module, keys in whole_modules(unexpected, [k for k, m in mapped.items() if m in model]):
        findings.append(rules.unexpected_key(keys[0], ckpt[keys[0]], model=model_name) if module is None else
                        rules.unexpected_module(module, keys, sum(nbytes(ckpt[k]) for k in keys),
                                                model=model_name))
    key_map: dict[str, str] = {}
    for ckey, mkey in mapped.items():
        spec = ckpt[ckey]
        if mkey not in model:
            continue
        want = model[mkey]
        if tuple(spec[0]) != tuple(want[0]):
            findings.append(rules.shape_mismatch(mkey, spec, want, model=model_name))
            continue
        key_map[ckey] = mkey
        if spec[1] != want[1]:
            findings.append(rules.dtype_mismatch(mkey, spec, want, model=model_name))
    return Comparison(tuple(findings), fix, key_map, len(missing), len(unexpected))
