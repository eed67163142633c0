"""The copy-on-write layer under ``placecheck run``'s scratch area (:mod:`placecheck.run.scratch` says
what it is for and what is guaranteed).

:class:`Overlay` keeps its state on disk under its root, so every process of the run shares it:

- a write to an absolute path ``P`` goes to ``ROOT/tree/P``; a read of ``P`` sees that copy when there
  is one, else the real ``P``; appending or updating (``"a"``, ``"r+"``, ``os.open`` without
  ``O_TRUNC``) copies the real file there first;
- a removed ``P`` is marked ``ROOT/gone/P`` (a file): from then on ``P`` is missing for the script
  (``FileNotFoundError``, ``os.path.exists`` False) while the real one stays; a directory removed and
  made again shows only what the script put in it (its mark and its copy together); listings merge the
  copy and the real directory, minus the marks;
- not redirected: the root itself, the system's temporary directory (torch.compile's caches, a
  library's temporary files, placecheck's own), ``/dev``, ``/proc``, ``/sys``; the deepest of those and
  the protected directories (the script's and the working directory: a test's ``tmp_path`` under the
  temporary directory) holding a path decides.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import mmap
import os
import shutil
import stat as stat_mod
import tempfile
from collections.abc import Sequence
from typing import Any

from placecheck.findings.report import FileWrite

# the real functions, taken when this module is imported (before any patch of its own)
_open = builtins.open
_os_open = os.open
_stat = os.stat
_lstat = os.lstat
_listdir = os.listdir
_scandir = os.scandir
_mkdir = os.mkdir
_rmdir = os.rmdir
_unlink = os.unlink
_rename = os.rename
_rmtree = shutil.rmtree

def _st(path: Any, follow: bool = True) -> os.stat_result | None:
    try:
        return (_stat if follow else _lstat)(path)
    except (OSError, ValueError):
        return None


def real_isdir(path: Any) -> bool:
    st = _st(path)
    return st is not None and stat_mod.S_ISDIR(st.st_mode)


def real_isfile(path: Any) -> bool:
    st = _st(path)
    return st is not None and stat_mod.S_ISREG(st.st_mode)


def real_islink(path: Any) -> bool:
    st = _st(path, False)
    return st is not None and stat_mod.S_ISLNK(st.st_mode)


def real_lexists(path: Any) -> bool:
    return _st(path, False) is not None


WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def missing(path: Any) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


def inside(path: str, roots: Sequence[str]) -> bool:
    """``path`` is one of ``roots`` or under one."""
    return any(path == r or path.startswith(r if r.endswith(os.sep) else r + os.sep) for r in roots)


class Overlay:
    """The scratch area: a copy-on-write view of the file system, on disk under :attr:`root`."""

    def __init__(self, root: str, protected: Sequence[str] = ()) -> None:
        self.root = os.path.abspath(root)
        self.tree = os.path.join(self.root, "tree")
        self.gone = os.path.join(self.root, "gone")
        self.blocked_log = os.path.join(self.root, "blocked")
        temp = {os.path.abspath(tempfile.gettempdir()), os.path.realpath(tempfile.gettempdir())}
        self.passed = tuple(sorted({self.root, os.path.realpath(self.root), *temp, "/dev", "/proc", "/sys"}))
        """Not redirected (unless under :attr:`protected`)."""
        self.protected = tuple(p for p in (os.path.abspath(d) for d in protected) if p not in temp)
        """Always redirected: the script's directory and the working directory (not the temporary
        directory itself, whose other files a library writes)."""
        self._covers: dict[str, bool] = {}
        for d in (self.tree, self.gone):
            _makedirs(d)
        self._touched = _shared_flag(os.path.join(self.root, "touched"))
        """One byte every process of the run maps: 0 until the script first writes or removes something
        (:meth:`for_write`, :meth:`remove`, before the change). Until then every read is of the real path,
        with no look into the scratch area: most reads of a run (imports, ``realpath`` and ``linecache``
        of every source file) come before its first write, or in a run that writes nothing."""

    def touched(self) -> bool:
        """The script wrote or removed something (in any process of the run)."""
        return self._touched[0] != 0

    def _touch(self) -> None:
        if self._touched[0] == 0:
            self._touched[0] = 1

    # -- which paths ------------------------------------------------------------------------------

    def covers(self, path: str) -> bool:
        """Whether a write to ``path`` (absolute) is redirected: the deepest of :attr:`protected` and
        :attr:`passed` holding it decides (a ``tmp_path`` under the temporary directory is protected, a
        ``TMPDIR`` inside the project is not); never the scratch area itself."""
        # asked of every path the process reads (linecache's and realpath's stats of each frame's file
        # included): the answer depends on the path alone, so it is computed once per path
        known = self._covers.get(path)
        if known is None:
            known = self._covers[path] = self._decide_covers(path)
        return known

    def _decide_covers(self, path: str) -> bool:
        if inside(path, (self.root,)):
            return False
        passed = max((len(r) for r in self.passed if inside(path, (r,))), default=-1)
        if passed < 0:
            return True
        return max((len(r) for r in self.protected if inside(path, (r,))), default=-1) > passed

    def upper(self, path: str) -> str:
        drive, rest = os.path.splitdrive(path)
        return self.tree + (os.sep + drive.rstrip(":") if drive else "") + rest

    def _mark(self, path: str) -> str:
        drive, rest = os.path.splitdrive(path)
        return self.gone + (os.sep + drive.rstrip(":") if drive else "") + rest

    def hidden(self, path: str) -> bool:
        """``path`` or a directory above it was removed by the script (a mark in :attr:`gone`)."""
        if not self._touched[0]:
            return False
        mark = self.gone
        drive, rest = os.path.splitdrive(path)
        parts = ([drive.rstrip(":")] if drive else []) + [p for p in rest.split(os.sep) if p]
        for part in parts:
            mark = os.path.join(mark, part)
            try:
                st = _lstat(mark)
            except OSError:
                return False
            if not stat_mod.S_ISDIR(st.st_mode):
                return True
        return False

    def resolve(self, path: str) -> str | None:
        """Where a read of ``path`` goes: its scratch copy, the real path, or None (removed). A
        directory both in the scratch area and real is read as the real one (its listing is merged)."""
        if not self._touched[0]:
            return path
        up = self.upper(path)
        try:
            st = _lstat(up)
        except OSError:
            return None if self.hidden(path) else path
        if stat_mod.S_ISDIR(st.st_mode) and not self.hidden(path) and real_isdir(path):
            return path
        return up

    def _lower_visible(self, path: str) -> bool:
        return not self.hidden(path) and real_lexists(path)

    def exists(self, path: str) -> bool:
        """``path`` exists as the script sees it (a link counts, whatever it points to)."""
        if not self._touched[0]:
            return real_lexists(path)
        return real_lexists(self.upper(path)) or self._lower_visible(path)

    def is_dir(self, path: str) -> bool:
        where = self.resolve(path)
        return where is not None and real_isdir(where)

    def names(self, path: str) -> list[str] | None:
        """The merged listing of directory ``path`` (None: no such directory for the script)."""
        up, mark = self.upper(path), self._mark(path)
        upper = _listdir(up) if real_isdir(up) and not real_islink(up) else None
        lower = None
        if not self.hidden(path) and real_isdir(path):
            lower = _listdir(path)
            if real_isdir(mark):
                gone = {n for n in _listdir(mark) if not real_isdir(os.path.join(mark, n))}
                lower = [n for n in lower if n not in gone]
        if upper is None and lower is None:
            return None
        merged = dict.fromkeys(upper or ())
        merged.update(dict.fromkeys(lower or ()))
        return list(merged)

    def plain(self, path: str) -> bool:
        """Nothing of the script's is at or under ``path``: the real call may answer as it is."""
        if not self._touched[0]:
            return True
        return not real_lexists(self.upper(path)) and not real_lexists(self._mark(path)) \
            and not self.hidden(path)

    # -- writing ------------------------------------------------------------------------------------

    def for_write(self, path: str, copy: bool = False, given: Any = None) -> str:
        """The scratch path a write of ``path`` goes to, its directories made; ``copy``: the real
        file's content copied there first (appending, updating)."""
        self._touch()
        parent = os.path.dirname(path)
        if parent != path and not self.is_dir(parent):
            raise missing(given if given is not None else path)
        up = self.upper(path)
        _makedirs(os.path.dirname(up))
        if copy and not real_lexists(up) and self._lower_visible(path) and real_isfile(path):
            copy_file(path, up)
        return up

    def remove(self, path: str) -> None:
        """``path`` (a file, a link or an empty directory) gone for the script."""
        self._touch()
        up = self.upper(path)
        if real_lexists(up):
            if real_isdir(up) and not real_islink(up):
                _rmtree(up)
            else:
                _unlink(up)
        if self._lower_visible(path):
            mark = self._mark(path)
            if real_isdir(mark) and not real_islink(mark):
                _rmtree(mark)
            _makedirs(os.path.dirname(mark))
            with _open(mark, "wb"):
                pass

    def remove_tree(self, path: str) -> None:
        self.remove(path)

    def copy_in(self, src: str, dst: str) -> None:
        """``src`` as the script sees it (a file, a link or a whole directory) copied to ``dst``'s
        scratch path (a rename of a real file or directory: the real one stays where it is)."""
        where = self.resolve(src)
        if where is None:
            raise missing(src)
        target = self.for_write(dst)
        if real_islink(where):
            os.symlink(os.readlink(where), target)
        elif real_isdir(where):
            _makedirs(target)
            for name in self.names(src) or ():
                self.copy_in(os.path.join(src, name), os.path.join(dst, name))
        else:
            copy_file(where, target)

    def record_blocked(self, path: str) -> None:
        with contextlib.suppress(OSError), _open(self.blocked_log, "a", encoding="utf-8") as log:
            log.write(path.replace("\n", " ") + "\n")

    # -- what the script did ------------------------------------------------------------------------

    def writes(self, keep: bool) -> list[FileWrite]:
        """What the script changed, sorted by path: the files (and new directories) of :attr:`tree`, the
        marks of :attr:`gone`, the writes the hook refused."""
        out: dict[str, FileWrite] = {}
        for base, dirs, files in os.walk(self.tree):
            for name in [*files, *[d for d in dirs if real_islink(os.path.join(base, d))]]:
                up = os.path.join(base, name)
                path = self._user_path(up, self.tree)
                change = "overwritten" if real_lexists(path) else "created"
                out[path] = FileWrite(path, change, up if keep else "")
            for name in dirs:  # a directory of the script's own (not one holding a file it wrote)
                up = os.path.join(base, name)
                path = self._user_path(up, self.tree)
                if not real_lexists(path):
                    out[path] = FileWrite(path, "created", up if keep else "")
        for base, _dirs, files in os.walk(self.gone):
            for name in files:
                path = self._user_path(os.path.join(base, name), self.gone)
                if real_lexists(path) and (path not in out or real_isdir(path)):
                    out[path] = FileWrite(path, "deleted")
        with contextlib.suppress(OSError), _open(self.blocked_log, encoding="utf-8") as log:
            for line in log:
                path = line.rstrip("\n")
                out[path + "\0blocked"] = FileWrite(path, "blocked")
        return sorted(out.values(), key=lambda w: (w.path, w.change))

    def _user_path(self, inside: str, base: str) -> str:
        rest = inside[len(base):]
        if os.name == "nt":  # tree/C/Users/...: C:\\Users\\...
            drive, _, tail = rest.lstrip(os.sep).partition(os.sep)
            return f"{drive}:{os.sep}{tail}"
        return rest or os.sep

    def reset(self) -> None:
        """Empty again: the script starts over (auto's second attempt sees the user's files as they are)."""
        for d in (self.tree, self.gone):
            _rmtree(d, ignore_errors=True)
            _makedirs(d)
        with contextlib.suppress(OSError):
            _unlink(self.blocked_log)
        self._touched[0] = 0

    def close(self) -> None:
        """Before the scratch area is removed: on Windows, unmap the shared flag (a mapped file cannot be
        deleted there). Elsewhere the mapping stays, for a thread of the script still in a wrapper."""
        if os.name == "nt":
            with contextlib.suppress(BufferError, ValueError):
                self._touched.close()


def _makedirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)`` with the real functions."""
    if real_isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        _makedirs(parent)
    with contextlib.suppress(FileExistsError):
        _mkdir(path)


def _shared_flag(path: str) -> mmap.mmap:
    """One byte of ``path`` (made, 0, when missing), mapped shared: what a process writes there every
    process that maps it reads at once (forked children inherit the mapping, spawned ones map the file)."""
    fd = _os_open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < 1:
            os.ftruncate(fd, 1)
        return mmap.mmap(fd, 1)
    finally:
        os.close(fd)


def copy_file(src: str, dst: str) -> None:
    with _open(src, "rb") as read, _open(dst, "wb") as write:
        shutil.copyfileobj(read, write, 1 << 20)
    with contextlib.suppress(OSError):
        shutil.copymode(src, dst)
