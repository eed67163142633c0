"""``torch.export`` programs (``.pt2``): their index, their pickled members, and a load that runs no code.

A ``.pt2`` archive keeps its tensors as raw bytes (``data/weights/weight_0``)
described by JSON configs (``data/weights/model_weights_config.json``,
``data/constants/model_constants_config.json``). But ``torch.export.load``
also unpickles members with ``weights_only=False`` or plain ``pickle.loads``:
the sample inputs (``data/sample_inputs/model.pt``, tried with
``weights_only=True`` then without), weights and constants flagged
``use_pickle`` (tensor subclasses), legacy ``data/weights/model.pt`` files and
opaque constants (``opaque_obj_*``). So :func:`read_pt2_index` lists every
member torch would unpickle for the safety scan, and
:func:`load_pt2_state_dict` rebuilds ``ExportedProgram.state_dict`` from the
raw weight files and the config, exactly as torch does
(``torch.export.pt2_archive._package._load_state_dict``), with
``weights_only=True`` for pickled weights unless the user trusts the file.
``torch.export.load`` itself is never called.

``ExportedProgram.state_dict`` holds the parameters and persistent buffers
(the weights config); constants (non-persistent buffers, lifted tensor
constants) are kept apart: they are on a device, but not in the state_dict.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from typing import Any

from placecheck.basics.errors import LoadError

MODEL_NAME = "model"
"""The program ``torch.export.load`` returns from a package (its default name)."""

# torch.export's ScalarType names -> torch dtype names and sizes.
_EXPORT_DTYPES = {
    "BYTE": ("uint8", 1), "CHAR": ("int8", 1), "SHORT": ("int16", 2), "INT": ("int32", 4),
    "LONG": ("int64", 8), "HALF": ("float16", 2), "FLOAT": ("float32", 4), "DOUBLE": ("float64", 8),
    "COMPLEXHALF": ("complex32", 4), "COMPLEXFLOAT": ("complex64", 8),
    "COMPLEXDOUBLE": ("complex128", 16), "BOOL": ("bool", 1), "BFLOAT16": ("bfloat16", 2),
    "UINT16": ("uint16", 2), "UINT32": ("uint32", 4), "UINT64": ("uint64", 8),
    "FLOAT8E4M3FN": ("float8_e4m3fn", 1), "FLOAT8E5M2": ("float8_e5m2", 1),
}


@dataclass(frozen=True)
class Payload:
    """One tensor of a .pt2 config: where its bytes are and how to view them."""

    fqn: str
    member: str
    """The archive member holding its bytes (shared by aliased tensors)."""
    use_pickle: bool
    """Its member is a ``torch.save`` of the tensor (a tensor subclass), not raw bytes."""
    is_param: bool
    requires_grad: bool
    dtype: str
    itemsize: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    storage_offset: int
    location: str


@dataclass(frozen=True)
class Pt2Index:
    """What a .pt2 archive holds for its ``model`` program."""

    weights: dict[str, Payload]
    """``ExportedProgram.state_dict``: parameters and persistent buffers."""
    constants: dict[str, Payload]
    """Tensor constants: non-persistent buffers and lifted constants (not in the state_dict)."""
    pickled: tuple[str, ...]
    """Every member ``torch.export.load`` would unpickle (to be scanned for globals)."""
    legacy: bool = False
    """The weights are one pickled ``data/weights/model.pt`` (torch < 2.6), not raw files."""


def _bad(shown: str, member: str, what: str) -> LoadError:
    return LoadError(f"{shown!r}: {member} {what}: the .pt2 archive is corrupt or was not written by "
                     "torch.export.save")


def _as_int(value: Any, shown: str, member: str, fqn: str) -> int:
    number = value.get("as_int") if isinstance(value, dict) else None
    if type(number) is not int:
        raise _bad(shown, member, f"gives {fqn!r} a size that is not an integer ({value!r}); placecheck "
                   "reads programs exported with static shapes")
    return number


def _dtype(code: Any, shown: str, member: str, fqn: str) -> tuple[str, int]:
    from placecheck.engines.compat import export_scalar_type

    try:
        if type(code) is not int:
            raise ValueError(code)
        name = export_scalar_type(code)
    except ValueError:
        raise _bad(shown, member, f"gives {fqn!r} the unknown dtype {code!r}") from None
    if name not in _EXPORT_DTYPES:
        raise _bad(shown, member, f"gives {fqn!r} the dtype {name}, which placecheck does not read")
    return _EXPORT_DTYPES[name]


def _payload(fqn: str, entry: Any, base_dir: str, shown: str, member: str) -> Payload | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("path_name"), str):
        raise _bad(shown, member, f"has a malformed entry for {fqn!r}")
    meta = entry.get("tensor_meta")
    if meta is None:
        return None  # a script object or opaque constant: no tensor
    if not isinstance(meta, dict):
        raise _bad(shown, member, f"has a malformed tensor_meta for {fqn!r}")
    dtype, itemsize = _dtype(meta.get("dtype"), shown, member, fqn)
    shape = tuple(_as_int(s, shown, member, fqn) for s in meta.get("sizes") or ())
    strides = tuple(_as_int(s, shown, member, fqn) for s in meta.get("strides") or ())
    offset = _as_int(meta.get("storage_offset") or {"as_int": 0}, shown, member, fqn)
    if any(d < 0 for d in shape) or any(s < 0 for s in strides) or offset < 0 or len(strides) != len(shape):
        raise _bad(shown, member, f"gives {fqn!r} negative or inconsistent sizes, strides or offset")
    dev = meta.get("device") or {}
    if not isinstance(dev, dict) or not isinstance(dev.get("type", "cpu"), str):
        raise _bad(shown, member, f"gives {fqn!r} a malformed device")
    location = str(dev.get("type", "cpu"))
    if dev.get("index") is not None:
        location += f":{dev['index']}"
    return Payload(fqn, base_dir + entry["path_name"], bool(entry.get("use_pickle")),
                   bool(entry.get("is_param")), bool(meta.get("requires_grad")), dtype, itemsize, shape,
                   strides, offset, location)


def _config(archive: zipfile.ZipFile, member: str, shown: str) -> dict[str, Any]:
    try:
        config = json.loads(archive.read(member)).get("config", {})
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, AttributeError) as exc:
        raise _bad(shown, member, f"is not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise _bad(shown, member, "has no config object")
    return config


def read_pt2_index(archive: zipfile.ZipFile, names: list[str], shown: str) -> Pt2Index:
    """Parse the ``model`` program's configs and list the members torch would unpickle."""
    prefix = names[0].partition("/")[0] + "/" if names and "/" in names[0] else ""
    weights_dir, constants_dir = f"{prefix}data/weights/", f"{prefix}data/constants/"
    weights_config = f"{weights_dir}{MODEL_NAME}_weights_config.json"
    constants_config = f"{constants_dir}{MODEL_NAME}_constants_config.json"
    legacy_weights = f"{weights_dir}{MODEL_NAME}.pt"
    name_set = set(names)
    weights: dict[str, Payload] = {}
    constants: dict[str, Payload] = {}
    pickled: list[str] = []
    if weights_config in name_set:
        for fqn, entry in _config(archive, weights_config, shown).items():
            payload = _payload(str(fqn), entry, weights_dir, shown, weights_config)
            if payload is None:
                raise _bad(shown, weights_config, f"has no tensor_meta for the weight {fqn!r}")
            weights[str(fqn)] = payload
    elif legacy_weights not in name_set:
        raise LoadError(f"{shown!r} is a .pt2 archive without a weights config for its {MODEL_NAME!r} "
                        "program: placecheck reads programs saved by torch.export.save")
    if constants_config in name_set:
        for fqn, entry in _config(archive, constants_config, shown).items():
            payload = _payload(str(fqn), entry, constants_dir, shown, constants_config)
            if payload is not None:
                constants[str(fqn)] = payload
            elif isinstance(entry, dict):
                pickled.append(constants_dir + str(entry.get("path_name")))  # custom_obj_, opaque_obj_
    raw = {p.member for p in [*weights.values(), *constants.values()] if not p.use_pickle}
    pickled += [p.member for p in [*weights.values(), *constants.values()] if p.use_pickle]
    # Anything else that is not raw tensor bytes or JSON may be unpickled by some loader
    # (sample inputs, legacy model.pt files, members of newer formats): scan what looks like a pickle.
    for member in names:
        if member in raw or member in pickled or member.endswith((".json", "/")):
            continue
        if member.startswith((weights_dir, constants_dir, f"{prefix}data/sample_inputs/")) or \
                _looks_pickled(archive, member):
            pickled.append(member)
    return Pt2Index(weights, constants, tuple(dict.fromkeys(pickled)),
                    legacy=weights_config not in name_set)


