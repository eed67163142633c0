"""``placecheck run --engine fake``: a whole script at the size of the job, with fake tensors.

The session is the audit's fake engine (:func:`placecheck.engines.engine.simulated_cuda`):
one ``FakeTensorMode`` for the whole script, so every tensor the script makes
(the model's parameters built on the CPU, the batches, the activations, the
optimizer's state) is a fake tensor with a shape, a dtype and a device and no
memory for its data, and ``model.to("cuda")`` makes fake CUDA tensors. An 8B
model costs what its metadata costs. The data-dependent layer
(:mod:`placecheck.engines.datadep`) keeps the real values of small tensors that do not
depend on the weights and answers the script's host reads (``.item()``,
``bool()``, printing, an ``if`` on a tensor) with them, or with a stated
assumption (the value 1) noted at its line.

What fake tensors cannot do without a GPU, this session does instead, each
said in the docs (docs/engines.md):

- backward: autograd's engine needs a CUDA device for the fake CUDA tensors
  of the graph. ``Tensor.backward``, ``torch.autograd.backward`` and
  ``torch.autograd.grad`` give each leaf the graph reaches (or each of
  ``inputs``) a fake gradient of its shape on its own device, what a GPU's
  backward would give, through the leaf's own gradient hooks
  (``param.register_hook``, the script's code: run as it is); the backward
  kernels are not run (a device mismatch in a custom ``autograd.Function``'s
  backward is not seen: the real-valued engine runs it).
- printing a fake tensor: its known values, or the assumed ones (a note).
- ``copy.deepcopy`` of a fake tensor (Lightning copies logged values, an EMA copies a model): a fake
  copy keeping its gradient and its attributes; torch's own copy would give it the storage of a real
  copy of data it does not have. A real host tensor is copied outside the fake mode.

The recorder (:mod:`placecheck.run.recorder`) and its report are the same as
under the real-valued engine: one detector.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from placecheck.basics.patching import Patch, patch, patched_once_imported
from placecheck.engines.callbacks import called_back
from placecheck.engines.classify import refused_on_device
from placecheck.engines.datadep import REPRESENTATIVE, DataDependentMode, composite_call, on_host

_BACKWARDS = frozenset({torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad})


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    return list(value) if isinstance(value, Sequence) else [value]


def _leaves(roots: list[torch.Tensor]) -> list[torch.Tensor]:
    """The leaf tensors (parameters, inputs with ``requires_grad``) the graphs of ``roots`` reach, in
    the order first reached: each ``AccumulateGrad`` node's variable."""
    # the nodes seen are kept alive, not just their ids: torch before 2.15 makes a new Python object for
    # a node at each access of next_functions, and a freed one's id is reused by the next
    seen: dict[int, Any] = {}
    found: dict[int, torch.Tensor] = {}
    stack = [r.grad_fn for r in roots if r.grad_fn is not None]
    for r in roots:
        if r.grad_fn is None and r.requires_grad:
            found[id(r)] = r
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            found.setdefault(id(variable), variable)
        stack.extend(child for child, _ in getattr(node, "next_functions", ()))
    return list(found.values())


