"""Checkpoint pre-flight: will this file load, where, into which model, and safely?

- :mod:`~placecheck.checkpoint.metadata` reads a checkpoint's structure (every
  storage's saved location tag, dtype, shape and size) from the file's index
  alone, never its tensor data and never running its pickled code;
- :mod:`~placecheck.checkpoint.pt2` reads a ``torch.export`` program's configs
  and rebuilds its state_dict from the raw weight files, never through
  ``torch.export.load`` (which unpickles parts of the archive with
  ``weights_only=False``);
- :mod:`~placecheck.checkpoint.safety` lists the globals a pickle asks for
  and which of them ``torch.load(weights_only=True)`` would refuse;
- :mod:`~placecheck.checkpoint.compare` checks a state_dict against a model's;
- :mod:`~placecheck.checkpoint.preflight` turns all that into a
  :class:`~placecheck.findings.report.Report` (PC301-PC306) and loads a checkpoint into
  a model for ``placecheck audit --checkpoint``.
"""

from __future__ import annotations

from placecheck.checkpoint.metadata import CheckpointFormat, CheckpointMeta, read_checkpoint
from placecheck.checkpoint.preflight import CheckpointResult, check_checkpoint, load_into_model

__all__ = [
    "CheckpointFormat",
    "CheckpointMeta",
    "CheckpointResult",
    "check_checkpoint",
    "load_into_model",
    "read_checkpoint",
]
