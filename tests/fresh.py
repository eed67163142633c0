"""Run a check in a fresh interpreter, as ``placecheck run`` does from the command line.

A script that forks (``mp.Process`` with the fork start method, DataLoader
workers) inherits the process it runs in. In a pytest worker that process has
already run hundreds of other checks, and once autograd's device threads have
started in it PyTorch refuses a backward in every forked child ("Unable to
handle autograd's threading in combination with fork-based multiprocessing"),
which no user's fresh ``placecheck run`` would see. Tests of forking scripts call
:func:`fresh` so their result does not depend on which tests ran before them.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def _as_a_command_line(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # a process spawned by multiprocessing inherits the spawn start method as its default; a command
    # line's interpreter has the platform's (fork on Linux), which the scripts' workers use
    multiprocessing.set_start_method(None, force=True)
    return func(*args, **kwargs)


def fresh(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` in a new interpreter (spawned, in this working directory)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_as_a_command_line, func, args, kwargs).result()
