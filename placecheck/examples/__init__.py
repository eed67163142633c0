"""Example models for ``make demo`` and the docs: one buggy, one clean; ``pipeline.py`` splits a model
across two GPUs (``--device keep``)."""
