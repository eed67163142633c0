"""The forward pass's inputs: ``--input`` specs, ``--example-inputs``, or inferred from the first layer.

A spec is ``[NAME=]DTYPE[D0,D1,...][:LOW..HIGH]``:

- ``float32[8,3,224,224]``: a positional argument, standard normal values;
- ``input_ids=int64[2,128]:0..32000``: the keyword argument ``input_ids``,
  integers drawn uniformly from ``0 <= v < 32000``;
- ``bool[2,5]`` and ``bfloat16[4,16]:-1..1``; ``float32[]`` is a 0-dim tensor.

``HIGH`` is exclusive, as in ``torch.randint``. Without a range, floating and
complex inputs are standard normal (``torch.randn``) and integer inputs are 0 or
1 (``0..2``): small enough to be a valid index into any table, a mask or a
label, so a spec without a range never crashes an embedding lookup; give the
range (``:0..VOCAB``) for realistic token ids; int64 ranges stay within
``±2**53``. ``bool`` inputs are random True/False. Dtype names are torch's
(``float32``, ``int64``, ...) plus the usual aliases (``float``, ``half``,
``long``, ``int``, ``fp16``, ``bf16``, ``torch.float32``).

Positional specs become positional arguments in the order given; named ones
become keyword arguments.

``--example-inputs TARGET`` (same syntax as the model's target) names a
callable taking no arguments, or a value, that gives one of:

- a tensor: the one positional argument;
- a list: the one positional argument (torchvision's detection models take a
  list of 3-D image tensors);
- a tuple: the positional arguments;
- a dict with string keys: the keyword arguments;
- a 2-tuple ``(tuple_or_list, dict)``: positional and keyword arguments.

Anything inside may nest lists, tuples and dicts of tensors; :func:`move_inputs`
moves all of them to the target device, as a correct training loop would.

With neither, :func:`resolve_inputs` infers one input from the model: a
torchvision model of a known family gets its family's usual input (see
:mod:`placecheck.model.zoo`); any other model gets one shaped for the first layer in
module order that it recognises (convolutions, ``Linear``, ``Embedding``,
recurrent layers, ``TransformerEncoderLayer``). The description it returns says
what it inferred, from which layer, for the report's notes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from placecheck.basics.errors import LoadError, UsageError, one_line
from placecheck.basics.options import ExampleInputs
from placecheck.basics.values import Device

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

INPUT_GRAMMAR = "[NAME=]DTYPE[D0,D1,...][:LOW..HIGH]"
INPUT_EXAMPLE = "--input float32[1,3,224,224] or --input input_ids=int64[2,128]:0..32000"

DEFAULT_INT_RANGE = (0, 2)
"""Values of an integer input with no range: 0 or 1 (valid indices, masks and labels)."""

MAX_INPUT_BYTES = 4 * 2**30
"""An input spec larger than this is refused: it is host memory, allocated for real."""

# Canonical dtype name -> (kind, bytes per element). Kept free of torch so that
# parsing a spec (and `placecheck audit --help`) never imports it.
_DTYPES: dict[str, tuple[str, int]] = {
    "float16": ("float", 2), "bfloat16": ("float", 2), "float32": ("float", 4), "float64": ("float", 8),
    "complex64": ("complex", 8), "complex128": ("complex", 16),
    "int8": ("int", 1), "int16": ("int", 2), "int32": ("int", 4), "int64": ("int", 8),
    "uint8": ("int", 1), "bool": ("bool", 1),
}
_ALIASES = {
    "float": "float32", "fp32": "float32", "f32": "float32",
    "double": "float64", "fp64": "float64", "f64": "float64",
    "half": "float16", "fp16": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "long": "int64", "i64": "int64",
    "int": "int32", "i32": "int32",
    "short": "int16", "i16": "int16",
    "char": "int8", "i8": "int8",
    "byte": "uint8", "u8": "uint8",
    "cfloat": "complex64", "cdouble": "complex128",
    "boolean": "bool",
}
# LOW..HIGH each dtype admits. int64 stops at 2**53: the bounds are held as floats, which
# represent every integer up to there exactly (and torch.randint refuses a HIGH of 2**63).
_INT_BOUNDS = {"int8": (-(2**7), 2**7), "int16": (-(2**15), 2**15), "int32": (-(2**31), 2**31),
               "int64": (-(2**53), 2**53), "uint8": (0, 2**8), "bool": (0, 2)}

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf"
_SPEC = re.compile(
    r"^(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*)?"
    r"(?P<dtype>[A-Za-z_][A-Za-z0-9_.]*)\s*"
    r"\[(?P<shape>[^\]]*)\]\s*"
    rf"(?::\s*(?P<low>{_NUMBER})\s*\.\.\s*(?P<high>{_NUMBER}))?$"
)


@dataclass(frozen=True)
class InputSpec:
    """One parsed ``--input``: a tensor to create for the forward pass."""

    name: str | None
    """The keyword argument it is passed as; ``None`` for a positional argument."""
    dtype: str
    """Canonical torch dtype name (``float32``, ``int64``, ``bool``, ...)."""
    shape: tuple[int, ...]
    low: float | None
    """Lowest value (inclusive); ``None`` means the default for the dtype."""
    high: float | None
    """Highest value (exclusive); ``None`` means the default for the dtype."""

    def __str__(self) -> str:
        text = f"{self.dtype}[{','.join(map(str, self.shape))}]"
        if self.low is not None and self.high is not None:
            text += f":{_number(self.low)}..{_number(self.high)}"
        return f"{self.name}={text}" if self.name else text

    @property
    def kind(self) -> str:
        """``float``, ``complex``, ``int`` or ``bool``."""
        return _DTYPES[self.dtype][0]

    @property
    def nbytes(self) -> int:
        """Host memory the tensor takes."""
        return math.prod(self.shape) * _DTYPES[self.dtype][1]

    def make(self) -> torch.Tensor:
        """A real CPU tensor as the spec says (fake-tensor modes are bypassed, see :func:`_real`)."""
        import torch

        dtype = getattr(torch, self.dtype)
        with _real():
            if self.kind in ("int", "bool"):
                low, high = (DEFAULT_INT_RANGE if self.low is None or self.high is None
                             else (int(self.low), int(self.high)))
                values = torch.randint(low, high, self.shape, dtype=torch.int64)
                return values.to(dtype)
            if self.low is None or self.high is None:
                return torch.randn(self.shape, dtype=dtype)
            return torch.empty(self.shape, dtype=dtype).uniform_(self.low, self.high)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _grammar_error(text: str, why: str) -> UsageError:
    return UsageError(f"--input {text!r}: {why}; expected {INPUT_GRAMMAR}, e.g. {INPUT_EXAMPLE}")


def canonical_dtype(name: str) -> str | None:
    """``"long"`` -> ``"int64"``; ``"torch.float32"`` -> ``"float32"``; ``None`` if unknown."""
    key = name.strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    return key if key in _DTYPES else None


def parse_input_spec(text: str) -> InputSpec:
    """Parse one ``--input``; a :class:`UsageError` showing the grammar when it does not parse."""
    match = _SPEC.match(text.strip())
    if not match:
        raise _grammar_error(text, "not a tensor spec")
    dtype = canonical_dtype(match["dtype"])
    if dtype is None:
        known = ", ".join(_DTYPES)
        raise _grammar_error(text, f"unknown dtype {match['dtype']!r} (use one of {known})")
    shape_text = match["shape"].strip()
    dims: list[int] = []
    if shape_text:
        for part in shape_text.split(","):
            part = part.strip()
            if not part.isdigit():
                raise _grammar_error(text, f"dimension {part!r} is not a non-negative integer")
            dims.append(int(part))
    low = high = None
    if match["low"] is not None:
        low, high = float(match["low"]), float(match["high"])
        if not (math.isfinite(low) and math.isfinite(high)):
            raise _grammar_error(text, "the range must be finite")
        if low >= high:
            raise _grammar_error(text, f"the range {match['low']}..{match['high']} is empty "
                                       "(LOW must be below HIGH, which is exclusive)")
        kind = _DTYPES[dtype][0]
        if kind == "complex":
            raise _grammar_error(text, "complex inputs take no range (they are standard normal)")
        if kind in ("int", "bool"):
            if not (low.is_integer() and high.is_integer()):
                raise _grammar_error(text, f"a {dtype} range needs integer bounds")
            lo_ok, hi_ok = _INT_BOUNDS[dtype]
            if low < lo_ok or high > hi_ok:
                raise _grammar_error(text, f"the range does not fit {dtype} "
                                           f"(at most {lo_ok}..{hi_ok})")
    spec = InputSpec(match["name"], dtype, tuple(dims), low, high)
    if spec.nbytes > MAX_INPUT_BYTES:
        raise UsageError(f"--input {text!r} would take {spec.nbytes / 2**30:.1f} GiB of host memory "
                         f"(at most {MAX_INPUT_BYTES // 2**30} GiB): use a smaller shape; "
                         "a batch of 1 finds the same placement problems")
    return spec


def _real() -> Any:
    """A context where factories make real tensors, even inside the simulated engine's fake mode."""
    import contextlib

    from placecheck.engines.compat import active_fake_mode

    if active_fake_mode() is None:
        return contextlib.nullcontext()
    from placecheck.engines.compat import unset_fake_temporarily

    return unset_fake_temporarily()


