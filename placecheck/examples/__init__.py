"""Example models for ``make demo`` and the docs: one buggy, one clean."""
