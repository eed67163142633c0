"""The ranks' processes of ``placecheck run --nproc-per-node N`` (:mod:`placecheck.run.ranks` starts them):
each runs the script as one rank with torchrun's environment and writes its report and the GPUs of its
collectives to ``rank{K}.json`` as JSON.

Where ``os.fork`` exists, one process (``python -m placecheck.run.rank --ranks CONFIG DIR N``,
:func:`fork_ranks`) imports torch and placecheck once and forks a child per rank, as
:mod:`placecheck.commands.worker`'s warm server forks a child per model (and for the same reason it runs
no torch op before forking: an OpenMP thread pool started before a fork hangs the child). It relays what
each rank prints, line by line as printed, as ``RANK<TAB>line`` on its stdout, and writes each rank's
exit status to ``statuses.json``. That process is itself a child forked from a warm server
(:func:`served_ranks`), kept by the asking process for its next ranks' run (a test suite, a library
caller running several scripts): torch and placecheck are imported once per asking process, not once per
run. Elsewhere each rank is a process of its own (``python -m placecheck.run.rank CONFIG OUT``,
:func:`main`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import sys

_CHILD_FAILED = 70
"""Exit status of a rank's child that could not even start (its output says why)."""


def main(config_path: str, out_path: str) -> None:
    """A rank's process: run the script as this rank (torchrun's environment is set), write the report."""
    from placecheck.basics.options import RunOptions
    from placecheck.findings.formats.json import report_to_dict
    from placecheck.run import _simulate
    from placecheck.run.scratch import protect_from_environment
    from placecheck.run.script import Program

    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    options = RunOptions.from_dict(config["options"])
    program = Program(config["target"], tuple(config["args"]), options.module)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with protect_from_environment(config.get("scratch") or {}):  # its writes: the run's scratch area
        report, uses = _simulate(program, options, frozenset(config["codes"]),
                                 rank=(rank, world, int(os.environ["LOCAL_RANK"])))
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump({"report": report_to_dict(report), "uses": uses}, handle)


def _rank_child(rank: int, nproc: int, config_path: str, out_dir: str, write: int, others: list[int]) -> None:
    """In a forked child: become rank ``rank`` (its environment, its output to ``write``), run it, exit."""
    status = _CHILD_FAILED
    try:
        for fd in others:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        from placecheck.run.ranks import rank_environment

        os.environ.update(rank_environment(rank, nproc))
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if "torch" in sys.modules and threads.isdigit() and int(threads) > 0:
            # torch was imported before the fork, maybe under another OMP_NUM_THREADS (a warm server's):
            # the rank's share of the cores, set before its first op, as torch would read it at import
            sys.modules["torch"].set_num_threads(int(threads))
        os.environ["PYTHONUNBUFFERED"] = "1"  # what the rank starts prints as it goes too
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
        main(config_path, os.path.join(out_dir, f"rank{rank}.json"))
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # nothing may return into the parent's loop
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def served_ranks(spec_path: str, result_path: str) -> int:
    """Entry point of a ranks' job forked from a warm server
    (:class:`placecheck.basics.forkserver.ForkServer`, whose child this is, in its own session, stderr to a
    file the asking process reads as it grows):
    :func:`fork_ranks` with the asking process's environment and working directory (the spec's JSON:
    ``env``, ``cwd``, ``config``, ``dir``, ``nproc``); what it prints goes to that file too."""
    del result_path  # the ranks write their own results (rank{K}.json, statuses.json)
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    os.environ.clear()
    os.environ.update(spec["env"])
    os.chdir(spec["cwd"])
    os.dup2(2, 1)
    return fork_ranks(spec["config"], spec["dir"], int(spec["nproc"]))


def fork_ranks(config_path: str, out_dir: str, nproc: int) -> int:
    """Fork the ``nproc`` ranks from this one warm process, relay their output, write their statuses."""
    from placecheck.engines.compat import training_modules
    from placecheck.run.ranks import RANK_MODULES

    for name in (*RANK_MODULES, *training_modules()):
        __import__(name)
    gc.collect()
    gc.freeze()  # the imports' objects: a child's collections skip them instead of copying their pages
    sys.stdout.flush()
    sys.stderr.flush()
    reads: dict[int, int] = {}  # read end -> rank
    pids: dict[int, int] = {}  # pid -> rank
    for rank in range(nproc):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            _rank_child(rank, nproc, config_path, out_dir, write, [*reads, read])
        os.close(write)
        reads[read] = rank
        pids[pid] = rank
    statuses = _relay(reads, pids)
    with open(os.path.join(out_dir, "statuses.json"), "w", encoding="utf-8") as handle:
        json.dump({str(rank): status for rank, status in statuses.items()}, handle)
    return 0


def _relay(reads: dict[int, int], pids: dict[int, int]) -> dict[int, int]:
    """Each rank's lines as ``RANK<TAB>line`` on stdout until every rank has exited (and what they printed
    is read: a process a rank left behind may hold its pipe open); the ranks' exit statuses."""
    out = sys.stdout.buffer
    pending = {fd: b"" for fd in reads}
    statuses: dict[int, int] = {}
    grace = 0
    while pending and grace < 10:
        ready, _, _ = select.select(list(pending), [], [], 0.1)
        for fd in ready:
            chunk = os.read(fd, 65536)
            lines = (pending[fd] + chunk).split(b"\n")
            pending[fd] = lines.pop()
            if not chunk and pending[fd]:
                lines.append(pending[fd])
            for line in lines:
                out.write(str(reads[fd]).encode() + b"\t" + line + b"\n")
            out.flush()
            if not chunk:
                del pending[fd]
                os.close(fd)
        while len(statuses) < len(pids):
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in pids:
                statuses[pids[pid]] = os.waitstatus_to_exitcode(status)
        if len(statuses) == len(pids) and not ready:
            grace += 1  # every rank exited: read what is left for a second at most
    for pid, rank in pids.items():
        if rank not in statuses:
            _, status = os.waitpid(pid, 0)
            statuses[rank] = os.waitstatus_to_exitcode(status)
    return statuses


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ranks"]:
        sys.exit(fork_ranks(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    main(sys.argv[1], sys.argv[2])