def inputs_from_specs(specs: Sequence[str]) -> tuple[tuple[Any, ...], dict[str, Any], str]:
    """``--input`` specs -> (args, kwargs, description); duplicate names are a UsageError."""
    parsed = [parse_input_spec(s) for s in specs]
    names = [p.name for p in parsed if p.name]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UsageError(f"--input names {', '.join(duplicates)} more than once: give each keyword "
                         "argument one spec")
    total = sum(p.nbytes for p in parsed)
    if total > MAX_INPUT_BYTES:
        raise UsageError(f"the --input specs together take {total / 2**30:.1f} GiB of host memory "
                         f"(at most {MAX_INPUT_BYTES // 2**30} GiB): use smaller shapes")
    args = tuple(p.make() for p in parsed if p.name is None)
    kwargs = {p.name: p.make() for p in parsed if p.name is not None}
    return args, kwargs, "inputs from --input: " + ", ".join(map(str, parsed))


def _split_example(value: Any, target: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What an example-inputs callable returned -> (args, kwargs), as the module docstring says."""
    import torch

    if isinstance(value, torch.Tensor | list):
        return (value,), {}
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            raise UsageError(f"--example-inputs {target} returned a dict with key {bad[0]!r}: "
                             "dict keys are keyword-argument names and must be identifiers")
        return (), dict(value)
    if isinstance(value, tuple):
        if (len(value) == 2 and isinstance(value[0], tuple | list) and isinstance(value[1], dict)
                and not hasattr(value, "_fields")):
            args, kwargs = _split_example(tuple(value[0]), target)[0], value[1]
            return args, _split_example(kwargs, target)[1]
        return tuple(value), {}
    raise UsageError(f"--example-inputs {target} returned a {type(value).__name__}: return a tensor, "
                     "a list (one argument), a tuple (positional arguments), a dict (keyword "
                     "arguments) or (args, kwargs)")


def inputs_from_example(target: str) -> tuple[tuple[Any, ...], dict[str, Any], str]:
    """Call the ``--example-inputs`` target (or take its value) -> (args, kwargs, description)."""
    from placecheck.model.load import resolve

    obj = resolve(target)
    if callable(obj) and not _is_tensor(obj):
        try:
            with _real():
                value = obj()
        except TypeError as exc:
            raise LoadError(f"--example-inputs {target}: calling it raised {one_line(exc)}: "
                            "name a function that takes no arguments") from exc
        except Exception as exc:
            raise LoadError(f"--example-inputs {target}: calling it raised {one_line(exc)} "
                            "(--debug shows the traceback)") from exc
    else:
        value = obj
    args, kwargs = _split_example(value, target)
    return args, kwargs, f"inputs from --example-inputs {target}: {describe(args, kwargs)}"


def _is_tensor(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.Tensor)


def describe(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """A short text of nested inputs: ``float32[2,3], mask=bool[2], [float32[3,64,64], ...]``."""

    def one(value: Any) -> str:
        import torch

        if isinstance(value, torch.Tensor):
            return f"{str(value.dtype).removeprefix('torch.')}[{','.join(map(str, value.shape))}]"
        if isinstance(value, list | tuple):
            inner = ", ".join(one(v) for v in value[:3]) + (", ..." if len(value) > 3 else "")
            return f"[{inner}]" if isinstance(value, list) else f"({inner})"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {one(v)}" for k, v in list(value.items())[:3]) + \
                (", ...}" if len(value) > 3 else "}")
        return type(value).__name__

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts) or "no arguments"


# -- inference ---------------------------------------------------------------------------------------

_CONV_SPATIAL = {1: (64,), 2: (224, 224), 3: (16, 112, 112)}
"""Spatial size for an inferred convolution input: an ImageNet-sized image for 2-D (what
torchvision's classification models expect), a 16-frame 112x112 clip for 3-D (its video
models), a 64-step sequence for 1-D."""

_BATCH = 2
_SEQUENCE = 16
_RECURRENT_STEPS = 8


def _float_dtype(module: nn.Module) -> str:
    """The dtype of the module's first floating parameter, as a spec name (float32 when none)."""
    for p in module.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return "float32"


def _spec_for_layer(module: nn.Module) -> InputSpec | None:
    """The input a recognised first layer takes; ``None`` for a layer that says nothing."""
    import torch.nn as nn

    dtype = _float_dtype(module)
    if isinstance(module, nn.modules.lazy.LazyModuleMixin):
        return None  # its input size is what it waits to learn
    if isinstance(module, nn.modules.conv._ConvNd):
        dims = len(module.kernel_size)
        return InputSpec(None, dtype, (_BATCH, module.in_channels, *_CONV_SPATIAL[dims]), None, None)
    if isinstance(module, nn.Linear):
        return InputSpec(None, dtype, (_BATCH, module.in_features), None, None)
    if isinstance(module, nn.Embedding | nn.EmbeddingBag):
        return InputSpec(None, "int64", (_BATCH, _SEQUENCE), 0, module.num_embeddings)
    if isinstance(module, nn.RNNBase):
        shape = ((_BATCH, _RECURRENT_STEPS) if module.batch_first else (_RECURRENT_STEPS, _BATCH))
        return InputSpec(None, dtype, (*shape, module.input_size), None, None)
    if isinstance(module, nn.TransformerEncoderLayer):
        d_model = module.self_attn.embed_dim
        batch_first = module.self_attn.batch_first
        shape = (_BATCH, _SEQUENCE) if batch_first else (_SEQUENCE, _BATCH)
        return InputSpec(None, dtype, (*shape, d_model), None, None)
    return None


def _recognised(module: nn.Module) -> bool:
    import torch.nn as nn

    # MultiheadAttention is recognised so that inference stops there (it takes query, key and
    # value) instead of reading its out_proj Linear as the model's first layer.
    return isinstance(module, nn.modules.conv._ConvNd | nn.Linear | nn.Embedding | nn.EmbeddingBag
                      | nn.RNNBase | nn.TransformerEncoderLayer | nn.MultiheadAttention)


def infer_inputs(model: nn.Module) -> tuple[tuple[Any, ...], dict[str, Any], str]:
    """One input for ``model``, from its torchvision family or its first recognised layer."""
    import torch.nn as nn

    from placecheck.model import zoo

    with _real():
        family = zoo.family_inputs(model)
    if family is not None:
        args, kwargs, whose = family
        return args, kwargs, f"inferred input {describe(args, kwargs)} for {whose}"
    name = type(model).__name__
    for path, module in model.named_modules():
        if not _recognised(module):
            continue
        spec = _spec_for_layer(module)
        layer = f"{path or 'the model itself'} ({type(module).__name__})"
        if spec is None:
            why = ("takes query, key and value" if isinstance(module, nn.MultiheadAttention)
                   else "does not fix its input size")
            raise UsageError(f"cannot infer an input for {name}: its first layer, {layer}, {why}; "
                             "pass --input, e.g. --input float32[1,3,224,224]")
        return (spec.make(),), {}, f"inferred input {spec} from {layer}"
    raise UsageError(f"cannot infer an input for {name}: pass --input, e.g. --input float32[1,3,224,224]")


def resolve_inputs(model: nn.Module, specs: Sequence[str], example_inputs: str | ExampleInputs | None
                   ) -> tuple[tuple[Any, ...], dict[str, Any], str]:
    """The forward pass's (args, kwargs, description), as real CPU tensors (possibly nested).

    From ``--input`` specs, else from ``--example-inputs`` (a target, or the
    objects themselves from a Python caller), else inferred
    (:func:`infer_inputs`). Giving both is a :class:`UsageError`.
    """
    if specs and example_inputs:
        raise UsageError("--input and --example-inputs cannot be combined: pass one of them")
    if specs:
        return inputs_from_specs(specs)
    if isinstance(example_inputs, ExampleInputs):
        args, kwargs = _split_example(example_inputs.value, "(inputs given in Python)")
        return args, kwargs, f"inputs given in Python: {describe(args, kwargs)}"
    if example_inputs:
        return inputs_from_example(example_inputs)
    return infer_inputs(model)


def move_inputs(obj: Any, device: Device) -> Any:
    """``obj`` with every tensor in nested lists, tuples (namedtuples too) and dicts moved to ``device``.

    The containers are those ``torch.utils._pytree`` flattens (as PyTorch's
    own tracing does); other values are returned as they are. On a CPU-only
    build of torch, ``.to("cuda")`` fails inside the simulated engine's fake
    mode ("not linked with support for cuda devices"); there the tensor is
    converted to a fake one on ``device`` directly, as the engine does for parameters.
    """
    import torch

    from placecheck.engines.compat import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: _move_tensor(t, device), obj)


def _move_tensor(t: torch.Tensor, device: Device) -> torch.Tensor:
    import torch

    try:
        return t.to(device)
    except (RuntimeError, AssertionError) as exc:
        from placecheck.engines.classify import needs_cuda_driver  # a lower layer, with torch-free import

        if not needs_cuda_driver(exc):
            raise
        from placecheck.engines.compat import active_fake_mode

        fake_mode = active_fake_mode()
        if fake_mode is None:
            raise
        from placecheck.engines.compat import unset_fake_temporarily

        with unset_fake_temporarily():
            meta = t.detach().to("meta")
        moved: torch.Tensor = fake_mode.fake_tensor_converter.from_meta_and_device(
            fake_mode, meta, torch.device(device))
        return moved.requires_grad_(t.requires_grad)
