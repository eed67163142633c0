"""What a script saves and loads with ``torch.save`` / ``torch.load``, as on the simulated machine.

A save writes plain host tensors (no placecheck class in the file), each storage tagged with the
device it came from as a GPU run writes it (``cuda:1``: ``placecheck checkpoint`` or a later run on a
machine without that GPU then shows PC301), and remembers those devices; a load puts each storage
back where it was saved (or where ``map_location`` maps it), tagged as the engine's device tensor.
A load of storages the simulated machine lacks, without ``map_location``, is PC301 and then fails as
it would there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import typing
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

from placecheck.basics.errors import PlacecheckError
from placecheck.basics.values import Device
from placecheck.checks.state import replace_tensors
from placecheck.engines.calls import as_device
from placecheck.engines.compat import (
    DisableTorchFunctionSubclass,
    FakeTensor,
    active_fake_mode,
    storage_location_registry,
)
from placecheck.engines.cudaapi import current_index
from placecheck.engines.datadep import on_host
from placecheck.engines.sources import here
from placecheck.engines.tagged import SimulatedTensor, untagged

if typing.TYPE_CHECKING:
    from placecheck.run.session import Recording


class _StorageProbe:
    """The storage a ``map_location`` callable is given, asked where the callable sends it: ``.cuda(i)``,
    ``.to(device)``, ``.cpu()`` (torch hands it the storage on the CPU; returned as it is, it stays there)."""

    def __init__(self) -> None:
        self.device: Any = "cpu"

    def cuda(self, device: Any = None, non_blocking: bool = False) -> _StorageProbe:
        self.device = torch.device("cuda", current_index()) if device is None else as_device(
            device if not isinstance(device, str) or device.startswith("cuda") else f"cuda:{device}")
        return self

    def to(self, *args: Any, **kwargs: Any) -> _StorageProbe:
        device = args[0] if args else kwargs.get("device")
        if device is not None:
            self.device = device
        return self

    def cpu(self) -> _StorageProbe:
        self.device = "cpu"
        return self

    def pin_memory(self, *args: Any, **kwargs: Any) -> _StorageProbe:
        return self


def _file_path(f: Any) -> str | None:
    """The absolute path of what ``torch.save``/``torch.load`` got: a path, or a file opened from one
    (``with open(path, "wb") as f: torch.save(model, f)``); None for a buffer."""
    if isinstance(f, str | bytes) or hasattr(f, "__fspath__"):
        return os.path.abspath(os.fsdecode(f))
    name = getattr(f, "name", None)
    return os.path.abspath(name) if isinstance(name, str) and not name.startswith("<") else None


def _empty_coo(t: torch.Tensor) -> torch.Tensor:
    sparse_dim = t.sparse_dim()
    return torch.sparse_coo_tensor(torch.zeros((sparse_dim, 0), dtype=torch.int64),
                                   torch.zeros((0, *t.shape[sparse_dim:]), dtype=t.dtype), t.shape)


_EMPTY_SPARSE: dict[torch.layout, Callable[[torch.Tensor], torch.Tensor]] = {
    torch.sparse_coo: _empty_coo,
    torch.sparse_csr: lambda t: _empty_coo(t).to_sparse_csr(),
    torch.sparse_csc: lambda t: _empty_coo(t).to_sparse_csc(),
}
"""A fake sparse tensor saved: an empty one of its layout (no data to write, as a fake dense tensor is
saved as a meta one), so that the file loads as a sparse tensor."""


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A tagged tensor's data as an ordinary CPU tensor (what a real GPU would copy back to save); a fake
    tensor (the fake engine's, which has no data to write and cannot be pickled) as a ``meta`` tensor of
    its shape, strides and dtype."""
    if isinstance(t, SimulatedTensor):
        with DisableTorchFunctionSubclass():
            return untagged(t)  # (a sparse one too: it has no storage for as_subclass)
    if isinstance(t, FakeTensor) and t.layout in _EMPTY_SPARSE:
        with on_host():  # an empty sparse host tensor of its layout, shape and dtype, which pickles
            return _EMPTY_SPARSE[t.layout](t)
    if isinstance(t, FakeTensor):
        with on_host():  # no mode of the run's: a plain meta tensor, which pickles
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return t


