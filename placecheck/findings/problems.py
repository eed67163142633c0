"""Findings grouped by root cause: one *problem* per mistake in the user's code.

A model with 24 blocks that each keep ``self.mask = torch.tril(...)`` as a
plain attribute makes 24 PC101 findings from one line; the PC201 that the
first of those masks causes in ``Block.forward`` is a symptom of the same
line. :func:`group` turns such findings into one :class:`Finding` per problem:

- the same rule at the same assignment or creating line (the ``source`` of a
  walk or checkpoint finding), or, for a walk finding without one, the same
  rule, the same attribute and the same module path once indices are
  collapsed (``blocks.*`` + ``mask``), is one problem whose ``instances`` list
  every ``where``;
- a forward finding whose offending tensor came from another problem (its
  ``origin`` is a walk instance's path, a PC202's creating line, or a path
  under a PC203's module) becomes *evidence* of that problem, as does a PC204
  on the line whose ``.cpu()`` made a PC206's output;
- shape mismatches of one checkpoint (PC304) are one problem: a checkpoint
  saved from a differently sized model; so are the whole modules a checkpoint
  lacks (PC302) or adds (PC303) at the indices of one container
  (``layer3.{2..5}.*``).

The problem keeps its first instance's fields; its severity is the worst of
its instances and evidence (a crash found is still an error), ``nbytes`` and
``count`` total its instances. Decisions use finding fields only: no torch,
no message text.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

from placecheck.basics.codes import Code
from placecheck.findings.finding import Evidence, Finding, natural_key

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|(?<=\[)\d+(?=\])")
"""A ModuleList / Sequential index (``blocks.3``) or a list index (``heads[3]``)."""

_ATTRIBUTE = re.compile(r"[^.\[]+")
"""The first attribute name of a path relative to its module (``cache`` of ``cache['k']``)."""

# Forward findings whose offending tensor can come from another problem; PC202/PC203 are causes
# themselves and PC207 is the forward stopping.
_SYMPTOM_CODES = frozenset({Code.PC201, Code.PC204, Code.PC205, Code.PC206, Code.PC208})

_GROUPED_WHOLE = frozenset({Code.PC304})
"""Rules whose findings in one report are one problem whatever their key: every shape mismatch of a
checkpoint says the same thing (it was saved from a model of another size)."""


_WHOLE_MODULES = frozenset({Code.PC302, Code.PC303})
"""Rules whose finding can cover a whole module's keys (``layer3.2.*``): the same module at other
indices (``layer3.{2..5}.*``) is one problem, as a walk finding's instances are."""


def collapse_indices(path: str) -> str:
    """``blocks.3.attn.mask`` -> ``blocks.*.attn.mask``; ``heads[2]`` -> ``heads[*]``."""
    return _INDEX.sub("*", path)


def identity(finding: Finding) -> tuple[str, str]:
    """``(code, where with indices collapsed)``: what names a problem whatever its instance count.

    Baselines and SARIF fingerprints use it, so that a model growing from 12 to
    24 blocks keeps the same problem (and the same alert).
    """
    return finding.code, collapse_indices(finding.where)


def _group_key(f: Finding) -> tuple[str, ...]:
    if f.code in _GROUPED_WHOLE:
        return (f.code,)
    phase = f.code[:3]
    if f.code in _WHOLE_MODULES and f.where.endswith(".*"):
        return (f.code, "modules", collapse_indices(f.where))
    if phase in ("PC1", "PC3"):
        if f.source:  # the assignment line: one line of code, one problem
            return (f.code, "line", f.source)
        if phase == "PC1":
            inside = f.module and f.where.startswith(f.module + ".")
            relative = f.where[len(f.module) + 1:] if inside else f.where
            match = _ATTRIBUTE.match(relative)
            attribute = match.group() if match else relative
            return (f.code, "attribute", collapse_indices(f.module), attribute)
    if phase == "PC2" and f.source:
        # the trace already reports a line once; instances here are the same line seen from other modules
        return (f.code, "line", f.source, dict(f.details).get("op", ""), collapse_indices(f.origin))
    return (f.code, "one", f.where, f.source, f.message)


def _merge(members: Sequence[Finding]) -> Finding:
    """One problem from the findings of one group (already in canonical order)."""
    first = members[0]
    instances: list[str] = []
    for m in members:
        for where in m.instances or (m.where, *_also(m)):
            if where not in instances:
                instances.append(where)
    worst = min((m.severity for m in members), key=lambda s: -s.rank)
    return dataclasses.replace(
        first, severity=worst, instances=tuple(instances),
        nbytes=sum(m.nbytes for m in members), count=sum(m.count for m in members),
        evidence=tuple(e for m in members for e in m.evidence))


def _also(f: Finding) -> list[str]:
    """The other modules whose forward ran the same line (the trace reports a line once, ``also``)."""
    also = dict(f.details).get("also", "")
    return ["" if w == "''" else w for w in also.split(", ") if w]


def _under(path: str, prefix: str) -> bool:
    return bool(prefix) and (path == prefix or path.startswith((prefix + ".", prefix + "[")))


