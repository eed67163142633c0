"""Data-dependent ops under fake tensors: run through them with stated assumptions.

Fake tensors hold no values, so PyTorch's fake mode stops where an op's result
depends on them: a value read to the host (``.item()``, ``.tolist()``,
``bool(t)``/``if t``, ``int(t)``, a tensor used as an index) raises
``DataDependentOutputException``, and an op whose output *shape* depends on
values (``nonzero``/``torch.where(mask)``/``argwhere``, boolean-mask indexing,
``masked_select``, ``unique``, ``repeat_interleave`` without ``output_size``)
raises ``DynamicOutputShapeException``. Mixture-of-experts routers and
transformers' padding checks hit both.

:class:`DataDependentMode`, a dispatch mode entered just inside the fake
mode, answers those ops instead:

- It keeps the real values of the tensors whose values do not depend on the
  weights, when they are small: what was copied from host data (the forward's
  inputs, ``torch.tensor([...], device="cuda")``), deterministic factories
  (``arange``, ``zeros``, ``full``...), and what is computed from those alone.
  A data-dependent op on such tensors gets its exact result; no assumption.
- Where the values are unknown (they come from weights fake tensors do not
  hold), it assumes the plausible upper bound of a shape (every element of a
  mask is nonzero, every element of ``unique``'s input is distinct, each
  ``repeat_interleave`` count is 1; so every expert of a router is visited),
  that floating values are finite (``isnan``/``isinf`` are all false), and
  that a value read to the host is 1 (``True``, ``1``, ``1.0``). Each
  assumption is recorded as an :class:`Assumption` with the line that made it;
  a value read where the code branches on it is marked so: the other path was
  not checked.

Host syncs are not this module's business: the tracer reports them (PC204)
wherever they happen. Not reentrant: one mode per fake mode, entered once.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from placecheck.engines.classify import DeviceMismatchError
from placecheck.engines.compat import TorchDispatchMode, pad_packed_sequence_op, tree_flatten, tree_map
from placecheck.engines.shortcuts import shortcut
from placecheck.engines.sources import first_outside, where_is
from placecheck.engines.sparse import on_fake_cuda

aten = torch.ops.aten

KNOWN_BYTES_LIMIT = 1 << 20
"""The largest tensor (storage bytes) whose real values are kept; larger ones are unknown."""

REPRESENTATIVE = 1
"""The value assumed for a number read from a tensor whose values are unknown (``True``, ``1``, ``1.0``)."""


@dataclass(frozen=True)
class Assumption:
    """One assumption the fake engine made to run through a data-dependent op."""

    what: str
    """What was assumed, in words ("every element is nonzero")."""
    op: str
    """The op or the host read that needed it ("nonzero", "bool()")."""
    line: str
    """``file:line`` of the innermost frame outside torch and placecheck ("" when none)."""
    branch: bool = False
    """The code branched on the assumed value: the other path was not checked."""

    def note(self, count: int = 1, phase: str = "forward") -> str:
        """The report's note for this assumption, made ``count`` times at its line."""
        where = f" at {self.line}" if self.line else ""
        times = f" ({count} times)" if count > 1 else ""
        text = (f"{phase}: {self.op}{where}{times} ran on an assumption (fake tensors hold no values): "
                f"{self.what}")
        if self.branch:
            text += "; the code branches on that value there: a path another value takes was not checked"
        return text


_Handler = Callable[["DataDependentMode", Any, tuple[Any, ...], dict[str, Any]], Any]
_Args = tuple[Any, ...]
_HANDLERS: dict[Any, _Handler | None] = {}
"""op overload -> its handler (None: it has none, looked up once by name)."""
_NAMED_HANDLERS: dict[str, _Handler] = {}
"""Handlers of ops from libraries torch does not import itself, by schema name (``torchvision::nms``)."""


def _handles(*ops: Any) -> Callable[[_Handler], _Handler]:
    """Register a handler for ``ops`` (aten overloads, or schema names of other libraries' ops, which
    may not be loaded yet); a second handler for one op is refused."""
    def register(handler: _Handler) -> _Handler:
        for op in ops:
            table: dict[Any, Any] = _NAMED_HANDLERS if isinstance(op, str) else _HANDLERS
            if op in table:
                raise ValueError(f"{op} already has a data-dependent handler")
            table[op] = handler
        return handler
    return register


