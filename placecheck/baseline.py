"""Baselines: adopt placecheck on an existing model and fail only on new findings.

``--write-baseline FILE`` records every current finding; ``--baseline FILE``
then hides the findings it records and reports the rest. An entry that
matches no finding any more (the bug was fixed, or moved out of recognition)
is reported as stale, so the file can be pruned.

Matching key: ``(model, code, where, file)``, where ``model`` is the model's
name in the run (its TARGET, or the config's ``name``), ``where`` the dotted
path, and ``file`` the finding's source file without its line number,
repository-relative (see :func:`placecheck.formats.location.repo_path`).
Lines are left out so that an edit above a finding does not make it new;
messages are left out because they name sizes and dtypes that change
without the bug changing. Two findings can share a key (two tensors created
off-device in one module's forward, same file), so an entry holds a ``count``
and hides at most that many: a third such finding is new.

PC901 (the audit did not finish: a crash, a hang, out of memory) is never
recorded and never hidden: it says nothing about placement, and a baselined
one would let a model that segfaults pass CI forever.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from placecheck import __version__
from placecheck.errors import UsageError
from placecheck.finding import Finding
from placecheck.formats.location import repo_path, split_source
from placecheck.report import Report

BASELINE_VERSION = 1

NEVER_BASELINED = "PC901"
"""runner.INCOMPLETE, named here without importing the runner."""

Key = tuple[str, str, str, str]
"""``(model, code, where, file)``."""


def finding_key(model: str, finding: Finding) -> Key:
    """The baseline key of one finding of ``model`` (see the module docstring)."""
    file = repo_path(split_source(finding.source)[0]) if finding.source else ""
    return (model, finding.code, finding.where, file)


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
    """Record every finding of ``reports``; return the number of findings recorded."""
    counts: Counter[Key] = Counter()
    messages: dict[Key, str] = {}
    for report in reports:
        for f in report.findings:
            if f.code == NEVER_BASELINED:
                continue
            key = finding_key(report.target, f)
            counts[key] += 1
            messages.setdefault(key, f.message)
    entries = [{"model": k[0], "code": k[1], "where": k[2], "file": k[3], "count": n,
                "message": messages[k]} for k, n in sorted(counts.items())]
    data = {"placecheck_baseline": BASELINE_VERSION, "placecheck_version": __version__,
            "entries": entries}
    try:
        Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write --write-baseline {str(path)!r}: {exc.strerror or exc}") from None
    return sum(counts.values())


def read(path: str | Path) -> Counter[Key]:
    """The entries of a baseline file, as key -> count; UsageError when it is not one."""
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read --baseline {str(path)!r}: {exc.strerror or exc}; "
                         "create it with --write-baseline") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--baseline {str(path)!r} is not JSON (line {exc.lineno}): "
                         "recreate it with --write-baseline") from None
    if not isinstance(data, dict) or data.get("placecheck_baseline") != BASELINE_VERSION:
        raise UsageError(f"--baseline {str(path)!r} is not a placecheck baseline (version "
                         f"{BASELINE_VERSION}): recreate it with --write-baseline")
    counts: Counter[Key] = Counter()
    for i, entry in enumerate(data.get("entries", [])):
        try:
            key = (str(entry["model"]), str(entry["code"]), str(entry["where"]), str(entry.get("file", "")))
            count = int(entry.get("count", 1))
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"--baseline {str(path)!r}: entry {i} needs model, code and where: "
                             "recreate it with --write-baseline") from None
        counts[key] += count
    return counts


def apply(reports: Sequence[Report], baseline: Counter[Key], complete: bool = False) -> BaselineResult:
    """Hide the findings ``baseline`` records; report entries left unmatched as stale.

    Stale entries are judged only for models in this run (auditing one model
    with a baseline must not call every other model's entries stale), unless
    ``complete`` says the run audited every model there is (a ``--config``
    run): then an entry of a model the config no longer lists is stale too.
    A PC901 finding is never hidden (a PC901 entry, from an older placecheck,
    matches nothing and is stale).
    """
    remaining = Counter(baseline)
    out: list[Report] = []
    suppressed = 0
    for report in reports:
        kept: list[Finding] = []
        hidden = 0
        for f in report.findings:
            key = finding_key(report.target, f)
            if remaining[key] > 0 and f.code != NEVER_BASELINED:
                remaining[key] -= 1
                hidden += 1
            else:
                kept.append(f)
        notes = list(report.notes)
        if hidden:
            notes.append(f"baseline: {hidden} known finding{'s' if hidden != 1 else ''} not shown")
        suppressed += hidden
        out.append(replace(report, findings=tuple(kept), notes=tuple(notes)))
    audited = {r.target for r in reports}
    stale = tuple(StaleEntry(*key, count=n, absent=key[0] not in audited)
                  for key, n in sorted(remaining.items()) if n > 0 and (complete or key[0] in audited))
    for i, report in enumerate(out):
        mine = [f"baseline: stale entry, no longer found: {s.describe()}" for s in stale
                if s.model == report.target]
        if mine:
            out[i] = replace(report, notes=(*report.notes, *mine))
    return BaselineResult(tuple(out), suppressed, stale)
