"""What runs inside a model's audit process: one audit (the child) and the warm fork server.

Two ways to get a model its own process, chosen by ``--isolation``
(:mod:`placecheck.commands.runner` is the parent that starts them and reads their results):

- ``spawn``: a fresh interpreter per model, ``python -m placecheck.commands.worker SPEC RESULT``
  (:func:`child_main`); every model pays the imports of torch and torchvision again.
- ``fork`` (the default where ``os.fork`` exists): a warm server,
  ``python -m placecheck.commands.worker --serve PRELOAD``, imports torch, placecheck's engine and
  the libraries the config's targets live in once (:func:`serve`), then forks a fresh child
  per model. The child runs the same :func:`child_main`, so it writes the same result file,
  and it dies with the model: whatever the model changes (the default dtype or device, a
  monkeypatch, ``sys.modules``) goes with it and never reaches the next model.

Forking after torch is imported is safe only while the server itself has run no torch
op: an OpenMP (GNU libgomp) thread pool started before a fork hangs the child's first
parallel op. The server therefore only imports; each child sets its own thread count, as a
fresh interpreter does (the spec's ``threads``: its share of the cores when several models run at
once, :func:`placecheck.commands.runner.child_threads`).

The server speaks a line protocol over its stdin/stdout: it writes ``ready`` once warm;
for each request line (JSON: ``spec``, ``result``, ``stderr``, and ``entry``
when the child runs another of placecheck's entry points than :func:`child_main`, as
``placecheck fix``'s proofs do) it forks,
writes ``started PID``, waits for the child and writes ``exited STATUS`` (negative: killed
by that signal). The parent enforces timeouts by killing the child's process group (each
child starts its own session). This module imports torch only inside the processes it runs.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

from placecheck.basics.errors import PlacecheckError, one_line
from placecheck.basics.options import AuditOptions
from placecheck.engines import compat
from placecheck.engines.classify import out_of_memory

WARM_MODULES = ("torch", "placecheck.commands.api", "placecheck.model.load",
                "placecheck.findings.formats.json", "placecheck.checks.trace", "placecheck.model.inputs",
                "placecheck.engines.datadep", *compat.WARM_MODULES)
"""What every audit imports (some lazily, during the forward). The server imports them before its first
fork, with what training imports on first use (:func:`placecheck.engines.compat.training_modules`: a
proof's or a rank's script), so that no child imports them again."""

_CHILD_FAILED = 70
"""Exit status of a forked child that could not even start its audit (its stderr says why)."""


# ---- one model's audit ---------------------------------------------------------------------------


def _audit(spec: dict[str, Any]) -> Any:
    """Audit one model as ``placecheck audit TARGET`` would, with the options its entry gives."""
    from placecheck.commands.api import audit
    from placecheck.model.load import build, parse_kwargs, resolve, split_target

    target = spec["target"]
    options = AuditOptions.from_dict(spec["options"]).replace(target=target)
    options.check()  # a bad option fails before any import of the target
    _, attr = split_target(target)
    constructor_kwargs = {**spec["kwargs"], **parse_kwargs(None, spec["args"])}

    def factory() -> Any:
        return build(resolve(target), attr, constructor_kwargs)

    return audit(factory, options=options)


def child_main(spec_path: str, result_path: str) -> int:
    """Run one model's audit and write ``{"status": ..., ...}`` JSON to ``result_path``."""
    import faulthandler

    faulthandler.enable()  # a segfault prints the Python stack to stderr, which the parent keeps
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    result: dict[str, Any]
    try:
        if spec.get("threads"):  # its share of the cores while other models' audits run beside it
            import torch

            torch.set_num_threads(int(spec["threads"]))
        from placecheck.findings.formats.json import report_to_dict

        report = _audit(spec)
        result = {"status": "ok", "report": report_to_dict(report)}
    except MemoryError:
        result = {"status": "oom", "message": "MemoryError"}
    except PlacecheckError as exc:
        status = "oom" if out_of_memory(exc) else "load-error"
        result = {"status": status, "message": str(exc)}
    except Exception as exc:
        status = "oom" if out_of_memory(exc) else "error"
        result = {"status": status, "message": f"unexpected {one_line(exc)}"}
    Path(result_path).write_text(json.dumps(result), encoding="utf-8")
    return 0


# ---- the warm fork server ------------------------------------------------------------------------


def _installed(module: str) -> bool:
    """Whether ``module`` belongs to an installed distribution (site-packages) or to placecheck.

    Only such modules are imported by the warm server: a user's own module (a file target, a
    package in the working tree) may change global state when imported, and must do so in
    the one model's child that imports it, not in every child forked after it.
    """
    top = module.split(".")[0]
    if top == "placecheck":
        return True
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    origin = spec.origin if spec is not None else None
    if not origin:
        return False
    path = Path(origin).resolve()
    roots = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    return any(root in path.parents for root in roots)


def preload(modules: list[str]) -> list[str]:
    """Import :data:`WARM_MODULES`, torch's training modules
    (:func:`~placecheck.engines.compat.training_modules`) and the installed ones of ``modules``; return those
    imported.

    A module that fails to import is left to the model's child, which reports the failure
    as that model's own (a load error), exactly as without the server.
    """
    imported = []
    warm = (*WARM_MODULES, *compat.training_modules())
    for name in [*warm, *modules]:
        if name not in warm and not _installed(name):
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # SystemExit too: the child gets to report it
            continue
        imported.append(name)
    return imported


def _fork_child(request: dict[str, Any], protocol: int) -> int:
    """Fork one model's child; in the child, run the audit and exit. Returns the child's pid."""
    pid = os.fork()
    if pid:
        return pid
    status = _CHILD_FAILED
    try:
        os.setsid()  # its own process group: a timeout kills whatever it started too
        os.close(protocol)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        stderr = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(stderr, 2)
        status = _entry(request.get("entry"))(request["spec"], request["result"])
    except BaseException:  # nothing may return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(status)


def _entry(name: str | None) -> Any:
    """The function a request runs in its child: :func:`child_main`, or the ``placecheck.MODULE:FUNCTION``
    it names (called with the request's two paths; returns the exit status). Only placecheck's own."""
    if not name:
        return child_main
    module, _, function = name.partition(":")
    if module.split(".")[0] != "placecheck" or not function:
        raise ValueError(f"the server runs placecheck's own entry points only, not {name!r}")
    return getattr(importlib.import_module(module), function)


def serve(modules: list[str]) -> int:
    """The fork server's loop (see the module docstring); returns when its stdin closes."""
    # The protocol gets its own copy of stdout; what imports print goes to stderr instead.
    protocol = os.dup(1)
    os.dup2(2, 1)
    preload(modules)
    # What the imports made is moved out of the collector's reach: a child's collections then skip
    # it instead of walking (and so copying, page by page) the server's whole heap.
    gc.collect()
    gc.freeze()

    def say(line: str) -> None:
        os.write(protocol, (line + "\n").encode())

    say("ready")
    for raw in sys.stdin.buffer:
        if not raw.strip():
            continue
        request = json.loads(raw)
        pid = _fork_child(request, protocol)
        say(f"started {pid}")
        _, status = os.waitpid(pid, 0)
        say(f"exited {os.waitstatus_to_exitcode(status)}")
    return 0


def main(argv: list[str]) -> int:
    """``python -m placecheck.commands.worker SPEC RESULT`` or
    ``python -m placecheck.commands.worker --serve JSON``."""
    if argv[:1] == ["--serve"]:
        return serve(json.loads(argv[1]) if len(argv) > 1 else [])
    return child_main(argv[0], argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
