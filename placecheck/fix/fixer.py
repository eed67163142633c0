"""Fixing a target: audit, plan, prove, and write (re-exported by :mod:`placecheck.fix`).

    >>> from placecheck.fix import fix, write
    >>> from placecheck.basics.options import FixOptions
    >>> result = fix("placecheck/examples/buggy.py:BuggyNet", FixOptions(device="cuda"))
    >>> print(result.diff())        # nothing is written until write(result)

The audit runs once; :mod:`placecheck.fix.plan` turns the selected findings
into libcst edits (:mod:`placecheck.fix.edits`); :mod:`placecheck.fix.proof`
audits the edited sources again in a forked child, with the same options. An
edit is offered only when its findings are gone, no new finding appeared, and
the re-audit ran to its end where the first did; the others are listed with
the reason. The user's files change only in
:func:`write`, which refuses when a file changed on disk since the audit.
"""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from placecheck.basics.errors import LoadError, PlacecheckError
from placecheck.basics.options import AuditOptions, FixOptions, RunOptions
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.report import Report
from placecheck.fix.codes import AUTOFIX, NEVER, fixable_text
from placecheck.fix.plan import VIA_ORIGIN, Edit, Plan, Unfixed, make_plan, patched_texts, split_source
from placecheck.fix.proof import ProofOutcome, reaudit

__all__ = ["AUTOFIX", "NEVER", "Edit", "FixRefused", "FixResult", "Unfixed", "fix", "fix_report", "fix_run",
           "fixable_text", "write"]


class FixRefused(PlacecheckError):
    """``write`` found a file changed since the audit: nothing was written."""


