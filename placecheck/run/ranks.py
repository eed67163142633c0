"""``placecheck run --nproc-per-node N``: a torchrun script run as each of its N ranks.

torchrun starts the script once per GPU with its environment (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...). So does this: each rank is
a child process of its own (a fresh interpreter: module globals, the current
CUDA device, ``dist.get_rank()`` are the rank's own) that runs the script as
``placecheck run`` does, on ``N`` simulated GPUs, with:

- ``init_process_group`` (nccl, gloo or the default) landing on PyTorch's fake
  process group (collectives return at once and move no data, so the ranks need
  not run together), the backend asked for remembered;
- NCCL's rules checked where a GPU job breaks (:class:`RankChecks`): a CPU tensor
  in a collective of an NCCL group (PC402); a module, a tensor, a loaded
  checkpoint or a collective on a GPU other than the rank's own
  (``cuda:LOCAL_RANK``: a missing ``set_device``, a hard-coded ``cuda:0``, a
  ``map_location`` to GPU 0) (PC401);
- each collective and each ``DistributedDataParallel`` construction recorded with
  the GPU it ran on, so that the parent sees two ranks on one GPU, which NCCL
  refuses ("Duplicate GPU detected") (PC401).
- FSDP2's ``fully_shard`` sharding each rank's module into DTensors on its GPU, as
  on a GPU (:mod:`placecheck.run.dtensors`), FSDP1's ``FullyShardedDataParallel``
  and Lightning's ``fsdp`` strategy run as their placement, each rank with whole
  parameters on its FSDP device; the first forward's all-gather recorded with its
  GPU (:mod:`placecheck.run.fsdp`).

The parent (:func:`run_ranks`) merges the ranks' reports into one: a finding
that several ranks have (the same code, place and line, their own GPU aside) is
reported once, naming them (``on ranks 0-1, ...``; ``details["ranks"]``).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from placecheck.basics.errors import UsageError
from placecheck.basics.options import nproc_value
from placecheck.basics.values import Device
from placecheck.engines.calls import device_of
from placecheck.engines.sources import here
from placecheck.findings import rules
from placecheck.findings.finding import Finding

if TYPE_CHECKING:
    from placecheck.basics.options import RunOptions
    from placecheck.findings.report import Coverage, Report
    from placecheck.run.script import Program
    from placecheck.run.session import Recording

TORCHRUN_MODULE = "torch.distributed.run"
"""``python -m torch.distributed.run`` is ``torchrun``."""

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
               "all_gather_single", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
               "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv", "isend", "irecv")
"""The tensor collectives and point-to-point calls of ``torch.distributed`` whose tensors are checked."""

OBJECT_COLLECTIVES = ("broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list")
"""The collectives of picklable objects: each rank keeps its own
(:func:`placecheck.run.patches.own_objects`)."""

_TORCHRUN_FLAGS = frozenset({"standalone", "no-python", "module", "m"})
_TORCHRUN_VALUED = frozenset({
    "nproc-per-node", "nnodes", "node-rank", "master-addr", "master-port", "rdzv-backend", "rdzv-endpoint",
    "rdzv-id", "rdzv-conf", "max-restarts", "monitor-interval", "start-method", "role", "redirects", "tee",
    "log-dir", "local-ranks-filter", "run-path", "local-addr", "logs-specs", "rdzv-timeout"})
_PORT = "29500"


def torchrun_command(args: Sequence[str], nproc: int | None) -> tuple[str, list[str], bool, int]:
    """``-m torch.distributed.run ARGS`` read as torchrun reads ARGS: ``(target, args, module, nproc)``
    of the script (or ``-m`` module) it launches. ``nproc``: ``--nproc-per-node`` given to placecheck."""
    rest = list(args)
    module = False
    while rest and rest[0].startswith("-") and rest[0] != "--":
        option = rest.pop(0)
        name, has_value, value = option.lstrip("-").partition("=")
        name = name.replace("_", "-")
        if name in _TORCHRUN_FLAGS:
            module = module or name in ("module", "m")
            continue
        if name not in _TORCHRUN_VALUED:
            raise UsageError(f"-m {TORCHRUN_MODULE}: unknown torchrun option {option!r}: give torchrun's "
                             "options, then the script and its arguments")
        if not has_value:
            if not rest:
                raise UsageError(f"-m {TORCHRUN_MODULE}: {option} needs a value")
            value = rest.pop(0)
        if name == "nproc-per-node":
            nproc = nproc_value(value)
        elif name == "nnodes" and value.strip() not in ("1", "1:1"):
            raise UsageError(f"--nnodes {value}: placecheck run simulates one node; give --nnodes 1 (or "
                             "none) and --nproc-per-node for its ranks")
    if rest and rest[0] == "--":
        rest.pop(0)
    if not rest:
        raise UsageError(f"-m {TORCHRUN_MODULE}: give the script to launch (placecheck run -m "
                         f"{TORCHRUN_MODULE} --nproc-per-node 2 train.py)")
    return rest[0], rest[1:], module, nproc or 1


TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launcher_note(error: BaseException | None) -> str:
    """For a plain run (no ``--nproc-per-node``) that failed for want of torchrun: the script read one of
    torchrun's variables that is not set (``KeyError: 'LOCAL_RANK'``), or its ``init_process_group`` raised
    without them; "" otherwise."""
    if error is None or any(name in os.environ for name in ("RANK", "LOCAL_RANK")):
        return ""
    from placecheck.engines.sources import frames_of

    missing = isinstance(error, KeyError) and bool(error.args) and error.args[0] in TORCHRUN_VARIABLES
    in_init = any(f.f_code.co_name == "init_process_group"
                  and f.f_globals.get("__name__", "").startswith("torch.distributed")
                  for f in frames_of(error.__traceback__))
    if not (missing or in_init):
        return ""
    what = f"reads {error.args[0]} from the environment" if missing else \
        "calls init_process_group without RANK, WORLD_SIZE and MASTER_ADDR in the environment"
    return (f"run: the script {what}: torchrun sets them for each rank; run it as torchrun would, "
            "placecheck run --nproc-per-node N SCRIPT (each rank simulated, with NCCL's rules)")


def rank_environment(rank: int, nproc: int) -> dict[str, str]:
    """What torchrun sets for local rank ``rank`` of ``nproc`` on one node (``--standalone``)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc), "ROLE_NAME": "default",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": _PORT, "TORCHELASTIC_RUN_ID": "none",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "False",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            # DDP copies an input that is not on its device on a side stream, which needs a driver; on the
            # current stream the copy (and where it goes) is the same
            "PYTORCH_DDP_USE_SIDE_STREAM": "0"}


