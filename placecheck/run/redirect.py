"""How ``placecheck run``'s scratch area (:mod:`placecheck.run.overlay`, :mod:`placecheck.run.scratch`) is
put under the script.

:func:`protected` installs it for a block: the Python calls every file access goes through are
patched (through :mod:`placecheck.basics.patching`): ``open`` (``builtins`` and ``io``), ``os.open``,
``os.stat``, ``os.lstat``, ``os.access``, ``os.readlink``, ``os.listdir``, ``os.scandir``,
``os.remove``/``unlink``, ``os.rename``/``replace``, ``os.mkdir``, ``os.rmdir``, ``os.truncate``,
``os.chmod``, ``os.utime``, ``os.link``, ``os.symlink``, ``shutil.rmtree``; ``os.makedirs``,
``os.path``, ``os.walk``, ``glob``, ``pathlib`` (3.11 to 3.13; 3.13's glob of a ``Path`` keeps
``os.lstat`` and ``os.scandir`` in its class, patched there too) and ``shutil``'s copies and moves call
those at call time. A module that took one of them by name before the block (``from os import
remove``) has that name patched too. Code that opens a path in C or Rust is given the scratch path:
torch's zip writer (``torch.save``), ``torch.load`` and ``UntypedStorage.from_file`` (``mmap=True``;
a shared map writes), ``torch.from_file``, safetensors' ``serialize_file`` and ``safe_open``. numpy
(``save``, ``tofile``), pickle, json, logging, Hugging Face's ``save_pretrained``, Lightning (fsspec),
accelerate and TensorBoard write through Python's ``open``.

Under the patches, an audit hook (:func:`sys.addaudithook`) is the net: an ``open`` for writing, a
rename, removal, ``mkdir``, ``chmod``, ``utime``, ``truncate`` or link Python makes to a protected path
(not its scratch copy) while a block is active got past the patches (a reference taken before it,
``io.FileIO`` called directly); it is refused with ``PermissionError`` and recorded. An audit hook
cannot be removed: outside a block it returns at once. ``sys.dont_write_bytecode`` holds for the block:
the import system writes ``__pycache__`` through ``posix`` directly, past the patches.

Each wrapper calls the original as it is outside a block (a module may keep one it took during a
block). Not a security sandbox: ``ctypes``, a program of another language, a path relative to a
directory descriptor go around it.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import io
import os
import shutil
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from placecheck.basics.patching import Patch, patch, patched_once_imported
from placecheck.run.overlay import (
    WRITE_FLAGS,
    Overlay,
    copy_file,
    missing,
    real_isdir,
    real_islink,
    real_lexists,
)

_WHY = ("placecheck run's scratch area: the script's writes are redirected there, never to the user's files "
        "(placecheck.run.redirect says why for each)")
_WHY_C = ("placecheck run's scratch area: a writer in C or Rust opens the path itself, so it is given the "
          "scratch copy's path (placecheck.run.redirect)")

_ACTIVE: Overlay | None = None
"""The scratch area of the run in progress in this process (and its forked children); None between runs."""


def active() -> Overlay | None:
    return _ACTIVE


# -- the wrappers ------------------------------------------------------------------------------------
# Each is the original's wrapper: outside a run (a reference a module took during one) it calls the
# original as it is. Paths are keyed absolute (os.path.abspath, the working directory at the call).

def _key(path: Any) -> str | None:
    """``path`` absolute when it is a path the overlay covers; None for a descriptor or a path it does not."""
    overlay = _ACTIVE
    if overlay is None or isinstance(path, int):
        return None
    try:
        text = os.fsdecode(path)
    except TypeError:
        return None
    if not text:
        return None
    if os.path.isabs(text):  # (asked of the same source files over and over: linecache, realpath)
        known = _ABSOLUTE.get(text)
        if known is None:
            if len(_ABSOLUTE) > 10_000:
                _ABSOLUTE.clear()
            known = _ABSOLUTE[text] = os.path.normpath(text)
        full = known
    else:
        full = os.path.abspath(text)
    return full if overlay.covers(full) else None


_ABSOLUTE: dict[str, str] = {}
"""An absolute path as given -> normalised: what :func:`os.path.abspath` gives for it, whatever the
working directory."""


def _same_kind(given: Any, path: str) -> Any:
    """``path`` as bytes when the script gave bytes."""
    return os.fsencode(path) if isinstance(given, bytes) else path


def _read(given: Any) -> Any:
    """What a read of ``given`` opens: the scratch copy, the real path, or ``FileNotFoundError``."""
    full = _key(given)
    if full is None:
        return given
    assert _ACTIVE is not None
    where = _ACTIVE.resolve(full)
    if where is None:
        raise missing(given)
    return given if where == full else _same_kind(given, where)


def _writing_mode(mode: str) -> tuple[bool, bool, bool]:
    """(writes, keeps the old content, exclusive) for an ``open`` mode."""
    writes = any(c in mode for c in "wax+")
    return writes, ("a" in mode or ("+" in mode and "w" not in mode)), "x" in mode


def _opened(original: Callable[..., Any]) -> Callable[..., Any]:
    def open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        full = _key(file)
        if full is None:
            return original(file, mode, *args, **kwargs)
        assert _ACTIVE is not None
        writes, keeps, exclusive = _writing_mode(mode if isinstance(mode, str) else "r")
        if not writes:
            return original(_read(file), mode, *args, **kwargs)
        if exclusive and _ACTIVE.exists(full):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), file)
        if keeps and "a" not in mode and not _ACTIVE.exists(full):  # r+ of a missing file
            raise missing(file)
        return original(_same_kind(file, _ACTIVE.for_write(full, copy=keeps, given=file)), mode, *args,
                        **kwargs)
    return open


def _os_opened(original: Callable[..., Any]) -> Callable[..., Any]:
    def open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> Any:
        full = _key(path) if dir_fd is None else None
        if full is None:
            return original(path, flags, mode, dir_fd=dir_fd)
        assert _ACTIVE is not None
        if not flags & WRITE_FLAGS:
            return original(_read(path), flags, mode)
        if flags & os.O_CREAT and flags & os.O_EXCL and _ACTIVE.exists(full):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
        if not flags & os.O_CREAT and not _ACTIVE.exists(full):
            raise missing(path)
        if _ACTIVE.is_dir(full):  # a directory opened to fsync it: the real one, read only
            return original(_read(path), flags, mode)
        keeps = not flags & os.O_TRUNC
        return original(_same_kind(path, _ACTIVE.for_write(full, copy=keeps, given=path)), flags, mode)
    return open


def _reading(original: Callable[..., Any]) -> Callable[..., Any]:
    """``os.stat``, ``os.lstat``, ``os.access``, ``os.readlink``: asked of what a read would open."""
    def read(path: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("dir_fd") is not None:
            return original(path, *args, **kwargs)
        return original(_read(path), *args, **kwargs)
    return read


def _accessed(original: Callable[..., Any]) -> Callable[..., Any]:
    def access(path: Any, mode: int, *args: Any, **kwargs: Any) -> bool:
        try:
            target = _read(path) if kwargs.get("dir_fd") is None else path
        except FileNotFoundError:
            return False
        return bool(original(target, mode, *args, **kwargs))
    return access


def _listed(original: Callable[..., Any]) -> Callable[..., Any]:
    def listdir(path: Any = ".") -> Any:
        full = _key(path)
        if full is None:
            return original(path)
        assert _ACTIVE is not None
        if _ACTIVE.plain(full):
            return original(path)
        names = _ACTIVE.names(full)
        if names is None:
            return original(_read(path))  # its own error: not a directory, or missing
        return [os.fsencode(n) for n in names] if isinstance(path, bytes) else names
    return listdir


class _Entry:
    """An ``os.DirEntry`` of a file in the scratch area, named by the path the script listed."""

    def __init__(self, entry: os.DirEntry[Any], path: Any) -> None:
        self._entry = entry
        self.name = entry.name
        self.path = path

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return self._entry.is_dir(follow_symlinks=follow_symlinks)

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return self._entry.is_file(follow_symlinks=follow_symlinks)

    def is_symlink(self) -> bool:
        return self._entry.is_symlink()

    def is_junction(self) -> bool:
        return False

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        return self._entry.stat(follow_symlinks=follow_symlinks)

    def inode(self) -> int:
        return self._entry.inode()

    def __fspath__(self) -> Any:
        return self.path

    def __repr__(self) -> str:
        return f"<DirEntry {self.name!r}>"


class _Listing:
    """What ``os.scandir`` returns for a merged directory: an iterator and a context manager."""

    def __init__(self, entries: list[Any]) -> None:
        self._entries = iter(entries)

    def __iter__(self) -> _Listing:
        return self

    def __next__(self) -> Any:
        return next(self._entries)

    def __enter__(self) -> _Listing:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._entries = iter(())


def _scanned(original: Callable[..., Any]) -> Callable[..., Any]:
    def scandir(path: Any = ".") -> Any:
        full = _key(path)
        if full is None:
            return original(path)
        assert _ACTIVE is not None
        overlay = _ACTIVE
        if overlay.plain(full):
            return original(path)
        names = overlay.names(full)
        if names is None:
            return original(_read(path))
        entries: list[Any] = []
        seen: set[str] = set()
        up = overlay.upper(full)
        if real_isdir(up):
            with original(up) as upper:
                for entry in upper:
                    seen.add(entry.name)
                    named = os.path.join(os.fsdecode(path), os.fsdecode(entry.name))
                    entries.append(_Entry(entry, _same_kind(path, named)))
        wanted = set(names) - seen
        if wanted:
            with original(path) as lower:
                entries.extend(e for e in lower if os.fsdecode(e.name) in wanted)
        return _Listing(entries)
    return scandir


def _removing(original: Callable[..., Any], directory: bool) -> Callable[..., Any]:
    """``os.remove``/``os.unlink`` (``directory`` False) and ``os.rmdir``."""
    def remove(path: Any, *, dir_fd: Any = None) -> None:
        full = _key(path) if dir_fd is None else None
        if full is None:
            return original(path, dir_fd=dir_fd)  # type: ignore[no-any-return]
        assert _ACTIVE is not None
        if not _ACTIVE.exists(full):
            raise missing(path)
        is_dir = _ACTIVE.is_dir(full) and not real_islink(_ACTIVE.resolve(full) or full)
        if directory and not is_dir:
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        if not directory and is_dir:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if directory and _ACTIVE.names(full):
            raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), path)
        _ACTIVE.remove(full)
        return None
    return remove


def _made_dir(original: Callable[..., Any]) -> Callable[..., Any]:
    def mkdir(path: Any, mode: int = 0o777, *, dir_fd: Any = None) -> None:
        full = _key(path) if dir_fd is None else None
        if full is None:
            return original(path, mode, dir_fd=dir_fd)  # type: ignore[no-any-return]
        assert _ACTIVE is not None
        if _ACTIVE.exists(full):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
        up = _ACTIVE.for_write(full, given=path)
        original(up, mode)
        return None
    return mkdir


def _renamed(original: Callable[..., Any]) -> Callable[..., Any]:
    """``os.rename``/``os.replace``: a scratch file moves; a real one is copied (it stays where it is) and
    marked removed; a file of the temporary directory moves into the scratch area."""
    def rename(src: Any, dst: Any, *, src_dir_fd: Any = None, dst_dir_fd: Any = None) -> None:
        if src_dir_fd is not None or dst_dir_fd is not None:
            return original(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)  # type: ignore[no-any-return]
        s, d = _key(src), _key(dst)
        if s is None and d is None:
            return original(src, dst)  # type: ignore[no-any-return]
        overlay = _ACTIVE
        assert overlay is not None
        source = os.path.abspath(os.fsdecode(src))
        if s is not None and not overlay.exists(s):
            raise missing(src)
        if s is None and not real_lexists(source):
            raise missing(src)
        source_is_dir = overlay.is_dir(s) if s is not None else real_isdir(source)
        if d is not None and overlay.exists(d):
            if overlay.is_dir(d):
                if not source_is_dir:
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), dst)
                if overlay.names(d):
                    raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), dst)
            elif source_is_dir:
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), dst)
            overlay.remove(d)
        if d is None:  # out of the user's tree, into the temporary directory: a copy there
            target = os.path.abspath(os.fsdecode(dst))
            where = overlay.resolve(s) if s is not None else None
            if where is None:
                raise missing(src)
            if real_isdir(where):
                shutil.copytree(where, target, symlinks=True)
            else:
                copy_file(where, target)
            overlay.remove(s)  # type: ignore[arg-type]
            return None
        if s is None:  # from the temporary directory into the user's tree: moved into the scratch area
            target = overlay.for_write(d, given=dst)
            try:
                original(source, target)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                shutil.move(source, target)
            return None
        up = overlay.upper(s)
        if real_lexists(up) and not (real_isdir(up) and not overlay.hidden(s) and real_isdir(s)):
            target = overlay.for_write(d, given=dst)
            original(up, target)  # the script's own file: moved within the scratch area
            if overlay._lower_visible(s):
                overlay.remove(s)
            return None
        overlay.copy_in(s, d)
        overlay.remove(s)
        return None
    return rename


def _removed_tree(original: Callable[..., Any]) -> Callable[..., Any]:
    def rmtree(path: Any, ignore_errors: bool = False, onerror: Any = None, *args: Any,
               **kwargs: Any) -> None:
        full = _key(path) if kwargs.get("dir_fd") is None else None
        if full is None:
            return original(path, ignore_errors, onerror, *args, **kwargs)  # type: ignore[no-any-return]
        assert _ACTIVE is not None
        try:
            if not _ACTIVE.exists(full):
                raise missing(path)
            where = _ACTIVE.resolve(full) or full
            if real_islink(where):
                raise OSError("Cannot call rmtree on a symbolic link")
            if not real_isdir(where):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            _ACTIVE.remove_tree(full)
        except OSError as exc:
            if ignore_errors:
                return None
            handler = kwargs.get("onexc") or onerror
            if handler is None:
                raise
            handler(os.rmdir, path, exc if kwargs.get("onexc") else sys.exc_info())
        return None
    return rmtree


def _changing(original: Callable[..., Any]) -> Callable[..., Any]:
    """``os.truncate``, ``os.chmod``, ``os.utime``: a file's scratch copy (made from the real one) is
    changed; a directory's mode and times are left as they are."""
    def change(path: Any, *args: Any, **kwargs: Any) -> Any:
        full = _key(path) if kwargs.get("dir_fd") is None else None
        if full is None:
            return original(path, *args, **kwargs)
        assert _ACTIVE is not None
        if not _ACTIVE.exists(full):
            raise missing(path)
        if _ACTIVE.is_dir(full):
            return None
        return original(_same_kind(path, _ACTIVE.for_write(full, copy=True, given=path)), *args, **kwargs)
    return change


