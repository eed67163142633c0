"""Source attribution: which line of the user's code, and which module's forward, an event belongs to.

A finding's ``source`` is the innermost frame outside torch, placecheck, the
standard library and installed packages (site-packages); in ``audit`` never a
frame outside the forward; its ``where`` is the module whose ``forward`` ran
that line. Every command asks the same questions here: ``audit``'s tracer,
``placecheck run``'s recorder (:func:`here`, :func:`user_line`) and the
data-dependent ops of the fake engine (:func:`first_outside`); one
:func:`display_path` writes the line. Which files are torch's or placecheck's
own, and which installed package a file belongs to, is cached per file name:
the Python stack is walked only when an event is recorded.

This module imports no other placecheck module: the classifier, the engines
and the tracer all build on it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType, FrameType, TracebackType
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.values import Site
from placecheck.findings.events import EventSite

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PACKAGE = sys.modules[__name__.partition(".")[0]]  # the package root, imported before any module of it
PLACECHECK_DIR = os.path.dirname(os.path.abspath(str(_PACKAGE.__file__))) + os.sep
"""placecheck's own package: its files are placecheck's machinery (but its examples, which are user code)."""
_EXAMPLES_DIR = PLACECHECK_DIR + "examples" + os.sep
"""placecheck's examples are user code: the README runs them, and an audit of one reports its lines."""
_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__)) + os.sep
"""The standard library (contextlib's, functools' and unittest.mock's call wrappers among it)."""
_USER_FILES: set[str] = set()
"""Files inside placecheck's package that hold code under audit (see :func:`treat_as_user_code`)."""


def treat_as_user_code(*classes: type) -> None:
    """The files defining ``classes`` (the model's module classes) are the user's code.

    The code under audit is user code by definition, even when it lives in
    placecheck's own package (the examples an audit runs): its lines are a
    finding's ``source``, not frames of the tool. Only files inside placecheck
    need saying so; torch's classes are never the user's.
    """
    for cls in classes:
        try:
            filename = inspect.getsourcefile(cls) or ""
        except (OSError, TypeError):
            continue
        if os.path.abspath(filename).startswith(PLACECHECK_DIR):
            _USER_FILES.update((filename, os.path.abspath(filename)))


def is_internal(code: CodeType) -> bool:
    """True for torch's, placecheck's and the standard library's own frames; not the code under audit.

    The one decision of which frames are the tool's and the framework's, for every command: ``audit``'s
    tracer (:class:`Attribution`), ``placecheck run``'s recorder (:func:`user_frame`, :func:`here`) and
    the data-dependent ops (:func:`first_outside`) all ask it. Installed packages are not internal but
    not the user's either (:func:`library_package`); :func:`frame_kind` answers both questions.
    """
    return _internal_name(code.co_filename)


def _internal_name(name: str) -> bool:
    return _machinery_file(name) and name not in _USER_FILES


@functools.cache
def _machinery_file(name: str) -> bool:
    # cached per file name: the stack is walked often. Not per code object: code objects compare
    # equal across files (co_filename is not compared), so a copy of an example's file would read as
    # the example (placecheck's own directory) and its frames as the tool's
    return _machinery(name)


def placecheck_file(name: str) -> bool:
    """True for a file of placecheck's own machinery (its examples are user code)."""
    absolute = os.path.abspath(name)
    return absolute.startswith(PLACECHECK_DIR) and not absolute.startswith(_EXAMPLES_DIR)


def internal_file(name: str) -> bool:
    """True for a file of torch, of placecheck's own machinery, or of the standard library."""
    return _machinery(name) and name not in _USER_FILES and os.path.abspath(name) not in _USER_FILES


def _machinery(name: str) -> bool:
    if name.startswith("<"):
        return name.startswith("<frozen")  # <string>, <stdin>: code the user handed to exec
    absolute = os.path.abspath(name)
    if absolute.startswith(_EXAMPLES_DIR):
        return False
    if absolute.startswith((_TORCH_DIR, PLACECHECK_DIR)):
        return True
    # site-packages may live inside the standard library's directory (a Python without a virtualenv)
    return absolute.startswith(_STDLIB_DIR) and not absolute.startswith(_SITE_DIRS)


