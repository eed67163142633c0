"""Where in the user's script something happened: the innermost frame of their own code.

A run's events come from torch calls made anywhere in the program: the
script's top level, its training loop, a model's forward, a library it
imports. Their ``source`` is the innermost frame outside torch, placecheck,
the standard library and installed packages; placecheck's own examples count
as user code (the README runs one).
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from types import CodeType, FrameType, TracebackType

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PLACECHECK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_EXAMPLES_DIR = _PLACECHECK_DIR + "examples" + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def _site_dirs() -> tuple[str, ...]:
    import site

    dirs = {sysconfig.get_paths().get(k, "") for k in ("purelib", "platlib")}
    if hasattr(site, "getsitepackages"):  # missing in some virtualenvs
        dirs.update(site.getsitepackages())
    return tuple(sorted(os.path.abspath(d) + os.sep for d in dirs if d))


_SITE_DIRS = _site_dirs()


def _installed(filename: str) -> bool:
    """In site-packages, unless the working directory is inside it (a package run in place)."""
    name = os.path.abspath(filename)
    cwd = os.getcwd() + os.sep
    return any(name.startswith(base) and not (cwd.startswith(base) and name.startswith(cwd))
               for base in _SITE_DIRS)


# torch's own dispatch of a Tensor method to a torch function mode (Tensor.__format__ -> overrides):
# the call is still the caller's
_DISPATCH_FILES = frozenset(os.path.join(os.path.dirname(torch.__file__), name)
                            for name in ("overrides.py", "_tensor.py"))


def display_path(filename: str) -> str:
    """``filename`` relative to the working directory when it is under it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def is_foreign(code: CodeType) -> bool:
    """True for frames that are not the user's: torch, placecheck, the stdlib, installed packages."""
    return _foreign_file(code.co_filename)


@functools.cache
def _foreign_file(name: str) -> bool:
    # per file name, not per code object: code objects of two files with the same text compare equal
    if name.startswith("<"):
        return name.startswith("<frozen")
    absolute = os.path.abspath(name)
    if absolute.startswith(_EXAMPLES_DIR):
        return False
    return absolute.startswith((_TORCH_DIR, _STDLIB_DIR, _PLACECHECK_DIR)) or _installed(absolute)


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame of the user's code at or outside ``frame``."""
    while frame is not None and is_foreign(frame.f_code):
        frame = frame.f_back
    return frame


def here() -> tuple[str, FrameType | None]:
    """``(file:line, frame)`` of the innermost user frame around the caller; ``("", None)`` when none."""
    frame = user_frame(sys._getframe(1))
    return (where_is(frame), frame)


def _own(filename: str) -> bool:
    absolute = os.path.abspath(filename)
    return absolute.startswith(_PLACECHECK_DIR) and not absolute.startswith(_EXAMPLES_DIR)


def called_from_user() -> str:
    """``file:line`` when the torch call being handled was made by the user's code itself (not by
    torch or a library on its behalf, as ``nn.Linear.__init__`` calls ``torch.empty``); else ""."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and _own(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None or is_foreign(frame.f_code):
        return ""
    return where_is(frame)


def library_caller() -> str:
    """The function (``GradScaler.step``) that made the torch call being handled, when it is not the
    user's own code but torch's or a library's called from it; "" when the user made the call."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and (_own(frame.f_code.co_filename)
                                 or os.path.abspath(frame.f_code.co_filename) in _DISPATCH_FILES):
        frame = frame.f_back
    if frame is None or not is_foreign(frame.f_code):
        return ""
    name: str = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    name = name.split(".<locals>", 1)[0]
    package = _package_of(frame.f_code.co_filename)
    return f"{name} ({package})" if package else name


def _package_of(filename: str) -> str:
    """The installed package a file belongs to (``transformers``), "" when none."""
    name = os.path.abspath(filename)
    for base in _SITE_DIRS:
        if name.startswith(base):
            return name[len(base):].split(os.sep, 1)[0].removesuffix(".py")
    return ""


def where_is(frame: FrameType | None) -> str:
    """``file:line`` of ``frame`` as the user would type it ("" for none)."""
    if frame is None:
        return ""
    return f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def raised_at(exc: BaseException) -> str:
    """``file:line`` of the innermost user frame in ``exc``'s traceback ("" when none)."""
    line = ""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        if not is_foreign(tb.tb_frame.f_code):
            line = f"{display_path(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return line


def names_of(value: object, frame: FrameType | None) -> list[str]:
    """The names ``frame``'s locals (then globals) bind to ``value`` itself (identity)."""
    if frame is None:
        return []
    found = [name for name, v in frame.f_locals.items() if v is value and not name.startswith("_")]
    if not found and frame.f_globals is not frame.f_locals:
        found = [name for name, v in frame.f_globals.items() if v is value and not name.startswith("_")]
    return found