def _linked(original: Callable[..., Any], symbolic: bool) -> Callable[..., Any]:
    """``os.symlink`` (made in the scratch area) and ``os.link`` (a copy there: a hard link to a real file
    would let a later write in place change it)."""
    def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        full = _key(dst) if kwargs.get("dir_fd") is None and kwargs.get("dst_dir_fd") is None else None
        if full is None:
            return original(src, dst, *args, **kwargs)  # type: ignore[no-any-return]
        assert _ACTIVE is not None
        if _ACTIVE.exists(full):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
        target = _ACTIVE.for_write(full, given=dst)
        if symbolic:
            return original(src, target, *args, **kwargs)  # type: ignore[no-any-return]
        source = _read(src)
        copy_file(os.fsdecode(source), target)
        return None
    return link


_OS_PATCHES: tuple[tuple[str, Callable[[Callable[..., Any]], Callable[..., Any]]], ...] = (
    ("open", _os_opened), ("stat", _reading), ("lstat", _reading), ("access", _accessed),
    ("readlink", _reading), ("listdir", _listed), ("scandir", _scanned),
    ("remove", lambda o: _removing(o, False)), ("unlink", lambda o: _removing(o, False)),
    ("rmdir", lambda o: _removing(o, True)), ("mkdir", _made_dir), ("rename", _renamed),
    ("replace", _renamed), ("truncate", _changing), ("chmod", _changing), ("utime", _changing),
    ("symlink", lambda o: _linked(o, True)), ("link", lambda o: _linked(o, False)),
)
"""The ``os`` functions patched, each with the maker of its wrapper (those this platform has)."""


