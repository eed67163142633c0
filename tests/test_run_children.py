"""Issue 40 item 4: the script's child processes run under the simulation (:mod:`placecheck.run.children`).

``torch.multiprocessing`` workers, forked or spawned (``mp.Process``, ``mp.spawn``), train under the
engine and a recorder of their own process; their findings, counts, lines and errors come back into
the one report. Fixtures: ``tests/fixtures/run/children/``: the Hogwild example's shape (a model on the
GPU shared with ``share_memory()``, spawned workers with their own optimizers), workers forked from a
parent that has not used CUDA, and a worker that raises. Each check runs in a fresh interpreter
(tests/fresh.py): forked workers inherit the process they start from.
"""

from __future__ import annotations

import os
import re
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from fresh import fresh

from placecheck.findings.report import exit_code
from placecheck.run import run

pytestmark = [pytest.mark.compat]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run" / "children"
ENGINES = pytest.mark.parametrize("engine", ["tagged", "fake"])


def script(name: str) -> str:
    return os.path.relpath(FIXTURES / name)


def marked(name: str, mark: str) -> str:
    """``path:line`` of the fixture's line marked ``# MARK mark``."""
    text = (FIXTURES / name).read_text().splitlines()
    return f"{script(name)}:{next(i + 1 for i, s in enumerate(text) if f'# MARK {mark}' in s)}"


def errors(report: object) -> list[tuple[str, str, str]]:
    return sorted((f.code, f.source, f.where) for f in report.findings  # type: ignore[attr-defined]
                  if f.severity.value in ("error", "warning"))


def test_hogwild_spawned_workers_train_under_the_simulation_and_their_bug_is_found_at_its_line() -> None:
    fixed = fresh(run, script("hogwild_fixed.py"), engine="tagged")
    assert errors(fixed) == [] and fixed.unfinished == "" and exit_code([fixed]) == 0
    stats = dict(fixed.stats)
    # each worker's optimizer stepped to the budget (--steps 2): the shared parameters arrived as leaves
    assert stats["child_processes"] == 2 and stats["optimizer_steps"] == 4
    assert fixed.coverage is not None and fixed.coverage.not_run == ()  # train()'s lines ran in the workers
    buggy = fresh(run, script("hogwild_buggy.py"), engine="tagged")
    assert errors(buggy) == [("PC201", marked("hogwild_buggy.py", "loss"), "target")]
    assert exit_code([buggy]) == 1


def test_hogwild_spawned_under_the_fake_engine_is_a_limit_note_never_a_pass() -> None:
    report = fresh(run, script("hogwild_fixed.py"), engine="fake")
    start = f"{script('hogwild_fixed.py')}:54"
    assert report.unfinished == f"the simulation stopped at {start}"
    assert any(n.startswith(f"run: stopped at {start}: the script starts a child process (train) with "
                            "the spawn start method: the fake engine's tensors hold no data")
               for n in report.notes)
    assert exit_code([report], exit_zero=True) == 2


@ENGINES
def test_hogwild_forked_after_the_parent_used_cuda_is_cudas_fork_error_in_the_worker(engine: str) -> None:
    report = fresh(run, script("hogwild_fixed.py"), ["--start", "fork"], engine=engine)
    [(code, source, _)] = errors(report)
    # on a GPU the worker's first CUDA tensor raises "Cannot re-initialize CUDA in forked subprocess"
    assert (code, source) == ("PC207", f"{script('hogwild_fixed.py')}:33")


@ENGINES
def test_forked_workers_are_checked_and_their_bug_is_in_the_parents_report(engine: str) -> None:
    fixed = fresh(run, script("fork_fixed.py"), engine=engine)
    assert errors(fixed) == [] and fixed.unfinished == "" and exit_code([fixed]) == 0
    assert dict(fixed.stats)["child_processes"] == 2 and dict(fixed.stats)["device_ops"] > 0
    buggy = fresh(run, script("fork_buggy.py"), engine=engine)
    # the loss's line, after the move that left the labels out
    path, _, moved = marked("fork_buggy.py", "move").rpartition(":")
    # and the line to edit: the labels made without device= the line before the move (PC202)
    assert errors(buggy) == [("PC201", f"{path}:{int(moved) + 1}", "y"),
                             ("PC202", f"{path}:{int(moved) - 1}", "")]