def custom_backwards(roots: list[torch.Tensor]) -> list[type]:
    """The custom ``autograd.Function`` classes (the script's or a library's, not torch's) whose backward
    the graphs of ``roots`` hold: their backward code does not run under the fake engine."""
    from placecheck.engines.tagged import torchs_own

    found: dict[type, None] = {}
    seen: dict[int, Any] = {}
    stack = [r.grad_fn for r in roots if r.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node  # kept alive: see _leaves
        forward_cls = getattr(node, "_forward_cls", None)
        if isinstance(forward_cls, type) and not torchs_own(getattr(forward_cls, "backward", None)):
            found[forward_cls] = None
        stack.extend(child for child, _ in getattr(node, "next_functions", ()))
    return list(found)


def _fake_grad(leaf: torch.Tensor) -> torch.Tensor:
    """A gradient for ``leaf``: its shape, dtype and device (a fake tensor in the session's mode)."""
    with torch.no_grad():
        return torch.zeros_like(leaf, memory_format=torch.preserve_format)


def _backward(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``loss.backward()`` / ``torch.autograd.backward(...)``: every leaf reached gets its gradient."""
    roots = _as_list(args[0] if args else kwargs.get("tensors"))
    inputs = _as_list(kwargs.get("inputs"))
    if len(roots) == 1 and roots[0].requires_grad is False:
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    for leaf in inputs or _leaves(roots):
        if not leaf.requires_grad:
            continue
        grad = _fake_grad(leaf)
        for hook in list((getattr(leaf, "_backward_hooks", None) or {}).values()):
            with called_back():  # the script's gradient hook, as autograd calls it (a mask, a clip)
                changed = hook(grad)
            grad = grad if changed is None else changed
        if leaf.grad is None:
            leaf.grad = grad
        else:
            with torch.no_grad():
                leaf.grad.add_(grad)


def _grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[torch.Tensor | None, ...]:
    """``torch.autograd.grad(outputs, inputs)``: a gradient per input."""
    inputs = _as_list(args[1] if len(args) > 1 else kwargs.get("inputs"))
    return tuple(_fake_grad(t) for t in inputs)


def _deepcopy(t: torch.Tensor, memo: dict[int, Any]) -> torch.Tensor:
    """``copy.deepcopy`` of a fake tensor: a fake copy (``Tensor.__deepcopy__`` would give it the storage
    of a real CPU copy of its data, which it has none of, and fail), with its ``requires_grad``, its
    gradient and a parameter's mark, as torch's copy keeps them."""
    if id(t) in memo:
        return memo[id(t)]  # type: ignore[no-any-return]
    with torch.no_grad():
        copied = t.clone()
    copied.requires_grad_(t.requires_grad)
    memo[id(t)] = copied
    if t.grad is not None:
        copied.grad = copy.deepcopy(t.grad, memo)
    if getattr(t, "_is_param", False):  # (the fake tensor's other attributes are its mode's, not copied)
        copied._is_param = True  # type: ignore[attr-defined]
    return copied


class _ScriptCalls:
    """Backward, printing and deep copies of fake tensors, which the fake mode alone cannot do without a
    GPU: the fake engine's mode (:class:`placecheck.engines.engine.FakeCuda`) asks this first for each
    call of a script, ``(True, result)`` for a call handled here, ``(False, None)`` for any other."""

    def __init__(self) -> None:
        self.datadep: DataDependentMode | None = None
        """The session's data-dependent mode (set once the session is entered)."""
        from placecheck.engines.compat import FakeTensor

        self._fake: type[torch.Tensor] = FakeTensor

    def __call__(self, func: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> tuple[bool, Any]:
        if func in (torch.Tensor.backward, torch.autograd.backward):
            if func is torch.Tensor.backward and len(args) > 1:
                kwargs = {"grad_tensors": args[1], **kwargs}
                args = args[:1]
            _backward(args, kwargs)
            return True, None
        if func is torch.autograd.grad:
            return True, _grad(args, kwargs)
        if func is torch.Tensor.__repr__ and args and isinstance(args[0], self._fake):
            return True, self._printed(args[0])
        refused = refused_on_device(func, args)  # .numpy()/.pin_memory() of a device tensor: a GPU's error
        if refused is not None:
            raise refused
        if func is torch.Tensor.numpy and args and isinstance(args[0], self._fake) \
                and args[0].device.type == "cpu":
            return True, self._host_array(args[0])  # an export after training: the values known, or assumed
        if func is torch.Tensor.__deepcopy__ and args and type(args[0]) is self._fake:
            return True, _deepcopy(args[0], args[1] if len(args) > 1 else kwargs.get("memo", {}))
        if func is torch.Tensor.__deepcopy__ and args and type(args[0]) in (torch.Tensor, torch.nn.Parameter):
            with on_host():  # a real tensor (a known value): copied as torch copies it, on the host
                return True, func(*args, **kwargs)
        return composite_call(func, args, kwargs)  # ATen's kernel reads data fake tensors lack

    def _host_array(self, t: torch.Tensor) -> Any:
        """``.numpy()`` of a fake host tensor: its values when known, else the assumed ones (noted)."""
        assert self.datadep is not None
        real, _ = self.datadep.value(t)
        if real is None:
            self.datadep.assume(f"the value {REPRESENTATIVE} in every element", ".numpy()")
            with on_host():
                real = torch.ones(t.shape, dtype=t.dtype)
        with on_host():
            return real.detach().numpy()

    def _printed(self, t: torch.Tensor) -> str:
        """What printing ``t`` shows: its values when known, else the assumed ones (noted)."""
        assert self.datadep is not None
        real, _ = self.datadep.value(t)
        if real is None:
            self.datadep.assume(f"the value {REPRESENTATIVE} in every element", "printing a tensor")
            with on_host():
                real = torch.ones((), dtype=t.dtype).expand(t.shape)  # no memory for the elements
        with on_host():
            text = repr(real)
        if t.device.type == "cuda" and text.endswith(")"):
            text = f"{text[:-1]}, device='{t.device}')"  # as a GPU tensor prints
        return text


_WHY_STORAGES = ("a fake tensor's storage has no data, so every one's data_ptr() is 0: a library that tells "
                 "shared storages apart by it (transformers' save_pretrained, safetensors) takes every fake "
                 "tensor for one shared storage; a method of torch's storage class, which no mode sees")
_WHY_SAFETENSORS = ("safetensors reads a tensor's bytes from its memory (ctypes at data_ptr()), which a fake "
                    "tensor has not: they are written as zeros, the file's names, shapes and dtypes right")


@contextlib.contextmanager
def _storages_told_apart() -> Iterator[None]:
    """``UntypedStorage.data_ptr()`` of a storage without data (a fake tensor's, on ``meta``): a number of its
    own, the same for every view of it (its ``_cdata``), as distinct GPU storages have distinct pointers."""
    real = torch.UntypedStorage.data_ptr

    def data_ptr(storage: torch.UntypedStorage) -> int:
        if storage.device.type == "meta":
            return int(storage._cdata)
        return int(real(storage))

    with patch(torch.UntypedStorage, "data_ptr", data_ptr, _WHY_STORAGES), warnings.catch_warnings():
        # a fake tensor's own data_ptr() (such libraries read it too) is 0, with torch's warning that
        # reading it is deprecated: the warning is about placecheck's tensors, not the script's code
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        yield


def _safetensors_patches() -> list[Patch]:
    """safetensors' reader of a tensor's bytes (``_to_ndarray`` since 0.6, ``_tobytes`` before: private,
    looked up at each save, which ``save_file`` imported by name elsewhere still calls), given a fake
    tensor: zeros of its size (:class:`_Zeros`). Nothing is patched where neither is there."""
    import safetensors
    import safetensors.torch as st

    from placecheck.engines.compat import FakeTensor

    def fake(tensor: Any) -> bool:
        return isinstance(tensor, FakeTensor) or (isinstance(tensor, torch.Tensor) and tensor.is_meta)

    def to_ndarray(original: Callable[..., Any]) -> Callable[..., Any]:
        def _to_ndarray(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not fake(tensor):
                return original(tensor, *args, **kwargs)
            return _Zeros(tensor.numel() * tensor.element_size()), None
        return _to_ndarray

    def tobytes(original: Callable[..., Any]) -> Callable[..., Any]:
        def _tobytes(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return bytes(tensor.numel() * tensor.element_size()) if fake(tensor) \
                else original(tensor, *args, **kwargs)
        return _tobytes

    writers: list[Patch] = [(st, name, make) for name, make in (("_to_ndarray", to_ndarray),
                                                                ("_tobytes", tobytes))
                            if callable(getattr(st, name, None))]
    readers: list[Patch] = [(owner, "safe_open", _host_opened) for owner in (safetensors, st)
                            if hasattr(owner, "safe_open")]
    return writers + readers


class _Zeros:
    """``nbytes`` zero bytes where safetensors' writer reads an array's (its ``ctypes.data`` and ``nbytes``):
    an anonymous memory map, whose untouched pages read as zeros and take no memory (a 16 GB model's
    weights cost its file's size on disk, not in memory)."""

    def __init__(self, nbytes: int) -> None:
        import ctypes
        import mmap
        from types import SimpleNamespace

        self._buffer = mmap.mmap(-1, max(nbytes, 1))
        self._view = (ctypes.c_char * len(self._buffer)).from_buffer(self._buffer)
        self.nbytes = nbytes
        self.ctypes = SimpleNamespace(data=ctypes.addressof(self._view))


def _host_opened(original: Callable[..., Any]) -> Callable[..., Any]:
    """``safe_open(filename, framework="pt", device=...)``: the file read on the host (the reader writes
    each tensor's bytes into the memory of a tensor it makes, which a fake tensor has not: a crash), each
    tensor then moved where ``device`` says in the session, as the reader copies it there on a GPU."""
    def safe_open(filename: Any, framework: str, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.pop("device", args[0] if args else "cpu")
        if framework not in ("pt", "torch"):
            return original(filename, framework, *args, **kwargs) if args else \
                original(filename, framework, device=device, **kwargs)
        with on_host():
            opened = original(filename, framework, *args[1:], device="cpu", **kwargs)
        return _HostOpened(opened, f"cuda:{device}" if isinstance(device, int) else device)
    return safe_open


class _HostOpened:
    """An open safetensors file (:func:`_host_opened`): what it reads is read on the host, then placed."""

    def __init__(self, opened: Any, device: Any) -> None:
        self._opened = opened
        self._device = device

    def __enter__(self) -> _HostOpened:
        with on_host():
            self._opened.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._opened.__exit__(*exc)

    def _placed(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if torch.device(self._device).type == "cpu" else tensor.to(self._device)

    def get_tensor(self, name: str) -> torch.Tensor:
        with on_host():
            tensor = self._opened.get_tensor(name)
        return self._placed(tensor)

    def get_tensors(self) -> dict[str, torch.Tensor]:
        return {name: self.get_tensor(name) for name in self._opened.keys()}  # noqa: SIM118 - not a dict

    def get_slice(self, name: str) -> _HostSlice:
        with on_host():
            return _HostSlice(self._opened.get_slice(name), self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._opened, name)  # keys(), metadata(), offset_keys() ...


class _HostSlice:
    """A lazily read tensor of an open file (``get_slice``): indexed on the host, then placed."""

    def __init__(self, sliced: Any, opened: _HostOpened) -> None:
        self._sliced = sliced
        self._opened = opened

    def __getitem__(self, index: Any) -> torch.Tensor:
        with on_host():
            tensor = self._sliced[index]
        return self._opened._placed(tensor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sliced, name)  # get_shape(), get_dtype()


@contextlib.contextmanager
def fake_cuda(gpus: int = 1) -> Iterator[DataDependentMode]:
    """The fake engine's session for a whole script; yields the data-dependent mode (its assumptions)."""
    from placecheck.engines.compat import FakeTensorMode
    from placecheck.engines.datadep import active
    from placecheck.engines.engine import simulated_cuda

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        calls = _ScriptCalls()
        with simulated_cuda(gpus, fake_mode, script=calls), _storages_told_apart(), \
                patched_once_imported("safetensors.torch", _safetensors_patches, _WHY_SAFETENSORS):
            datadep = active()
            assert datadep is not None  # simulated_cuda enters one
            calls.datadep = datadep
            yield datadep
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