@dataclass
class FixResult:
    """What ``fix`` found, offers, and leaves to the user."""

    report: Report
    """The first audit."""
    edits: list[Edit] = field(default_factory=list)
    """Edits that passed the proof: their findings are gone and no new finding appeared."""
    failed: list[tuple[Edit, str]] = field(default_factory=list)
    """Edits that failed the proof, with the reason."""
    not_fixable: list[Unfixed] = field(default_factory=list)
    """Selected findings still reported after the offered edits that no edit was made for."""
    resolved: list[Finding] = field(default_factory=list)
    """Selected findings with no edit of their own that the offered edits made go away (a PC201
    that a PC202 caused)."""
    remaining: list[Finding] = field(default_factory=list)
    """Selected findings the audit still reports with the offered edits applied."""
    originals: dict[str, str] = field(default_factory=dict)
    """Each edited file's text as audited."""
    patched: dict[str, str] = field(default_factory=dict)
    """Each edited file's text with the offered edits."""
    chosen: list[Finding] = field(default_factory=list)
    """The findings of the first audit selected for fixing, in report order."""

    @property
    def fixed_findings(self) -> int:
        return sum(len(e.findings) for e in self.edits)

    def verdicts(self) -> list[tuple[Finding, bool, str]]:
        """Each selected finding of the first audit: whether it is fixed, and how or why not (one line)."""
        by_edit = {id(f): e for e in self.edits for f in e.findings}
        by_failure = {id(f): reason for e, reason in self.failed for f in e.findings}
        by_reason = {id(u.finding): u.reason for u in self.not_fixable}
        gone = {id(f) for f in self.resolved}
        out = []
        for finding in self.chosen:
            edit = by_edit.get(id(finding))
            if edit is not None:
                lines = f"{edit.start}" if edit.start == edit.end else f"{edit.start}-{edit.end}"
                at = "its origin " if finding.code in VIA_ORIGIN and edit.code != finding.code else ""
                out.append((finding, True, f"edit at {at}{edit.file}:{lines}"))
            elif id(finding) in gone:
                out.append((finding, True, "gone with the edits of its origins" if finding.code in VIA_ORIGIN
                            else "gone with the edits"))
            elif id(finding) in by_reason:
                out.append((finding, False, by_reason[id(finding)]))
            elif id(finding) in by_failure:
                out.append((finding, False, f"failed proof: {by_failure[id(finding)]}"))
            else:
                out.append((finding, False, "still reported after the edits"))
        return out

    @property
    def exit_code(self) -> int:
        """0 when nothing selected is left at warning or above, 1 otherwise."""
        return int(any(f.severity.rank >= Severity.WARNING.rank for f in self.remaining))

    @property
    def check_exit_code(self) -> int:
        """``placecheck fix --check``'s status: 1 when a proven edit is left to make, 0 when none is.

        Findings no edit fixes (a layer built in forward, an edit that failed its proof) do not count:
        the check asks whether ``fix --write`` would change anything, for pre-commit and CI."""
        return int(bool(self.edits))

    def diff(self) -> str:
        """A unified diff of every offered edit (``a/FILE`` against ``b/FILE``)."""
        chunks = []
        for path in sorted(self.patched):
            lines = difflib.unified_diff(self.originals[path].splitlines(keepends=True),
                                         self.patched[path].splitlines(keepends=True),
                                         f"a/{path}", f"b/{path}")
            chunks.append("".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                                  for line in lines))
        return "".join(chunks)

    def summary(self, written: bool = False, width: int | None = None) -> str:
        """What the edits fix, in the audit's words (problems and their instances), one line per selected
        finding under it, and, when nothing was ``written``, that ``--write`` applies the edits.

        ``would fix 16 of 18 instances (6 of 7 problems) with 6 edits; 2 not fixed (PC201 1, PC203 1)``;
        ``fixed ...`` once ``written``. ``width``: lines wrapped to it (the terminal's, from the CLI).
        """
        from placecheck.findings.problems import group
        from placecheck.findings.report import plural

        verdicts = self.verdicts()
        left = [f for f, fixed, _ in verdicts if not fixed]
        problems = len(group(self.chosen))
        fixed_problems = problems - len(group(left))
        by_code = Counter(f.code for f in left)
        codes = ", ".join(f"{code} {count}" for code, count in sorted(by_code.items()))
        line = (f"{'fixed' if written else 'would fix'} {len(verdicts) - len(left)} of "
                f"{plural(len(verdicts), 'instance')} ({fixed_problems} of {plural(problems, 'problem')}) "
                f"with {plural(len(self.edits), 'edit')}")
        if left:
            line += f"; {len(left)} not fixed ({codes})"
        if self.failed:
            their = "its" if len(self.failed) == 1 else "their"
            line += f"; {plural(len(self.failed), 'edit')} failed {their} proof"
        lines = [line]
        notes = sorted({e.note for e in self.edits if e.note})
        lines.extend(f"  note: {note}" for note in notes)
        lines.extend(f"  {('fixed' if written else 'would fix') if fixed else 'not fixed'}: {f.code} "
                     f"{f.where or f.source}: {how}" for f, fixed, how in verdicts)
        if self.edits and not written:
            lines.append("nothing written: --write applies the edits")
        if width is not None:
            import textwrap

            lines = [wrapped for text in lines for wrapped in textwrap.wrap(
                text, width, subsequent_indent="    " if text.startswith("  ") else "  ",
                break_on_hyphens=False, drop_whitespace=True) or [""]]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """The ``--format json`` object."""
        return {
            "target": self.report.target,
            "edits": [e.to_dict() for e in self.edits],
            "failed_proof": [{**e.to_dict(), "reason": reason} for e, reason in self.failed],
            "not_fixable": [{"code": u.finding.code, "where": u.finding.where, "source": u.finding.source,
                             "reason": u.reason} for u in self.not_fixable],
            "findings": [{"code": f.code, "where": f.where, "source": f.source, "fixed": fixed,
                          ("edit" if fixed else "reason"): how} for f, fixed, how in self.verdicts()],
            "summary": {"fixed": self.fixed_findings, "edits": len(self.edits),
                        "not_fixable": len(self.not_fixable), "failed_proof": len(self.failed),
                        "remaining": len(self.remaining)},
        }


def _line_map(before: str, after: str) -> dict[int, int]:
    """Line numbers of ``after`` (1-based) -> the line of ``before`` they come from."""
    mapping: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    for _, i1, i2, j1, j2 in matcher.get_opcodes():
        for j in range(j1, j2):
            mapping[j + 1] = i1 + 1 + min(j - j1, max(i2 - i1 - 1, 0))
    return mapping


def _key(finding: Finding, maps: Mapping[str, dict[int, int]]) -> tuple[str, ...]:
    """What identifies a finding across two audits: code, place, and the line in the audited file."""
    source = finding.source
    located = split_source(source)
    if located is not None and located[0] in maps:
        path, line = located
        source = f"{path}:{maps[path].get(line, line)}"
    return finding.code, finding.where, source, dict(finding.details).get("op", "")


