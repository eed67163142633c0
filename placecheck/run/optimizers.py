"""The script's optimizers: where each was built and resumed, and what they hold at each step.

Before each ``optimizer.step()`` (the global step pre-hook): state left on another device than its
parameter after a resume (PC307; the state is moved so the step runs on, as after the fix), and an
optimizer holding none of the parameters the forwards since the last step used (PC308).
"""

from __future__ import annotations

import typing
import weakref
from collections.abc import Callable
from typing import Any

import torch

from placecheck import rules
from placecheck.finding import Finding
from placecheck.rules import rule
from placecheck.sources import here

if typing.TYPE_CHECKING:
    from placecheck.run.session import Recording


class Optimizers:
    """Every optimizer the script builds, and the checks run before each of its steps."""

    def __init__(self, recorder: Recording) -> None:
        self.recorder = recorder
        self.built: weakref.WeakKeyDictionary[torch.optim.Optimizer, str] = weakref.WeakKeyDictionary()
        """Each optimizer -> the line that built it."""
        self.resumed: weakref.WeakKeyDictionary[torch.optim.Optimizer, str] = weakref.WeakKeyDictionary()
        """Each optimizer resumed with load_state_dict -> that line."""
        self.reported: set[tuple[int, str]] = set()

    def __len__(self) -> int:
        """How many optimizers the script built (and still holds)."""
        return len(self.built)

    def optimizer_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Optimizer.__init__``: the line each optimizer is built at."""
        def __init__(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original(opt, *args, **kwargs)
            if opt not in self.built:
                self.built[opt] = here()[0]
        return __init__

    def optimizer_load(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Optimizer.load_state_dict``: the line a resume loads its state at."""
        def load_state_dict(opt: torch.optim.Optimizer, state_dict: Any) -> Any:
            self.resumed[opt] = here()[0]
            return original(opt, state_dict)
        return load_state_dict

    def before_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The global step pre-hook: PC307 and PC308 before the step runs."""
        with self.recorder.quiet():
            self._check_state(opt)
            self._check_params(opt)

    def after_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The global step post-hook: one more step done (the run may stop here)."""
        self.recorder.step_done()

    def _check_state(self, opt: torch.optim.Optimizer) -> None:
        """PC307: optimizer state on another device than its parameter (a resume loaded before the move)."""
        r = rule("PC307")
        for index, group in enumerate(opt.param_groups):
            off_bytes, off_count, devices, param_devices = 0, 0, set(), set()
            for p in group["params"]:
                state = opt.state.get(p)
                if not state:
                    continue
                for key, value in list(state.items()):
                    if not isinstance(value, torch.Tensor) or value.device == p.device:
                        continue
                    if value.dim() == 0 and value.device.type == "cpu":
                        continue  # `step` counters stay on the CPU unless capturable/fused
                    off_bytes += value.numel() * value.element_size()
                    off_count += 1
                    devices.add(str(value.device))
                    param_devices.add(str(p.device))
                    state[key] = value.to(p.device)  # so the step runs on, as after the fix
            if not off_count:
                continue
            report_key = (id(opt), f"group{index}")
            if report_key in self.reported:
                continue
            self.reported.add(report_key)
            line = self.resumed.get(opt) or self.built.get(opt, "")
            state_on, params_on = ", ".join(sorted(devices)), ", ".join(sorted(param_devices))
            message, hint = rules.optimizer_state_off_device(off_count, off_bytes, index, state_on, params_on)
            self.recorder.add(Finding(
                code=r.code, kind=r.kind, severity=r.severity,
                where=f"{type(opt).__name__}.param_groups[{index}]", message=message, hint=hint,
                source=line, device=state_on, expected=params_on, nbytes=off_bytes, count=off_count,
                details=(("optimizer", type(opt).__name__),)))

    def _check_params(self, opt: torch.optim.Optimizer) -> None:
        """PC308: the forward since the last step used none of this optimizer's parameters."""
        roots = [m for m in self.recorder.roots.values() if any(p.requires_grad for p in m.parameters())]
        if not roots or id(opt) in {k[0] for k in self.reported if k[1] == "stale"}:
            return
        held = {id(p) for group in opt.param_groups for p in group["params"]}
        used = {id(p): (type(m).__name__, name) for m in roots for name, p in m.named_parameters()}
        if held & set(used):
            return
        self.reported.add((id(opt), "stale"))
        r = rule("PC308")
        names = [name for _, name in used.values()]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        model = ", ".join(sorted({cls for cls, _ in used.values()}))
        line = self.built.get(opt, "")
        message, hint = rules.stale_optimizer(type(opt).__name__, line, len(held), model, len(names), shown)
        self.recorder.add(Finding(
            code=r.code, kind=r.kind, severity=r.severity, where=f"{type(opt).__name__}",
            message=message, hint=hint,
            source=line, count=len(names), module=model,
            details=(("optimizer", type(opt).__name__), ("parameters", shown))))
