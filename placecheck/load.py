"""Turning a ``TARGET`` string and its arguments into an ``nn.Module``.

``TARGET`` is ``pkg.module:attr`` (importable from the current directory) or
``path/to/file.py:attr``; ``attr`` may be dotted. It names a module instance,
an ``nn.Module`` subclass, or a callable returning a module. Every failure is
a :class:`~placecheck.errors.LoadError` with one line saying what to do.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from placecheck.errors import LoadError, UsageError, one_line

TARGET_HELP = "MODULE:ATTR (e.g. torchvision.models:resnet18) or path/to/file.py:ATTR"


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
    if kwargs_json:
        try:
            data = json.loads(kwargs_json)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--kwargs is not valid JSON ({exc.msg} at column {exc.colno}): "
                             """pass an object such as '{"num_classes": 10}'""") from exc
        if not isinstance(data, dict):
            raise UsageError(f"--kwargs must be a JSON object such as "
                             f"""'{{"num_classes": 10}}', not a {type(data).__name__}""")
        out.update(data)
    for item in args:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(f"--arg {item!r} is not KEY=VALUE (e.g. --arg num_classes=10)")
        out[key.strip()] = parse_value(value)
    return out


def split_target(spec: str) -> tuple[str, str]:
    """``"a.b:C.d"`` -> ``("a.b", "C.d")``; the split is on the last colon."""
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise UsageError(f"target {spec!r} is not {TARGET_HELP}")
    return module, attr


def _import_file(path_text: str) -> Any:
    path = Path(path_text)
    if not path.is_file():
        raise LoadError(f"no such file {path_text!r}: check the path in the target")
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = path.stem if path.stem.isidentifier() and path.stem not in sys.modules else \
        f"_placecheck_target_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot load {path_text!r} as Python source: the file must end in .py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise LoadError(f"importing {path_text!r} raised {one_line(exc)}: fix the file "
                        "(--debug shows the traceback)") from exc
    return module


def _import_module(name: str) -> Any:
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            raise LoadError(f"no module named {missing!r}: run placecheck from the directory that "
                            "contains it, install it, or pass path/to/file.py:ATTR") from exc
        raise LoadError(f"importing {name!r} raised {one_line(exc)}: install what it needs "
                        "(--debug shows the traceback)") from exc
    except Exception as exc:
        raise LoadError(f"importing {name!r} raised {one_line(exc)}: fix the module "
                        "(--debug shows the traceback)") from exc


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
    return sorted(names)


def resolve(spec: str) -> Any:
    """Import the module part of ``spec`` and return the named attribute."""
    module_part, attr = split_target(spec)
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
                names = _candidates(root)
                if names:
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
        raise LoadError(f"{name} is a {type(obj).__name__}, not an nn.Module, an nn.Module "
                        "subclass or a function returning one")
    _check_call(obj, name, kwargs)


def build(obj: Any, name: str, kwargs: dict[str, Any]) -> Any:
    """Make an ``nn.Module`` from what a target names (instance, class or factory)."""
    import torch.nn as nn

    _validate(obj, name, kwargs)
    if isinstance(obj, nn.Module):
        return obj
    try:
        result = obj(**kwargs)
    except Exception as exc:
        raise LoadError(f"constructing {name} raised {one_line(exc)}: check its arguments "
                        "(--debug shows the traceback)") from exc
    if not isinstance(result, nn.Module):
        raise LoadError(f"{name} returned a {type(result).__name__}, not an nn.Module: "
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