def _handler(func: Any) -> _Handler | None:
    try:
        return _HANDLERS[func]
    except KeyError:
        schema = getattr(func, "_schema", None)
        handler = _NAMED_HANDLERS.get(schema.name) if schema is not None else None
        _HANDLERS[func] = handler
        return handler


# Factories whose values are not defined (empty) or not worth computing; random ones are
# skipped by their nondeterministic tag.
_NO_VALUES = frozenset({aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
                        aten.new_empty_strided.default, aten.empty_like.default, aten.empty_permuted.default})
# Results whose values do not depend on their input's values, only on its shape and dtype.
_SHAPE_ONLY = frozenset({aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
                         aten.new_zeros.default, aten.new_ones.default, aten.new_full.default})
# Predicates assumed all false on unknown floating values (they are assumed finite).
_NOT_FINITE = frozenset({aten.isnan.default, aten.isinf.default, aten.isposinf.default,
                         aten.isneginf.default})
_META_OPS = frozenset({torch.ops.prim.device.default, aten.sym_size.int, aten.sym_stride.int,
                       aten.sym_numel.default, aten.sym_storage_offset.default, aten.dim.default,
                       aten.is_contiguous.default, aten.is_contiguous.memory_format})


def _fake_tensor_type() -> type[torch.Tensor]:
    from placecheck.engines.compat import FakeTensor

    return FakeTensor


