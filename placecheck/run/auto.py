"""``placecheck run --engine auto``: fake tensors when a real-valued step would not fit.

The script starts under the real-valued engine (exact losses, branches and
``.item()``), watched: every parameter and buffer registered in a module (the
moment a layer is built, its memory is taken), and every tensor made during the
first forward of a top-level module. The bytes a real-valued step would hold
are estimated as it goes, from that evidence alone:

    4 x parameter bytes (weights, gradients, two optimizer moments as Adam keeps)
    + buffer bytes + 2 x the bytes the first forward made so far
      (activations kept for backward, and their gradients; an upper bound: views
      and in-place results count too)

and compared with the budget: :data:`DEFAULT_BUDGET` (2 GiB), less when less
memory is available (half of ``MemAvailable``), or ``PLACECHECK_RUN_MEMORY``
(``512MiB``, ``8GiB``: :class:`~placecheck.basics.values.Size`'s grammar) / ``run(memory=...)`` (bytes, or a
size as a string).

The moment the estimate passes the budget (an 8B model's embedding, 2 GB,
passes it while it is built), the real-valued attempt is abandoned: what the
script printed is dropped, the random number generators are put back, the
memory is released, and the script runs again from its start under the fake
engine (:mod:`placecheck.run.fake`), where any model costs its metadata. What
the script did before that point (files it wrote) happens twice; a note says
so. Once the first forward ended, or the first optimizer step, within the
budget, the run simply goes on with real values: a small script runs once,
exactly as under ``--engine tagged``.

Where the fake engine cannot go on (code that needs a CUDA driver: a legacy ``.type(x.type())``, a
custom kernel; a value it cannot give), auto does not give up: what a real-valued step holds is
measured under the fake engine too (the same estimate), and when it fits in half the memory
available (:func:`real_values_fit`; the budget, a choice of speed, does not bound this fallback), the
script runs once more from its start with real values, whose findings are the report's; else the run
stops there with a note (exit code 2, never a finding).
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import torch

from placecheck.basics.devices import human_bytes
from placecheck.basics.values import Size
from placecheck.model.construct import available_memory
from placecheck.run.session import StopRun

DEFAULT_BUDGET = 2 << 30
"""The most bytes a real-valued step may hold (lowered to half the memory available): past a few GiB a
step on the CPU takes tens of seconds (a resnet50 step at batch 32, 4.7 GB, took 69 s here)."""

ENV = "PLACECHECK_RUN_MEMORY"
DEFAULT_SOURCE = "placecheck's default, or half the memory available when that is less"

def parse_bytes(text: str, what: str = ENV) -> int:
    """A size in :class:`~placecheck.basics.values.Size`'s grammar (``512MiB``, ``8GB``), as bytes."""
    return Size.parse(text, what).bytes


def memory_budget(memory: int | str | None = None) -> tuple[int, str]:
    """The budget of a real-valued step, and where it comes from (for the note)."""
    if memory is not None:
        value = memory if isinstance(memory, int) else parse_bytes(memory, "memory")
        return value, "run(memory=...)"
    env = os.environ.get(ENV)
    if env:
        return parse_bytes(env), f"{ENV}={env}"
    available = available_memory()  # 0: unknown
    if available and available // 2 < DEFAULT_BUDGET:
        return available // 2, DEFAULT_SOURCE
    return DEFAULT_BUDGET, DEFAULT_SOURCE


class Switch(StopRun):
    """Raised into the script to abandon the real-valued attempt: the fake engine runs it again."""


