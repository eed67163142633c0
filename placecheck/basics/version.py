"""placecheck's version, at the bottom of the layers: the report formats, baselines and shards write it
(``placecheck.__version__`` is this value; ``pyproject.toml`` holds the same)."""

from __future__ import annotations

VERSION = "0.1.0"