class _Prover:
    """Runs proofs of edit sets and keeps the reasons edits failed."""

    def __init__(self, plan: Plan, audit_once: Callable[[], Report], first: list[Finding],
                 ran_through: bool = True) -> None:
        self.plan = plan
        self.audit_once = audit_once
        self.first = Counter(_key(f, {}) for f in first)
        self.ran_through = ran_through
        """Whether the first audit's forward (or run's script) ran to its end: then a proof's must too."""

    def stopped(self, outcome: ProofOutcome) -> str:
        """Why the re-audit with the edits stopped before its end where the first audit did not; ``""``.

        An edit that makes the forward raise (``list + nn.ModuleList``) brings no finding, only an
        unchecked rest: with an inferred input the audit notes the error and goes on."""
        report = outcome.report
        if not self.ran_through or report is None:
            return ""
        why = getattr(report, "incomplete", "") or getattr(report, "unfinished", "")
        return f"with the edits the audit stopped before its end: {why}" if why else ""

    def prove(self, edits: list[Edit]) -> tuple[ProofOutcome, dict[str, dict[int, int]], list[Finding]]:
        texts = patched_texts(self.plan, edits)
        outcome = reaudit(self.audit_once, texts)
        maps = {path: _line_map(self.plan.originals[path], text) for path, text in texts.items()}
        seen = Counter(self.first)
        new = []
        for finding in outcome.findings:
            key = _key(finding, maps)
            if seen[key] > 0:
                seen[key] -= 1
            else:
                new.append(finding)
        return outcome, maps, new

    def settle(self, edits: list[Edit]) -> tuple[list[Edit], list[tuple[Edit, str]], ProofOutcome | None,
                                                  dict[str, dict[int, int]]]:
        """The largest set of ``edits`` this finds that passes the proof together, and the failures."""
        pending = list(edits)
        failed: list[tuple[Edit, str]] = []
        while pending:
            outcome, maps, new = self.prove(pending)
            if outcome.error:
                failed.extend((e, f"the re-audit with the edits failed: {outcome.error}") for e in pending)
                return [], failed, None, {}
            still = Counter(_key(f, maps) for f in outcome.findings)
            stuck = {id(e): f"the audit still reports {e.code} at "
                            f"{e.findings[0].where or e.findings[0].source}"
                     for e in pending if any(still[_key(f, {})] for f in e.findings)}
            if new:
                stuck.update(self._blame(pending, stuck, new))
            elif self.stopped(outcome):
                stuck.update(self._blame(pending, stuck, [], self.stopped(outcome)))
            if not stuck:
                return pending, failed, outcome, maps
            failed.extend((e, stuck[id(e)]) for e in pending if id(e) in stuck)
            pending = [e for e in pending if id(e) not in stuck]
        return [], failed, None, {}

    def _blame(self, pending: list[Edit], stuck: dict[int, str], new: list[Finding],
               stopped: str = "") -> dict[int, str]:
        """Which edits bring the new findings (or stop the audit before its end, ``stopped``): each edit
        proven alone when there are several."""
        def said(found: list[Finding]) -> str:
            if not found:
                return f"the re-audit {stopped.removeprefix('with the edits the audit ')}"
            f = found[0]
            return f"the re-audit reports a new finding: {f.code} at {f.where or f.source}: {f.message}"

        candidates = [e for e in pending if id(e) not in stuck]
        if len(candidates) <= 1:
            return {id(e): said(new) for e in candidates}
        blamed = {}
        for edit in candidates:
            outcome, _, alone_new = self.prove([edit])
            if outcome.error:
                blamed[id(edit)] = f"the re-audit with this edit failed: {outcome.error}"
            elif alone_new:
                blamed[id(edit)] = said(alone_new)
            elif self.stopped(outcome):
                blamed[id(edit)] = "the re-audit " + self.stopped(outcome).removeprefix(
                    "with the edits the audit ")
        together = ("together the edits bring " + said(new).removeprefix("the re-audit reports ") if new else
                    "together the edits stop the audit before its end: "
                    + stopped.removeprefix("with the edits the audit stopped before its end: "))
        return blamed or {id(e): together for e in candidates}


