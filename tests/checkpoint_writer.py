"""Writing checkpoints with any saved location tag, on a machine without a GPU.

A storage's device in a ``torch.save`` file is only metadata: the persistent
id ``('storage', storage_type, key, location, numel)`` in ``data.pkl``. This
writer produces torch's zip layout (``<name>/data.pkl``, ``<name>/data/<key>``,
``version``, ``byteorder``) with a pickler whose persistent ids carry the tag
each tensor should claim, so tests can make ``cuda:3`` checkpoints on a CPU.
"""

from __future__ import annotations

import io
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch


def _storage_bytes(storage: torch.UntypedStorage) -> bytes:
    flat = torch.empty(0, dtype=torch.uint8).set_(storage)
    return flat.numpy().tobytes()


def save_with_locations(obj: Any, path: Path, locations: Mapping[str, str] | None = None,
                        default: str = "cpu") -> Path:
    """``torch.save(obj, path)``, but each tensor's storage tagged with a location of our choosing.

    ``locations`` maps a state_dict key (a key anywhere in ``obj``'s nested dicts)
    to its tag; every other storage gets ``default``.
    """
    tag_by_ptr: dict[int, str] = {}

    def collect(value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                if isinstance(v, torch.Tensor) and locations and k in locations:
                    tag_by_ptr[v.untyped_storage().data_ptr()] = locations[k]
                collect(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                collect(v)

    collect(obj)
    records: dict[str, bytes] = {}
    keys: dict[int, str] = {}

    class Pickler(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:
            if not isinstance(o, torch.storage.TypedStorage):
                return None
            untyped = o._untyped_storage
            ptr = untyped.data_ptr()
            if ptr not in keys:
                keys[ptr] = str(len(keys))
                records[keys[ptr]] = _storage_bytes(untyped)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                storage_type = getattr(torch, o._pickle_storage_type())
            return ("storage", storage_type, keys[ptr], tag_by_ptr.get(ptr, default), o._size())

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(obj)
    name = path.stem or "archive"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{name}/data.pkl", buf.getvalue())
        zf.writestr(f"{name}/byteorder", "little")
        for key, data in records.items():
            zf.writestr(f"{name}/data/{key}", data)
        zf.writestr(f"{name}/version", "3\n")
    return path