class Probe:
    """What the real-valued attempt has built and made so far, and the decision."""

    def __init__(self, budget: int, source: str) -> None:
        self.budget = budget
        self.source = source
        self.decided = ""
        """"" while watching; then ``fake`` (switch) or ``tagged`` (go on)."""
        self.activations = 0
        self.params = 0
        self.buffers = 0
        self.at = ""
        self._seen: set[int] = set()
        self._streams: tuple[TextIO, TextIO] | None = None
        self._captured = io.StringIO()

    # -- measuring ---------------------------------------------------------------------------------
    def registered(self, t: Any, buffer: bool) -> None:
        """A parameter or buffer registered in a module (its memory is taken)."""
        if self.decided or not isinstance(t, torch.Tensor) or id(t) in self._seen:
            return
        self._seen.add(id(t))
        nbytes = t.numel() * t.element_size()
        if buffer:
            self.buffers += nbytes
        else:
            self.params += nbytes
        self._check()

    def made(self, out: Any) -> None:
        """A tensor (or tensors) made during the first forward."""
        if isinstance(out, torch.Tensor):
            self.activations += out.numel() * out.element_size()
        elif isinstance(out, tuple | list):
            for o in out:
                if isinstance(o, torch.Tensor):
                    self.activations += o.numel() * o.element_size()
        self._check()

    @property
    def estimate(self) -> int:
        return 4 * self.params + self.buffers + 2 * self.activations

    def _check(self) -> None:
        if self.estimate > self.budget:
            from placecheck.engines.sources import here

            self.decided = "fake"
            self.at = here()[0]
            raise Switch("to run again with fake tensors")

    def done(self, at: str = "") -> None:
        """The first forward (or optimizer step) ended within the budget: real values from now on."""
        if not self.decided:
            self.decided = "tagged"
            self.at = at
            self.release()

    # -- the script's output while undecided --------------------------------------------------------
    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Hold what the script prints until the decision: shown when the run goes on, dropped when it
        starts again under the fake engine."""
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = sys.stderr = self._captured
        try:
            yield
        finally:
            if self._streams is not None:
                sys.stdout, sys.stderr = self._streams
                self._streams = None

    def release(self) -> None:
        """Show what was held, and let the script print as usual from now on."""
        if self._streams is None:
            return
        out, err = self._streams
        sys.stdout, sys.stderr = out, err
        self._streams = None
        out.write(self._captured.getvalue())
        out.flush()

    def note(self, gpus: str = "1 GPU") -> str:
        where = f", when the script reached {self.at}" if self.at else ""
        sizes = (f"{human_bytes(self.params)} of parameters x 4 (weights, gradients, two optimizer "
                 f"moments) + {human_bytes(self.buffers)} of buffers + {human_bytes(self.activations)} made "
                 "by the first forward x 2")
        if self.decided == "fake":
            return (f"engine: auto chose fake tensors: a real-valued step would hold more than "
                    f"{human_bytes(self.estimate)} ({sizes}{where}), over the budget of "
                    f"{human_bytes(self.budget)} ({self.source}); the script ran again from its start "
                    "with fake tensors, so what it did before that point happened twice (its writes to files "
                    "were discarded: it started again from your files)")
        budget = (f"{human_bytes(self.budget)}, {self.source}" if self.source != DEFAULT_SOURCE else
                  f"{human_bytes(DEFAULT_BUDGET)} or half the memory available; {ENV} sets it")
        return (f"engine: CUDA simulated with real CPU values ({gpus}), chosen by --engine auto: a "
                f"real-valued step holds about {human_bytes(self.estimate)}, within the budget ({budget}); "
                "losses, .item() and branches are real values; the script really runs, its writes kept in a "
                "scratch area, never in your files")


def real_values_fit(needed: int) -> tuple[bool, int]:
    """Whether a real-valued run that holds ``needed`` bytes fits this machine: within half the memory
    available now (:data:`DEFAULT_BUDGET` when that is unknown), whatever budget chose fake tensors;
    and that room."""
    available = available_memory()
    room = available // 2 if available else DEFAULT_BUDGET
    return needed <= room, room


def fallback_note(limit: str, needed: int, room: int, fits: bool) -> str:
    """The note when the fake engine, chosen by auto, could not go on (``limit``, its note): the script
    ran again with real values, or (``fits`` False) the run stops there."""
    # "run: stopped at train.py:9: the code there needs ..." -> "stopped at train.py:9"
    stop = limit.split(": ", 1)[-1]
    stop = stop.split(": the code there", 1)[0].split(": the simulation", 1)[0]
    if fits:
        return (f"engine: auto went back to real values: the fake engine could not go on ({stop}), and a "
                f"real-valued step holds about {human_bytes(needed)} (measured under the fake engine), "
                "within "
                f"half the memory available ({human_bytes(room)}): the script ran again from its start with "
                "real CPU values, so what it did before that point happened once more; its findings are "
                "those of this last run")
    return (f"engine: auto kept fake tensors: the fake engine could not go on ({stop}), and a real-valued "
            f"step would hold more than {human_bytes(needed)} (measured under the fake engine), over half "
            "the "
            f"memory available ({human_bytes(room)}): the run stops there (see the note that says why); run "
            "on a GPU, or where more memory is free, to check the rest")


@contextlib.contextmanager
def random_state_kept() -> Iterator[None]:
    """The random number generators as they were before the block, once it ends: the real-valued run
    draws what a plain run draws."""
    torch_state = torch.random.get_rng_state()
    python_state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        random.setstate(python_state)
        if numpy is not None and numpy_state is not None:
            numpy.random.set_state(numpy_state)
