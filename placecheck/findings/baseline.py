"""Baselines: adopt placecheck on an existing model and fail only on new findings.

``--write-baseline FILE`` records every current problem; ``--baseline FILE``
then hides the problems it records and reports the rest. An entry that
matches no problem any more (the bug was fixed, or moved out of recognition)
is reported as stale, so the file can be pruned.

Matching key: ``(model, code, where, file)``, where ``model`` is the model's
name in the run (its TARGET, or the config's ``name``), ``where`` the dotted
path of the problem's first instance with its indices collapsed
(``blocks.*.mask``: see :func:`placecheck.findings.problems.identity`), and ``file``
the problem's source file without its line number, repository-relative (see
:func:`placecheck.findings.formats.location.repo_path`). Lines are left out so that an
edit above a problem does not make it new; indices, so that a model growing
from 12 blocks to 24 keeps its known problem known; messages, because they
name sizes and dtypes that change without the bug changing. Two problems can
share a key (two tensors created off-device in one module's forward, same
file), so an entry holds a ``count`` and hides at most that many: a third
such problem is new.

A version-1 file (written before findings were grouped: one entry per
finding, its ``where`` uncollapsed) still reads: a problem is hidden when one
of its instances has an entry, and the entries of its other instances and of
the findings it caused are used up with it, so that they are not called stale.

PC901 (the audit did not finish: a crash, a hang, out of memory) is never
recorded and never hidden: it says nothing about placement, and a baselined
one would let a model that segfaults pass CI forever.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from placecheck.basics.codes import Code
from placecheck.basics.errors import UsageError
from placecheck.basics.version import VERSION
from placecheck.findings.finding import Finding
from placecheck.findings.formats.location import repo_path, split_source
from placecheck.findings.problems import identity
from placecheck.findings.report import Report

BASELINE_VERSION = 2
LEGACY_VERSION = 1
"""One entry per finding, before findings were grouped into problems."""

NEVER_BASELINED = Code.PC901
"""runner.INCOMPLETE, named here without importing the runner."""

Key = tuple[str, str, str, str]
"""``(model, code, where, file)``."""


def _file(source: str) -> str:
    return repo_path(split_source(source)[0]) if source else ""


def finding_key(model: str, finding: Finding) -> Key:
    """The baseline key of one problem of ``model`` (see the module docstring)."""
    code, where = identity(finding)
    return (model, code, where, _file(finding.source))


def _legacy_keys(model: str, finding: Finding) -> tuple[list[Key], list[Key]]:
    """The version-1 keys of a problem's instances and of the findings it caused."""
    file = _file(finding.source)
    instances = [(model, finding.code, where, file) for where in finding.instances or (finding.where,)]
    caused = [(model, e.code, e.where, _file(e.source)) for e in finding.evidence]
    return instances, caused


@dataclass(frozen=True)
class Baseline:
    """The entries of a baseline file: key -> how many problems (or, version 1, findings) it hides."""

    entries: Counter[Key]
    version: int = BASELINE_VERSION
    shown: dict[Key, str] = field(default_factory=dict)
    """The ``where`` to show for an entry when it is stale: its first instance (the key's is collapsed)."""


@dataclass(frozen=True)
class StaleEntry:
    """A baseline entry (or part of its count) that matched no finding."""

    model: str
    code: str
    where: str
    file: str
    count: int
    absent: bool = False
    """The entry's model was not in the run (a ``--config`` run: the config no longer lists it)."""

    def describe(self) -> str:
        """One line for humans."""
        place = f"{self.where or '<root>'}" + (f" ({self.file})" if self.file else "")
        times = f" x{self.count}" if self.count > 1 else ""
        gone = " (model no longer in the config)" if self.absent else ""
        return f"{self.model}: {self.code} at {place}{times}{gone}"


@dataclass(frozen=True)
class BaselineResult:
    """Reports with baselined findings removed, and what the baseline no longer matches."""

    reports: tuple[Report, ...]
    suppressed: int
    stale: tuple[StaleEntry, ...]


def write(path: str | Path, reports: Sequence[Report]) -> int:
    """Record every problem of ``reports``; return the number of problems recorded."""
    counts: Counter[Key] = Counter()
    firsts: dict[Key, Finding] = {}
    for report in reports:
        for f in report.findings:
            if f.code == NEVER_BASELINED:
                continue
            key = finding_key(report.target, f)
            counts[key] += 1
            firsts.setdefault(key, f)
    entries = [{"model": k[0], "code": k[1], "where": k[2], "file": k[3], "count": n,
                "instance": firsts[k].where, "message": firsts[k].message}
               for k, n in sorted(counts.items())]
    data = {"placecheck_baseline": BASELINE_VERSION, "placecheck_version": VERSION,
            "entries": entries}
    try:
        Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write --write-baseline {str(path)!r}: {exc.strerror or exc}") from None
    return sum(counts.values())