def _not_rewritten(finding: Finding) -> str:
    """Why a code without a rewrite is left."""
    # every code is in AUTOFIX or NEVER (tests/test_fix_reasons.py): the fallback is for a code added later
    return NEVER.get(finding.code, f"{finding.code} has no rewrite in placecheck fix yet")


def fix_report(report: Report, audit_once: Callable[[], Report], *, select: Iterable[str] | None = None,
               ignore: Iterable[str] | None = None, unsafe: bool = False, script: str = "") -> FixResult:
    """Plan, prove and collect the edits for ``report``; ``audit_once`` repeats its audit.

    ``script``: the file a ``placecheck run`` report ran (a tensor made there outside a function with a
    tensor argument takes the script's device expression).

    ``select``/``ignore`` (code prefixes) choose the findings to fix; the
    proof compares every finding, selected or not, so an edit that brings a
    finding of another code is not offered.
    """
    from placecheck.findings.rules import selected

    codes = selected(select, ignore)
    chosen = [f for f in report.findings if f.code in codes]
    plan = make_plan([f for f in chosen if f.code in AUTOFIX], unsafe, report.findings, script)
    result = FixResult(report, originals=plan.originals, chosen=chosen)
    picked = {id(f) for f in chosen}
    unplanned = [Unfixed(f, _not_rewritten(f)) for f in chosen if f.code not in AUTOFIX] + \
        [u for u in plan.not_fixable if id(u.finding) in picked]
    if not plan.edits:
        result.not_fixable = unplanned
        result.remaining = chosen
        return result
    prover = _Prover(plan, audit_once, list(report.findings),
                     ran_through=not (report.incomplete or report.unfinished))
    result.edits, result.failed, outcome, maps = prover.settle(plan.edits)
    unplanned += [Unfixed(f, "not every tensor it mixed comes from a line placecheck fix rewrote")
                  for f in plan.via_origins]
    if outcome is None:
        result.not_fixable = unplanned
        result.remaining = chosen
        return result
    result.patched = patched_texts(plan, result.edits)
    result.originals = {path: plan.originals[path] for path in result.patched}
    result.remaining = [f for f in outcome.findings if f.code in codes]
    left = Counter(_key(f, maps) for f in result.remaining)
    result.not_fixable = [u for u in unplanned if left[_key(u.finding, {})]]
    in_edits = {id(f) for e in [*result.edits, *(e for e, _ in result.failed)] for f in e.findings}
    result.resolved = [u.finding for u in unplanned if not left[_key(u.finding, {})]
                       and id(u.finding) not in in_edits]
    return result


@dataclass(frozen=True)
class _ModelAudit:
    """One audit of a model target, every code: the first audit and each proof (picklable, for a proof
    that cannot fork)."""

    target: str
    kwargs: dict[str, Any]
    options: AuditOptions

    def __call__(self) -> Report:
        from placecheck.commands.api import audit
        from placecheck.model.load import build, resolve, split_target

        _, attr = split_target(self.target)
        return audit(lambda: build(resolve(self.target), attr, self.kwargs), self.options.device,
                     options=self.options)


@dataclass(frozen=True)
class _ScriptRun:
    """One ``placecheck run`` of a script, every code."""

    script: str
    args: tuple[str, ...]
    options: RunOptions

    def __call__(self) -> Report:
        from placecheck.run import run

        return run(self.script, list(self.args), options=self.options.replace(select=(), ignore=()))


def _fix_options(options: AuditOptions | None, select: Iterable[str] | None, ignore: Iterable[str] | None,
                 unsafe: bool) -> FixOptions:
    """The :class:`FixOptions` of a :func:`fix` call: ``options`` (an AuditOptions taken as a model
    fix's), the keywords applied."""
    if options is None:
        opts = FixOptions()
    elif isinstance(options, FixOptions):
        opts = options
    else:
        opts = FixOptions(**{f.name: getattr(options, f.name) for f in fields(AuditOptions)})
    changes: dict[str, Any] = {}
    if select is not None:
        changes["select"] = select
    if ignore is not None:
        changes["ignore"] = ignore
    if unsafe:
        changes["unsafe"] = True
    return opts.replace(**changes) if changes else opts