def _causes_of(symptom: Finding, causes: Sequence[Finding]) -> list[int]:
    """The indices in ``causes`` of the problems ``symptom`` is evidence of, the first first: one per
    origin it names (an op that received ``h0`` and ``c0``, each made off the device, crashed on both)."""
    origins = [symptom.origin, *dict(symptom.details).get("origins", "").split(", ")]
    found: list[int] = []
    for origin in (o for o in origins if o):
        for i, cause in enumerate(causes):
            paths = cause.instances or (cause.where,)
            lazy = cause.code == Code.PC203 and (_under(origin, cause.module) or _under(origin, cause.where)
                                                 or origin == cause.source)
            if lazy or (cause.code.startswith("PC1") and any(_under(origin, w) for w in paths)) \
                    or (cause.code == Code.PC202 and origin in (cause.source, cause.origin)):
                if i not in found:
                    found.append(i)
                break
    if not found and symptom.code == Code.PC204 and symptom.source:
        # the .cpu() that made an output off the device: the output is the problem, the sync its cost
        for i, cause in enumerate(causes):
            if cause.code == Code.PC206 and symptom.source in (cause.origin, cause.source):
                return [i]
    return found


def group(findings: Iterable[Finding]) -> list[Finding]:
    """The problems of ``findings``, in canonical order (see the module docstring)."""
    ordered = sorted(findings, key=lambda f: f.sort_key)
    groups: dict[tuple[str, ...], list[Finding]] = {}
    for f in ordered:
        groups.setdefault(_group_key(f), []).append(f)
    problems = [_merge(members) for members in groups.values()]
    parent: dict[int, int] = {}
    shared: dict[int, list[int]] = {}
    """A symptom -> the other causes it is evidence of too (each gets its own copy of the evidence)."""
    for i, p in enumerate(problems):
        causes = [c for c in _causes_of(p, problems) if c != i] if p.code in _SYMPTOM_CODES else []
        if causes:
            parent[i] = causes[0]
            shared[i] = causes[1:]
    evidence: dict[int, list[Finding]] = {}
    absorbed: set[int] = set()
    for i in parent:
        # a chain (the sync of an output that a stray tensor made) ends at the first cause
        root, seen = i, {i}
        while root in parent and parent[root] not in seen:
            root = parent[root]
            seen.add(root)
        if root != i and root not in parent:
            evidence.setdefault(root, []).append(problems[i])
            absorbed.add(i)
            for other in shared.get(i, []):
                if other not in parent and other != root:
                    evidence.setdefault(other, []).append(problems[i])
    out = []
    for i, p in enumerate(problems):
        if i in absorbed:
            continue
        found = sorted(evidence.get(i, []), key=lambda f: f.sort_key)
        if found:
            worst = min((p.severity, *(f.severity for f in found)), key=lambda s: -s.rank)
            p = dataclasses.replace(p, severity=worst,
                                    evidence=(*p.evidence, *(Evidence.of(f) for f in found)))
        out.append(p)
    return sorted(out, key=lambda f: f.sort_key)


def instance_modules(finding: Finding) -> list[str]:
    """The module of each instance: ``blocks.0`` ... ``blocks.23`` for ``blocks.{0..23}.mask``.

    A problem keeps only its first instance's ``module``; the others' are its
    instance paths without the attribute (for a forward line run by several
    modules, the instances are the modules).
    """
    if len(finding.instances) <= 1 or not finding.module:
        return [finding.module]
    if finding.where == finding.module:
        return list(finding.instances)
    if not finding.where.startswith(finding.module + "."):
        return [finding.module]
    match = _ATTRIBUTE.match(finding.where[len(finding.module) + 1:])
    attribute = "." + (match.group() if match else "")
    return [w[:w.rfind(attribute)] if w.rfind(attribute) > 0 else finding.module for w in finding.instances]


def where_label(finding: Finding) -> str:
    """``blocks.{0..23}.mask (24)`` for a problem with instances; its ``where`` (or ``<root>``) otherwise.

    The instances are written as one pattern when they are exactly every
    combination of the parts that vary (``blocks.{0,1}.cache['{k,v}']``),
    else as the first one and the count.
    """
    instances = finding.instances
    if len(instances) <= 1:
        return finding.where or "<root>"
    return f"{_pattern(instances) or (instances[0] or '<root>') + ' ...'} ({len(instances)})"


_TOKEN = re.compile(r"(\d+|[A-Za-z_]\w*)")


def _pattern(instances: Sequence[str]) -> str:
    split = [_TOKEN.split(w) for w in instances]
    if len({len(parts) for parts in split}) != 1:
        return ""
    columns = list(zip(*split, strict=True))
    out, combinations = [], 1
    for column in columns:
        values = list(dict.fromkeys(column))
        if len(values) == 1:
            out.append(values[0])
            continue
        if any(not _TOKEN.fullmatch(v) for v in values):
            return ""  # punctuation differs: not one pattern
        combinations *= len(values)
        out.append("{" + _values_text(values) + "}")
    return "".join(out) if combinations == len(set(instances)) else ""


def _values_text(values: list[str]) -> str:
    if all(v.isdigit() for v in values):
        numbers = sorted(int(v) for v in values)
        if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
            return f"{numbers[0]}..{numbers[-1]}"
        return ",".join(map(str, numbers))
    return ",".join(sorted(values, key=natural_key))