class DataDependentMode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's mode is untyped
    """Runs data-dependent ops on fake tensors with exact values where known, stated assumptions elsewhere.

    Enter it inside ``fake_mode`` (it must see each op before the fake mode
    does). :attr:`assumptions` holds what was assumed, in order, once per
    (assumption, line); :meth:`notes` words them for the report.
    """

    def __init__(self, fake_mode: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.fake_mode = fake_mode
        self.known: WeakIdKeyDictionary = WeakIdKeyDictionary()
        """fake tensor -> (its real CPU values, the assumption they rest on or None)."""
        self._views: dict[int, list[weakref.ref[torch.Tensor]]] = {}
        """storage (``_cdata``) -> the known fake tensors on it, so that a write forgets them at once."""
        self.assumptions: dict[Assumption, int] = {}
        """Each assumption made -> how many times."""
        self.value_reads = 0
        """Data-dependent ops run on values known (not assumed) so far: their results depend on those
        values (:mod:`placecheck.engines.reuse` reuses only calls that made none)."""
        self._fake_type: type[torch.Tensor] = _fake_tensor_type()
        self.host_values = False
        """Ops on real host tensors alone (a dataset's file read through ``torch.frombuffer``, a batch, a
        loaded file) run for real, as on a GPU machine's host: ``placecheck run``'s fake engine sets it
        (its scripts index and read their data); the audit's forward keeps every result fake."""

    # -- what the report gets -------------------------------------------------------------------
    def notes(self, phase: str = "forward") -> list[str]:
        """One note per assumption and line, in the order they were first made."""
        return [a.note(n, phase) for a, n in self.assumptions.items()]

    def assume(self, what: str, op: str) -> Assumption:
        """Record that ``op`` (a host read outside the ops handled here: printing a tensor) ran on the
        assumption ``what``, at the caller's user line."""
        return self._assume(what, None, op=op)

    def branched(self) -> list[Assumption]:
        """The assumptions the code branched on (a path depending on another value was not checked)."""
        return [a for a in self.assumptions if a.branch]

    def reset(self) -> None:
        """Forget the assumptions recorded so far (the values known stay)."""
        self.assumptions.clear()

    # -- dispatch -------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _META_OPS:
            return func(*args, **kwargs)
        if self.host_values and self._host_only(args, kwargs):
            with on_host():
                return func(*args, **kwargs)
        handled, out = on_fake_cuda(func, args, kwargs)  # a sparse op: fake CUDA needs a driver for it
        if handled:
            return out
        made = shortcut(func, args, kwargs)  # an op whose fake path is slow, made from metadata
        if made is not None:
            self._propagate(func, args, kwargs, made)
            return made
        handler = _handler(func)
        if handler is not None:
            if any(self.value(t)[0] is not None for t in _tensors_in(args, kwargs)):
                self.value_reads += 1
            return handler(self, func, args, kwargs)
        out = func(*args, **kwargs)
        self._propagate(func, args, kwargs, out)
        return out

    def _host_only(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Every tensor of an op is a real CPU tensor (one at least), and it names no other device nor
        pinned memory: host data computed from host data (a view, a cast, an index of a file's bytes)."""
        tensors = _tensors_in(args, kwargs)
        if not tensors or kwargs.get("pin_memory"):
            return False
        for t in tensors:
            if isinstance(t, self._fake_type) or t.device.type != "cpu":
                return False
        return not any(isinstance(a, torch.device) and a.type != "cpu" for a in (*args, *kwargs.values()))

    # -- values ---------------------------------------------------------------------------------
    def value(self, t: Any) -> tuple[torch.Tensor | None, Assumption | None]:
        """The real values of ``t`` when known (a real tensor is its own value), and what they rest on."""
        if not isinstance(t, torch.Tensor):
            return None, None
        if not isinstance(t, self._fake_type):
            return (t, None) if t.device.type == "cpu" else (None, None)
        known: tuple[torch.Tensor, Assumption | None] | None = self.known.get(t)  # type: ignore[no-untyped-call]
        return known if known is not None else (None, None)

    def _keep(self, fake: Any, real: Any, assumption: Assumption | None) -> None:
        if not (isinstance(fake, self._fake_type) and isinstance(real, torch.Tensor)):
            return
        if fake.layout != torch.strided or real.layout != torch.strided:
            return  # a sparse tensor has no one storage to watch for writes: its values are not kept
        if real.untyped_storage().nbytes() > KNOWN_BYTES_LIMIT or fake.shape != real.shape:
            self.known.pop(fake, None)  # type: ignore[no-untyped-call]
            return
        self.known[fake] = (real, assumption)
        self._views.setdefault(fake.untyped_storage()._cdata, []).append(weakref.ref(fake))

    def take(self, t: torch.Tensor) -> tuple[torch.Tensor, Assumption | None] | None:
        """Forget ``t``'s values and return them (None when unknown), leaving no weak reference to ``t``:
        ``torch.utils.swap_tensors`` refuses a tensor that has one. :meth:`give` puts them back."""
        value: tuple[torch.Tensor, Assumption | None] | None = self.known.pop(t, None)  # type: ignore[no-untyped-call]
        if value is not None and isinstance(t, self._fake_type):
            storage = t.untyped_storage()._cdata
            refs = [ref for ref in self._views.get(storage, ()) if ref() is not t]
            if refs:
                self._views[storage] = refs
            else:
                self._views.pop(storage, None)
        return value

    def give(self, t: torch.Tensor, value: tuple[torch.Tensor, Assumption | None]) -> None:
        """``t``'s values are ``value`` again (what :meth:`take` returned)."""
        self._keep(t, *value)

    def _forget(self, fake: Any) -> None:
        """``fake`` was written with values not known: forget it and every known view of its storage."""
        if not isinstance(fake, self._fake_type) or not len(self.known) or fake.layout != torch.strided:
            return
        for ref in self._views.pop(fake.untyped_storage()._cdata, ()):
            other = ref()
            if other is not None:
                self.known.pop(other, None)  # type: ignore[no-untyped-call]

    def _real(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              values: dict[int, torch.Tensor]) -> Any:
        """``func`` run on the CPU with the real values ``values`` (id of fake tensor -> values)."""
        def real(a: Any) -> Any:
            if isinstance(a, torch.Tensor) and id(a) in values:
                return values[id(a)]
            if isinstance(a, torch.device) and a.type != "cpu":
                return torch.device("cpu")
            return a

        real_args, real_kwargs = tree_map(real, (args, kwargs))
        if "device" in real_kwargs:
            real_kwargs["device"] = torch.device("cpu")
        if real_kwargs.get("pin_memory"):
            real_kwargs["pin_memory"] = False
        with on_host():
            return func(*real_args, **real_kwargs)

    def _propagate(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Keep the real values of ``out`` when they follow from known inputs; forget what was overwritten."""
        tensors = _tensors_in(args, kwargs)
        if not tensors and not isinstance(out, self._fake_type):
            return
        values: dict[int, torch.Tensor] = {}
        rests_on: Assumption | None = None
        unknown = []
        for t in tensors:
            real, assumption = self.value(t)
            if real is None:
                unknown.append(t)
                if func not in _NOT_FINITE and func not in _SHAPE_ONLY:
                    break  # one unknown input is enough: nothing to compute
            else:
                values[id(t)] = real
                rests_on = rests_on or assumption
        if func in _NOT_FINITE and unknown and unknown[0].is_floating_point():
            with on_host():
                out_real = torch.zeros((), dtype=torch.bool).expand(unknown[0].shape)
            self._keep(out, out_real, self._assume("finite values (no NaN or infinity)", func, record=False))
            return
        if func in _SHAPE_ONLY and unknown and unknown[0] is args[0]:
            src = args[0]
            with on_host():
                values[id(src)] = torch.zeros((), dtype=src.dtype).expand(src.shape)
            unknown = unknown[1:]
        if unknown or not self._worth_computing(func, out):
            if len(self.known):
                for _, arg in _written(func, args, kwargs):
                    self._forget(arg)
            return
        try:
            real_out = self._real(func, args, kwargs, values)
        except Exception:  # the real op disagrees (a CPU-only kernel): the values stay unknown
            for _, arg in _written(func, args, kwargs):
                self._forget(arg)
            return
        fakes, _ = tree_flatten(out)
        reals, _ = tree_flatten(real_out)
        if len(fakes) == len(reals):
            for fake, real in zip(fakes, reals, strict=True):
                self._keep(fake, real, rests_on)
        for _, arg in _written(func, args, kwargs):
            if arg is not out and id(arg) in values:
                self._keep(arg, values[id(arg)], rests_on)

    def _worth_computing(self, func: Any, out: Any) -> bool:
        if func in _NO_VALUES or torch.Tag.nondeterministic_seeded in func.tags:
            return False
        for fake in tree_flatten(out)[0]:
            if isinstance(fake, torch.Tensor) and fake.numel() * fake.element_size() > KNOWN_BYTES_LIMIT:
                return False
        return True

    # -- assumptions ----------------------------------------------------------------------------
    def _assume(self, what: str, func: Any, record: bool = True, op: str = "") -> Assumption:
        frame = first_outside(sys._getframe(1))
        line = where_is(frame)
        assumption = Assumption(what, op or _op_name(func), line, branch=_branches(frame))
        if record:
            self.assumptions[assumption] = self.assumptions.get(assumption, 0) + 1
        return assumption

    def _noted(self, assumption: Assumption | None, func: Any, op: str = "") -> None:
        """A data-dependent op read values that rest on an earlier assumption: note it at this line."""
        if assumption is not None:
            made = f" at {assumption.line}" if assumption.line else ""
            self._assume(f"{assumption.what} (assumed for {assumption.op}{made})", func, op=op)

    def _fake_empty(self, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=like.device)

    def nonzero(self, mask: torch.Tensor, func: Any, op: str = "") -> torch.Tensor:
        """``mask.nonzero()``: exact when the values are known, else every element assumed nonzero."""
        real, rests_on = self.value(mask)
        if real is not None:
            self._noted(rests_on, func, op)
            with on_host():
                result = real.nonzero()
        else:
            assumption = self._assume("every element is nonzero (the largest shape)", func, op=op)
            rests_on = assumption
            result = None
            if mask.numel() * 8 * max(mask.dim(), 1) <= KNOWN_BYTES_LIMIT:
                with on_host():
                    result = torch.ones(mask.shape, dtype=torch.bool).nonzero()
        shape = tuple(result.shape) if result is not None else (mask.numel(), mask.dim())
        out = self._fake_empty(shape, mask, torch.int64)
        if result is not None:
            self._keep(out, result, rests_on)
        return out


def _tensors_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors among an aten op's arguments (aten takes tensors directly or in one list)."""
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


@functools.cache
def _mutable_arguments(func: Any) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, keyword-only) of each argument ``func``'s schema writes to."""
    return tuple((i, a.name, a.kwarg_only) for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _written(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[tuple[int, Any]]:
    """The arguments ``func`` writes to (its schema's mutable arguments, ``out=`` included)."""
    for i, name, kwarg_only in _mutable_arguments(func):
        value = args[i] if i < len(args) and not kwarg_only else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            yield i, value
        elif isinstance(value, list | tuple):
            for v in value:
                if isinstance(v, torch.Tensor):
                    yield i, v


@contextlib.contextmanager
def on_host() -> Iterator[None]:
    """No fake mode and no dispatch mode for the block: real values are computed on the CPU there."""
    from placecheck.engines.compat import _disable_current_modes, unset_fake_temporarily

    with unset_fake_temporarily(), _disable_current_modes():
        yield


def _op_name(func: Any) -> str:
    return str(getattr(func, "__name__", func)).split(".")[0] + "()"


# Python 3.11's POP_JUMP_FORWARD_IF_FALSE, 3.12's POP_JUMP_IF_FALSE, JUMP_IF_FALSE_OR_POP
# (and/or), 3.13's TO_BOOL (the conversion before the jump), UNARY_NOT, CONTAINS_OP (x in t)
_BRANCH_OPS = frozenset(name for name in dis.opname
                        if ("JUMP" in name and "IF" in name)
                        or name in ("TO_BOOL", "UNARY_NOT", "CONTAINS_OP"))


def _branches(frame: FrameType | None) -> bool:
    """True when ``frame`` is at an instruction that branches on the value being read (``if t:``,
    ``while t:``, ``x in t``, ``and``/``or``/``not``), judged from the bytecode it is executing."""
    if frame is None or frame.f_lasti < 0:
        return False
    code = frame.f_code.co_code
    if frame.f_lasti >= len(code):
        return False
    return dis.opname[code[frame.f_lasti]] in _BRANCH_OPS


# -- handlers ------------------------------------------------------------------------------------
def _exact(mode: DataDependentMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
           tensors: list[torch.Tensor], op: str) -> tuple[bool, Any]:
    """(True, real result) when every tensor in ``tensors`` has known values, noting what they rest on."""
    values: dict[int, torch.Tensor] = {}
    rests_on: Assumption | None = None
    for t in tensors:
        real, assumption = mode.value(t)
        if real is None:
            return False, None
        values[id(t)] = real
        rests_on = rests_on or assumption
    mode._noted(rests_on, func, op)
    return True, (mode._real(func, args, kwargs, values), rests_on)


def _as_fake(mode: DataDependentMode, real: Any, like: torch.Tensor, rests_on: Assumption | None) -> Any:
    """Fake tensors on ``like``'s device shaped like the real results, their values kept."""
    if isinstance(real, torch.Tensor):
        fake = mode._fake_empty(tuple(real.shape), like, real.dtype)
        mode._keep(fake, real, rests_on)
        return fake
    return type(real)(_as_fake(mode, r, like, rests_on) for r in real)


@_handles(aten.nonzero.default)
def _nonzero(mode: DataDependentMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return mode.nonzero(args[0], func)


@_handles(aten.index.Tensor)
def _index(mode: DataDependentMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``x[mask]``: each boolean index becomes the long indices of its nonzero elements (its columns)."""
    source, indices = args[0], list(args[1])
    expanded: list[Any] = []
    masked = False
    for index in indices:
        if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
            masked = True
            positions = mode.nonzero(index, func, op="boolean-mask indexing")
            real, rests_on = mode.value(positions)
            for dim in range(index.dim()):
                column = positions.select(1, dim)
                if real is not None:
                    with on_host():
                        real_column = real.select(1, dim)
                    mode._keep(column, real_column, rests_on)
                expanded.append(column)
        else:
            expanded.append(index)
    if not masked:
        out = func(*args, **kwargs)
        mode._propagate(func, args, kwargs, out)
        return out
    new_args = (source, expanded)
    out = func(*new_args, **kwargs)
    mode._propagate(func, new_args, kwargs, out)
    return out


@_handles(aten.masked_select.default)
def _masked_select(mode: DataDependentMode, func: Any, args: _Args, kwargs: dict[str, Any]) -> Any:
    source, mask = args[0], args[1]
    done, result = _exact(mode, func, args, kwargs, [source, mask], "masked_select()")
    if done:
        return _as_fake(mode, result[0], source, result[1])
    mode._assume("every element of the mask is true (the largest shape)", func, op="masked_select()")
    numel = torch.broadcast_shapes(source.shape, mask.shape).numel()  # type: ignore[no-untyped-call]
    return mode._fake_empty((numel,), source, source.dtype)


@_handles(aten._unique2.default, aten._unique.default, aten.unique_consecutive.default,
          aten.unique_dim.default, aten.unique_dim_consecutive.default)
def _unique(mode: DataDependentMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``torch.unique``: exact when known, else every element (or slice along ``dim``) assumed distinct."""
    source: torch.Tensor = args[0]
    done, result = _exact(mode, func, args, kwargs, [source], "unique()")
    if done:
        return _as_fake(mode, result[0], source, result[1])
    assumption = mode._assume("every element is distinct (the largest shape)", func, op="unique()")
    # run the real op on a sample of distinct values of the same shape: its outputs have the shapes
    # (and the inverse and counts the values) that distinct inputs give
    with on_host():
        distinct = torch.arange(source.numel(), dtype=torch.float64).reshape(source.shape)
    sample = mode._real(func, args, kwargs, {id(source): distinct})
    outs = list(sample)
    fakes = [mode._fake_empty(tuple(outs[0].shape), source, source.dtype)]
    fakes += [_as_fake(mode, o, source, assumption) for o in outs[1:]]
    return tuple(fakes)


@_handles(aten.repeat_interleave.Tensor)
def _repeat_interleave(mode: DataDependentMode, func: Any, args: _Args, kwargs: dict[str, Any]) -> Any:
    repeats: torch.Tensor = args[0]
    if kwargs.get("output_size") is not None:
        out = func(*args, **kwargs)
        mode._propagate(func, args, kwargs, out)
        return out
    done, result = _exact(mode, func, args, kwargs, [repeats], "repeat_interleave()")
    if done:
        return _as_fake(mode, result[0], repeats, result[1])
    assumption = mode._assume(f"each repeat count is {REPRESENTATIVE}", func, op="repeat_interleave()")
    with on_host():
        real = torch.arange(repeats.numel(), dtype=repeats.dtype).repeat_interleave(REPRESENTATIVE)
    return _as_fake(mode, real, repeats, assumption)


@_handles(aten.bincount.default)
def _bincount(mode: DataDependentMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    source: torch.Tensor = args[0]
    weights = args[1] if len(args) > 1 else kwargs.get("weights")
    tensors = [source] + ([weights] if isinstance(weights, torch.Tensor) else [])
    done, result = _exact(mode, func, args, kwargs, tensors, "bincount()")
    if done:
        return _as_fake(mode, result[0], source, result[1])
    assumption = mode._assume(f"every value is {REPRESENTATIVE}", func, op="bincount()")
    minlength = int(args[2]) if len(args) > 2 else int(kwargs.get("minlength", 0))
    if weights is None:
        with on_host():
            sample = torch.full(tuple(source.shape), REPRESENTATIVE, dtype=torch.int64)
            counts = sample.bincount(minlength=minlength)
        return _as_fake(mode, counts, source, assumption)
    size = max(minlength, REPRESENTATIVE + 1)
    return mode._fake_empty((size,), source, weights.dtype)


@_handles(aten._pack_padded_sequence.default)
def _pack_padded(mode: DataDependentMode, func: Any, args: _Args, kwargs: dict[str, Any]) -> Any:
    """``pack_padded_sequence``'s op: ``(data, batch_sizes)``; ``data`` holds ``sum(lengths)`` steps and
    ``batch_sizes`` (a real CPU tensor, as ATen makes it) how many sequences are longer than each step. The
    lengths are on the CPU by contract, so their values are normally known; else every sequence is
    assumed to have the full length."""
    source, lengths = args[0], args[1]
    batch_first = bool(args[2] if len(args) > 2 else kwargs.get("batch_first", False))
    if lengths.device.type != "cpu" or lengths.dim() != 1:  # ATen's own check, as a GPU raises it
        raise DeviceMismatchError(f"_pack_padded_sequence needs its argument 1 (lengths) on the CPU, but got "
                                  f"a tensor on {lengths.device}")
    real, rests_on = mode.value(lengths)
    if real is not None:
        mode._noted(rests_on, func, "pack_padded_sequence()")
    else:
        rests_on = mode._assume("every sequence has the full length (the largest shape)", func,
                                op="pack_padded_sequence()")
        steps, batch = (source.shape[1], source.shape[0]) if batch_first else source.shape[:2]
        with on_host():
            real = torch.full((int(batch),), int(steps), dtype=torch.int64)
    with on_host():
        real = real.to(torch.int64)
        longest = int(real.max()) if real.numel() else 0
        batch_sizes = torch.tensor([int((real > t).sum()) for t in range(longest)], dtype=torch.int64)
        total = int(real.sum())
    data = mode._fake_empty((total, *source.shape[2:]), source, source.dtype)
    return data, batch_sizes  # a real CPU tensor, as ATen makes it: the packed RNN ops read its data


def pad_packed_sequence(mode: DataDependentMode, args: _Args, kwargs: dict[str, Any]) -> Any:
    """``torch._VF._pad_packed_sequence(data, batch_sizes, batch_first, padding_value, total_length)``
    under fake tensors: ``(padded, lengths)``, composed of ops fake tensors run. ATen's kernel is
    composite and writes ``lengths`` through a data pointer, which a fake tensor has none of; its
    torch function is called in its place (the engines' torch function modes: :func:`composite_call`).
    ``batch_sizes`` is on the CPU by contract: its values are known (a real CPU tensor)."""
    names = ("data", "batch_sizes", "batch_first", "padding_value", "total_length")
    given = {**dict(zip(names, args, strict=False)), **kwargs}
    data, batch_sizes = given["data"], given["batch_sizes"]
    real, rests_on = mode.value(batch_sizes)
    if real is None:
        raise RuntimeError("pad_packed_sequence: the batch sizes of the packed sequence are unknown")
    mode._noted(rests_on, aten._pad_packed_sequence.default, "pad_packed_sequence()")
    sizes = [int(b) for b in real.tolist()]
    steps = max(int(given.get("total_length", 0) or 0), len(sizes))
    batch = sizes[0] if sizes else 0
    padded = data.new_full((steps, batch, *data.shape[1:]), float(given.get("padding_value", 0.0)))
    offset = 0
    for step, size in enumerate(sizes):
        padded[step, :size] = data[offset:offset + size]
        offset += size
    if given.get("batch_first", False):
        padded = padded.transpose(0, 1)
    with on_host():
        lengths = torch.tensor([sum(1 for b in sizes if b > i) for i in range(batch)], dtype=torch.int64)
    return padded, lengths


def composite_call(func: Any, args: _Args, kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """``(True, result)`` for a torch function whose composite ATen kernel reads tensor data directly
    (no fake tensor can run it), called under the fake engine: its result made of ops that can;
    ``(False, None)`` otherwise (then call ``func`` itself)."""
    if func is not _composite_ops()[0]:  # checked first: this is on every call's path
        return False, None
    mode = active()
    if mode is None:
        return False, None
    return True, pad_packed_sequence(mode, args, kwargs)


@functools.cache
def _composite_ops() -> tuple[Any, ...]:
    return (pad_packed_sequence_op(),)


@_handles("torchvision::nms")
def _nms(mode: DataDependentMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torchvision's ``nms(boxes, scores, iou_threshold)``: the indices of the boxes kept, by score;
    exact when known, else every box assumed kept (the largest shape), in their order."""
    boxes, scores = args[0], args[1]
    done, result = _exact(mode, func, args, kwargs, [boxes, scores], "nms()")
    if done:
        return _as_fake(mode, result[0], boxes, result[1])
    assumption = mode._assume("every box is kept (the largest shape)", func, op="nms()")
    with on_host():
        kept = torch.arange(boxes.shape[0], dtype=torch.int64)
    return _as_fake(mode, kept, boxes, assumption)


@_handles(aten._local_scalar_dense.default)
def _scalar(mode: DataDependentMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A value read to the host (``.item()``, ``bool()``, ``int()``, ``.tolist()``, an index)."""
    source: torch.Tensor = args[0]
    real, rests_on = mode.value(source)
    if real is not None:
        with on_host():
            value = real.item()
        if rests_on is not None:
            mode._noted(rests_on, func, op=_read_name(value))
        return value
    value = _representative(source.dtype)
    mode._assume(f"the value {value!r}", func, op=f"a value read from a tensor ({_read_name(value)})")
    return value


@_handles(aten.equal.default, aten.allclose.default)
def _compare(mode: DataDependentMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    done, result = _exact(mode, func, args, kwargs, [a for a in args if isinstance(a, torch.Tensor)],
                          _op_name(func))
    if done:
        return result[0]
    mode._assume("True (the tensors compare equal)", func)
    return True


def _representative(dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return bool(REPRESENTATIVE)
    if dtype.is_floating_point or dtype.is_complex:
        return float(REPRESENTATIVE)
    return int(REPRESENTATIVE)


def _read_name(value: Any) -> str:
    return {bool: "bool()", float: ".item()"}.get(type(value), ".item() or an index")


def active() -> DataDependentMode | None:
    """The data-dependent mode of the simulated session running now (None outside one)."""
    from placecheck.engines.compat import _get_current_dispatch_mode_stack

    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, DataDependentMode):
            return mode
    return None