def fix(target: str, options: AuditOptions | None = None, *, kwargs: Mapping[str, Any] | None = None,
        select: Iterable[str] | None = None, ignore: Iterable[str] | None = None,
        unsafe: bool = False) -> FixResult:
    """Audit ``target`` (``path/to/file.py:ATTR`` or ``MODULE:ATTR``) and offer proven edits.

    ``options`` are a :class:`~placecheck.basics.options.FixOptions` (or the audit's
    :class:`~placecheck.basics.options.AuditOptions`: device, engine, inputs...); the
    proof uses the same. Every code is audited; the options' ``select``/``ignore``
    (or these keywords) choose which are fixed. ``kwargs`` are the model's
    constructor arguments. ``unsafe`` registers PC101 buffers as persistent
    (``state_dict()`` keys change). With ``FixOptions(run=True)`` ``target`` is a
    script: see :func:`fix_run`. Nothing is written: see :func:`write`.
    """
    opts = _fix_options(options, select, ignore, unsafe)
    opts.check()
    if opts.run:
        return fix_run(target, options=opts)
    every_code = opts.audit_options().replace(select=(), ignore=(), copy_model=False, target=target)
    audit_once = _ModelAudit(target, dict(kwargs or {}), every_code)
    return fix_report(audit_once(), audit_once, select=opts.select, ignore=opts.ignore, unsafe=opts.unsafe)


def fix_run(script: str, args: Sequence[str] = (), *, options: FixOptions | None = None,
            steps: int | None = None, gpus: int | None = None, timeout: float | None = None,
            select: Iterable[str] | None = None, ignore: Iterable[str] | None = None,
            unsafe: bool = False) -> FixResult:
    """``placecheck run`` ``script`` with ``args`` and offer proven edits of it and of your modules it uses.

    The proof runs the patched script again (in a forked child, with the same
    ``steps``, ``gpus`` and ``timeout``): the script runs twice, its writes in a scratch area each
    time, never in the user's files. Besides the codes :func:`fix` rewrites, a DataLoader batch element
    the loop does not move (PC201) is moved beside its siblings. The keywords
    are fields of :class:`~placecheck.basics.options.FixOptions`; ``options=`` passes
    a whole object (``run=True``) instead. Nothing is written: see :func:`write`.
    """
    from placecheck.basics.errors import UsageError
    from placecheck.run.script import Program

    given = FixOptions(run=True, steps=steps, gpus=gpus, timeout=timeout, select=select,  # type: ignore[arg-type]
                       ignore=ignore, unsafe=unsafe)  # type: ignore[arg-type]
    if options is None:
        options = given
    elif given != FixOptions(run=True):
        raise UsageError("fix_run(): pass options= or keyword arguments, not both")
    elif not options.run:
        options = options.replace(run=True)
    options.check()
    Program(script, tuple(args)).check()  # a missing script or a syntax error: LoadError, here
    audit_once = _ScriptRun(script, tuple(args), options.run_options())
    # the first run in a child as well: a backward on simulated CUDA here would start autograd's device
    # threads, and PyTorch refuses a backward in every child forked after that (the proofs)
    first = reaudit(audit_once, {})
    if first.report is None:
        raise LoadError(f"placecheck run of {script} failed: {first.error}")
    return fix_report(first.report, audit_once, select=options.select, ignore=options.ignore,
                      unsafe=options.unsafe, script=script)


def write(result: FixResult) -> list[str]:
    """Write the offered edits; every file is checked unchanged first, then each is replaced whole.

    Each file is written to a temporary file in its own directory and renamed
    over the original, so it is never left half-written. Raises
    :class:`FixRefused`, writing nothing, when a file differs from what was audited.
    """
    changed = []
    for path in result.patched:
        try:
            with open(path, encoding="utf-8", newline="") as handle:
                now = handle.read()
        except OSError:
            now = None
        if now != result.originals[path]:
            changed.append(path)
    if changed:
        raise FixRefused(f"{', '.join(changed)} changed on disk since the audit: nothing written; "
                         "run placecheck fix again")
    for path, text in sorted(result.patched.items()):
        folder, name = os.path.split(os.path.abspath(path))
        descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".placecheck-fix", dir=folder)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            shutil.copymode(path, temporary)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    return sorted(result.patched)