# -- in a rank's process ------------------------------------------------------------------------------------

def _tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple) and depth < 3:
        for item in value:
            yield from _tensors(item, depth + 1)
    elif isinstance(value, dict) and depth < 8:
        for item in value.values():
            yield from _tensors(item, depth + 1)


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


class RankChecks:
    """One rank's NCCL rules, in its own process: what it placed where, what its collectives got."""

    def __init__(self, recorder: Recording, rank: int, world_size: int, local_rank: int) -> None:
        self.recorder = recorder
        self.rank = rank
        self.world_size = world_size
        self.own = torch.device("cuda", local_rank)
        self.backend: str | None = None
        """The backend the script asked ``init_process_group`` for (None: not called, or the default)."""
        self.uses: dict[tuple[str, str, str], None] = {}
        """(line, call, device) of every collective and DDP construction on a GPU, in order, once each."""
        self.misplaced: dict[Device, list[str]] = {}
        """A GPU other than the rank's own -> the lines that put tensors there, in order."""
        self.first: dict[Device, str] = {}
        """That GPU -> what the first of those lines did."""
        self.sharded = False
        """The script sharded a module with FSDP (:mod:`placecheck.run.fsdp`)."""
        self.where: dict[Device, str] = {}
        """That GPU -> the module moved there first, or the call that made the first tensor there."""

    @property
    def nccl(self) -> bool:
        """The group is NCCL's only: CPU tensors have no backend (the default group has gloo for them)."""
        return self.backend is not None and all(
            part.strip().split(":")[-1] == "nccl" for part in self.backend.lower().split(","))

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """The process group, the collectives and DDP's construction patched for the rank's run."""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
        from torch.nn.parallel import DistributedDataParallel

        from placecheck.engines.dispatch import subscribed
        from placecheck.run import dtensors
        from placecheck.run.dtensors import DTENSOR_MODULE, VIEW_WARNING, ScriptDTensorMixes
        from placecheck.run.fsdp import FSDP_MODULE, ShardedPlacement
        from placecheck.run.patches import (
            Patch,
            ddp_comm_hooks,
            ddp_construction,
            fake_process_group,
            own_objects,
            patched,
            patched_once_imported,
            watched_collective,
        )

        patches: list[Patch] = [(owner, "init_process_group", fake_process_group(self._init))
                                for owner in (dist, distributed_c10d)]
        for name in COLLECTIVES:
            patches += [(owner, name, watched_collective(name, self._collective, self._received))
                        for owner in (dist, distributed_c10d) if hasattr(owner, name)]
        for name in OBJECT_COLLECTIVES:
            patches += [(owner, name, own_objects(name, lambda: self.rank, lambda: self.world_size))
                        for owner in (dist, distributed_c10d) if hasattr(owner, name)]
        patches.append((DistributedDataParallel, "__init__", ddp_construction(self._ddp_module)))
        patches += [(DistributedDataParallel, name, make)
                    for name, make in ddp_comm_hooks().items()]
        sharded = ShardedPlacement(self.placed_at, self._sharded_forward,
                                   lambda text: self.recorder.notes.setdefault(text, None),
                                   self.recorder.quiet)
        # FSDP's code is patched once the script imports it: importing it costs each rank half a second;
        # DTensor's (FSDP2's parameters) once it is imported (by FSDP, or by the script itself)
        # an op mixing a plain tensor with a DTensor: subscribed before the recorder, which sees it first
        mixes = ScriptDTensorMixes(self.recorder.add, self.recorder.quiet, lambda: self.recorder.quieted)
        with patched(patches), patched_once_imported(DTENSOR_MODULE, dtensors.patches), \
                patched_once_imported(FSDP_MODULE, sharded.patches), warnings.catch_warnings(), \
                subscribed(mixes):
            # the engine's results are views of their CPU data, which FSDP2 warns about for a module's output
            warnings.filterwarnings("ignore", message=VIEW_WARNING)
            try:
                yield
            finally:
                if dist.is_initialized():
                    dist.destroy_process_group()

    def _init(self, backend: Any, rank: int, world_size: int) -> tuple[int, int]:
        self.backend = str(backend) if backend is not None else None
        return (self.rank if rank < 0 else rank), (self.world_size if world_size < 0 else world_size)

    def _collective(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        line = here()[0]
        if not line:
            return
        tensors = [t for t in _tensors((args, kwargs)) if t.device.type != "meta"]
        host = [t for t in tensors if t.device.type == "cpu"]
        if host and self.nccl:
            self._cpu_in_nccl(f"dist.{name}", _describe(host[0]), line)
        for device in sorted({str(t.device) for t in tensors if t.device.type == "cuda"}):
            self.uses[(line, f"dist.{name}", device)] = None

    def _ddp_module(self, module: Any) -> None:
        line = here()[0]
        if not line or not isinstance(module, torch.nn.Module):
            return
        devices = sorted({str(t.device) for t in [*module.parameters(), *module.buffers()]})
        if "cpu" in devices and self.nccl:
            self._cpu_in_nccl("DistributedDataParallel(...)", "its parameters", line)
        for device in devices:
            if device.startswith("cuda"):
                self.uses[(line, "DistributedDataParallel(...)", device)] = None

    def _received(self, name: str, given: dict[str, Any]) -> None:
        """A collective's outputs, given the rank's own values (:func:`~placecheck.run.patches.own_values`),
        out of the script's sight."""
        from placecheck.run.patches import own_values

        with self.recorder.quiet(), torch.no_grad():
            own_values(name, given, self.rank, self.world_size)

    def _sharded_forward(self, device: torch.device) -> None:
        """The outermost sharded module's forward: its all-gather runs on ``device``."""
        from placecheck.run.fsdp import ALL_GATHER

        self.sharded = True
        line = here()[0]
        if line and device.type == "cuda":
            self.uses[(line, ALL_GATHER, str(device))] = None

    def limit_of(self, exc: BaseException) -> str:
        """The note for ``exc`` when it is a limit of this rank's simulation, not the script's error: none of
        its own (FSDP2's DTensor parameters are simulated, :mod:`placecheck.run.dtensors`)."""
        return ""

    def _cpu_in_nccl(self, call: str, what: str, line: str) -> None:
        self.recorder.add(rules.collective_on_host(call, what, str(self.backend), str(self.own), line),
                          key_extra=call)

    def placed(self, func: Any, out: torch.Tensor) -> None:
        """A tensor created or moved by the script: on a GPU other than the rank's own, remembered."""
        if out.device.type == "cuda" and out.device != self.own:
            name = getattr(func, "__name__", "a call")
            self.placed_at(out.device, f"{name} made {_describe(out)}", here()[0], name)

    def placed_at(self, device: torch.device, what: str, line: str, where: str) -> None:
        """``what`` (a module's move, a tensor made) put state on ``device`` at ``line``; ``where``: the
        module moved, or the call that made the tensor."""
        if device.type != "cuda" or device == self.own or not line:
            return
        placed = device_of(device)
        lines = self.misplaced.setdefault(placed, [])
        if line not in lines:
            lines.append(line)
            self.first.setdefault(placed, what)
            self.where.setdefault(placed, where)

    def loaded(self, obj: Any, line: str) -> None:
        """``torch.load``'s result: state on a GPU other than the rank's own (``map_location`` to GPU 0)."""
        devices = sorted({str(t.device) for t in _tensors(obj)
                          if t.device.type == "cuda" and t.device != self.own})
        if not devices or not line:
            return
        self.recorder.add(rules.rank_loaded_off_device(", ".join(devices), str(self.own), line),
                          key_extra="torch.load")

    def findings(self) -> list[Finding]:
        """PC401 for each GPU other than its own the rank put tensors on, at the first line that did."""
        own = device_of(self.own)
        return [rules.rank_off_device(self.first[device], self.where[device], device, own, lines)
                for device, lines in self.misplaced.items()]


# -- the parent: one process per rank, one report --------------------------------------------------------

def run_ranks(program: Program, options: RunOptions, codes: frozenset[str]) -> Report:
    """Run ``program`` as ``options.nproc_per_node`` ranks, each in a process of its own, and merge their
    reports."""
    from placecheck.findings.formats.json import report_from_dict
    from placecheck.findings.report import Report

    nproc, gpus, timeout = options.nproc_per_node or 1, options.gpu_count, options.timeout
    from placecheck.run.scratch import child_environment

    # the ranks write into this run's scratch area, as every process of the run does
    config = {"target": program.target, "args": list(program.args), "options": options.to_dict(),
              "codes": sorted(codes), "scratch": child_environment()}
    with tempfile.TemporaryDirectory(prefix="placecheck-ranks-") as tmp:
        config_path = os.path.join(tmp, "config.json")
        with open(config_path, "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        start = _forked_ranks if hasattr(os, "fork") else _spawned_ranks
        outcomes = start(config_path, tmp, nproc, timeout)
        results: list[tuple[Report, list[tuple[str, str, str]]]] = []
        crashed: list[str] = []
        for rank, (rc, printed) in enumerate(outcomes):
            out_path = os.path.join(tmp, f"rank{rank}.json")
            if not os.path.exists(out_path):
                tail = [text for text in printed if text.strip()][-1:] or [f"exit status {rc}"]
                crashed.append(f"rank {rank}: the simulation of this rank ended without a report "
                               f"(exit status {rc}): {tail[0]}")
                continue
            with open(out_path, encoding="utf-8") as handle:
                data = json.load(handle)
            results.append((report_from_dict(data["report"]), [tuple(u) for u in data["uses"]]))
    if crashed:
        raise RuntimeError("; ".join(crashed))
    reports = [r for r, _ in results]
    findings = _merge(reports) + _shared_gpus([u for _, u in results])
    findings = [f for f in findings if f.code in codes]
    notes = [_describe_ranks(nproc, gpus), *_merge_notes([r.notes for r in reports])]
    stats = {**dict(reports[0].stats), "ranks": nproc}
    unfinished = _merge_unfinished([r.unfinished for r in reports])
    return Report.build(program.name, ", ".join(f"cuda:{k}" for k in range(nproc)), reports[0].engine,
                        findings, notes, stats, unfinished=unfinished,
                        coverage=_merge_coverage([r.coverage for r in reports]))


def _merge_coverage(coverages: Sequence[Coverage | None]) -> Coverage | None:
    from placecheck.findings.report import Coverage

    """The script's lines that ran on any rank (a line under ``if rank == 0:`` ran); the blocks never run
    are those of the rank that ran the most."""
    known = [c for c in coverages if c is not None]
    if not known:
        return None
    not_run = set.intersection(*(set(c.not_run) for c in known))
    most = min(known, key=lambda c: len(c.not_run))
    return Coverage(most.file, most.lines, most.lines - len(not_run), tuple(sorted(not_run)), most.blocks)


def _spawned_ranks(config_path: str, tmp: str, nproc: int, timeout: float | None
                   ) -> list[tuple[int | None, list[str]]]:
    """Each rank in a process of its own (``python -m placecheck.run.rank CONFIG OUT``): each rank's exit
    status and the lines it printed (relayed as it prints them)."""
    children = []
    lock = threading.Lock()
    for rank in range(nproc):
        out_path = os.path.join(tmp, f"rank{rank}.json")
        # unbuffered: the script's lines reach the terminal as the rank prints them
        env = {**os.environ, **rank_environment(rank, nproc), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "placecheck.run.rank", config_path, out_path],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, encoding="utf-8", errors="replace")
        printed: list[str] = []
        assert proc.stdout is not None
        relay = threading.Thread(target=_relay, args=(proc.stdout, {rank: printed}, lock, False),
                                 daemon=True)
        relay.start()
        children.append((proc, printed, relay))
    outcomes: list[tuple[int | None, list[str]]] = []
    for proc, printed, relay in children:
        outcomes.append((_wait(proc, timeout), printed))
        relay.join(timeout=10)  # a process the rank left behind may hold the pipe open
    return outcomes


def _forked_ranks(config_path: str, tmp: str, nproc: int, timeout: float | None
                  ) -> list[tuple[int | None, list[str]]]:
    """The ranks forked from one process that imported torch and placecheck once
    (:func:`placecheck.run.rank.fork_ranks`): each rank's exit status and the lines it printed. That
    process is forked from this process's warm server (:func:`_served`) where there is one to fork from,
    else started (``python -m placecheck.run.rank --ranks``)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           # read by torch when it is imported: the same for every rank
           "OMP_NUM_THREADS": rank_environment(0, nproc)["OMP_NUM_THREADS"]}
    printed: dict[int, list[str]] = {rank: [] for rank in range(nproc)}
    served, rc = _served(config_path, tmp, nproc, timeout, env, printed)
    if not served:
        proc = subprocess.Popen([sys.executable, "-m", "placecheck.run.rank", "--ranks", config_path, tmp,
                                 str(nproc)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, encoding="utf-8", errors="replace",
                                start_new_session=True)
        assert proc.stdout is not None
        relay = threading.Thread(target=_relay, args=(proc.stdout, printed, threading.Lock(), True),
                                 daemon=True)
        relay.start()
        rc = _wait(proc, timeout, group=True)
        relay.join(timeout=10)
    statuses: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError), \
            open(os.path.join(tmp, "statuses.json"), encoding="utf-8") as handle:
        statuses = json.load(handle)
    return [(statuses.get(str(rank), rc), printed[rank]) for rank in range(nproc)]


RANK_MODULES = ("torch", "torch.distributed", "torch.nn.parallel", "placecheck.run",
                "placecheck.run.recorder", "placecheck.run.ranks", "placecheck.findings.formats.json")
"""What every rank imports: imported once, before the ranks fork (:func:`placecheck.run.rank.fork_ranks`),
and by the warm server the process that forks them is forked from."""

_SERVERS: dict[str, Any] = {}
"""This process's warm ranks' servers (:class:`placecheck.basics.forkserver.ForkServer`), by the
``PYTHONPATH`` they were started with (what their ``sys.path`` holds), each started on first use and
stopped at exit."""

_SERVER_LOCK = threading.Lock()


def _served(config_path: str, tmp: str, nproc: int, timeout: float | None, env: dict[str, str],
            printed: dict[int, list[str]]) -> tuple[bool, int | None]:
    """The ranks' process forked from this process's warm server, its output relayed as it grows (the
    server's child writes it to a file): (whether it ran so, its exit status: None when killed at
    ``timeout`` and 2 minutes of grace). Not run where no server can fork it: the caller starts it."""
    from placecheck.basics.forkserver import NO_TIMEOUT, ForkServer, JobFiles, ServerGone, fork_available

    if not fork_available():
        return False, None
    key = env.get("PYTHONPATH", "")
    files = JobFiles(Path(tmp) / "job.json", Path(tmp) / "job.result", Path(tmp) / "ranks.out")
    files.spec.write_text(json.dumps({"env": env, "cwd": os.getcwd(), "config": config_path, "dir": tmp,
                                      "nproc": nproc}), encoding="utf-8")
    files.stderr.touch()
    done = threading.Event()
    relay = threading.Thread(target=_relay, args=(_grown_lines(files.stderr, done), printed,
                                                  threading.Lock(), True), daemon=True)
    with _SERVER_LOCK:  # one request at a time on a server's line protocol
        server = _SERVERS.get(key)
        if server is None or server.process.poll() is not None:
            server = _SERVERS[key] = ForkServer([*RANK_MODULES, "placecheck.run.rank"], workdir=None, env=env)
            atexit.register(server.close)
        relay.start()
        try:
            status: int | None = server.run(files, NO_TIMEOUT if timeout is None else timeout + 120,
                                            entry="placecheck.run.rank:served_ranks")
        except ServerGone:  # the server died (or never got warm): no rank ran, or those that ran are read
            _SERVERS.pop(key).close()
            status = None
            if not os.path.exists(os.path.join(tmp, "statuses.json")):
                printed.update({rank: [] for rank in printed})
                return False, None
        except BaseException:  # Ctrl-C: the server's protocol is mid-request; a later run starts anew
            _SERVERS.pop(key).close()
            raise
        finally:
            done.set()
            relay.join(timeout=10)
    return True, status


def _grown_lines(path: Path, done: threading.Event) -> Iterator[str]:
    """The lines of ``path`` as another process appends them, until ``done`` is set and all is read."""
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        pending = ""
        while True:
            finished = done.is_set()
            chunk = handle.read()
            pending += chunk
            *lines, pending = pending.split("\n")
            yield from (line + "\n" for line in lines)
            if finished and not chunk:
                break
            if not chunk:
                time.sleep(0.02)
        if pending:
            yield pending


def _wait(proc: subprocess.Popen[str], timeout: float | None, group: bool = False) -> int | None:
    """``proc``'s exit status; killed (with its process group: the ranks it forked) past ``timeout``
    and 2 minutes of grace."""
    try:
        return proc.wait(timeout=None if timeout is None else timeout + 120)
    except subprocess.TimeoutExpired:
        if group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        return proc.wait()


def _relay(stream: Iterable[str], printed: dict[int, list[str]], lock: threading.Lock,
           tagged: bool) -> None:
    """The ranks' output, line by line as they print it, prefixed as torchrun does (``[rank1]: ...``):
    a process of one rank (``printed`` has its one rank), or the forking process's ``RANK<TAB>line``s
    (``tagged``)."""
    only = next(iter(printed))
    for line in stream:
        text = line.rstrip("\n")
        rank = only
        if tagged:
            head, tab, rest = text.partition("\t")
            if not (tab and head.isdigit() and int(head) in printed):
                continue  # the forking process's own output (an import's warning): no rank's
            rank, text = int(head), rest
        printed[rank].append(text)
        with lock:
            print(f"[rank{rank}]: {text}", flush=True)
    if isinstance(stream, io.IOBase):
        stream.close()


def ranks_label(ranks: Sequence[int]) -> str:
    """``rank 1``, ``ranks 0-3``, ``ranks 0, 2``."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _neutral(text: str, rank: int) -> str:
    """``text`` with the rank's own GPU named generically: what is the same on every rank compares equal."""
    return re.sub(rf"\bcuda:{rank}\b", "cuda:LOCAL_RANK", text)


def _merge(reports: Sequence[Report]) -> list[Finding]:
    """The ranks' findings, each once, naming the ranks that have it (the first of them shown)."""
    groups: dict[tuple[str, ...], list[tuple[int, Finding]]] = {}
    for rank, report in enumerate(reports):
        for f in report.findings:
            key = (f.code, f.kind, f.where, f.source, _neutral(f.message, rank), _neutral(f.device, rank),
                   _neutral(f.expected, rank))
            groups.setdefault(key, []).append((rank, f))
    merged = []
    for members in groups.values():
        first = members[0][1]
        label = ranks_label([rank for rank, _ in members])
        merged.append(dataclasses.replace(
            first, message=f"on {label}, {first.message}",
            details=(*first.details, ("ranks", label.split(" ", 1)[1]))))
    return merged


def _shared_gpus(uses: Sequence[Sequence[tuple[str, str, str]]]) -> list[Finding]:
    """PC401 where two or more ranks ran DDP's construction or a collective on one GPU: NCCL's
    "Duplicate GPU detected"."""
    by_site: dict[tuple[str, str], dict[Device, set[int]]] = {}
    for rank, rank_uses in enumerate(uses):  # as each rank's process wrote them (JSON)
        for line, call, device in rank_uses:
            by_site.setdefault((line, call), {}).setdefault(Device.of(device), set()).add(rank)
    shared = [(line, call, device, sorted(ranks)) for (line, call), devices in by_site.items()
              for device, ranks in sorted(devices.items()) if len(ranks) >= 2]
    if not shared:
        return []
    # a GPU job stops at the first of them: that one is the finding, the later ones are counted
    line, call, device, ranks = shared[0]
    label = ranks_label(ranks)
    return [rules.ranks_share_gpu(label, call, device, ranks, len(shared) - 1, line)]


def _describe_ranks(nproc: int, gpus: int) -> str:
    return (f"ranks: {nproc} (torchrun --nproc-per-node {nproc} simulated: each rank a process of its own "
            f"with torchrun's environment, RANK = LOCAL_RANK = k, on a node of {gpus} simulated GPU"
            f"{'s' if gpus != 1 else ''}; init_process_group's group is PyTorch's fake process group "
            "(collectives return at once and move no data), with NCCL's rules when the script asks for "
            "nccl); each finding names the ranks that have it; the ranks run with real values (--engine "
            "tagged: the fake engine cannot build DistributedDataParallel yet)")


def _merge_notes(notes: Sequence[Sequence[str]]) -> list[str]:
    order: list[str] = []
    where: dict[str, list[int]] = {}
    shown: dict[str, str] = {}
    for rank, rank_notes in enumerate(notes):
        for note in rank_notes:
            key = _neutral(note, rank)
            if key not in where:
                order.append(key)
                shown[key] = note
            where.setdefault(key, []).append(rank)
    out = []
    for key in order:
        ranks = where[key]
        if len(ranks) == len(notes) and (key.startswith(("engine: ", "torch: ")) or key == shown[key]):
            out.append(shown[key])
        else:
            out.append(f"{ranks_label(ranks)}: {shown[key]}")
    return out


def _merge_unfinished(unfinished: Sequence[str]) -> str:
    said: dict[str, list[int]] = {}
    for rank, text in enumerate(unfinished):
        if text:
            said.setdefault(_neutral(text, rank), []).append(rank)
    return "; ".join(f"{ranks_label(ranks)}: {text}" for text, ranks in said.items())