def _map_tree(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor], undo: _Undo | None = None,
              depth: int = 0) -> Any:
    """``obj`` with ``fn`` applied to every tensor in its dicts, lists and tuples (rebuilt, not mutated)
    and in the modules in it (replaced in place through :func:`placecheck.checks.state.replace_tensors`;
    ``undo`` collects the originals).

    Not ``torch.utils._pytree``: a checkpoint is rebuilt as the types it holds, and a ``state_dict``
    keeps its ``_metadata`` (the per-module versions ``load_state_dict`` reads), which pytree drops.
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if depth > 32:
        return obj
    if isinstance(obj, dict):
        items = [(k, _map_tree(v, fn, undo, depth + 1)) for k, v in obj.items()]
        try:
            out = type(obj)()
        except TypeError:
            out = {}
        out.update(items)
        metadata = getattr(obj, "_metadata", None)
        if metadata is not None:  # a state_dict's per-module versions, which load_state_dict reads
            out._metadata = metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list):
        return [_map_tree(v, fn, undo, depth + 1) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_map_tree(v, fn, undo, depth + 1) for v in obj)
    if isinstance(obj, nn.Module):  # a pickled whole module: its tensors are replaced in place
        _replace_module_tensors(obj, fn, undo)
    return obj


_Undo = dict[int, tuple[nn.Module, torch.Tensor]]
"""id of a tensor put into a module -> (the module saved whole, the tensor it replaced)."""


def _replace_module_tensors(model: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor],
                            undo: _Undo | None) -> None:
    """Every tensor ``model`` holds, registered or plain (the state registry's traversal), replaced by
    ``fn`` of it (parameters stay parameters); ``undo`` collects what was replaced, for :func:`_restore`."""
    done: dict[int, torch.Tensor] = {}

    def swap(t: torch.Tensor) -> torch.Tensor:
        if id(t) in done:  # a tensor held twice stays one tensor
            return done[id(t)]
        new = fn(t)
        if new is not t and isinstance(t, nn.Parameter):
            with on_host():  # under the fake engine too, a plain Parameter of what fn gave
                new = nn.Parameter(new, requires_grad=t.requires_grad)
        if new is not t and undo is not None:
            undo[id(new)] = (model, t)
        done[id(t)] = new
        return new

    replace_tensors(model, swap)


def _restore(undo: _Undo) -> None:
    """Put back the tensors :func:`_replace_module_tensors` replaced."""
    for model in {id(m): m for m, _ in undo.values()}.values():
        replace_tensors(model, lambda t: undo[id(t)][1] if id(t) in undo else t)


@contextlib.contextmanager
def _location_tags(tags: dict[int, str]) -> Iterator[None]:
    """``torch.save`` writes each storage in ``tags`` (by data pointer) with its simulated device as the
    location a GPU run writes (``cuda:1``), not ``cpu``: a tagger of torch's serialization registry,
    first in its order for the one save. Loading is never routed through it (its deserializer declines)."""
    def tag(storage: Any) -> str | None:
        return tags.get(storage.data_ptr()) if tags else None

    def decline(storage: Any, location: str) -> None:
        return None

    registry = storage_location_registry()
    entry = (min((e[0] for e in registry), default=0) - 1, tag, decline)
    registry.insert(0, entry)
    try:
        yield
    finally:
        registry.remove(entry)


class Checkpoints:
    """The script's ``torch.save`` and ``torch.load`` calls."""

    def __init__(self, recorder: Recording) -> None:
        self.recorder = recorder
        self.saved: dict[str, list[str]] = {}
        """Files this run saved with torch.save -> the device of each tensor, in order."""

    def torch_load(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``torch.load`` as on the simulated machine (:meth:`_load`)."""
        def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
            with self.recorder.quiet():
                loaded = self._load(original, f, map_location, args, kwargs)
                if self.recorder.ranks is not None:  # one rank of a torchrun launch: on its own GPU?
                    self.recorder.ranks.loaded(loaded, here()[0])
                return loaded
        return load

    def _load(self, original: Callable[..., Any], f: Any, map_location: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        """``torch.load`` as on the simulated machine: storages restored where they were saved when it has
        that device (tagged), PC301 and the load's failure when it does not."""
        from placecheck.checkpoint import read_checkpoint
        from placecheck.checkpoint.preflight import device_findings

        line = here()[0]
        if map_location is None and (isinstance(f, str | bytes) or hasattr(f, "__fspath__")) \
                and _file_path(f) not in self.saved:  # (a file this run saved: this machine's devices)
            try:
                meta = read_checkpoint(f)
            except (PlacecheckError, OSError):
                meta = None
            missing = device_findings(meta, self.recorder.target, self.recorder.gpus) \
                if meta is not None else []
            missing = [m for m in missing if m.device != m.expected and "," not in m.device]
            if missing:
                for finding in missing:
                    self.recorder.add(dataclasses.replace(finding, source=line))
                have = f"torch.cuda.device_count() is {self.recorder.gpus}"
                error = RuntimeError(f"Attempting to deserialize object on CUDA device "
                                     f"{Device.of(missing[0].device).ordinal} but {have}.")
                self.recorder.reported_errors.add(id(error))
                raise error
        locations: dict[int, str] = {}

        def remember(storage: Any, location: str) -> Any:
            locations[storage.data_ptr()] = location
            return storage

        with self.recorder.host_data():  # the file's real values, on the host (fake tensors cannot unpickle)
            loaded = original(f, remember, *args, **kwargs)
        fake = active_fake_mode() is not None
        saved_here = iter(self.saved.get(_file_path(f) or "", []))

        def place(t: torch.Tensor) -> torch.Tensor:
            saved = next(saved_here, None) or locations.get(t.untyped_storage().data_ptr(), "cpu")
            dest = self._mapped(map_location, saved)
            if dest.type == "cuda":
                if fake:  # the fake engine's device tensor: the host copy moved in the session's fake mode
                    return t.to(dest)
                return SimulatedTensor.tag(_plain(t), dest)
            return t

        return _map_tree(loaded, place)

    @staticmethod
    def _mapped(map_location: Any, saved: str) -> torch.device:
        """Where ``torch.load(map_location=...)`` puts a storage saved on ``saved``: a string, a
        ``torch.device``, a dict of locations, or a callable given each storage (on the CPU) and its
        location (``lambda s, loc: s.cuda(rank)``: asked with a :class:`_StorageProbe`)."""
        if map_location is None:
            target: Any = saved
        elif isinstance(map_location, dict):
            target = map_location.get(saved, saved)
        elif isinstance(map_location, str | torch.device | int):
            target = map_location
        elif callable(map_location):
            probe = _StorageProbe()
            returned = map_location(probe, saved)
            target = probe.device if returned is probe or returned is None \
                else getattr(returned, "device", "cpu")
        else:
            target = "cpu"
        return as_device(target, current_index()) or torch.device("cpu")

    def torch_save(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``torch.save`` of plain host tensors, remembering where each was (a later load in the run puts
        it back there)."""
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            devices: list[str] = []

            tags: dict[int, str] = {}

            def host(t: torch.Tensor) -> torch.Tensor:
                devices.append(str(t.device))
                plain = _plain(t)  # a fake tensor: a meta tensor of its shape (it holds no data to write)
                if t.device.type == "cuda" and plain.layout == torch.strided \
                        and plain.untyped_storage().data_ptr():  # (a sparse tensor has no one storage)
                    tags[plain.untyped_storage().data_ptr()] = str(t.device)
                return plain

            undo: _Undo = {}
            with self.recorder.quiet():
                try:
                    plain = _map_tree(obj, host, undo)
                    path = _file_path(f)
                    if path is not None:
                        # the file holds host tensors (no placecheck class in it); a later torch.load of
                        # it in this run puts each back on the device it was saved from, as on a GPU
                        self.saved[path] = devices
                    # outside the fake engine's modes: its mode would make the meta tensors fake again
                    with _location_tags(tags), on_host():
                        return original(plain, f, *args, **kwargs)
                finally:
                    _restore(undo)  # a whole module saved: the script's module keeps its own tensors
        return save
