"""The one walk of the stack that attributes a call (``sources.frames``): which frame is placecheck's,
torch's, an installed package's or the user's, on chains of frames whose code reads as each of those
files (this file is the user's)."""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import typer

import placecheck
from placecheck.engines.sources import Frames, first_outside, frames, user_frame

PLACECHECK_FILE = os.path.join(os.path.dirname(placecheck.__file__), "engines", "dispatch.py")
TORCH_FILE = os.path.join(os.path.dirname(torch.__file__), "functional.py")
LIBRARY_FILE = os.path.join(os.path.dirname(typer.__file__), "main.py")


def _functions(**sources: tuple[str, str]) -> dict[str, Any]:
    """Each ``name=(filename, code)``: functions whose frames read as ``filename``'s."""
    namespace: dict[str, Any] = {"sys": sys, "frames": frames, "user_frame": user_frame,
                                 "first_outside": first_outside}
    for filename, code in sources.values():
        exec(compile(code, filename, "exec"), namespace)
    return namespace


def _file(frame: Any) -> str:
    return "" if frame is None else frame.f_code.co_filename


def test_the_walk_tells_placecheck_torch_a_library_and_the_user_apart() -> None:
    # this test calls the library, which calls torch, which calls placecheck's machinery
    f = _functions(probe=(PLACECHECK_FILE, "def probe(stop):\n    return frames(sys._getframe(), stop)\n"),
                   in_torch=(TORCH_FILE, "def in_torch(stop):\n    return probe(stop)\n"),
                   library=(LIBRARY_FILE, "def library(stop):\n    return in_torch(stop)\n"))
    found: Frames = f["library"](None)
    assert _file(found.caller) == TORCH_FILE  # the first frame outside placecheck's machinery
    assert _file(found.first_outside) == LIBRARY_FILE  # the first outside torch and placecheck
    assert _file(found.user) == __file__ and found.user.f_code.co_name == \
        "test_the_walk_tells_placecheck_torch_a_library_and_the_user_apart"
    assert _file(found.callee) == LIBRARY_FILE  # the frame the user's line called into


def test_the_user_calling_torch_directly_is_the_caller_and_the_first_outside() -> None:
    f = _functions(probe=(PLACECHECK_FILE, "def probe():\n    return frames(sys._getframe())\n"),
                   in_torch=(TORCH_FILE, "def in_torch():\n    return probe()\n"))
    found: Frames = f["in_torch"]()
    assert _file(found.caller) == TORCH_FILE
    assert found.first_outside is found.user and _file(found.user) == __file__
    assert _file(found.callee) == TORCH_FILE
    own_only: Frames = f["probe"]()
    assert own_only.caller is own_only.user and _file(own_only.caller) == __file__


def test_the_walk_stops_at_the_runner_of_a_forward() -> None:
    f = _functions(probe=(PLACECHECK_FILE, "def probe(stop):\n    return frames(sys._getframe(), stop)\n"),
                   in_torch=(TORCH_FILE, "def in_torch(stop):\n    return probe(stop)\n"))

    def runner(stop: Any) -> Frames:  # the user's frame is the stop: nothing inside it is the user's
        return f["in_torch"](stop)  # type: ignore[no-any-return]

    stopped = runner(runner.__code__)
    assert _file(stopped.caller) == TORCH_FILE and stopped.user is None and stopped.first_outside is None
    unbounded = runner(None)
    assert unbounded.user is not None and unbounded.user.f_code is runner.__code__


def test_user_frame_and_first_outside_are_views_of_the_walk() -> None:
    f = _functions(probe=(TORCH_FILE, "def probe():\n    me = sys._getframe()\n"
                                      "    return user_frame(me), first_outside(me)\n"),
                   library=(LIBRARY_FILE, "def library():\n    return probe()\n"))
    user, outside = f["library"]()
    assert _file(user) == __file__ and _file(outside) == LIBRARY_FILE
