"""Turning a ``TARGET`` string and its arguments into an ``nn.Module``.

``TARGET`` is ``pkg.module:attr`` (importable from the current directory) or
``path/to/file.py:attr``; ``attr`` may be dotted. It names a module instance,
an ``nn.Module`` subclass, or a callable returning a module. Every failure is
a :class:`~placecheck.basics.errors.LoadError` with one line saying what to do,
``sys.exit()`` from script code (argparse at import time) included.

A file inside a package (directories with ``__init__.py``) is imported by its
dotted name, so its relative and package-absolute imports work; a file is
imported once per process, however many times the audit builds the model.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import io
import json
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from placecheck.basics.errors import LoadError, UsageError, one_line

TARGET_HELP = "MODULE:ATTR (e.g. torchvision.models:resnet18) or path/to/file.py:ATTR"


def _a(noun: str) -> str:
    """``"a list"``, ``"an int"``: the article English wants before a type name."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def parse_value(text: str) -> Any:
    """``--arg`` values: int, float, bool, None, else the string itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_kwargs(kwargs_json: str | None, args: Iterable[str] = ()) -> dict[str, Any]:
    """Merge ``--kwargs`` (a JSON object) and repeated ``--arg key=value``; ``--arg`` wins."""
    out: dict[str, Any] = {}
    if kwargs_json is not None:
        if not kwargs_json.strip():
            raise UsageError("--kwargs is empty: pass a JSON object such as "
                             """'{"num_classes": 10}', or leave the option out""")
        try:
            data = json.loads(kwargs_json)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--kwargs is not valid JSON ({exc.msg} at column {exc.colno}): "
                             """pass an object such as '{"num_classes": 10}'""") from exc
        if not isinstance(data, dict):
            raise UsageError(f"--kwargs must be a JSON object such as "
                             f"""'{{"num_classes": 10}}', not {_a(type(data).__name__)}""")
        out.update(data)
    for item in args:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(f"--arg {item!r} is not KEY=VALUE (e.g. --arg num_classes=10)")
        out[key.strip()] = parse_value(value)
    return out


SCRIPT_COMMANDS = {"audit": "checked with `placecheck run {file}`",
                   "fix": "fixed with `placecheck fix --run {file}`"}
"""What to run instead when a command that takes a model is given a script (a file with no class)."""


def split_target(spec: str, command: str = "audit") -> tuple[str, str]:
    """``"a.b:C.d"`` -> ``("a.b", "C.d")``; the split is on the last colon.

    A target that is not of that form gets an error about what was typed: pytest's ``file.py::Net``
    (use one colon), a file with no ``:ATTR`` (the classes it defines, read with :mod:`ast`, or, for a
    script, the ``command`` that takes scripts).
    """
    if "::" in spec:
        left, _, right = spec.partition("::")
        raise UsageError(f"target {spec!r} has '::' (pytest's form): placecheck's is one colon, "
                         f"{left}:{right}")
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise UsageError(_no_attr_message(spec.rstrip(":") if sep and not attr else spec, command))
    return module, attr


def _no_attr_message(path: str, command: str) -> str:
    """Why ``path`` (no ``:ATTR``) is not a target, and the form that would work."""
    file = Path(path)
    if not file.is_file():
        return f"target {path!r} is not {TARGET_HELP}"
    if file.suffix != ".py":
        return _not_python(path)
    classes = defined_classes(file)
    if classes:
        shown = ", ".join(classes[:12]) + (", ..." if len(classes) > 12 else "")
        return (f"target {path!r} names a file but no model in it: add :CLASS, e.g. {path}:{classes[0]} "
                f"(classes in it: {shown})")
    instead = SCRIPT_COMMANDS.get(command, SCRIPT_COMMANDS["audit"]).format(file=path)
    return (f"{path!r} defines no class: `placecheck {command}` takes a model, {path}:ATTR with ATTR a "
            f"module class or a function returning one; a script is {instead}")


def _not_python(path: str) -> str:
    return f"{path!r} is not a Python file: a target is {TARGET_HELP}"


def defined_classes(file: Path) -> list[str]:
    """The classes ``file`` defines at its top level that could be models, read with :mod:`ast` (the
    file is not imported): those deriving from an ``nn.Module``-looking base (``nn.X``, ``torch.nn.X``,
    ``Module``, a class of the file that is one), else every class; [] when it does not parse."""
    import ast

    try:
        tree = ast.parse(file.read_bytes(), str(file))
    except (SyntaxError, ValueError, OSError):
        return []
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    models: list[str] = []
    for node in classes:
        for base in node.bases:
            text = ast.unparse(base)
            if text in models or text.startswith(("nn.", "torch.nn.")) or text.split(".")[-1] == "Module":
                models.append(node.name)
                break
    return models or [node.name for node in classes]


_GUARD = "guard script code with `if __name__ == '__main__':`"

_FILE_MODULES: dict[tuple[Path, int, int], types.ModuleType] = {}
"""Files already imported, by (resolved path, mtime, size): each runs its top level once."""


def forget_imported_files() -> None:
    """Import every file target again on its next use (a re-audit of edited sources)."""
    _FILE_MODULES.clear()


@contextlib.contextmanager
def _exit_as_load_error(doing: str) -> Iterator[None]:
    """Turn ``sys.exit()`` inside the target's code into a one-line LoadError.

    A script's ``argparse`` (or a bare ``sys.exit(0)``) would otherwise end
    placecheck with the script's status, ``0`` reading as a clean audit in CI.
    What the code writes to stderr is held back and replayed, except when it
    exits: then its last line (argparse's error) goes into the message instead.
    Ctrl-C (KeyboardInterrupt) is not caught.
    """
    held = io.StringIO()
    real_stderr = sys.stderr
    sys.stderr = held
    try:
        yield
    except SystemExit as exc:
        sys.stderr = real_stderr
        said = [line.strip() for line in held.getvalue().splitlines() if line.strip()]
        printed = f" after printing {said[-1]!r}" if said else ""
        raise LoadError(f"{doing} called sys.exit({exc.code!r}){printed}: {_GUARD}") from exc
    finally:
        if sys.stderr is held:
            sys.stderr = real_stderr
            real_stderr.write(held.getvalue())


@contextlib.contextmanager
def _script_default_device() -> Iterator[None]:
    """Run module-level code on the host, as in the user's script, even under ``--init meta``.

    The audit builds a factory's model inside ``torch.device("meta")``; a module
    first imported there would create its module- and class-level tensors on meta.
    """
    torch = sys.modules.get("torch")
    if torch is None or torch.get_default_device().type != "meta":
        yield
        return
    with torch.device("cpu"):
        yield


def _on_path(directory: str) -> None:
    if directory not in sys.path:
        sys.path.insert(0, directory)


def _package_name(path: Path) -> tuple[str, Path] | None:
    """``(dotted name, root directory)`` for a file inside a package; None for a plain file.

    The package is every directory upwards that has an ``__init__.py``; the root
    is the directory holding the outermost one.
    """
    parts = [path.stem]
    directory = path.parent
    while (directory / "__init__.py").is_file() and directory.name.isidentifier():
        parts.insert(0, directory.name)
        if directory.parent == directory:
            break
        directory = directory.parent
    if len(parts) == 1 or not all(part.isidentifier() for part in parts):
        return None
    if path.stem == "__init__":
        parts.pop()
    return ".".join(parts), directory


def _same_file(module: Any, path: Path) -> bool:
    found = getattr(module, "__file__", None)
    return isinstance(found, str) and Path(found).resolve() == path


def _import_file(path_text: str) -> Any:
    path = Path(path_text)
    if not path.is_file():
        raise LoadError(f"no such file {path_text!r}: check the path in the target")
    path = path.resolve()
    stat = path.stat()
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key in _FILE_MODULES:
        return _FILE_MODULES[key]
    _on_path(os.getcwd())  # the project's own packages, as `python path/to/file.py` from here
    package = _package_name(path)
    module = _import_package_file(path_text, path, package) if package else None
    if module is None:
        module = _exec_file(path_text, path)
    _FILE_MODULES[key] = module
    return module


def _runs_at_import(path: Path, exc: BaseException) -> str:
    """When ``exc`` came out of a statement of ``path``'s top level that is code, not a definition (a
    training loop, a call): ``line 16 (`for step in range(3):`)``; "" otherwise (a definition's or an
    import's own error). Read from the traceback's frame of the file's top level, not from the message."""
    import ast
    import traceback

    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__)
             if f.name == "<module>" and f.lineno is not None and Path(f.filename).resolve() == path]
    if not lines:
        return ""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (SyntaxError, ValueError, OSError):
        return ""
    line = lines[-1]
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import,
                                 ast.ImportFrom)):
                return ""
            text = ast.get_source_segment(path.read_text(encoding="utf-8", errors="replace"), node) or ""
            first = text.splitlines()[0].strip() if text else ""
            return f"line {node.lineno} (`{first}`)" if first else f"line {node.lineno}"
    return ""


