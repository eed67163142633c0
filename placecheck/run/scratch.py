"""``placecheck run`` never changes the user's files: the script's writes land in a scratch area.

``placecheck run`` is the check a user runs before a GPU job, often in CI, on the job's own directory.
A script that resumes from ``best.pt`` and saves it at its end must find the file it saved earlier in
the same run, and must not leave a 2-step model (or the fake engine's zeros) where the trained weights
were. So for the run every write of the script (and of its DataLoader workers, torchrun ranks and
child processes) goes to a scratch area (``tempfile.mkdtemp(prefix="placecheck-run-")``) that the
script itself reads back, and after the run every file of the user's is as it was:

- :mod:`placecheck.run.overlay`: the copy-on-write layer, on disk (every process of the run shares it);
- :mod:`placecheck.run.redirect`: the patches that put it under the script, and the audit hook that
  refuses, and records, a write that got past them;
- here: a run's :class:`Session` (the scratch area, a snapshot of the script's and the working
  directory's trees before the run, compared after it: a change nothing in Python made, by C code
  writing by itself or another program the script started, is reported, never silent), what the report
  says of the writes (:func:`note`, :func:`unfinished`), and the interface for child processes:
  :func:`child_environment` (the variables a spawned Python child needs) and
  :func:`protect_from_environment` (entered by the child's bootstrap; a no-op without them). A forked
  child (a DataLoader worker) inherits the patches.

What is guaranteed, and what is not, is docs/contract.md's: it protects the user's files from their own
script; it is not a security sandbox.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat as stat_mod
import tempfile
from collections.abc import Iterator, Mapping, Sequence

from placecheck.findings.report import FileWrite, Report
from placecheck.run import redirect
from placecheck.run.overlay import Overlay, inside
from placecheck.run.redirect import protected as protected

SCRATCH_ENV = "PLACECHECK_SCRATCH"
"""The scratch area's root, for a spawned child (:func:`child_environment`)."""

PROTECTED_ENV = "PLACECHECK_SCRATCH_PROTECTED"
"""The directories always protected (the script's and the working directory), ``os.pathsep``-joined."""

NO_SCRATCH = "PLACECHECK_NO_SCRATCH"
"""Set (to anything), ``placecheck run`` does not redirect the script's writes: what
``benchmarks/bench_run_size.py`` measures the protection against, and a debugging aid. Never for a
user's run: the script's writes then change the user's files."""

SNAPSHOT_LIMIT = 20_000
"""Entries (files and directories) of the script's and the working directory's trees compared before
and after a run; past it the rest is not looked at (the docs say so)."""

WRITES_SHOWN = 500
"""Entries of the report's list of writes; a note counts the rest."""

_SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache",
                           ".ruff_cache", "node_modules", "site-packages", ".tox", ".nox"})
"""Directories the snapshot does not enter: version control, caches other processes write, installed
packages."""


def child_environment() -> dict[str, str]:
    """The variables a spawned Python child needs to write into this run's scratch area
    (:func:`protect_from_environment` reads them); empty outside a run."""
    overlay = redirect._ACTIVE
    if overlay is None:
        return {}
    return {SCRATCH_ENV: overlay.root, PROTECTED_ENV: os.pathsep.join(overlay.protected)}


def area() -> str | None:
    """The scratch area of the run in progress (None outside a run): placecheck's own files of the run
    (a spawned child's configuration) go under it, so that they go with it, even where a process of the
    run is killed (a rank at Ctrl-C) before it removes its own."""
    return redirect._ACTIVE.root if redirect._ACTIVE is not None else None


@contextlib.contextmanager
def protect_from_environment(variables: Mapping[str, str] | None = None) -> Iterator[None]:
    """In a spawned child (or a torchrun rank): its writes go to the scratch area
    :func:`child_environment` named, read from ``variables`` (default ``os.environ``); a no-op without
    them, or inside a run already."""
    given = os.environ if variables is None else variables
    root = given.get(SCRATCH_ENV)
    if not root or redirect._ACTIVE is not None or not os.path.isdir(root):
        yield
        return
    protected_dirs = [p for p in given.get(PROTECTED_ENV, "").split(os.pathsep) if p]
    with protected(Overlay(root, protected_dirs)):
        yield


# -- after the run: what changed on disk anyway ------------------------------------------------------------

Snapshot = dict[str, tuple[int, int, bool]]
"""path -> (size, modification time in ns, is a directory)."""


def snapshot(roots: Sequence[str], skip: Sequence[str] = (), limit: int = SNAPSHOT_LIMIT) -> Snapshot:
    """The files and directories under ``roots`` (breadth first, at most ``limit``; links not followed;
    :data:`_SKIPPED_DIRS`, virtual environments and ``skip`` not entered), with the real functions."""
    out: Snapshot = {}
    queue = [os.path.abspath(r) for r in roots]
    skipped = {os.path.abspath(s) for s in skip}
    seen: set[str] = set()
    while queue and len(out) < limit:
        top = queue.pop(0)
        if top in seen or top in skipped:
            continue
        seen.add(top)
        try:
            with os.scandir(top) as entries:
                listed = list(entries)
        except OSError:
            continue
        if any(e.name == "pyvenv.cfg" for e in listed) and top not in roots:
            continue  # a virtual environment: installed packages, not the user's files
        for entry in listed:
            if len(out) >= limit:
                break
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = stat_mod.S_ISDIR(st.st_mode)
            out[entry.path] = (0 if is_dir else st.st_size, 0 if is_dir else st.st_mtime_ns, is_dir)
            if is_dir and entry.name not in _SKIPPED_DIRS:
                queue.append(entry.path)
    return out


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """The paths created, removed or changed between two snapshots (a truncated snapshot's missing tail
    is not a removal: only paths both reached are compared for removal)."""
    complete = len(after) < SNAPSHOT_LIMIT and len(before) < SNAPSHOT_LIMIT
    out = [p for p, v in after.items() if before.get(p) != v and not (p not in before and not complete)]
    if complete:
        out += [p for p in before if p not in after]
    return sorted(out)


