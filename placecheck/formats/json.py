"""``--format json``: the machine-readable contract of PLACEMENT.md."""

from __future__ import annotations

import json
from typing import Any

from placecheck.formats.base import Formatter
from placecheck.report import Report

SCHEMA_VERSION = 1


def report_to_dict(report: Report) -> dict[str, Any]:
    """The JSON object for one report (also used by multi-model formats)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "target": report.target,
        "device": report.device,
        "engine": report.engine,
        "summary": report.summary(),
        "notes": list(report.notes),
        "stats": dict(report.stats),
        "findings": [f.to_dict() for f in report.findings],
    }


class JsonFormatter(Formatter):
    """Stable, indented JSON; keys in a fixed order."""

    def format(self, report: Report) -> str:
        return json.dumps(report_to_dict(report), indent=2) + "\n"