def _import_failed(path_text: str, path: Path, exc: Exception, imported_as: str = "") -> LoadError:
    """The LoadError for a file whose import raised ``exc``: a file that runs code at import (a script
    that trains when imported) is named as one, with the command that checks scripts."""
    as_name = f" (as {imported_as})" if imported_as else ""
    at = _runs_at_import(path, exc)
    if at:
        return LoadError(f"{path_text!r} runs code at import: {at} raised {one_line(exc)}; it is a script: "
                         f"check it with `placecheck run {path_text}`, or {_GUARD} to audit its models")
    return LoadError(f"importing {path_text!r}{as_name} raised {one_line(exc)}: fix the file "
                     "(--debug shows the traceback)")


def _import_package_file(path_text: str, path: Path, package: tuple[str, Path]) -> Any:
    """Import ``path`` by its dotted name; None when that name is taken by another file."""
    name, root = package
    _on_path(str(root))
    if name in sys.modules and not _same_file(sys.modules[name], path):
        return None
    try:
        with _exit_as_load_error(f"importing {path_text!r}"), _script_default_device():
            module = importlib.import_module(name)
    except LoadError:
        raise
    except Exception as exc:
        raise _import_failed(path_text, path, exc, name) from exc
    return module if _same_file(module, path) else None


def _exec_file(path_text: str, path: Path) -> Any:
    """Run a file that is not (importable as) part of a package under a module name of its own."""
    _on_path(str(path.parent))
    name = path.stem if path.stem.isidentifier() and path.stem not in sys.modules else \
        f"_placecheck_target_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot load {path_text!r} as Python source: the file must end in .py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with _exit_as_load_error(f"importing {path_text!r}"), _script_default_device():
            spec.loader.exec_module(module)
    except LoadError:
        sys.modules.pop(name, None)
        raise
    except Exception as exc:
        sys.modules.pop(name, None)
        raise _import_failed(path_text, path, exc) from exc
    return module


