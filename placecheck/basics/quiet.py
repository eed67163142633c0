"""Quieting a library's own log lines (and warnings) while placecheck runs its code.

Torch, its fake tensors and accelerate log or warn about what the simulation
means to do (GPUs that are not there, an error placecheck reports itself as a
finding); the user is owed placecheck's one line, not theirs. Torch-free.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet(logger: str, level: int = logging.CRITICAL, *, warnings_too: bool = False) -> Iterator[None]:
    """While the block runs, ``logger`` logs only records above ``level`` (``CRITICAL + 1``: none);
    ``warnings_too`` also ignores every warning. Both are restored afterwards."""
    log = logging.getLogger(logger)
    before = log.level
    log.setLevel(level)
    try:
        with warnings.catch_warnings() if warnings_too else contextlib.nullcontext():
            if warnings_too:
                warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(before)