def test_mp_spawn_workers_are_checked_and_their_bug_is_found() -> None:
    fixed = fresh(run, script("fork_fixed.py"), ["--spawn"], engine="tagged")
    assert errors(fixed) == [] and fixed.unfinished == "" and dict(fixed.stats)["child_processes"] == 2
    buggy = fresh(run, script("fork_buggy.py"), ["--spawn"], engine="tagged")
    assert [(c, s) for c, s, _ in errors(buggy)] == [("PC201", f"{script('fork_buggy.py')}:20"),
                                                     ("PC202", f"{script('fork_buggy.py')}:18")]


@ENGINES
def test_a_worker_that_raises_leaves_the_run_unfinished_exit_2(engine: str) -> None:
    report = fresh(run, script("worker_raises.py"), engine=engine)
    said = re.escape(f"raised KeyError at {marked('worker_raises.py', 'raises')}: 'scale'")
    assert re.fullmatch(rf"child process work \(pid \d+\) {said}", report.unfinished), report.unfinished
    assert exit_code([report], exit_zero=True) == 2


def test_a_simulated_parameter_crosses_a_spawn_as_a_leaf_on_its_device() -> None:
    """The cause of the workers' "can't optimize a non-leaf Tensor": pickled as a Tensor subclass, a
    parameter is rebuilt with ``as_subclass``, an alias attached to autograd's graph."""
    from placecheck.engines.tagged import tagged_cuda
    from placecheck.run.children import _simulated_tensors_sent

    with tagged_cuda(1):
        model = nn.Linear(2, 2).to("cuda")
        model.share_memory()
        sent = ForkingPickler.dumps(model.weight)
        assert not ForkingPickler.loads(sent).is_leaf  # torch's own rebuild: what the workers got
        with _simulated_tensors_sent():
            weight = ForkingPickler.loads(ForkingPickler.dumps(model.weight))
        assert weight.is_leaf and weight.requires_grad and isinstance(weight, nn.Parameter)
        assert weight.device == torch.device("cuda", 0)
        torch.optim.SGD([weight], lr=0.1)  # accepted
        with torch.no_grad():
            weight.add_(1.0)  # the storage is shared, as torch shares a CPU tensor's
        assert torch.equal(weight, model.weight)


_SUBCLASS = """import sys
import torch
import torch.multiprocessing as mp


class Worker(mp.Process):
    def run(self):
        x = torch.ones(2, device="cuda")
        w = torch.ones(2)
        print((x * w).sum().item())  # MARK mix


if __name__ == "__main__":
    mp.set_start_method(sys.argv[1], force=True)
    worker = Worker()
    worker.start()
    worker.join()
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_process_subclass_whose_own_run_mixes_devices_is_found(tmp_path: Path, method: str) -> None:
    path = tmp_path / "subclass.py"
    path.write_text(_SUBCLASS)
    report = fresh(run, str(path), [method], engine="tagged")
    assert errors(report) == [("PC201", f"{path}:10", "w"), ("PC202", f"{path}:9", "")]  # w's creation too


def test_the_scripts_start_method_is_its_own(tmp_path: Path) -> None:
    """A script's ``set_start_method("spawn", force=True)`` does not outlive its run: in a test suite it made
    a later script's DataLoader workers spawn (and fail on the unguarded ``__main__``)."""
    import multiprocessing

    path = tmp_path / "subclass.py"
    path.write_text(_SUBCLASS)
    before = multiprocessing.get_start_method(allow_none=True)
    assert before != "spawn"
    report = run(str(path), ["spawn"], engine="tagged")  # in this process: its state is the question
    assert errors(report) == [("PC201", f"{path}:10", "w"), ("PC202", f"{path}:9", "")]  # w's creation too
    assert multiprocessing.get_start_method(allow_none=True) == before


def test_the_scripts_sigint_handler_is_its_own(tmp_path: Path) -> None:
    """A script (or a framework in it: Lightning's interrupt handling) that leaves SIGINT ignored does not
    take the caller's Ctrl-C with it."""
    import signal

    path = tmp_path / "ignores.py"
    path.write_text("import signal\nimport torch\ntorch.ones(1, device='cuda')\n"
                    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n")
    before = signal.getsignal(signal.SIGINT)
    assert before is not signal.SIG_IGN
    run(str(path), engine="tagged")
    assert signal.getsignal(signal.SIGINT) is before