def _import_module(name: str) -> Any:
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        with _exit_as_load_error(f"importing {name!r}"), _script_default_device():
            return importlib.import_module(name)
    except LoadError:
        raise
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            raise LoadError(f"no module named {missing!r}: {_missing_module_advice(missing)}") from exc
        raise LoadError(f"importing {name!r} raised {one_line(exc)}: install what it needs "
                        "(--debug shows the traceback)") from exc
    except Exception as exc:
        raise LoadError(f"importing {name!r} raised {one_line(exc)}: fix the module "
                        "(--debug shows the traceback)") from exc


EXTRAS = {"torchvision": "vision"}
"""Packages that an extra of placecheck installs: a missing one is advised as ``pip install
'placecheck[EXTRA]'``."""


def close_names(wanted: str, names: Iterable[str], cutoff: float = 0.6) -> list[str]:
    """The names closest to ``wanted`` (a typo's likely meaning), best first; [] when none is close.
    Module names are matched with a higher ``cutoff``: an environment has hundreds (``torchgen`` is not
    what ``torchvison`` meant)."""
    import difflib

    return difflib.get_close_matches(wanted, sorted(set(names)), n=3, cutoff=cutoff)


MODULE_CUTOFF = 0.8


def _installed_top_level() -> set[str]:
    """The top-level modules this interpreter can import: those on ``sys.path`` (installed packages and
    the current directory's), the built-in ones, and those the installed distributions provide."""
    import pkgutil
    from importlib import metadata

    names = {m.name for m in pkgutil.iter_modules()} | set(sys.builtin_module_names)
    with contextlib.suppress(Exception):  # a broken distribution's metadata must not hide the error
        names |= set(metadata.packages_distributions())
    return {n for n in names if n.isidentifier() and not n.startswith("_")}


