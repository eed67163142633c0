"""Where the audit runs: a real device, or CUDA simulated with fake tensors or with real values.

The simulated engine enters ``FakeTensorMode(allow_non_fake_inputs=True)``:
``model.to("cuda")`` turns registered parameters and buffers into fake CUDA
tensors (no memory for their data), everything ``.to()`` did not move stays a
real CPU tensor, and an op mixing the two raises PyTorch's own "Expected all
tensors to be on the same device". Model code that asks
``torch.cuda.is_available()`` or ``device_count()`` sees the simulated GPUs.

The real-valued engine (:mod:`placecheck.tagged`) keeps real CPU data in
tensors that report the simulated device: slower and needing the weights in
memory, but it runs what fake tensors cannot (``.item()``, boolean masks,
data-dependent control flow, backward without a GPU). ``auto`` falls back to it
when the fake engine cannot run a model's forward (see :func:`fallback_engine`).

Not reentrant: one simulated session at a time per process.
"""

from __future__ import annotations

import contextlib
import enum
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
import torch.nn as nn

from placecheck.devices import device_index
from placecheck.errors import UsageError


class EngineChoice(str, enum.Enum):
    """The ``--engine`` choices."""

    AUTO = "auto"
    REAL = "real"
    FAKE = "fake"
    TAGGED = "tagged"
    """CUDA simulated with real CPU values tagged as CUDA (placecheck.tagged)."""

    def __str__(self) -> str:
        return self.value


SIMULATED_CUDA = "simulated cuda"
SIMULATED_CUDA_VALUES = "simulated cuda (real values)"


@dataclass(frozen=True)
class Engine:
    """A chosen engine: its report name, target device and simulated GPU count."""

    name: str
    device: str
    simulated: bool
    gpus: int = 0
    reason: str = ""
    """Why this engine was chosen, for the report's notes."""
    real_values: bool = False
    """A simulation with real CPU values (placecheck.tagged), not fake tensors."""

    @property
    def fake(self) -> bool:
        """CUDA simulated with fake tensors."""
        return self.simulated and not self.real_values

    def session(self) -> contextlib.AbstractContextManager[Any]:
        """The context every step of the audit (build, move, forward) runs in."""
        if self.real_values:
            from placecheck.tagged import tagged_cuda

            return tagged_cuda(self.gpus)
        if self.simulated:
            return simulated_cuda(self.gpus)
        return contextlib.nullcontext()


def _real_available(device: str) -> tuple[bool, str]:
    kind = device.split(":")[0]
    if kind in ("cpu", "meta"):
        return True, ""
    if kind == "cuda":
        if not torch.cuda.is_available():
            return False, "no CUDA GPU is present"
        count = torch.cuda.device_count()
        if device_index(device) >= count:
            return False, f"this machine has {count} GPU{'s' if count != 1 else ''}"
        return True, ""
    if kind == "mps":
        ok = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
        return ok, "" if ok else "MPS is not available on this machine"
    return False, f"unknown device {device}"


def choose_engine(device: str, choice: EngineChoice = EngineChoice.AUTO, gpus: int | None = None,
                  train: bool = False) -> Engine:
    """Pick the engine for ``device`` (normalised) and ``--engine``.

    ``auto``: the real device when present; simulated CUDA when the target is
    CUDA and no (or too few) GPUs are present: with fake tensors, or with real
    values when ``train`` (a backward needs them without a GPU). ``gpus`` is the
    number of simulated GPUs (default: enough for the target index).
    """
    kind = device.split(":")[0]
    available, why_not = _real_available(device)
    sim_gpus = max(gpus or 1, device_index(device) + 1)
    if choice is EngineChoice.REAL or (choice is EngineChoice.AUTO and available):
        if not available:
            raise UsageError(f"--engine real cannot run on {device}: {why_not}; "
                             "use --engine auto to simulate CUDA")
        return Engine(name=kind, device=device, simulated=False, reason=f"real {kind} device")
    if kind != "cuda":
        if choice in (EngineChoice.FAKE, EngineChoice.TAGGED):
            raise UsageError(f"--engine {choice.value} simulates CUDA only, not {device}: use --device cuda")
        raise UsageError(f"{device} is not available here ({why_not}): placecheck simulates "
                         "CUDA only; use --device cuda or --device cpu")
    plural = "s" if sim_gpus != 1 else ""
    if choice is EngineChoice.FAKE and train:
        raise UsageError("--train needs a backward pass, which the fake engine cannot run without a GPU: "
                         "use --engine tagged (or auto)")
    if choice is EngineChoice.TAGGED or train:
        why = ("requested with --engine tagged" if choice is EngineChoice.TAGGED else
               f"{why_not}; --train needs a backward, which fake tensors cannot run without a GPU")
        return Engine(name=SIMULATED_CUDA_VALUES, device=device, simulated=True, gpus=sim_gpus,
                      real_values=True, reason=f"{why}; CUDA simulated with real CPU values "
                                               f"({sim_gpus} GPU{plural})")
    reason = "requested with --engine fake" if choice is EngineChoice.FAKE else why_not
    return Engine(name=SIMULATED_CUDA, device=device, simulated=True, gpus=sim_gpus,
                  reason=f"{reason}; CUDA simulated with fake tensors ({sim_gpus} GPU"
                         f"{'s' if sim_gpus != 1 else ''})")