def read(path: str | Path) -> Baseline:
    """The entries of a baseline file (this version's or version 1); UsageError when it is not one."""
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read --baseline {str(path)!r}: {exc.strerror or exc}; "
                         "create it with --write-baseline") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--baseline {str(path)!r} is not JSON (line {exc.lineno}): "
                         "recreate it with --write-baseline") from None
    version = data.get("placecheck_baseline") if isinstance(data, dict) else None
    if version not in (BASELINE_VERSION, LEGACY_VERSION):
        raise UsageError(f"--baseline {str(path)!r} is not a placecheck baseline (version "
                         f"{LEGACY_VERSION} or {BASELINE_VERSION}): recreate it with --write-baseline")
    counts: Counter[Key] = Counter()
    shown: dict[Key, str] = {}
    for i, entry in enumerate(data.get("entries", [])):
        try:
            key = (str(entry["model"]), str(entry["code"]), str(entry["where"]), str(entry.get("file", "")))
            count = int(entry.get("count", 1))
            shown.setdefault(key, str(entry.get("instance", key[2])))
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"--baseline {str(path)!r}: entry {i} needs model, code and where: "
                             "recreate it with --write-baseline") from None
        counts[key] += count
    return Baseline(counts, version, shown)


_LEGACY_WHERE_CHANGED = frozenset({Code.PC203})
"""Codes whose ``where`` changed meaning since version 1: PC203's was the module whose forward built
the layer, it is now the layer's own path; such an entry matches by model, code and file."""


def _take(remaining: Counter[Key], key: Key, legacy: bool) -> bool:
    """Use up one entry for ``key``; a version-1 walk entry had no file (walk findings had no source)."""
    candidates = [key]
    if legacy and key[3]:
        candidates.append((*key[:3], ""))
    if legacy and key[1] in _LEGACY_WHERE_CHANGED:
        candidates += sorted(k for k in remaining if (k[0], k[1], k[3]) == (key[0], key[1], key[3]))
    for candidate in candidates:
        if remaining[candidate] > 0:
            remaining[candidate] -= 1
            return True
    return False


def _known(remaining: Counter[Key], model: str, f: Finding, legacy: bool) -> bool:
    """Whether the baseline records problem ``f`` (using up its entries)."""
    if not legacy:
        return _take(remaining, finding_key(model, f), legacy)
    instances, caused = _legacy_keys(model, f)
    if not any([_take(remaining, key, legacy) for key in instances]):  # a list: every instance is used up
        return False
    for key in caused:
        _take(remaining, key, legacy)
    return True


def apply(reports: Sequence[Report], baseline: Baseline, complete: bool = False) -> BaselineResult:
    """Hide the problems ``baseline`` records; report entries left unmatched as stale.

    Stale entries are judged only for models in this run (auditing one model
    with a baseline must not call every other model's entries stale), unless
    ``complete`` says the run audited every model there is (a ``--config``
    run): then an entry of a model the config no longer lists is stale too.
    A PC901 finding is never hidden (a PC901 entry, from an older placecheck,
    matches nothing and is stale).
    """
    remaining = Counter(baseline.entries)
    legacy = baseline.version == LEGACY_VERSION
    out: list[Report] = []
    suppressed = 0
    for report in reports:
        kept: list[Finding] = []
        hidden = 0
        for f in report.findings:
            if f.code != NEVER_BASELINED and _known(remaining, report.target, f, legacy):
                hidden += 1
            else:
                kept.append(f)
        notes = list(report.notes)
        if hidden:
            notes.append(f"baseline: {hidden} known finding{'s' if hidden != 1 else ''} not shown")
        suppressed += hidden
        out.append(replace(report, findings=tuple(kept), notes=tuple(notes)))
    audited = {r.target for r in reports}
    stale = tuple(StaleEntry(key[0], key[1], baseline.shown.get(key, key[2]), key[3], count=n,
                             absent=key[0] not in audited)
                  for key, n in sorted(remaining.items()) if n > 0 and (complete or key[0] in audited))
    for i, report in enumerate(out):
        mine = [f"baseline: stale entry, no longer found: {s.describe()}" for s in stale
                if s.model == report.target]
        if mine:
            out[i] = replace(report, notes=(*report.notes, *mine))
    return BaselineResult(tuple(out), suppressed, stale)
