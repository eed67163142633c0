"""Reading what a script wrote under ``placecheck run``: its writes land in the scratch area, never in
the test's files (:mod:`placecheck.run.scratch`); a test that reads one runs with ``keep_scratch=True``
(``--keep-scratch``) and finds it through the report's ``writes``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TREE = f"{os.sep}tree{os.sep}"


def kept(writes: Iterable[Any], path: str | Path) -> Path:
    """Where the kept scratch area holds what the script wrote to ``path`` (``writes``: a report's, or
    the JSON report's list of dicts)."""
    for write in writes:
        item = write if isinstance(write, dict) else {"path": write.path, "scratch": write.scratch}
        if item["path"] == str(path):
            assert item["scratch"], f"{path} was written, but the scratch area was not kept"
            return Path(item["scratch"])
    raise AssertionError(f"the script wrote no {path}: {list(writes)}")


def remove_kept(writes: Iterable[Any]) -> None:
    """Remove the kept scratch areas ``writes`` name."""
    for write in writes:
        scratch = write["scratch"] if isinstance(write, dict) else write.scratch
        if TREE in scratch:
            shutil.rmtree(scratch[:scratch.index(TREE)], ignore_errors=True)