def _submodules(package: str) -> set[str]:
    """The submodules (and public module attributes) of the importable ``package``; empty otherwise."""
    import pkgutil

    try:
        parent = importlib.import_module(package)
    except Exception:
        return set()
    names = {m.name for m in pkgutil.iter_modules(getattr(parent, "__path__", None) or [])}
    names |= {k for k, v in vars(parent).items() if isinstance(v, types.ModuleType)}
    return {n for n in names if not n.startswith("_")}


def _missing_module_advice(missing: str) -> str:
    """What to do about ``missing``, a module that is not found: the closest names when it looks like a
    typo (of an installed package, or of a submodule of one), the extra that installs it, else (a name
    that looks like the user's own module) where to run from."""
    parent, _, last = missing.rpartition(".")
    if parent:
        close = close_names(last, _submodules(parent), MODULE_CUTOFF)
        if close:
            return f"did you mean {', '.join(f'{parent}.{c}' for c in close)}?"
        if parent.partition(".")[0] in _installed_top_level():
            return f"{parent!r} has no module {last!r}; check the name (or pass path/to/file.py:ATTR)"
    top = missing.partition(".")[0]
    if top in EXTRAS:
        return f"it is not installed: pip install 'placecheck[{EXTRAS[top]}]' (or pip install {top})"
    close = [c for c in close_names(missing, _installed_top_level(), MODULE_CUTOFF) if c != missing]
    if not parent and close:
        return f"did you mean {', '.join(close)}?"
    return "run placecheck from the directory that contains it, install it, or pass path/to/file.py:ATTR"


def _candidates(module: Any) -> list[str]:
    """Public names in ``module`` that could be targets, for 'did you mean'."""
    import torch.nn as nn

    names = []
    for key, value in vars(module).items():
        if key.startswith("_"):
            continue
        is_module = isinstance(value, nn.Module) or (isinstance(value, type) and issubclass(value, nn.Module))
        is_local_function = inspect.isfunction(value) and value.__module__ == module.__name__
        if is_module or is_local_function:
            names.append(key)
    return sorted(names, key=str.lower)


def resolve(spec: str, command: str = "audit") -> Any:
    """Import the module part of ``spec`` and return the named attribute."""
    module_part, attr = split_target(spec, command)
    if Path(module_part).is_file() and not module_part.endswith(".py"):
        raise LoadError(_not_python(module_part))  # notes.md:Net is a file, not the module notes.md
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        obj = _import_file(module_part)
    else:
        obj = _import_module(module_part)
    root = obj
    walked = []
    for part in attr.split("."):
        walked.append(part)
        if not hasattr(obj, part):
            hint = ""
            if len(walked) == 1:
                close = close_names(part, (k for k, v in vars(root).items()
                                           if not k.startswith("_") and callable(v)))
                names = _candidates(root)
                if close:
                    hint = f": did you mean {', '.join(close)}?"
                elif names:
                    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
                    hint = f"; it has: {shown}"
            raise LoadError(f"{module_part!r} has no attribute {'.'.join(walked)!r}{hint}")
        obj = getattr(obj, part)
    return obj


