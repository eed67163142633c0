"""The JSON report's schema as shipped in the package, for the tests that render JSON.

``validate_report(data)`` raises ``jsonschema.ValidationError`` unless ``data`` (a parsed
``--format json`` output: one model, or a ``--config`` run) is what
``placecheck/schema/report.schema.json`` describes.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema

SCHEMA: dict[str, Any] = json.loads(
    (resources.files("placecheck") / "schema" / "report.schema.json").read_text(encoding="utf-8"))
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def validate_report(data: Any) -> Any:
    """``data``, once the schema accepts it (so a test can go on reading it)."""
    VALIDATOR.validate(data)
    return data


def validate_json(text: str) -> Any:
    """The parsed ``--format json`` output ``text``, once the schema accepts it."""
    return validate_report(json.loads(text))
