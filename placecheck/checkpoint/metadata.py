"""Reading a checkpoint's structure without its tensor data and without running it.

Every format is read from its index alone:

- ``torch.save`` zip files (and TorchScript archives, which share the layout):
  ``data.pkl`` is unpickled by :class:`_MetaUnpickler`, whose
  ``persistent_load`` records each storage's ``('storage', type, key,
  location, numel)`` id instead of reading ``data/<key>``, and whose
  ``find_class`` hands back inert stand-ins instead of importing anything;
- legacy (pre-1.6, non-zip) ``torch.save`` files: the same unpickler over the
  main pickle at the start of the file; the raw storages after it are skipped;
- ``torch.export`` programs (``.pt2``): ``model_weights_config.json`` and
  ``model_constants_config.json`` describe every tensor
  (:mod:`~placecheck.checkpoint.pt2`), and every member ``torch.export.load``
  would unpickle (sample inputs, pickled weights, opaque constants) goes
  through the same inert unpickler for its globals;
- safetensors: the 8-byte little-endian length and the JSON header, checked
  as strictly as the safetensors library checks it (offsets contiguous from 0
  and covering the data section exactly).

A multi-gigabyte checkpoint is therefore read in the time it takes to read its
index. Nothing here ever calls a global a file names: the security check
(:mod:`placecheck.checkpoint.safety`) and any real ``torch.load`` come later.
"""

from __future__ import annotations

import _compat_pickle
import collections
import contextlib
import enum
import io
import json
import os
import pickle
import struct
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from placecheck.basics.errors import LoadError, UsageError
from placecheck.checkpoint.pt2 import Pt2Index, read_pt2_index
from placecheck.checkpoint.safety import normalize_module, unsafe_globals

LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
"""The first pickle of a legacy ``torch.save`` file (``torch.serialization.MAGIC_NUMBER``)."""

TORCHSCRIPT_GLOBALS = ("__torch__.", "torch.jit._pickle.")
"""Globals of a TorchScript archive that ``torch.jit.load`` handles without importing Python:
classes compiled from its ``code/`` and the list/type-tag builders of its C++ unpickler."""

_SAFETENSORS_MAX_HEADER = 100 * 2**20  # the safetensors library's own limit

_SAFETENSORS_DTYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1),
    "BOOL": ("bool", 1), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "C64": ("complex64", 8),
}