def display_path(filename: str) -> str:
    """``filename`` relative to the working directory when it is under it."""
    return _display_path(filename, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _display_path(filename: str, cwd: str) -> str:
    # cached: a model with thousands of modules asks for the same few files at every assignment
    try:
        rel = os.path.relpath(filename, cwd)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def _site_dirs() -> tuple[str, ...]:
    """Where installed packages live: sysconfig's purelib/platlib and site's package directories."""
    import site
    import sysconfig

    dirs = {sysconfig.get_paths().get(k, "") for k in ("purelib", "platlib")}
    with contextlib.suppress(AttributeError):  # site.getsitepackages is missing in some virtualenvs
        dirs.update(site.getsitepackages())
    return tuple(sorted(os.path.abspath(d) + os.sep for d in dirs if d))


_SITE_DIRS = _site_dirs()


def library_package(code: CodeType) -> str:
    """The installed package ``code`` belongs to ("torchvision"), or "" for the user's own code.

    A file in site-packages/dist-packages is library code, unless the working
    directory is inside that package (a package audited in place). A project's
    own virtualenv under the working directory is still installed code; an
    editable install's files are outside site-packages anyway. Cached per file name (not per code
    object: equal code objects of two files compare equal).
    """
    return library_of_file(code.co_filename)


MACHINERY, LIBRARY, USER = 0, 1, 2
"""What :func:`frame_kind` tells a frame's code apart as."""


def frame_kind(code: CodeType, working_directory: str) -> int:
    """:data:`MACHINERY` (torch's, placecheck's: :func:`is_internal`), :data:`LIBRARY` (an installed
    package's: :func:`library_package`) or :data:`USER`, in one cached lookup per file, for stack walks
    that ask both questions of every frame (``working_directory``: ``os.getcwd()``, read once per walk)."""
    return _kind_of_file(code.co_filename, working_directory, len(_USER_FILES))


@functools.lru_cache(maxsize=4096)
def _kind_of_file(filename: str, working_directory: str, user_files: int) -> int:
    # user_files: the size of _USER_FILES, which only grows; a new user file is a new key
    if _internal_name(filename):
        return MACHINERY
    return LIBRARY if _library_of(filename, working_directory) else USER


def library_of_file(filename: str) -> str:
    """The installed package ``filename`` belongs to, or "" (see :func:`library_package`)."""
    return _library_of(filename, os.getcwd())


@functools.cache
def _library_of(filename: str, working_directory: str) -> str:
    name = os.path.abspath(os.path.join(working_directory, filename))
    cwd = working_directory + os.sep
    for base in _SITE_DIRS:
        # a project's own virtualenv (./.venv) is still installed code; working inside
        # site-packages itself (auditing an installed package in place) is not
        if name.startswith(base) and not (cwd.startswith(base) and name.startswith(cwd)):
            return name[len(base):].split(os.sep, 1)[0].removesuffix(".py")
    return ""


def is_users(code: CodeType) -> bool:
    """True for a frame of the user's own code: neither internal (:func:`is_internal`) nor an installed
    package's (:func:`library_package`)."""
    return not is_internal(code) and not library_package(code)


@dataclass(frozen=True, slots=True)
class Frames:
    """Who made the call at a frame, read from the stack once (:func:`frames`)."""

    caller: FrameType | None
    """The innermost frame outside placecheck's own machinery: torch's, a library's or the user's."""
    first_outside: FrameType | None
    """The innermost frame outside torch and placecheck: the user's code, or an installed package's."""
    user: FrameType | None
    """The innermost frame of the user's own code (:func:`is_users`)."""
    callee: FrameType | None
    """The frame ``user``'s line called into (None when ``user`` is the frame the scan began at)."""


def own_file(filename: str) -> bool:
    """placecheck's own machinery (its examples, and files holding the code under audit, are not)."""
    return _own_file(filename, len(_USER_FILES))


@functools.lru_cache(maxsize=4096)
def _own_file(filename: str, user_files: int) -> bool:
    # user_files: the size of _USER_FILES, which only grows; a new user file is a new key
    return os.path.abspath(filename).startswith(PLACECHECK_DIR) and internal_file(filename)


def frames(frame: FrameType | None, stop: CodeType | None = None) -> Frames:
    """The one walk of the stack that attributes a call: from ``frame`` outwards, no further than a
    frame running ``stop`` (the forward's runner, for ``audit``), to the innermost frame of the user's
    code. Every site of every command is read from it: :class:`Attribution` (``audit``), :func:`here`
    and :func:`user_frame` (``run``), :func:`first_outside` (the data-dependent ops) and
    ``run``'s library callers."""
    cwd = os.getcwd()
    caller = outside = user = callee = inner = None
    scan = frame
    while scan is not None and scan.f_code is not stop:
        code = scan.f_code
        if caller is None and not own_file(code.co_filename):
            caller = scan
        kind = frame_kind(code, cwd)
        if kind != MACHINERY:
            outside = outside or scan
            if kind == USER:
                user, callee = scan, inner
                break
        inner = scan
        scan = scan.f_back
    return Frames(caller, outside, user, callee)


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame of the user's own code (:func:`is_users`) at or outside ``frame``."""
    return frames(frame).user


def first_outside(frame: FrameType | None) -> FrameType | None:
    """The innermost frame outside torch and placecheck at or outside ``frame``: the user's code, or an
    installed package's."""
    return frames(frame).first_outside


def where_is(frame: FrameType | None) -> str:
    """``file:line`` of ``frame`` as the user would type it ("" for none)."""
    if frame is None:
        return ""
    return f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def here() -> tuple[str, FrameType | None]:
    """``(file:line, frame)`` of the innermost user frame around the caller; ``("", None)`` when none.

    For events outside any one forward (``placecheck run``'s whole script): no frame bounds the search,
    unlike :meth:`Attribution.site`.
    """
    frame = user_frame(sys._getframe(1))
    return (where_is(frame), frame)


def frames_of(tb: TracebackType | None) -> list[FrameType]:
    """The frames of a traceback, outermost first."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def user_line(exc: BaseException) -> str:
    """``file:line`` of the innermost user frame in ``exc``'s traceback: outside installed packages
    when there is one, else the innermost outside torch and placecheck ("" when none)."""
    frames = [f for f in frames_of(exc.__traceback__) if not is_internal(f.f_code)]
    frames = [f for f in frames if not library_package(f.f_code)] or frames
    if not frames:
        return ""
    tb = exc.__traceback__
    line = 0
    while tb is not None:
        if tb.tb_frame is frames[-1]:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f"{display_path(frames[-1].f_code.co_filename)}:{line}"



_CALL_CODES = frozenset({nn.Module._call_impl.__code__, nn.Module._wrapped_call_impl.__code__})
"""``Module.__call__``'s frames: the innermost one on the stack names the module whose forward runs."""


class Attribution:
    """Turns a Python frame into a :class:`EventSite` for one traced forward.

    ``stop`` is the code object of the function that ran the forward: the
    search for the user's line never looks beyond it. ``module_paths`` maps
    ``id(module)`` to its dotted path; a module the forward calls that is not
    registered (held in a plain list) is named when it is first seen running
    (:meth:`module_path`).
    """

    def __init__(self, stop: CodeType, module_paths: dict[int, str],
                 unregistered: Callable[[nn.Module], str] | None = None) -> None:
        self.stop = stop
        self.module_paths = module_paths
        self.unregistered = unregistered

    def site(self, frame: FrameType | None, subject: Any = None) -> EventSite:
        """Where the call at ``frame`` happened, looking outwards no further than the forward.

        ``source`` is the innermost frame outside torch, placecheck and
        installed packages; with none, the innermost line in an installed
        package (``library`` names it); with none either (torch code called from
        torch modules), the definition of the module's class when that is the
        user's, else "". ``where`` is the module whose forward ran that line:
        the innermost ``Module.__call__`` on the stack outside it (with no
        source, the innermost one: torch's own modules included). ``subject``: the tensor the event is
        about (the one synced or copied); ``api`` is set when the user's line called a torch (or
        installed) function that acted on a tensor other than the arguments it was given
        (:func:`api_call`).
        """
        found = frames(frame, self.stop)
        user = found.user
        shown = user or found.first_outside
        module = self.running_module(shown or frame)
        where = self.module_path(module) if module is not None else ""
        if shown is not None:
            return EventSite(Site(display_path(shown.f_code.co_filename), shown.f_lineno), where,
                        "" if user is not None else library_package(shown.f_code),
                        api=api_call(found.callee, subject) if subject is not None else "")
        return EventSite(class_definition(module), where)

    def module_path(self, module: nn.Module) -> str:
        """The dotted path of ``module``: registered, or named by the caller's ``unregistered``."""
        path = self.module_paths.get(id(module))
        if path is None:
            path = self.unregistered(module) if self.unregistered is not None else ""
        return path

    def running_module(self, frame: FrameType | None) -> nn.Module | None:
        """The module whose ``Module.__call__`` is innermost on the stack from ``frame`` out (a module
        of the model, or one the forward runs that the model holds unregistered)."""
        while frame is not None and frame.f_code is not self.stop:
            if frame.f_code in _CALL_CODES:
                candidate = frame.f_locals.get("self")
                if isinstance(candidate, nn.Module) and (
                        id(candidate) in self.module_paths
                        or (self.unregistered is not None and self.unregistered(candidate))):
                    return candidate
            frame = frame.f_back
        return None


_TENSOR_FILES = frozenset(os.path.join(os.path.dirname(torch.__file__), name)
                          for name in ("_tensor.py", "_tensor_str.py", "overrides.py", "functional.py"))
"""torch's Python methods of ``Tensor`` (printing, ``__format__``, ``__contains__``...), its dispatch to
torch function modes, and torch/functional.py's thin wrappers of single ops (``torch.unique``): what
happens there is the user's own call on the user's tensor, not an API's work."""


def _same_storage(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are tensors on one storage (``b`` an element or a view of ``a``)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.device != b.device:
        return False
    try:
        return bool(a.untyped_storage()._cdata == b.untyped_storage()._cdata)
    except Exception:  # a tensor without a storage of its own (a subclass may refuse to say)
        return False


def api_call(callee: FrameType | None, subject: Any) -> str:
    """``pad_packed_sequence (torch)`` when ``callee`` (the frame the user's line called) is a function of
    torch or of an installed package (not a module's ``__call__``, not a ``Tensor`` method) and
    ``subject`` is none of its arguments: the API did this by itself; else ""."""
    if callee is None or callee.f_code in _CALL_CODES:
        return ""
    filename = callee.f_code.co_filename
    if placecheck_file(filename) or os.path.abspath(filename) in _TENSOR_FILES:
        return ""
    package = library_of_file(filename) or ("torch" if os.path.abspath(filename).startswith(_TORCH_DIR)
                                            else "")
    if not package:
        return ""
    code = callee.f_code
    count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) \
        + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    arguments = [callee.f_locals.get(name) for name in code.co_varnames[:count]]
    passed = [a for arg in arguments for a in (arg.values() if isinstance(arg, dict) else
                                                arg if isinstance(arg, tuple) and not hasattr(arg, "_fields")
                                                else (arg,))]
    if any(a is subject or _same_storage(a, subject) for a in passed):
        return ""  # the API acted on what the user passed in: the user can pass it where it is wanted
    name: str = getattr(code, "co_qualname", code.co_name)
    return f"{name.split('.<locals>', 1)[0]} ({package})"


def library_of_class(cls: type) -> str:
    """The installed package that defines ``cls`` ("transformers"), or "" (the user's, or unknown)."""
    try:
        filename = inspect.getsourcefile(cls) or ""
    except (OSError, TypeError):
        return ""
    return library_of_file(filename) if filename else ""


def class_definition(module: nn.Module | None) -> Site:
    """``file:line`` of ``module``'s class when it is the user's own (``Site()`` for torch's classes)."""
    if module is None:
        return Site()
    cls = type(module)
    try:
        filename = inspect.getsourcefile(cls) or ""
        line = inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return Site()
    if not filename or internal_file(filename) or library_of_file(filename):
        return Site()
    return Site(display_path(filename), line)


def module_being_built(frame: FrameType | None) -> str:
    """``nn.Linear`` when the call came from an ``nn.Module.__init__`` called by user code."""
    building = ""
    while frame is not None and is_internal(frame.f_code):
        if frame.f_code.co_name == "__init__":
            obj: Any = frame.f_locals.get("self")
            if isinstance(obj, nn.Module):
                building = f"nn.{type(obj).__name__}" if type(obj).__module__.startswith("torch.") \
                    else type(obj).__name__
        frame = frame.f_back
    return building
