"""What a script's DataLoaders yield: each batch element tagged with its loader's line, and how the
script then copies it to the device (``non_blocking`` against ``pin_memory``: a note; a framework's own
blocking copy of pinned batches is none, the script cannot change it)."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from placecheck.engines import classify
from placecheck.engines.sources import here
from placecheck.run.origins import Origin
from placecheck.run.session import StopRun
from placecheck.run.sites import library_caller

if typing.TYPE_CHECKING:
    from placecheck.run.session import Recording

PIN_WARNING = "'pin_memory' argument is set as true but no accelerator is found"
"""What a DataLoader(pin_memory=True) warns on a machine without CUDA: the simulation has no pinned memory."""


def non_blocking(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The ``non_blocking`` of a ``.to(...)``/``.cuda(...)`` call."""
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return any(isinstance(a, bool) and a for a in args[1:3])  # to(device, non_blocking) / cuda(device, nb)


class Loaders:
    """The script's DataLoader iterators and the batches they yield."""

    def __init__(self, recorder: Recording) -> None:
        self.recorder = recorder
        self.iterators: dict[int, tuple[bool, str]] = {}
        """id of a loader's iterator -> (its loader pins memory, the line that iterated it)."""
        self.loader_of: dict[int, int] = {}
        """id of a loader's iterator -> id of the loader."""
        self.last_loader: int | None = None
        """id of the loader the latest batch came from."""
        self.counts: dict[int, list[Any]] = {}
        """id of a loader's iterator -> [started before the fast-forward, batches, batches in it, its
        early end counted]."""
        self.batch_copies: dict[tuple[str, str, bool, str], dict[str, None]] = {}
        """(copy line, loop line, pinned, the installed code that copied or "") -> batch paths copied with
        the other non_blocking than pinned."""

    def loader_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``DataLoader.__iter__``: remember the iterator, its loop line and its ``pin_memory``."""
        def __iter__(loader: Any) -> Any:
            if self.recorder.loaders_in_process and getattr(loader, "num_workers", 0) > 0:
                # fake tensors cannot cross into worker processes; a worker's batch is a CPU tensor
                # all the same
                self.recorder.notes[
                    f"run: the DataLoader at {here()[0] or 'an unknown line'} ran its {loader.num_workers} "
                    "workers' work in the script's process (fake tensors cannot cross into worker "
                    "processes); its batches are CPU tensors, as from workers"] = None
                loader.num_workers = 0
            ff = self.recorder.fastforward
            line = here()[0]
            stop = ff.pass_began(id(loader), line) if ff is not None else ""
            if stop:  # a loop that keeps iterating it after the budget, with nothing new: it ends here
                raise StopRun(stop)
            with self.recorder.host_data():  # the sampler's shuffle and seed: real values
                iterator = original(loader)
            self.iterators[id(iterator)] = (bool(getattr(loader, "pin_memory", False)), line)
            self.counts[id(iterator)] = [ff is None or not ff.on, 0, 0, False]
            self.loader_of[id(iterator)] = id(loader)
            return iterator
        return __iter__

    def loader_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``_BaseDataLoaderIter.__next__``: tag every plain tensor of the batch with where it came from."""
        def __next__(iterator: Any) -> Any:
            ff = self.recorder.fastforward
            count = self.counts.setdefault(id(iterator), [True, 0, 0, False])
            if ff is not None and not ff.batch_allowed(count[0], count[1], count[2],
                                                       self.loader_of.get(id(iterator), 0)):
                pinned, loop = self.iterators.get(id(iterator), (False, ""))
                if loop and not count[3]:
                    try:
                        left = max(0, len(iterator) - count[1])
                    except TypeError:  # an iterable-style dataset has no length
                        left = 0
                    ff.loader_cuts[loop] = ff.loader_cuts.get(loop, 0) + left
                    count[3] = True
                raise StopIteration
            with self.recorder.host_data():
                batch = original(iterator)
            count[1] += 1
            self.last_loader = self.loader_of.get(id(iterator))
            if ff is not None:
                ff.activity += 1
                if ff.on:
                    count[2] += 1
            pinned, _ = self.iterators.get(id(iterator), (False, ""))
            line = here()[0]
            for path, t in classify.tensors_with_paths(batch, "batch"):
                if self.recorder.is_host_tensor(t):
                    self.recorder.origins.track(t, Origin("batch", path, line, pinned))
            return batch
        return __next__

    def copied(self, origin: Origin, line: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A batch element copied to the device at ``line``: remembered when its ``non_blocking`` does not
        match its loader's ``pin_memory``."""
        if non_blocking(args, kwargs) == origin.pinned:
            return
        by = library_caller()
        if by and origin.pinned:
            return  # a framework's own blocking copy (HF Trainer's): nothing the script can change
        self.batch_copies.setdefault((line, origin.line, origin.pinned, by), {})[origin.path] = None

    def copy_notes(self) -> list[str]:
        """Batches copied with ``non_blocking`` that does not match the loader's ``pin_memory``."""
        notes = []
        for (line, loop, pinned, by), paths in self.batch_copies.items():
            what = ", ".join(paths)
            by = f" in {by}" if by else ""
            if pinned:
                notes.append(f"{line}: {what} from pinned memory (a DataLoader with pin_memory=True, "
                             "iterated "
                             f"at {loop}) copied with a blocking .to(): non_blocking=True lets the copy "
                             "overlap with compute")
            else:
                notes.append(f"{line}: .to(..., non_blocking=True){by} of {what} from a DataLoader without "
                             f"pin_memory=True (iterated at {loop}): from pageable memory the copy is "
                             "synchronous, the flag does nothing; pass pin_memory=True to the DataLoader")
        return notes
