"""From findings to edits: which findings can be rewritten, in which file, and the patched texts.

A finding is fixable when its code has a rewrite (:mod:`placecheck.fix.edits`),
its ``source`` names a line of a ``.py`` file of the user's own that may be
written (not an installed package, not a notebook, not generated code), and
the rewrite finds the statement it expects there. No torch here.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from placecheck.basics.codes import Code
from placecheck.basics.values import Site
from placecheck.findings.finding import Finding
from placecheck.fix.edits import NotFixable, Request, Rewrite, rewrite

_GENERATED_MARKERS = ("@generated", "do not edit", "automatically generated", "auto-generated")


@dataclass(frozen=True)
class Edit:
    """One rewrite of the user's code, and the findings it answers."""

    file: str
    """The file as the findings name it (relative to the working directory when inside it)."""
    code: str
    start: int
    """First line replaced, in the file as audited (1-based)."""
    end: int
    """Last line replaced."""
    before: str
    after: str
    note: str
    findings: tuple[Finding, ...]
    request: Request

    def to_dict(self) -> dict[str, object]:
        """The ``--format json`` record of this edit."""
        return {"file": self.file, "code": self.code, "start_line": self.start, "end_line": self.end,
                "before": self.before, "after": self.after, "note": self.note,
                "findings": [f.where or f.source for f in self.findings]}


@dataclass(frozen=True)
class Unfixed:
    """A finding left to the user, and why."""

    finding: Finding
    reason: str


@dataclass
class Plan:
    """Every selected finding sorted into an edit or a reason it is not one."""

    originals: dict[str, str] = field(default_factory=dict)
    """Text of each file an edit touches, as read when the edits were planned."""
    edits: list[Edit] = field(default_factory=list)
    not_fixable: list[Unfixed] = field(default_factory=list)
    via_origins: list[Finding] = field(default_factory=list)
    """Mismatches (PC201) with several origins: each origin has its edit; the mismatch is fixed when all
    are, which only the proof shows."""


def split_source(source: str) -> tuple[str, int] | None:
    """``"net.py:12"`` -> ``("net.py", 12)`` (:meth:`Site.parse <placecheck.basics.values.Site.parse>`); None
    when there is no line, which an edit needs."""
    site = Site.parse(source)
    return None if site.line is None else (site.path, site.line)


def _installed_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(os.path.abspath(d) + os.sep for d in dirs if d))


_INSTALLED = _installed_dirs()


def is_installed(path: str) -> bool:
    """Whether ``path`` belongs to the interpreter or an installed package (never edited)."""
    name = os.path.abspath(path)
    return name.startswith(_INSTALLED) or name.startswith(os.path.abspath(sys.prefix) + os.sep)


def why_not_editable(path: str) -> str:
    """Why the file ``path`` is not the user's own writable source; ``""`` when it is."""
    if path.endswith(".ipynb") or "ipykernel" in path or path.startswith("<"):
        return "the line is in a notebook or interactive cell, not a file placecheck fix can rewrite"
    if not path.endswith(".py") or not os.path.isfile(path):
        return f"{path} is not a Python source file on disk"
    if is_installed(path):
        return f"{path} is an installed package's file: only your own code is rewritten"
    if not os.access(path, os.W_OK) or not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
        return f"{path} is not writable"
    with open(path, encoding="utf-8", errors="replace") as handle:
        head = "".join(handle.readline() for _ in range(5)).lower()
    if any(marker in head for marker in _GENERATED_MARKERS):
        return f"{path} is generated code (its header says so): fix the generator instead"
    return ""


def edited_line(finding: Finding) -> tuple[str, int] | None:
    """The file and line a fix of ``finding`` edits: its ``source``, or for a batch element a
    ``placecheck run`` loop did not move (PC201), the loop (its ``origin``)."""
    if finding.code == Code.PC201 and dict(finding.details).get("batch"):
        return split_source(finding.origin)
    return split_source(finding.source)


def request_for(finding: Finding, line: int, unsafe: bool, script: str = "") -> Request:
    """The rewrite a finding asks for (``line``: from :func:`edited_line`); ``script``: the file
    ``placecheck run`` ran, if any."""
    details = dict(finding.details)
    batch = details.get("batch", "") if finding.code == Code.PC201 else ""
    use = 0
    if batch:
        used, loop = split_source(finding.source), split_source(finding.origin)
        use = used[1] if used is not None and loop is not None and used[0] == loop[0] else 0
    located = edited_line(finding)
    in_script = bool(script) and located is not None and _same_file(located[0], script)
    fields: tuple[str, ...] = ()
    if finding.code == Code.PC101:
        attr = _attribute(finding.where, finding.module)
        base, dot, rest = attr.partition(".")
        fields = (rest,) if dot and "[" not in base else ()
    return Request(code=finding.code, line=line, where=finding.where, module=finding.module,
                   op=details.get("op", ""), device=finding.expected, unsafe=unsafe, batch=batch, use=use,
                   fields=fields, script=in_script)


