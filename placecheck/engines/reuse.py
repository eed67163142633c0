"""Identical module calls on the fake engine: run the first, give the others its output's shapes.

A forward on fake tensors can observe only what a call is made of: the
module's code and Python attributes (its submodules' too), the metadata of its
parameters, buffers and tensor attributes and of its inputs (shape, stride,
dtype, device), and which of those tensors have values :mod:`placecheck.engines.datadep`
knows. Two calls equal in all of that run the same ops on the same devices.
A DeepSeek-V3-shaped model makes 14,848 such calls of one expert's code (256
experts in 58 layers), and most of its audit was spent repeating them.

:class:`CallReuse` runs the first call of each such *key* as usual, while
watching it. The call is reusable when it did nothing that depends on which
module or which values it was:

- the tracer recorded no placement activity in it (no off-target argument or
  result, no registration; ``activity`` is the tracer's counter). A host sync
  is allowed: the tracer records it once per line anyway;
- an assumption it made on unknown values depends only on shapes: it is
  counted again for each reused call, so the report's "(N times)" stays true.
  A data-dependent op that read values (known, or resting on the call's own
  assumptions: ``DataDependentMode.value_reads``) makes the values part of the
  key: the call is reused only where its state and inputs have the same values
  known (a hash of them), or the same none;
- it wrote none of its own tensors or its inputs (their version counters), and
  left its own key as it was (no lazy layer, no changed attribute);
- its outputs are new tensors (no view of an input or of its state) with no
  known values, and its other outputs are plain values.

A later call with the same key then returns new fake tensors of the first
call's output shapes, without running. The module's hooks would not run, so a
module with hooks (or any global module hook) is never reused; neither is a
call whose inputs hold objects other than tensors and plain values (a cache
it could write to), nor anything with gradients enabled (a backward needs the
graph).

What this cannot see is code reading state outside the call's key: a global
counter, a registry keyed by the module's identity. ``reuse_calls=False``
(``--no-reuse-calls``) runs every call. The report says how many calls were
reused (:meth:`CallReuse.notes`).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules import module as module_mod

from placecheck.basics.patching import patch
from placecheck.engines.compat import (
    DisableTorchFunction,
    FakeTensor,
    tree_flatten,
    tree_unflatten,
    unset_fake_temporarily,
)
from placecheck.engines.datadep import on_host

if typing.TYPE_CHECKING:
    from placecheck.engines.datadep import DataDependentMode

_PLAIN = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format, enum.Enum)
"""Values compared by value (an ``enum`` member by identity, which is the same)."""
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_INTERNALS = frozenset({"_parameters", "_buffers", "_modules", "training", *_HOOKS,
                        "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                        "_forward_pre_hooks_with_kwargs", "_is_full_backward_hook", "_state_dict_hooks",
                        "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                        "_load_state_dict_post_hooks"})
"""``nn.Module``'s own bookkeeping: registered state is keyed separately, hooks make a module not
reusable, and the state-dict hooks do not run in a forward."""
_DEPTH = 4
"""Containers nested deeper than this in an attribute are compared by identity."""


_UNSEEN = object()
"""No call of this key ran yet."""
_BY_VALUES = object()
"""The first call of this key read values: the key takes the values known too (:meth:`CallReuse._values`)."""


class _NotReusable(Exception):
    """The call cannot be keyed (its inputs hold an object that is not a tensor or a plain value)."""


@dataclass
class _Memo:
    """What the first call of a key left: its output's structure and tensors' metadata, and the
    assumptions it made (None: the call was not reusable)."""

    spec: Any
    leaves: list[Any]
    assumptions: dict[Any, int]
    path: str


_TensorMeta = tuple[Any, ...]


class CallReuse:
    """Reuses the outputs' shapes of identical module calls during one fake forward of ``model``.

    ``activity`` returns the tracer's count of placement events so far; ``mode``
    is the fake engine's data-dependent mode (its known values and assumptions).
    Use :meth:`installed` around the forward; :attr:`reused` counts the calls
    that did not run.
    """

    def __init__(self, model: nn.Module, activity: Callable[[], int], mode: DataDependentMode,
                 paths: dict[int, str]) -> None:
        self.activity = activity
        self.mode = mode
        self.paths = paths
        self.reused = 0
        self.example = ""
        """One reused call and the call it reused, for the note (the largest module reused)."""
        self._example_size = 0
        self._interned: dict[tuple[Any, ...], int] = {}
        self._memos: dict[tuple[Any, ...], Any] = {}
        """key -> its first call's :class:`_Memo`, None (not reusable) or ``_BY_VALUES``."""
        self._candidates = self._repeated(model)

    # -- keys ---------------------------------------------------------------------------------------
    def _intern(self, key: tuple[Any, ...]) -> int:
        """A small integer per distinct key: a parent's key holds its children's as integers, so no
        key is hashed more than once however deep the model."""
        return self._interned.setdefault(key, len(self._interned))

    def _tensor(self, t: torch.Tensor) -> _TensorMeta:
        known = self.mode.value(t)[0] is not None
        return (type(t), tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad,
                known)

    def _value(self, v: Any, depth: int = 0) -> Any:
        """An attribute's value as a comparable key: plain values by value, tensors by metadata,
        containers by their items, anything else by identity."""
        if isinstance(v, torch.Tensor):
            return self._tensor(v)
        if isinstance(v, _PLAIN) or v is Ellipsis:
            return (type(v), v)
        if depth < _DEPTH and type(v) in (tuple, list, torch.Size):
            return (type(v), tuple(self._value(x, depth + 1) for x in v))
        if depth < _DEPTH and type(v) in (set, frozenset) and all(isinstance(x, _PLAIN) for x in v):
            return (type(v), frozenset(v))
        if depth < _DEPTH and type(v) is dict:
            return (dict, tuple((self._value(k, depth + 1), self._value(x, depth + 1)) for k, x in v.items()))
        return ("id", id(v))

    def key(self, module: nn.Module, known: dict[int, int | None] | None = None) -> int | None:
        """``module``'s key now: its class, attributes and state, its children's keys; None when it
        (or a submodule) has hooks. ``known``: keys computed already in this pass (by module id)."""
        if known is not None and id(module) in known:
            return known[id(module)]
        d = module.__dict__
        if any(d.get(h) for h in _HOOKS):
            return _remember(known, module, None)
        children: list[tuple[str, int | None]] = []
        for name, child in d["_modules"].items():
            if child is None:
                children.append((name, None))
                continue
            child_key = self.key(child, known)
            if child_key is None:
                return _remember(known, module, None)
            children.append((name, child_key))
        attrs = tuple((k, self._value(v)) for k, v in d.items() if k not in _INTERNALS)
        params = tuple((k, None if p is None else self._tensor(p)) for k, p in d["_parameters"].items())
        buffers = tuple((k, None if b is None else self._tensor(b)) for k, b in d["_buffers"].items())
        key = (type(module), d.get("training"), attrs, params, buffers, tuple(children))
        return _remember(known, module, self._intern(key))

    def _repeated(self, model: nn.Module) -> set[int]:
        """The modules whose key another module shares (computed once, bottom-up)."""
        counts: dict[int, list[int]] = {}
        known: dict[int, int | None] = {}
        self.key(model, known)
        by_id = {}
        for module in model.modules():
            if module is model:
                continue
            by_id[id(module)] = module
            k = known.get(id(module))
            if k is not None:
                counts.setdefault(k, []).append(id(module))
        # a leaf's call (one or two ops) costs about what its key does: only modules with children
        return {m for ids in counts.values() if len(ids) > 1 for m in ids if by_id[m]._modules}

    def _inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, list[torch.Tensor]]:
        leaves, spec = tree_flatten((args, kwargs))
        keyed: list[Any] = []
        tensors = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                tensors.append(leaf)
                keyed.append(self._tensor(leaf))
            elif isinstance(leaf, _PLAIN):
                keyed.append((type(leaf), leaf))
            else:
                raise _NotReusable
        return self._intern((str(spec), tuple(keyed))), tensors

    # -- the call -----------------------------------------------------------------------------------
    def _call(self, module: nn.Module, original: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        if id(module) not in self._candidates or torch.is_grad_enabled():
            return original(module, *args, **kwargs)
        with DisableTorchFunction():  # the bookkeeping's own tensor reads are not the model's
            found = self._lookup(module, args, kwargs)
        if isinstance(found, _Memo):
            return self._reuse(module, found)
        if found is None:
            return original(module, *args, **kwargs)
        key, inputs = found
        with DisableTorchFunction():
            state = [*module.parameters(), *module.buffers()]
            versions = [t._version for t in (*state, *inputs)]
        activity = self.activity()
        mode = self.mode
        reads = mode.value_reads
        assumed = dict(mode.assumptions)
        out = original(module, *args, **kwargs)
        with DisableTorchFunction():
            clean = (self.activity() == activity and [t._version for t in (*state, *inputs)] == versions
                     and self.key(module) == key[0])
            made = self._memo(module, out, [*state, *inputs], assumed) if clean else None
            if made is not None and mode.value_reads != reads and len(key) == 2:
                # it read values (known, or resting on its assumptions): reuse it for the same values only
                self._memos[key] = _BY_VALUES
                key = (*key, self._values(module, inputs))
            self._memos[key] = made
        return out

    def _lookup(self, module: nn.Module, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> _Memo | tuple[tuple[Any, ...], list[torch.Tensor]] | None:
        """The memo this call can reuse; else its key (with the values known, when an earlier call of
        its key read values) and input tensors when it is the first of its key (to be watched); else
        None (run it as it is)."""
        state_key = self.key(module)
        if state_key is None:
            return None
        try:
            input_key, inputs = self._inputs(args, kwargs)
        except _NotReusable:
            return None
        key: tuple[Any, ...] = (state_key, input_key)
        memo = self._memos.get(key, _UNSEEN)
        if memo is _BY_VALUES:  # the first call read values: the values are part of the key
            key = (*key, self._values(module, inputs))
            memo = self._memos.get(key, _UNSEEN)
        if memo is _UNSEEN:
            return key, inputs
        return typing.cast("_Memo | None", memo)

    def _values(self, module: nn.Module, inputs: list[torch.Tensor]) -> int:
        """The values known of ``module``'s state and of the inputs, as a key (the same values read
        give the same results)."""
        keyed: list[tuple[Any, ...] | None] = []
        for t in (*module.parameters(), *module.buffers(), *inputs):
            real = self.mode.value(t)[0]
            if real is not None:
                with on_host():
                    data = torch.empty(0, dtype=torch.uint8).set_(real.untyped_storage()).numpy().tobytes()
                keyed.append((tuple(real.shape), real.stride(), real.storage_offset(), real.dtype,
                              hashlib.blake2b(data, digest_size=16).digest()))
            else:
                keyed.append(None)
        return self._intern(tuple(keyed))

    def _memo(self, module: nn.Module, out: Any, held: list[torch.Tensor],
              assumed: dict[Any, int]) -> _Memo | None:
        """What the first call left, when its outputs can be made again from shapes alone (new fake
        tensors with no values known, or plain values); else None."""
        leaves, spec = tree_flatten(out)
        storages = {_storage(t) for t in held}
        metas: list[Any] = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                storage = _storage(leaf)
                if storage in storages or type(leaf) is not FakeTensor or leaf.requires_grad \
                        or self.mode.value(leaf)[0] is not None:
                    return None
                storages.add(storage)
                metas.append((tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device))
            elif isinstance(leaf, _PLAIN):
                metas.append(("plain", leaf))
            else:
                return None
        made = {a: n - assumed.get(a, 0) for a, n in self.mode.assumptions.items() if n != assumed.get(a, 0)}
        return _Memo(spec, metas, made, self.paths.get(id(module), ""))

    def _reuse(self, module: nn.Module, memo: _Memo) -> Any:
        self.reused += 1
        for assumption, n in memo.assumptions.items():
            self.mode.assumptions[assumption] = self.mode.assumptions.get(assumption, 0) + n
        leaves = [meta[1] if meta[0] == "plain" else self._fake(*meta) for meta in memo.leaves]
        path = self.paths.get(id(module), "")
        weight = sum(1 for _ in module.modules())
        if weight > self._example_size:
            self._example_size = weight
            self.example = f"{path or type(module).__name__} as {memo.path or type(module).__name__}"
        return tree_unflatten(leaves, memo.spec)

    def _fake(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
        """A new fake tensor with no values, made from a meta one as the fake mode makes its own (a CPU-only
        torch build refuses a fake CUDA factory call)."""
        fake_mode = self.mode.fake_mode
        with DisableTorchFunction(), unset_fake_temporarily():  # not the model's: no event
            meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        made: torch.Tensor = fake_mode.fake_tensor_converter.from_meta_and_device(fake_mode, meta, device)
        return made

    @contextlib.contextmanager
    def installed(self) -> Iterator[CallReuse]:
        """Route every module call through this object while inside (a no-op for modules that have no
        identical twin)."""
        if not self._candidates or _global_hooks():
            yield self
            return
        original = nn.Module._call_impl
        reuse = self

        def call_impl(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return reuse._call(module, original, args, kwargs)

        with patch(nn.Module, "_call_impl", call_impl,
                   "a module call whose result is already known is not run again; no hook can skip a call"):
            yield self

    def notes(self) -> list[str]:
        """The report's note: how many module calls did not run, and an example."""
        if not self.reused:
            return []
        return [f"forward: {self.reused:,} module call{'s' if self.reused != 1 else ''} did not run again: "
                f"each had the code, attributes and tensor shapes, dtypes and devices of a call that ran "
                f"and made no placement event, and took that call's output shapes (e.g. {self.example}); "
                "--no-reuse-calls runs every call"]


def _remember(known: dict[int, int | None] | None, module: nn.Module, key: int | None) -> int | None:
    if known is not None:
        known[id(module)] = key
    return key


def _storage(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _global_hooks() -> bool:
    """Any global module hook (``register_module_forward_hook``...): they must see every call."""
    return any(getattr(module_mod, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks", "_global_forward_hooks_always_called"))