class CheckpointFormat(str, enum.Enum):
    """The container formats placecheck reads."""

    TORCH_ZIP = "torch.save (zip)"
    TORCH_LEGACY = "torch.save (legacy)"
    TORCHSCRIPT = "TorchScript"
    TORCH_EXPORT = "torch.export (.pt2)"
    SAFETENSORS = "safetensors"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class StorageMeta:
    """One storage as the file describes it: where it was saved, its type and size."""

    key: str
    """The storage's record key in the file (``data/<key>`` in a zip)."""
    location: str
    """The saved location tag, e.g. ``cuda:1`` or ``cpu``."""
    dtype: str
    """Element type without the ``torch.`` prefix (``float32``)."""
    numel: int
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class TensorMeta:
    """One tensor's metadata: shape, dtype, and the storage (and so the device) behind it."""

    shape: tuple[int, ...]
    dtype: str
    location: str
    """Saved location tag; ``""`` when the format records none (safetensors)."""
    storage: StorageMeta | None = None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class Opaque:
    """Inert stand-in for a global named in a pickle: never imported, never called.

    It records what the pickle gives it (constructor arguments, ``BUILD``
    state, items) so that the tensors inside a pickled object (a whole
    ``nn.Module``, a TorchScript module) can still be found.
    """

    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        obj = object.__new__(cls)
        obj.args = args
        obj.state = None
        obj.items = {}
        obj.elements = []
        return obj

    args: tuple[Any, ...]
    state: Any
    items: dict[Any, Any]
    elements: list[Any]

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def append(self, value: Any) -> None:
        self.elements.append(value)

    def extend(self, values: Any) -> None:
        self.elements.extend(values)

    def __repr__(self) -> str:
        return f"<{self.qualname}>"

    def attributes(self) -> dict[str, Any]:
        """The object's attribute dict from its pickled state, when it has one."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            merged = dict(state[0] or {})
            merged.update(state[1] or {})
            return merged
        return dict(state) if isinstance(state, dict) else {}


_OPAQUE_CLASSES: dict[str, type[Opaque]] = {}


def _opaque_class(qualname: str) -> type[Opaque]:
    cls = _OPAQUE_CLASSES.get(qualname)
    if cls is None:
        cls = type(qualname.rpartition(".")[2] or "Opaque", (Opaque,), {"qualname": qualname})
        _OPAQUE_CLASSES[qualname] = cls
    return cls


# --- stand-ins for the rebuild functions torch.save names -----------------------------------------

def _rebuild_tensor(storage: Any, offset: int, size: Any, stride: Any = None, *rest: Any) -> Any:
    if not isinstance(storage, StorageMeta):
        return _opaque_class("torch._utils._rebuild_tensor")(storage, offset, size, stride, *rest)
    return TensorMeta(tuple(int(s) for s in size), storage.dtype, storage.location, storage)


def _rebuild_qtensor(storage: Any, offset: int, size: Any, *rest: Any) -> Any:
    return _rebuild_tensor(storage, offset, size)


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    return data  # a Parameter is its data as far as placement and keys go


def _rebuild_meta_tensor_no_storage(dtype: Any, size: Any, *rest: Any) -> Any:
    return TensorMeta(tuple(int(s) for s in size), str(dtype), "meta")


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    # func comes from our own find_class, so it is a stand-in: calling it runs no file code.
    return func(*args)


def _codecs_encode(text: Any, encoding: str = "utf-8", *rest: Any) -> bytes:
    return str(text).encode(encoding)


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    return cls() if isinstance(cls, type) and issubclass(cls, Opaque) else _opaque_class("copyreg")()


def _torch_device(*args: Any) -> str:
    return ":".join(str(a) for a in args if a is not None)


_STAND_INS: dict[str, Any] = {
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
    "torch._utils._rebuild_qtensor": _rebuild_qtensor,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch._utils._rebuild_meta_tensor_no_storage": _rebuild_meta_tensor_no_storage,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "collections.OrderedDict": collections.OrderedDict,
    "builtins.set": set,
    "builtins.frozenset": frozenset,
    "builtins.slice": slice,
    "builtins.complex": complex,
    "builtins.bytearray": bytearray,
    "_codecs.encode": _codecs_encode,
    "copyreg._reconstructor": _reconstructor,
    "torch.device": _torch_device,
}


@dataclass(frozen=True)
class _StorageType:
    """What ``torch.FloatStorage`` etc. stand for in a persistent id: a dtype and its size."""

    dtype: str
    itemsize: int


def _storage_type(name: str) -> _StorageType | None:
    import torch

    cls = getattr(torch, name, None)
    if name == "UntypedStorage":
        return _StorageType("uint8", 1)
    if not (isinstance(cls, type) and issubclass(cls, torch.storage.TypedStorage)):
        return None
    with warnings.catch_warnings():  # TypedStorage is deprecated, and still what files name
        warnings.simplefilter("ignore")
        dtype = cls.dtype
    return _StorageType(str(dtype).removeprefix("torch."), dtype.itemsize)


class _MetaUnpickler(pickle.Unpickler):
    """Unpickles ``data.pkl`` into a tree of dicts, lists and :class:`TensorMeta` leaves.

    Safe on any file: ``find_class`` never imports, it returns stand-ins; and
    ``persistent_load`` records storages instead of reading them. Every
    global the pickle names passes through ``find_class`` and is recorded in
    ``globals`` for the safety check.
    """

    def __init__(self, file: IO[bytes], storages: dict[str, StorageMeta],
                 globals_seen: dict[str, None], key_prefix: str = "") -> None:
        super().__init__(file)
        self.storages = storages
        self.globals_seen = globals_seen
        self.key_prefix = key_prefix
        """Record directory of this pickle's storages (TorchScript constants live in constants/)."""

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names in protocol-2 pickles, mapped as pickle and torch map them (__builtin__.long:
        # builtins.int), so that the names shown and checked are the ones torch.load would look up.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = normalize_module(_compat_pickle.IMPORT_MAPPING.get(module, module))
        qualname = f"{module}.{name}"
        self.globals_seen.setdefault(qualname, None)
        if qualname in _STAND_INS:
            return _STAND_INS[qualname]
        if module == "torch" and name.endswith("Storage"):
            st = _storage_type(name)
            if st is not None:
                return st
        if module == "torch" and not name.startswith("_"):
            import torch

            if isinstance(getattr(torch, name, None), torch.dtype):
                return f"torch.{name}"  # a dtype pickled by name (torch.float16)
        return _opaque_class(qualname)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            storage_type, location, numel = pid[1], str(pid[3]), int(pid[4])
            key = self.key_prefix + str(pid[2])
            if isinstance(storage_type, _StorageType):
                dtype, itemsize = storage_type.dtype, storage_type.itemsize
            else:
                dtype, itemsize = "unknown", 1
            known = self.storages.get(key)
            if known is None:
                known = StorageMeta(key, location, dtype, numel, itemsize)
                self.storages[key] = known
            return known
        return _opaque_class("persistent_id")(pid)


@dataclass(frozen=True)
class CheckpointMeta:
    """What a checkpoint file holds, read from its index."""

    path: str
    format: CheckpointFormat
    root: Any
    """The unpickled object tree (dicts, lists, :class:`Opaque`) with
    :class:`TensorMeta` leaves; for safetensors and .pt2, a flat dict."""
    storages: tuple[StorageMeta, ...] = ()
    """Each distinct storage once; for formats without storages, one per tensor."""
    globals: tuple[str, ...] = ()
    """Every global the pickle names (empty for safetensors/.pt2)."""
    unsafe_globals: tuple[str, ...] = ()
    """Those ``torch.load(weights_only=True)`` refuses: loading them runs code."""
    size: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    """Free-form header metadata (safetensors ``__metadata__``)."""
    constants: dict[str, TensorMeta] = field(default_factory=dict)
    """Tensors the file places on a device that are not in the state_dict (.pt2 constants)."""
    pt2: Pt2Index | None = None
    """A .pt2 archive's configs, for loading it without ``torch.export.load``."""

    @property
    def needs_code_execution(self) -> bool:
        """True when loading requires ``weights_only=False``: some pickle names an unsafe global.

        A TorchScript archive's ``__torch__.*`` classes are compiled from its
        ``code/`` by ``torch.jit.load`` and are already left out of
        :attr:`unsafe_globals`; any other global counts in every format.
        """
        return bool(self.unsafe_globals)


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointMeta:
    """Read ``path``'s structure; :class:`LoadError` with one line for anything unreadable."""
    p = Path(path)
    shown = str(path)
    if not p.exists():
        raise LoadError(f"no such file {shown!r}: check the checkpoint path")
    if p.is_dir():
        raise LoadError(f"{shown!r} is a directory: pass one checkpoint file "
                        "(.pt, .pth, .bin, .safetensors, .pt2)")
    try:
        size = p.stat().st_size
        with p.open("rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise LoadError(f"cannot read {shown!r}: {exc.strerror or exc}") from None
    if size == 0:
        raise LoadError(f"{shown!r} is empty (0 bytes): the save did not finish, or the path is wrong")
    if head[:4] == b"PK\x03\x04" or zipfile.is_zipfile(p):
        return _read_zip(p, shown, size)
    if head[:2] == b"\x80\x02":
        return _read_legacy(p, shown, size)
    if len(head) >= 9 and head[8:9] == b"{":
        return _read_safetensors(p, shown, size)
    raise LoadError(f"{shown!r} is not a checkpoint placecheck can read (first bytes {head[:8].hex()}): "
                    "expected a torch.save file, a TorchScript archive, a .pt2 program or safetensors")


# --- torch.save zip, TorchScript -------------------------------------------------------------------

def _read_zip(p: Path, shown: str, size: int) -> CheckpointMeta:
    try:
        archive = zipfile.ZipFile(p)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise LoadError(f"{shown!r} is a truncated or corrupt zip archive ({exc}): copy or save it "
                        "again") from None
    with archive:
        names = archive.namelist()
        if any(n.endswith("/archive_format") for n in names) or any(
                n.endswith("model_weights_config.json") for n in names):
            return _read_pt2(archive, names, shown, size)
        data_pkl = sorted((n for n in names if n.endswith("data.pkl") and n.count("/") == 1), key=len)
        if not data_pkl:
            raise LoadError(f"{shown!r} is a zip archive but not a PyTorch checkpoint (no data.pkl): "
                            "pass a file written by torch.save, torch.jit.save or torch.export.save")
        prefix = data_pkl[0].rpartition("/")[0]
        # torch's own test (torch.serialization._is_torchscript_zip): a constants.pkl record.
        # A code/ folder alone proves nothing: anyone can add one to a hostile torch.save file.
        torchscript = f"{prefix}/constants.pkl" in names
        fmt = CheckpointFormat.TORCHSCRIPT if torchscript else CheckpointFormat.TORCH_ZIP
        storages: dict[str, StorageMeta] = {}
        pickles = [data_pkl[0]]
        if torchscript and f"{prefix}/constants.pkl" in names:
            pickles.append(f"{prefix}/constants.pkl")
        roots = []
        all_globals: dict[str, None] = {}
        for member in pickles:
            payload = _read_member(archive, member, shown)
            key_prefix = "constants/" if member.endswith("constants.pkl") else ""
            roots.append(_unpickle(io.BytesIO(payload), storages, all_globals, shown, member, key_prefix))
        # torch.load unpickles only these, but scan every other pickle in the archive too: what a
        # file names anywhere is worth knowing, and a reader that picks another record is not unsafe.
        for member in names:
            if member.endswith(".pkl") and member not in pickles:
                with contextlib.suppress(LoadError):  # a stray pickle torch never reads may be anything
                    _unpickle(io.BytesIO(_read_member(archive, member, shown)), {}, all_globals, shown,
                              member)
    root = roots[0]
    if len(roots) > 1 and roots[1]:
        root = {"<module>": roots[0], "<constants>": roots[1]}
    names_ = tuple(all_globals)
    unsafe = unsafe_globals(list(names_))
    if torchscript:  # torch.jit.load's own unpickler resolves these itself; it imports no Python
        unsafe = [g for g in unsafe if not g.startswith(TORCHSCRIPT_GLOBALS)]
    return CheckpointMeta(shown, fmt, root, tuple(storages.values()), names_, tuple(unsafe), size)


def _read_member(archive: zipfile.ZipFile, member: str, shown: str) -> bytes:
    try:
        return archive.read(member)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise LoadError(f"{shown!r}: cannot read {member} ({exc}): the archive is truncated or "
                        "corrupt; copy or save it again") from None


def _unpickle(stream: IO[bytes], storages: dict[str, StorageMeta], globals_seen: dict[str, None],
              shown: str, member: str, key_prefix: str = "") -> Any:
    try:
        return _MetaUnpickler(stream, storages, globals_seen, key_prefix).load()
    except Exception as exc:  # any malformed pickle; nothing in it was executed
        raise LoadError(f"{shown!r}: {member} could not be read ({type(exc).__name__}: {exc}): "
                        "the file is truncated or corrupt") from None


# --- legacy torch.save -----------------------------------------------------------------------------

def _read_legacy(p: Path, shown: str, size: int) -> CheckpointMeta:
    storages: dict[str, StorageMeta] = {}
    found: dict[str, None] = {}
    with p.open("rb") as fh:
        try:
            magic = _MetaUnpickler(fh, storages, found).load()
        except Exception:
            magic = None
        if magic != LEGACY_MAGIC_NUMBER:
            raise LoadError(f"{shown!r} is a pickle but not a torch.save file (no torch magic number): "
                            "placecheck reads files written by torch.save, torch.jit.save, "
                            "torch.export.save or safetensors")
        for what in ("protocol version", "system info"):
            _unpickle(fh, storages, found, shown, what)
        # The raw storages follow the main pickle; the unpickler stops at its STOP opcode.
        root = _unpickle(fh, storages, found, shown, "the main pickle")
    return CheckpointMeta(shown, CheckpointFormat.TORCH_LEGACY, root, tuple(storages.values()),
                          tuple(found), tuple(unsafe_globals(list(found))), size)


# --- torch.export .pt2 -----------------------------------------------------------------------------

def _read_pt2(archive: zipfile.ZipFile, names: list[str], shown: str, size: int) -> CheckpointMeta:
    index = read_pt2_index(archive, names, shown)
    found: dict[str, None] = {}
    trusted_script: dict[str, None] = {}  # globals of TorchScript-pickled custom objects
    legacy_root: Any = None
    for member in index.pickled:
        seen = trusted_script if member.rpartition("/")[2].startswith("custom_obj_") else found
        try:
            with archive.open(member) as stream:  # streamed: a nested zip's tensor data is never read
                root = _scan_pickled(stream, shown, member, seen)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError) as exc:
            raise LoadError(f"{shown!r}: cannot read {member} ({exc}): the archive is truncated or "
                            "corrupt; copy or save it again") from None
        if index.legacy and member.endswith("data/weights/model.pt"):
            legacy_root = root
    for name in trusted_script:
        if not name.startswith(TORCHSCRIPT_GLOBALS):  # torch._C._pickle_load_obj: TorchScript's unpickler
            found.setdefault(name, None)
    storages: dict[str, StorageMeta] = {}
    name_set = set(names)

    def tensors(payloads: Mapping[str, Any]) -> dict[str, TensorMeta]:
        out = {}
        for fqn, p in payloads.items():
            if p.member not in name_set:
                raise LoadError(f"{shown!r}: {p.member} (the data of {fqn!r}) is missing: the .pt2 archive "
                                "is truncated or corrupt")
            nbytes = archive.getinfo(p.member).file_size
            if not p.use_pickle:
                # The view the config describes must fit in the raw bytes, as torch.as_strided checks.
                numel = 1
                for d in p.shape:
                    numel *= d
                extent = sum((d - 1) * st for d, st in zip(p.shape, p.strides, strict=True))
                needed = 0 if numel == 0 else p.storage_offset + extent + 1
                if nbytes % p.itemsize or (nbytes and needed * p.itemsize > nbytes):
                    raise LoadError(f"{shown!r}: {p.member} has {nbytes} bytes but {fqn!r} ({p.dtype}"
                                    f"{list(p.shape)}) needs {needed * p.itemsize}: the .pt2 archive is "
                                    "truncated or corrupt")
            storage = storages.get(p.member)
            if storage is None:
                storage = StorageMeta(p.member, p.location, p.dtype, nbytes // p.itemsize, p.itemsize)
                storages[p.member] = storage
            out[fqn] = TensorMeta(p.shape, p.dtype, p.location, storage)
        return out

    if index.legacy:
        root = as_state_dict(legacy_root) if legacy_root is not None else None
        if root is None:
            raise LoadError(f"{shown!r}: data/weights/model.pt holds no state_dict: the .pt2 archive is "
                            "corrupt or was not written by torch.export.save")
    else:
        root = tensors(index.weights)
    constants = tensors(index.constants)
    names_ = tuple(found)
    return CheckpointMeta(shown, CheckpointFormat.TORCH_EXPORT, root, tuple(storages.values()), names_,
                          tuple(unsafe_globals(list(names_))), size, constants=constants, pt2=index)


def _scan_pickled(stream: IO[bytes], shown: str, member: str, found: dict[str, None]) -> Any:
    """Run the inert unpickler over a member some loader would unpickle; return its main object.

    ``stream`` (seekable) holds a nested ``torch.save`` zip (every ``.pkl`` in it
    is read, no storage), a legacy ``torch.save`` stream, or a plain pickle.
    """
    storages: dict[str, StorageMeta] = {}
    head = stream.read(4)
    stream.seek(0)
    if head == b"PK\x03\x04":
        try:
            inner = zipfile.ZipFile(stream)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise LoadError(f"{shown!r}: {member} is a corrupt zip ({exc}): the archive is truncated or "
                            "corrupt") from None
        with inner:
            pkls = sorted((n for n in inner.namelist() if n.endswith(".pkl")), key=len)
            if not pkls:
                raise LoadError(f"{shown!r}: {member} is a zip without data.pkl: the archive is corrupt")
            roots = [_unpickle(io.BytesIO(_read_member(inner, n, shown)), storages, found, shown,
                               f"{member}:{n}") for n in pkls]
        return roots[0]
    first = _unpickle(stream, storages, found, shown, member)
    if first != LEGACY_MAGIC_NUMBER:
        return first
    for what in ("protocol version", "system info"):
        _unpickle(stream, storages, found, shown, f"{member} ({what})")
    return _unpickle(stream, storages, found, shown, member)


# --- safetensors -----------------------------------------------------------------------------------

def _read_safetensors(p: Path, shown: str, size: int) -> CheckpointMeta:
    def lie(what: str) -> LoadError:
        return LoadError(f"{shown!r}: the safetensors header {what}: the file is truncated or "
                         "corrupt; copy or save it again")

    with p.open("rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        if header_len > min(size - 8, _SAFETENSORS_MAX_HEADER):
            raise lie(f"claims {header_len} bytes but the file has {size - 8} after the length")
        raw = fh.read(header_len)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise lie(f"is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise lie("is not a JSON object")
    data_size = size - 8 - header_len
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    # The library reads __metadata__ as a map of strings to strings and refuses anything else.
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise lie(f"has a __metadata__ that is not an object of strings ({type(metadata).__name__})")
    root: dict[str, TensorMeta] = {}
    storages: list[StorageMeta] = []
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str) or \
                not isinstance(entry.get("shape"), list) or not isinstance(entry.get("data_offsets"), list):
            raise lie(f"has a malformed entry for {name!r}")
        dtype_code, shape_list, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        # JSON integers only (no 2.5, no true): the library parses shapes and offsets as unsigned ints.
        if not all(type(d) is int and d >= 0 for d in [*shape_list, *offsets]) or len(offsets) != 2:
            raise lie(f"gives {name!r} a shape or offsets that are not non-negative integers")
        shape = tuple(shape_list)
        begin, end = offsets
        if dtype_code not in _SAFETENSORS_DTYPES:
            raise lie(f"gives {name!r} the unknown dtype {dtype_code!r}")
        dtype, itemsize = _SAFETENSORS_DTYPES[dtype_code]
        tensor = TensorMeta(shape, dtype, "")
        if begin > end:
            raise lie(f"gives {name!r} offsets that end before they begin")
        if end - begin != tensor.numel * itemsize:
            raise lie(f"says {name!r} ({dtype_code}{list(shape)}, {tensor.numel * itemsize} bytes) "
                      f"spans {end - begin} bytes")
        if end > data_size:
            raise lie(f"says {name!r} ends at byte {end} but the data section has {data_size} bytes")
        spans.append((begin, end, name))
        storage = StorageMeta(name, "", dtype, tensor.numel, itemsize)
        storages.append(storage)
        root[name] = TensorMeta(shape, dtype, "", storage)
    # As the library: sorted by offsets, each tensor starts where the previous one ended, from 0,
    # and the last ends where the file does ("invalid offset", "file not fully covered").
    spans.sort()
    covered, previous = 0, None
    for begin, end, name in spans:
        if begin != covered:
            where = f"after {previous!r}" if previous else "at the start of the data section"
            raise lie(f"leaves a gap or an overlap {where}: {name!r} starts at byte {begin}, not {covered}")
        covered, previous = end, name
    if covered != data_size:
        raise lie(f"covers {covered} bytes of a {data_size}-byte data section (trailing bytes)")
    return CheckpointMeta(shown, CheckpointFormat.SAFETENSORS, root, tuple(storages), size=size,
                          metadata={str(k): v for k, v in metadata.items()})


# --- finding the state_dict inside -----------------------------------------------------------------

# Names under which training scripts keep the model's weights, most likely first.
_STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network",
                    "model_state", "weights", "params", "ema", "model_ema", "ema_model")


def as_state_dict(obj: Any) -> dict[str, TensorMeta] | None:
    """``obj`` as a flat ``{key: TensorMeta}`` when it is (or pickles) a state_dict or a module."""
    if isinstance(obj, Mapping):
        tensors = {k: v for k, v in obj.items() if isinstance(v, TensorMeta)}
        # Other values may be scalars or opaque extra state (``_extra_state``), but not
        # containers: a dict holding dicts is a training checkpoint, not a state_dict.
        if tensors and all(isinstance(k, str) for k in obj) and \
                not any(isinstance(v, (Mapping, list, tuple)) for v in obj.values()):
            return tensors
        return None
    if isinstance(obj, Opaque):
        found = dict(_module_tensors(obj, "", set()))
        return found or None
    return None


def _module_tensors(obj: Opaque, prefix: str, visited: set[int]) -> Iterator[tuple[str, TensorMeta]]:
    """The state_dict entries of a pickled module (nn.Module or TorchScript), from its attributes."""
    if id(obj) in visited:  # a pickle may hold cycles (a child keeping a reference to its parent)
        return
    visited.add(id(obj))
    attrs = obj.attributes()
    if "_parameters" in attrs or "_modules" in attrs:  # a pickled nn.Module
        skip = attrs.get("_non_persistent_buffers_set") or set()
        for group in ("_parameters", "_buffers"):
            for name, value in dict(attrs.get(group) or {}).items():
                if isinstance(value, TensorMeta) and not (group == "_buffers" and name in skip):
                    yield prefix + name, value
        for name, child in dict(attrs.get("_modules") or {}).items():
            if isinstance(child, Opaque):
                yield from _module_tensors(child, f"{prefix}{name}.", visited)
        return
    for name, value in attrs.items():  # TorchScript: tensors and submodules are plain attributes
        if isinstance(value, TensorMeta):
            yield prefix + str(name), value
        elif isinstance(value, Opaque):
            yield from _module_tensors(value, f"{prefix}{name}.", visited)


def _is_optimizer_state(obj: Any) -> bool:
    """An optimizer's state_dict (``{"state": {0: {"exp_avg": ...}}, "param_groups": [...]}``)."""
    return isinstance(obj, Mapping) and "state" in obj and "param_groups" in obj


def _children(obj: Any) -> dict[str, Any]:
    if isinstance(obj, Mapping):
        return {str(k): v for k, v in obj.items()}
    if isinstance(obj, Opaque):
        return obj.attributes()
    return {}


def _resolve_key(root: Any, key: str) -> Any:
    """``--key model.ema`` -> ``root["model"]["ema"]``; a key may itself contain dots."""
    parts = key.split(".")
    obj: Any = root
    walked: list[str] = []
    while parts:
        children = _children(obj)
        for n in range(len(parts), 0, -1):  # the longest dotted run that is one key wins
            candidate = ".".join(parts[:n])
            if candidate in children:
                obj, walked, parts = children[candidate], [*walked, candidate], parts[n:]
                break
        else:
            where = f" under {'.'.join(walked)!r}" if walked else ""
            keys = sorted(children)
            shown = ", ".join(keys[:20]) + (", ..." if len(keys) > 20 else "")
            listing = f"keys there: {shown}" if keys else "there are no keys there"
            raise UsageError(f"--key {key!r}: {parts[0]!r} not found{where}; {listing}")
    return obj


def top_level_keys(meta: CheckpointMeta) -> list[str]:
    """The keys at the top of the checkpoint (for messages)."""
    return sorted(_children(meta.root))


def find_state_dict(meta: CheckpointMeta, key: str | None = None) -> tuple[str, dict[str, TensorMeta]] | None:
    """Locate the model weights: ``(path, state_dict)`` or None when there are none.

    With ``key``, take what it names (:class:`UsageError` listing the keys that
    exist when it names nothing, or something that is not a state_dict). Without,
    the root if it is a state_dict, else the best candidate a few levels down:
    a well-known name first (``state_dict``, ``model``, ...), then the largest.
    """
    if key:
        obj = _resolve_key(meta.root, key)
        sd = as_state_dict(obj)
        if sd is None:
            inner = sorted(_children(obj))
            listing = f"; keys there: {', '.join(inner[:20])}" if inner else ""
            raise UsageError(f"--key {key!r} names a {type(obj).__name__}, not a state_dict{listing}")
        return key, sd
    sd = as_state_dict(meta.root)
    if sd is not None:
        return "", sd
    candidates = _search_state_dicts(meta.root)
    if not candidates:
        return None

    def rank(item: tuple[str, dict[str, TensorMeta]]) -> tuple[int, int]:
        last = item[0].rpartition(".")[2]
        named = _STATE_DICT_KEYS.index(last) if last in _STATE_DICT_KEYS else len(_STATE_DICT_KEYS)
        return named, -len(item[1])

    return min(candidates, key=rank)


def _search_state_dicts(root: Any, depth: int = 3) -> list[tuple[str, dict[str, TensorMeta]]]:
    """State_dicts up to ``depth`` levels under ``root``, skipping optimizer state and cycles."""
    found: list[tuple[str, dict[str, TensorMeta]]] = []
    visited: set[int] = set()

    def search(obj: Any, path: str, depth: int) -> None:
        if id(obj) in visited:
            return
        visited.add(id(obj))
        for name, child in _children(obj).items():
            if _is_optimizer_state(child):  # Adam's exp_avg per parameter is not a model's weights
                continue
            child_path = f"{path}.{name}" if path else name
            sd = as_state_dict(child)
            if sd is not None:
                found.append((child_path, sd))
            elif depth > 1:
                search(child, child_path, depth - 1)

    search(root, "", depth)
    return found


def state_dict_candidates(meta: CheckpointMeta) -> list[str]:
    """Every path under which a state_dict was found (for a note on what ``--key`` can pick)."""
    if as_state_dict(meta.root) is not None:
        return []
    return [path for path, _ in _search_state_dicts(meta.root)]


def iter_tensors(obj: Any, path: str = "") -> Iterator[tuple[str, TensorMeta]]:
    """Every :class:`TensorMeta` in a tree, with its path; each container once (pickles can hold cycles)."""
    visited: set[int] = set()
    # An explicit stack, not recursion: a deep or cyclic pickle must not hit the recursion limit.
    stack: list[tuple[Any, str]] = [(obj, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, TensorMeta):
            yield where, node
            continue
        if not isinstance(node, (Mapping, Opaque, list, tuple)) or id(node) in visited:
            continue
        visited.add(id(node))
        children: list[tuple[Any, str]] = []
        if isinstance(node, (Mapping, Opaque)):
            children += [(child, f"{where}.{name}" if where else name)
                         for name, child in _children(node).items()]
        if isinstance(node, Opaque):
            children += [(child, f"{where}[{i}]")
                         for i, child in enumerate([*node.args, *node.elements, *node.items.values()])]
        elif isinstance(node, (list, tuple)):
            children += [(child, f"{where}[{i}]") for i, child in enumerate(node)]
        stack.extend(reversed(children))  # depth first, in the file's order