def _looks_pickled(archive: zipfile.ZipFile, member: str) -> bool:
    try:
        with archive.open(member) as fh:
            head = fh.read(4)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return False  # unreadable: the member that torch reads will say so
    return head.startswith((b"PK\x03\x04", b"\x80"))


def load_pt2_state_dict(path: str, index: Pt2Index, map_location: str, trust: bool) -> dict[str, Any]:
    """``ExportedProgram.state_dict`` rebuilt from the raw weight files, on ``map_location``.

    The raw bytes are read as torch's own loader reads them and viewed with
    the config's sizes, strides and offset (aliased weights share a member and
    stay aliased). Pickled weights (tensor subclasses) and legacy ``model.pt``
    files go through ``torch.load(weights_only=not trust)``.
    """
    import torch

    out: dict[str, Any] = {}
    with zipfile.ZipFile(path) as archive:
        if index.legacy:
            legacy = next(m for m in index.pickled if m.endswith(f"data/weights/{MODEL_NAME}.pt"))
            loaded = torch.load(io.BytesIO(archive.read(legacy)), map_location=map_location,
                                weights_only=not trust)
            return dict(loaded)
        bases: dict[str, Any] = {}
        for fqn, p in index.weights.items():
            if p.use_pickle:
                tensor = torch.load(io.BytesIO(archive.read(p.member)), map_location=map_location,
                                    weights_only=not trust)
            elif map_location == "meta":
                tensor = torch.empty_strided(p.shape, p.strides, dtype=getattr(torch, p.dtype), device="meta")
            else:
                dtype = getattr(torch, p.dtype)
                base = bases.get(p.member)
                if base is None:
                    data = bytearray(archive.read(p.member))
                    base = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
                    bases[p.member] = base = base.to(map_location)
                if base.numel() == 0:  # torch writes empty tensors as empty members and loads zeros
                    tensor = torch.zeros(p.shape, dtype=dtype, device=map_location)
                else:
                    tensor = torch.as_strided(base, p.shape, p.strides, p.storage_offset)
            if p.is_param:
                tensor = torch.nn.Parameter(tensor, requires_grad=p.requires_grad)
            out[fqn] = tensor
    return out