def _check_call(obj: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> None:
    """Raise a LoadError naming missing or unknown arguments before calling."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return  # builtins without a signature: let the call speak for itself
    params = sig.parameters
    accepts_var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [k for k in kwargs if k not in params and not accepts_var_kw]
    if unknown:
        known = [p.name for p in params.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        raise LoadError(f"{name} takes no argument {', '.join(map(repr, unknown))}; "
                        f"it accepts: {', '.join(known) or 'no arguments'}")
    missing = [p.name for p in params.values()
               if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and p.name not in kwargs]
    if missing:
        example = missing[0]
        raise LoadError(f"{name} needs arguments that were not given: {', '.join(missing)}; "
                        f"pass them with --arg {example}=VALUE or --kwargs '{{\"{example}\": ...}}'")


def _validate(obj: Any, name: str, kwargs: dict[str, Any]) -> None:
    """Everything that can be checked about a target without calling it."""
    import torch.nn as nn

    if isinstance(obj, nn.Module):
        if kwargs:
            raise LoadError(f"{name} is already a module instance: --kwargs/--arg apply only to "
                            "classes and factories")
        return
    if isinstance(obj, type) and not issubclass(obj, nn.Module):
        raise LoadError(f"{name} is a class but not an nn.Module subclass: name a module, a module "
                        "class or a function returning a module")
    if not callable(obj):
        raise LoadError(f"{name} is {_a(type(obj).__name__)}, not an nn.Module, an nn.Module "
                        "subclass or a function returning one")
    _check_call(obj, name, kwargs)


def _raised_in_ddp_constructor(exc: BaseException) -> bool:
    """Whether ``exc`` came out of ``DistributedDataParallel.__init__`` (from its traceback's frames)."""
    import traceback

    return any(frame.name == "__init__" and frame.filename.replace(os.sep, "/").endswith(
        "torch/nn/parallel/distributed.py") for frame in traceback.extract_tb(exc.__traceback__))


def build(obj: Any, name: str, kwargs: dict[str, Any]) -> Any:
    """Make an ``nn.Module`` from what a target names (instance, class or factory)."""
    import torch.nn as nn

    _validate(obj, name, kwargs)
    if isinstance(obj, nn.Module):
        return obj
    try:
        with _exit_as_load_error(f"constructing {name}"):
            result = obj(**kwargs)
    except LoadError:
        raise
    except Exception as exc:
        if _raised_in_ddp_constructor(exc):
            raise LoadError(f"constructing {name} raised {one_line(exc)} in DistributedDataParallel's "
                            "constructor, which reads the parameters' data that simulated GPUs do not "
                            "have: return the model DDP wraps and audit it with --wrap ddp "
                            "--world-size N") from exc
        raise LoadError(f"constructing {name} raised {one_line(exc)}: check its arguments "
                        "(--debug shows the traceback)") from exc
    if not isinstance(result, nn.Module):
        raise LoadError(f"{name} returned {_a(type(result).__name__)}, not an nn.Module: "
                        "name a function that returns the model")
    return result


def load_target(spec: str, kwargs: dict[str, Any] | None = None) -> Callable[[], Any]:
    """Resolve ``spec`` now and return a zero-argument builder for the model.

    What can be checked without calling the target is checked here; the call
    itself is deferred so that it runs inside the audit's engine (model code
    asking ``torch.cuda.is_available()`` must see the simulated GPU).
    """
    obj = resolve(spec)
    kw = dict(kwargs or {})
    _, attr = split_target(spec)
    _validate(obj, attr, kw)
    return lambda: build(obj, attr, kw)


def model_factory(target: str, kwargs: dict[str, Any]) -> Callable[[], Any]:
    """A zero-argument builder that resolves ``target`` and builds the model when called.

    Unlike :func:`load_target` nothing is imported until the audit calls it, so
    the target's import-time code runs inside the audit's engine too.
    """
    _, attr = split_target(target)

    def factory() -> Any:
        return build(resolve(target), attr, kwargs)

    return factory
