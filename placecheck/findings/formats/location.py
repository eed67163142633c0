"""Where a finding points in the repository: shared by the CI formats and the baseline.

A finding's ``source`` is ``file:line`` of the user's code (forward-pass
findings). A finding without one (walk findings: the tensor is an attribute,
not a line) points at the model itself: the file its TARGET names.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from placecheck.basics.values import Site

_SITE = re.compile(r"^.*[/\\](?:site|dist)-packages[/\\]")


def split_source(source: str) -> tuple[str, int | None]:
    """``"pkg/net.py:42"`` -> ``("pkg/net.py", 42)``; no line -> ``(source, None)``
    (:meth:`Site.parse <placecheck.basics.values.Site.parse>`)."""
    site = Site.parse(source)
    return site.path, site.line


def repo_path(path: str, root: str | None = None) -> str:
    """A stable, POSIX, repository-relative form of ``path``.

    Relative to ``root`` (the current directory) when inside it; an installed
    package's file is named from its package (``torchvision/models/vgg.py``),
    so the same finding has the same path on every machine.
    """
    if not path:
        return ""
    base = Path(root or os.getcwd()).resolve()
    candidate = Path(path)
    if candidate.is_absolute():
        try:
            return candidate.resolve().relative_to(base).as_posix()
        except ValueError:
            pass
        stripped = _SITE.sub("", str(candidate))
        if stripped != str(candidate):
            return PurePosixPath(stripped.replace("\\", "/")).as_posix()
        return candidate.as_posix()
    return PurePosixPath(path.replace("\\", "/")).as_posix().removeprefix("./")


def target_file(target: str) -> tuple[str, int | None]:
    """The file (and, when it can be found cheaply, the line) a TARGET names.

    ``path/net.py:Net`` -> that file and the line of ``class Net``/``def Net``;
    ``pkg.mod:build`` -> ``pkg/mod.py`` (``pkg/mod/__init__.py`` when that exists).
    Nothing is imported.
    """
    module, sep, attr = target.rpartition(":")
    if not sep:
        return "", None
    if module.endswith(".py") or "/" in module or "\\" in module:
        return repo_path(module), _definition_line(Path(module), attr.split(".")[0])
    as_path = module.replace(".", "/")
    if Path(as_path, "__init__.py").is_file():
        return f"{as_path}/__init__.py", _definition_line(Path(as_path, "__init__.py"), attr.split(".")[0])
    return f"{as_path}.py", _definition_line(Path(f"{as_path}.py"), attr.split(".")[0])


def _definition_line(path: Path, name: str) -> int | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    pattern = re.compile(rf"^\s*(?:class|def)\s+{re.escape(name)}\b|^{re.escape(name)}\s*=")
    for number, line in enumerate(text.splitlines(), start=1):
        if pattern.match(line):
            return number
    return None