@dataclasses.dataclass
class Session:
    """One run's scratch area, from before the script to the report (:func:`start`)."""

    overlay: Overlay
    keep: bool
    """``--keep-scratch``: the scratch area stays after the run, and the report says where."""
    watched: tuple[str, ...]
    """The trees the snapshot compares."""
    before: Snapshot

    def writes(self) -> list[FileWrite]:
        """What the script wrote (each redirected), what the audit hook refused, and what changed on disk
        in the watched trees anyway."""
        found = self.overlay.writes(self.keep)
        after = snapshot(self.watched, skip=self.skipped)
        found += [FileWrite(p, "escaped") for p in changed(self.before, after)]
        return found

    @property
    def skipped(self) -> tuple[str, ...]:
        """What the snapshot leaves out: the scratch area, and what is not redirected (the temporary
        directory, /dev, /proc, /sys) when the working directory holds it."""
        return tuple(p for p in self.overlay.passed if not any(inside(w, (p,)) for w in self.watched))

    def close(self) -> None:
        self.overlay.close()
        if not self.keep:
            shutil.rmtree(self.overlay.root, ignore_errors=True)

    def reported(self, report: Report) -> Report:
        """``report`` with the writes (at most :data:`WRITES_SHOWN`), their notes, and ``unfinished`` when
        one got past the scratch area."""
        writes = self.writes()
        notes = note(writes, self.overlay.root if self.keep else None)
        if len(writes) > WRITES_SHOWN:
            notes.append(f"files: the report lists the first {WRITES_SHOWN} of the {len(writes)} files the "
                         "script changed")
        return dataclasses.replace(report, notes=(*report.notes, *notes), writes=tuple(writes[:WRITES_SHOWN]),
                                   unfinished=report.unfinished or unfinished(writes))


def watched_dirs(script: str | None) -> tuple[str, ...]:
    """The trees the snapshot compares: the working directory and the script's directory (once, the
    outer one when one holds the other)."""
    dirs = [os.getcwd()]
    if script:
        dirs.append(os.path.dirname(os.path.abspath(script)))
    out: list[str] = []
    for d in sorted(set(dirs), key=len):
        if not inside(d, out):
            out.append(d)
    return tuple(out)


def start(script: str | None, keep: bool) -> Session | None:
    """A new scratch area for a run of ``script`` (None: a callable), and the snapshot before it; None
    when :data:`NO_SCRATCH` is set."""
    if os.environ.get(NO_SCRATCH):
        return None
    watched = watched_dirs(script)
    root = tempfile.mkdtemp(prefix="placecheck-run-")
    session = Session(Overlay(root, watched), keep, watched, {})
    session.before = snapshot(watched, skip=session.skipped)
    return session


def restarted() -> None:
    """The scratch area of the run in progress emptied: the script starts over from its beginning (auto's
    second attempt), seeing the user's files as they are."""
    if redirect._ACTIVE is not None:
        redirect._ACTIVE.reset()


def note(writes: Sequence[FileWrite], kept: str | None) -> list[str]:
    """The report's notes on the script's writes (none when it wrote nothing)."""
    redirected = [w for w in writes if w.change in ("created", "overwritten", "deleted")]
    notes = []
    if redirected:
        counts = {c: sum(1 for w in redirected if w.change == c)
                  for c in ("created", "overwritten", "deleted")}
        said = ", ".join(f"{n} {c}" for c, n in counts.items() if n)
        shown = ", ".join(_shown(w.path) for w in redirected[:5]) + (", ..." if len(redirected) > 5 else "")
        where = (f"kept at {kept} (each file under its own absolute path there, in tree/)" if kept else
                 "removed after the run (--keep-scratch keeps it)")
        notes.append(f"files: the script's writes went to a scratch area, never to your files ({said}: "
                     f"{shown}); the script read them back as written; the scratch area was {where}")
    blocked = [w for w in writes if w.change == "blocked"]
    if blocked:
        notes.append(f"files: {len(blocked)} write(s) got past the scratch area and were refused (a "
                     f"PermissionError in the script): {', '.join(_shown(w.path) for w in blocked[:5])}")
    escaped = [w for w in writes if w.change == "escaped"]
    if escaped:
        notes.append(f"files: {len(escaped)} file(s) changed on disk during the run by code placecheck "
                     "cannot redirect (C code writing by itself, another program the script started): "
                     f"{', '.join(_shown(w.path) for w in escaped[:5])}")
    return notes


def unfinished(writes: Sequence[FileWrite]) -> str:
    """The summary's reason when a write got past the scratch area ("" when none did)."""
    blocked = [w for w in writes if w.change == "blocked"]
    escaped = [w for w in writes if w.change == "escaped"]
    if escaped:
        return (f"{_shown(escaped[0].path)} changed on disk during the run, past placecheck's scratch "
                "area (see the notes)")
    if blocked:
        return f"a write to {_shown(blocked[0].path)} got past placecheck's scratch area and was refused"
    return ""


def _shown(path: str) -> str:
    with contextlib.suppress(ValueError):
        rel = os.path.relpath(path)
        if not rel.startswith(os.pardir):
            return rel
    return path