def _same_file(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def _attribute(where: str, module: str) -> str:
    """``blocks.0.rope.cos`` under module ``blocks.0`` -> ``rope.cos``."""
    return where[len(module) + 1:] if module and where.startswith(module + ".") else where


def origins(finding: Finding) -> list[str]:
    """Where the tensors a mismatch (PC201) mixed came from: attribute paths or ``file:line``s."""
    listed = dict(finding.details).get("origins", "")
    found = [o.strip() for o in listed.split(", ") if o.strip()]
    return found or ([finding.origin] if finding.origin else [])


_WALK = (Code.PC101, Code.PC102, Code.PC103)

VIA_ORIGIN = frozenset({Code.PC201, Code.PC205, Code.PC206})
"""Codes fixed where their tensor comes from (the finding's origin), not at the line that used it: a
mismatch (PC201), a CPU index copied to the device per call (PC205), an output off the device (PC206)."""


def origin_requests(finding: Finding, everything: Sequence[Finding], unsafe: bool,
                    script: str = "") -> list[tuple[str, Request, Finding | None]] | str:
    """A mismatch (PC201), a CPU index (PC205) or an output off the device (PC206) fixed where its tensors
    come from: for each origin, the file, the rewrite and the finding the audit made there (a PC101 of the
    attribute, a PC202 of the line), if any; or why not.

    An attribute's origin is the walk finding of that attribute (its line is the assignment); a line's is
    the PC202 the audit made there, else the torch factory on that line. In the script ``placecheck run``
    ran, a module's buffer the script never moved (``criterion.weight``) is moved where it is built.
    """
    named = origins(finding)
    used = split_source(finding.source)
    discarded = split_source(dict(finding.details).get("discarded move", ""))
    if finding.code == Code.PC201 and script and used is not None and _same_file(used[0], script) \
            and finding.where.isidentifier() and (not named or discarded is not None):
        # a name of the script used unmoved: its `x.to(device)` may have thrown the result away
        return [(used[0], Request(code=Code.PC201, line=used[1], where=finding.where, rebind=finding.where,
                                  script=True), None)]
    if not named:
        return "the audit does not say where the tensor came from: there is no line to give it a device"
    planned: list[tuple[str, Request, Finding | None]] = []
    for origin in named:
        at = split_source(origin)
        if at is not None:
            made = next((f for f in everything if f.code == Code.PC202 and f.source == origin), None)
            if made is not None:
                planned.append((at[0], request_for(made, at[1], unsafe, script), made))
            else:
                planned.append((at[0], Request(code=Code.PC202, line=at[1], device=finding.expected,
                                               script=bool(script) and _same_file(at[0], script)), None))
            continue
        walked = next((f for f in everything if f.code in _WALK and f.where == origin), None)
        located = split_source(walked.source) if walked is not None else None
        if walked is not None and located is not None:
            planned.append((located[0], request_for(walked, located[1], unsafe, script), walked))
            continue
        holder = origin.partition(".")[0]
        if finding.code == Code.PC201 and script and used is not None and _same_file(used[0], script) \
                and "." in origin and holder.isidentifier():
            planned.append((used[0], Request(code=Code.PC201, line=used[1], where=finding.where,
                                             holder=holder, script=True), None))
            continue
        built = next((f for f in everything if f.code == Code.PC203 and origin.startswith(f.where + ".")),
                     None)
        if built is not None:
            return f"its origin, {origin}, belongs to a layer built in forward (PC203 at {built.where})"
        return f"the audit names its origin ({origin}) but no line of your code that made it"
    return planned


def _request_key(request: Request) -> tuple[object, ...]:
    """Findings that ask for the same rewrite share one edit (``heads[0]`` and ``heads[1]``)."""
    if request.code in (Code.PC102, Code.PC103):
        return request.code, request.line, request.where.partition("[")[0]
    if request.code == Code.PC101:  # blocks.0.mask and blocks.1.mask, cache['k'] and cache['v']: one edit
        return request.code, request.line, re.split(r"[.\[]", _attribute(request.where, request.module))[0]
    if request.rebind:  # `x` used unmoved at several lines: its one discarded move
        return request.code, "rebind", request.rebind
    if request.batch or request.holder:  # `labels` used unmoved at several lines: one move in the loop
        return request.code, request.line, request.where, request.holder
    return request.code, request.line, request.op


def apply(text: str, requests: list[Request]) -> tuple[str, list[Rewrite | NotFixable]]:
    """``text`` with every request applied, bottom-up so earlier lines keep their numbers.

    The outcomes come back in the order of ``requests``. The proof asks for
    the same sets again (planning, proving, the final patch): each set is
    rewritten once.
    """
    order = sorted(range(len(requests)), key=lambda i: (-requests[i].line, i))
    new_text, outcomes = _apply_bottom_up(text, tuple(requests[i] for i in order))
    by_index = dict(zip(order, outcomes, strict=True))
    return new_text, [by_index[i] for i in range(len(requests))]


@functools.lru_cache(maxsize=64)
def _apply_bottom_up(text: str,
                     requests: tuple[Request, ...]) -> tuple[str, tuple[Rewrite | NotFixable, ...]]:
    outcomes: list[Rewrite | NotFixable] = []
    pending = list(requests)
    back: Callable[[int], int] = lambda line: line  # noqa: E731 - a line of `text` -> the original's
    while pending:
        request = pending.pop(0)
        outcome = rewrite(text, request)
        if isinstance(outcome, Rewrite):
            # most edits touch their own line or below; one that adds lines above the next request's line
            # (a helper class made an nn.Module) moves it
            forward, backward = _line_moves(text, outcome.source)
            pending = [replace(r, line=forward(r.line), use=forward(r.use) if r.use else 0) for r in pending]
            outcome = replace(outcome, start=back(outcome.start), end=back(outcome.end))
            back = _compose(back, backward)
            text = outcome.source
        outcomes.append(outcome)
    return text, tuple(outcomes)


def _compose(outer: Callable[[int], int], inner: Callable[[int], int]) -> Callable[[int], int]:
    return lambda line: outer(inner(line))


def _line_moves(before: str, after: str) -> tuple[Callable[[int], int], Callable[[int], int]]:
    """Line of ``before`` (1-based) -> the same line in ``after``, and back: lines the edit did not touch;
    the others as they are."""
    old, new = before.splitlines(), after.splitlines()
    if len(old) == len(new):
        return (lambda line: line), (lambda line: line)
    there: dict[int, int] = {}
    for block in difflib.SequenceMatcher(None, old, new, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            there[block.a + k + 1] = block.b + k + 1
    here = {b: a for a, b in there.items()}
    return (lambda line: there.get(line, line)), (lambda line: here.get(line, line))


def make_plan(findings: Iterable[Finding], unsafe: bool, everything: Sequence[Finding] = (),
              script: str = "") -> Plan:
    """Sort ``findings`` into edits and reasons; read each file once.

    ``everything``: every finding of the audit, selected or not (a mismatch's origin is fixed through the
    finding made there); ``script``: the file ``placecheck run`` ran, if any.
    """
    plan = Plan()
    grouped: dict[str, dict[tuple[object, ...], tuple[Request, list[Finding]]]] = {}

    def add(path: str, request: Request, found: list[Finding]) -> None:
        group = grouped.setdefault(path, {})
        key = _request_key(request)
        if key not in group:
            group[key] = (request, [])
        first, already = group[key]
        if first.fields and request.fields:  # one helper object: every tensor field it holds
            first = replace(first, fields=tuple(dict.fromkeys([*first.fields, *request.fields])))
        group[key] = (first, already + [f for f in found if all(f is not g for g in already)])

    for finding in findings:
        if finding.code in VIA_ORIGIN and not dict(finding.details).get("batch"):
            planned = origin_requests(finding, everything, unsafe, script)
            if isinstance(planned, str):
                plan.not_fixable.append(Unfixed(finding, planned))
                continue
            reasons = [why_not_editable(path) for path, _, _ in planned]
            if any(reasons):
                plan.not_fixable.append(Unfixed(finding, next(r for r in reasons if r)))
                continue
            for path, request, made in planned:
                answered = [made] if made is not None else []
                add(path, request, answered + ([finding] if len(planned) == 1 else []))
            if len(planned) > 1:
                plan.via_origins.append(finding)
            continue
        located = edited_line(finding)
        if located is None:
            plan.not_fixable.append(Unfixed(finding, "the audit does not say which line of your code "
                                                     "made it"))
            continue
        path, line = located
        reason = why_not_editable(path)
        if reason:
            plan.not_fixable.append(Unfixed(finding, reason))
            continue
        add(path, request_for(finding, line, unsafe, script), [finding])
    for path, requests in grouped.items():
        with open(path, encoding="utf-8", newline="") as handle:
            plan.originals[path] = handle.read()
        ordered = list(requests.values())
        _, outcomes = apply(plan.originals[path], [request for request, _ in ordered])
        for (request, found), outcome in zip(ordered, outcomes, strict=True):
            if isinstance(outcome, NotFixable):
                plan.not_fixable.extend(Unfixed(f, outcome.reason) for f in found)
            else:
                plan.edits.append(Edit(path, request.code, outcome.start, outcome.end, outcome.before,
                                       outcome.after, outcome.note, tuple(found), request))
    plan.edits.sort(key=lambda e: (e.file, e.start, e.code))
    return plan


def patched_texts(plan: Plan, edits: Iterable[Edit]) -> dict[str, str]:
    """The text of each planned file with just ``edits`` applied (unchanged files left out)."""
    by_file: dict[str, list[Request]] = {}
    for edit in edits:
        by_file.setdefault(edit.file, []).append(edit.request)
    return {path: apply(plan.originals[path], requests)[0] for path, requests in by_file.items()}
