"""The client of a warm fork server: one process that imported torch and placecheck once and forks a
fresh child per request (the server's side is :func:`placecheck.commands.worker.serve`).

Used by everything that runs work in a process of its own and wants torch's import paid once: the
audits of ``--isolation fork`` (:class:`placecheck.commands.runner.WarmPool`), ``placecheck fix``'s
proofs (:mod:`placecheck.fix.proof`) and the ranks of ``placecheck run --nproc-per-node``
(:mod:`placecheck.run.ranks`). Torch-free: the server imports torch, its client never does.

Each child starts its own session; a timeout, the server's death or an exception in the asking process
(Ctrl-C) kills that session, so nothing the child started outlives the request.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

_STDERR_TAIL = 12
"""How many of the server's last stderr lines :meth:`ForkServer.stderr_tail` gives."""

_WARM_UP_S = 600.0
"""How long a fork server may take to import torch and the config's libraries before it is given up."""
_REPLY_S = 60.0
"""How long a warm server may take to fork (``started``) or to report a killed child (``exited``)."""


def fork_available() -> bool:
    """Whether ``--isolation fork`` can run here: ``os.fork`` exists and forking is safe.

    macOS has ``os.fork``, but a process that loaded its system frameworks (torch does) may
    crash in a forked child; Python itself defaults to spawn there. Elsewhere without
    ``os.fork`` (Windows), ``fork`` falls back to ``spawn``.
    """
    return hasattr(os, "fork") and sys.platform != "darwin"


def _server_command(modules: list[str]) -> list[str]:
    """The command line of one warm fork server (a seam for the tests)."""
    return [sys.executable, "-m", "placecheck.commands.worker", "--serve", json.dumps(modules)]


class ServerGone(Exception):
    """The fork server's pipe closed: the server died."""


class ChildFiles(Protocol):
    """The three files of one forked child: what it reads, what it writes, and its stderr."""

    @property
    def spec(self) -> Path: ...
    @property
    def result(self) -> Path: ...
    @property
    def stderr(self) -> Path: ...


@dataclass(frozen=True)
class JobFiles:
    """The three files of one request: :class:`ChildFiles` as plain paths."""

    spec: Path
    result: Path
    stderr: Path


NO_TIMEOUT = 7 * 24 * 3600.0
"""``run``'s timeout for work without a time limit of its own (a proof, a ranks' run without --timeout)."""


class ForkServer:
    """One warm server process (``python -m placecheck.commands.worker --serve``) and its line protocol."""

    def __init__(self, modules: list[str], workdir: str | None, env: dict[str, str] | None = None) -> None:
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - open as long as the server lives
        self.process = subprocess.Popen(
            _server_command(modules), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            cwd=workdir, env=env, start_new_session=True, bufsize=0)
        self._buffer = b""
        self._ready = False

    def _line(self, seconds: float) -> str | None:
        """The server's next line; None when none came within ``seconds``; ServerGone at its end."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + seconds
        while b"\n" not in self._buffer:
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise ServerGone
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def warm_up(self) -> None:
        """Wait until the server has imported everything; ServerGone when it never does."""
        if not self._ready:
            if self._line(_WARM_UP_S) != "ready":
                raise ServerGone
            self._ready = True

    def run(self, files: ChildFiles, timeout: float, entry: str = "") -> int | None:
        """Fork one child and wait for it; its exit status, or None when stopped at ``timeout``.

        The child runs one model's audit, or ``entry`` (``placecheck.MODULE:FUNCTION``, given the spec
        and result paths) when one is named.
        """
        self.warm_up()
        assert self.process.stdin is not None
        request: dict[str, Any] = {"spec": str(files.spec), "result": str(files.result),
                                   "stderr": str(files.stderr)}
        if entry:
            request["entry"] = entry
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
        except OSError:
            raise ServerGone from None
        started = self._line(_REPLY_S)
        if started is None or not started.startswith("started "):
            raise ServerGone
        pid = int(started.split()[1])
        try:
            exited = self._line(timeout)
            if exited is None:  # past the timeout: kill the child's session, the server reaps it
                _kill_group(pid)
                exited = self._line(_REPLY_S)
                if exited is None:
                    raise ServerGone
                return None
        except BaseException:  # the server gone, or Ctrl-C in this process: the child's session goes too
            _kill_group(pid)
            raise
        return int(exited.split()[1])

    def stderr_tail(self) -> str:
        self._log.seek(0)
        lines = self._log.read().decode("utf-8", errors="replace").splitlines()
        return "\n".join(lines[-_STDERR_TAIL:])

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
        self._log.close()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)