# -- writers in C and Rust -----------------------------------------------------------------------------

def _path_arg(original: Callable[..., Any], write: bool, position: int = 0,
              keyword: str = "") -> Callable[..., Any]:
    """A function whose ``position``-th argument (or ``keyword``) is a path C code opens itself: given
    the scratch path (``write``: where a write goes, else what a read sees)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        given = kwargs.get(keyword) if keyword and keyword in kwargs else (
            args[position] if len(args) > position else None)
        if given is None or isinstance(given, int) or not (isinstance(given, str | bytes)
                                                            or hasattr(given, "__fspath__")):
            return original(*args, **kwargs)
        full = _key(given)
        if full is None:
            return original(*args, **kwargs)
        assert _ACTIVE is not None
        mapped = _ACTIVE.for_write(full, given=given) if write else _read(given)
        mapped = os.fsdecode(mapped) if not isinstance(given, bytes) else mapped
        if keyword and keyword in kwargs:
            kwargs[keyword] = mapped
        else:
            args = (*args[:position], mapped, *args[position + 1:])
        return original(*args, **kwargs)
    return call


def _from_file(original: Callable[..., Any]) -> Callable[..., Any]:
    """``UntypedStorage.from_file(filename, shared, nbytes)`` (torch.load's ``mmap=True``): a shared map
    writes the file, so it maps the scratch copy."""
    def from_file(filename: Any, shared: Any = False, *args: Any, **kwargs: Any) -> Any:
        full = _key(filename)
        if full is None:
            return original(filename, shared, *args, **kwargs)
        assert _ACTIVE is not None
        if shared:
            if not _ACTIVE.exists(full):
                raise missing(filename)
            return original(_ACTIVE.for_write(full, copy=True, given=filename), shared, *args, **kwargs)
        return original(os.fsdecode(_read(filename)), shared, *args, **kwargs)
    return from_file


def _c_writers() -> list[Patch]:
    """torch's writers and readers that open a path in C++ (those this torch has)."""
    import torch
    import torch.serialization as serialization

    out: list[Patch] = []
    if hasattr(serialization, "_open_zipfile_writer"):
        out.append((serialization, "_open_zipfile_writer", lambda o: _path_arg(o, True)))
    for owner in (torch, serialization):
        out.append((owner, "load", lambda o: _path_arg(o, False, 0, "f")))
    if hasattr(torch.UntypedStorage, "from_file"):  # TypedStorage.from_file calls it
        out.append((torch.UntypedStorage, "from_file", _from_file))
    if hasattr(torch, "from_file"):
        out.append((torch, "from_file", lambda o: _from_file_function(o)))
    return out


def _from_file_function(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.from_file(filename, shared=None, size=0, ...)``."""
    def from_file(filename: Any, shared: Any = None, *args: Any, **kwargs: Any) -> Any:
        full = _key(filename)
        if full is None:
            return original(filename, shared, *args, **kwargs)
        assert _ACTIVE is not None
        if shared:
            return original(_ACTIVE.for_write(full, copy=True, given=filename), shared, *args, **kwargs)
        return original(os.fsdecode(_read(filename)), shared, *args, **kwargs)
    return from_file


def _safetensors_patches(name: str) -> list[Patch]:
    """safetensors' Rust writer and reader, by the names module ``name`` calls them (``save_file`` calls
    its module's ``serialize_file``, ``load_file`` its ``safe_open``)."""
    module = sys.modules[name]
    out: list[Patch] = []
    if callable(getattr(module, "serialize_file", None)):
        out.append((module, "serialize_file", lambda o: _path_arg(o, True, 1, "filename")))
    if callable(getattr(module, "safe_open", None)):
        out.append((module, "safe_open", lambda o: _path_arg(o, False, 0, "filename")))
    return out


# -- the audit hook ------------------------------------------------------------------------------------

_WRITE_EVENTS = frozenset({"open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree",
                           "os.truncate", "os.chmod", "os.utime", "os.link", "os.symlink"})
_HOOKED = False


def _paths_written(event: str, args: tuple[Any, ...]) -> list[Any]:
    """The paths an audit event writes that can be told (none for an ``open`` for reading, nor for a path
    relative to a directory descriptor)."""
    args = tuple(args)
    if event == "open":
        flags = args[2] if len(args) > 2 else None
        return [args[0]] if isinstance(flags, int) and flags & WRITE_FLAGS else []
    if event == "os.rename":  # src, dst, src_dir_fd, dst_dir_fd
        return [args[i] for i in (0, 1) if len(args) > i + 2 and args[i + 2] is None]
    if event == "os.link":  # src, dst, src_dir_fd, dst_dir_fd
        return [args[1]] if len(args) > 3 and args[3] is None else []
    if event == "os.symlink":  # src, dst, dir_fd
        return [args[1]] if len(args) > 2 and args[2] is None else []
    if event == "os.truncate":  # path, length
        return [args[0]] if args else []
    # os.remove, os.rmdir, shutil.rmtree (path, dir_fd); os.mkdir, os.chmod (path, mode, dir_fd);
    # os.utime (path, times, ns, dir_fd)
    return [args[0]] if args and args[-1] is None else []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """The net under the patches: a write Python makes to a protected path while a run is active, that
    the patches did not redirect, is refused and recorded. A cheap no-op outside a run."""
    overlay = _ACTIVE
    if overlay is None or event not in _WRITE_EVENTS:
        return
    for path in _paths_written(event, args):
        try:
            full = _key(path)
        except (TypeError, ValueError):  # not a path the overlay could have redirected either
            continue
        if full is None:
            continue
        overlay.record_blocked(full)
        raise PermissionError(errno.EACCES, f"placecheck run refused a write to {full} that got past its "
                              "scratch area (your files are never changed; see the report)", path)


def _hook_once() -> None:
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True


# -- a run -------------------------------------------------------------------------------------------

_OWN = frozenset({"placecheck.run.overlay", "placecheck.run.redirect", "placecheck.run.scratch"})
"""The modules whose references to the real functions are theirs to keep: the overlay's own calls."""


def _captured(originals: dict[Any, Any], skip: frozenset[str]) -> list[tuple[object, str, Any]]:
    """``(module, name, replacement)`` for every module-level name bound to a patched original (a key of
    ``originals``) before the run (``from os import remove``): patched too. The owners patched themselves
    are in ``skip``. Only functions and classes are looked up (no ``id()``, which is an audit event, and
    no other object's ``__hash__``)."""
    out: list[tuple[object, str, Any]] = []
    kinds = {types.BuiltinFunctionType, types.FunctionType, type}
    for name, module in list(sys.modules.items()):
        if module is None or name in skip or name in _OWN:
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        for attr, value in list(namespace.items()):
            if type(value) in kinds:  # not isinstance: a deprecated object warns when its class is read
                try:
                    found = originals.get(value)
                except TypeError:
                    continue
                if found is not None:
                    out.append((module, attr, found))
    return out


@contextlib.contextmanager
def protected(overlay: Overlay) -> Iterator[Overlay]:
    """The script's writes go to ``overlay`` for the block: every patch installed (and undone after), the
    audit hook armed, no bytecode written."""
    global _ACTIVE
    _hook_once()
    replaced: dict[Any, Any] = {}  # original -> its wrapper
    with contextlib.ExitStack() as stack:
        def install(owner: object, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]],
                    why: str = _WHY) -> None:
            original = getattr(owner, name, None)
            if original is None:
                return
            wrapper = make(original)
            stack.enter_context(patch(owner, name, wrapper, why))
            with contextlib.suppress(TypeError):
                replaced.setdefault(original, wrapper)

        install(builtins, "open", _opened)
        stack.enter_context(patch(io, "open", builtins.open, _WHY))  # the same function, named twice
        for name, make in _OS_PATCHES:
            if hasattr(os, name):
                install(os, name, make)
        install(shutil, "rmtree", _removed_tree)
        import glob

        globber = getattr(glob, "_StringGlobber", None)  # 3.13: pathlib's glob, with os's functions taken
        for name in ("lstat", "scandir"):
            if globber is not None and isinstance(vars(globber).get(name), staticmethod):
                stack.enter_context(patch(globber, name, staticmethod(getattr(os, name)), _WHY))
        if "torch" in sys.modules:
            for owner, name, make in _c_writers():
                install(owner, name, make, _WHY_C)
        for package in ("safetensors", "safetensors.torch", "safetensors.numpy"):
            if package in sys.modules:  # imported before the run: a library may hold its safe_open
                for owner, name, make in _safetensors_patches(package):
                    install(owner, name, make, _WHY_C)
            else:
                stack.enter_context(patched_once_imported(
                    package, functools.partial(_safetensors_patches, package), _WHY_C))
        for module, attr, wrapper in _captured(replaced, frozenset({"builtins", "io", "os", "posix", "nt",
                                                                      "shutil", "_io", "posixpath"})):
            with contextlib.suppress(AttributeError, TypeError):
                stack.enter_context(patch(module, attr, wrapper, _WHY))
        bytecode = sys.dont_write_bytecode
        sys.dont_write_bytecode = True
        previous, _ACTIVE = _ACTIVE, overlay
        try:
            yield overlay
        finally:
            _ACTIVE = previous
            sys.dont_write_bytecode = bytecode