def fallback_engine(engine: Engine, why: str) -> Engine:
    """The real-valued engine that ``auto`` falls back to when fake tensors cannot run the forward."""
    plural = "s" if engine.gpus != 1 else ""
    return Engine(name=SIMULATED_CUDA_VALUES, device=engine.device, simulated=True, gpus=engine.gpus,
                  real_values=True,
                  reason=f"fell back from fake tensors, which cannot run this model's forward ({why}); "
                         f"CUDA simulated with real CPU values ({engine.gpus} GPU{plural})")


def _cuda_query_patches(gpus: int) -> dict[str, Callable[..., Any]]:
    """What model code may ask ``torch.cuda``, answered for ``gpus`` simulated GPUs."""

    def _props(device: Any = None) -> Any:
        return mock.Mock(name="placecheck simulated GPU", total_memory=80 * 2**30,
                         major=9, minor=0, multi_processor_count=132)

    return {
        "is_available": lambda: True,
        "device_count": lambda: gpus,
        "current_device": lambda: 0,
        "is_initialized": lambda: True,
        "get_device_name": lambda device=None: "placecheck simulated GPU",
        "get_device_capability": lambda device=None: (9, 0),
        "get_device_properties": _props,
        "is_bf16_supported": lambda *a, **k: True,
        "set_device": lambda device: None,
        "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "memory_allocated": lambda device=None: 0,
        "max_memory_allocated": lambda device=None: 0,
        "memory_reserved": lambda device=None: 0,
    }


def _called_from_torch(depth: int = 2) -> bool:
    """True when the caller of the patched function is torch itself."""
    name = sys._getframe(depth).f_globals.get("__name__", "")
    return bool(name == "torch" or name.startswith("torch."))


def _for_user_code(simulated: Callable[..., Any], real: Callable[..., Any]) -> Callable[..., Any]:
    """Answer model code with the simulated value, torch's own internals with the real one.

    torch consults ``torch.cuda.is_available()`` itself (fake tensors use it
    to decide whether they may initialise a device); only the user's code
    must see the simulated GPUs.
    """

    def query(*args: Any, **kwargs: Any) -> Any:
        if _called_from_torch():
            return real(*args, **kwargs)
        return simulated(*args, **kwargs)

    query.__name__ = getattr(real, "__name__", "query")
    query.__doc__ = getattr(real, "__doc__", None)
    return query


@contextlib.contextmanager
def cuda_queries_simulated(gpus: int) -> Iterator[None]:
    """Make ``torch.cuda.is_available()`` and friends report ``gpus`` GPUs to model code."""
    with contextlib.ExitStack() as stack:
        for name, fn in _cuda_query_patches(gpus).items():
            real = getattr(torch.cuda, name, None)
            if real is not None:
                stack.enter_context(mock.patch.object(torch.cuda, name, _for_user_code(fn, real)))
        yield


@contextlib.contextmanager
def simulated_cuda(gpus: int = 1) -> Iterator[Any]:
    """Fake-tensor mode plus simulated ``torch.cuda`` queries; yields the fake mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with cuda_queries_simulated(gpus), fake_mode:
        yield fake_mode


def _to_fake_device(fake_mode: Any, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    converter = fake_mode.fake_tensor_converter

    def convert(t: torch.Tensor) -> torch.Tensor:
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            meta = t.detach().to("meta")
        fake: torch.Tensor = converter.from_meta_and_device(fake_mode, meta, device)
        return fake

    return convert


@contextlib.contextmanager
def _each_module_applied_once() -> Iterator[None]:
    """Let ``Module._apply`` run once per module object during one ``.to()``.

    A module registered under two parents (T5's ``shared`` embedding is also
    ``encoder.embed_tokens``) is visited twice by ``.to()``. On a real device
    the second visit is a no-op; under fake tensors it tries to swap a
    parameter that is already fake and fails ("Couldn't swap
    Embedding.weight"). Overrides of ``_apply`` still run; only the base
    class's work is skipped the second time.
    """
    base_apply = nn.Module._apply
    applied: set[int] = set()

    def apply_once(self: nn.Module, fn: Callable[..., Any], recurse: bool = True) -> nn.Module:
        if id(self) in applied:
            return self
        applied.add(id(self))
        moved: nn.Module = base_apply(self, fn, recurse)  # type: ignore[no-untyped-call]
        return moved

    with mock.patch.object(nn.Module, "_apply", apply_once):
        yield


def move_model(model: nn.Module, engine: Engine) -> nn.Module:
    """``model.to(device)``, exactly as a user's script would, inside ``engine``.

    On a CPU-only build of torch, ``.to("cuda")`` under fake tensors fails
    ("not linked with support for cuda devices"); then each tensor is
    converted to a fake CUDA tensor through ``Module._apply``, the same hook
    ``.to()`` uses, so custom ``_apply`` overrides still run.
    """
    try:
        with _each_module_applied_once() if engine.fake else contextlib.nullcontext():
            moved = model.to(engine.device)
    except (RuntimeError, AssertionError) as exc:
        if not engine.fake or "cuda" not in str(exc).lower():
            raise
        from torch._guards import active_fake_mode

        fake_mode = active_fake_mode()
        if fake_mode is None:
            raise
        with _each_module_applied_once():
            moved = model._apply(  # type: ignore[no-untyped-call]
                _to_fake_device(fake_mode, torch.device(engine.device)))
    return moved if isinstance(moved, nn.Module) else model
