"""``--format json``: the machine-readable contract of PLACEMENT.md."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from placecheck.formats.base import Formatter
from placecheck.report import Report

SCHEMA_VERSION = 1


def report_to_dict(report: Report) -> dict[str, Any]:
    """The JSON object for one report (also used by multi-model formats).

    A report with a device map (``--device keep``) also has ``device_map`` (stages, bytes per
    device, budgets) and ``transfers`` (every cross-device copy of one forward).
    """
    placed = {} if report.device_map is None else {
        "device_map": report.device_map.to_dict(),
        "transfers": [t.to_dict() for t in report.device_map.transfers],
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "target": report.target,
        "device": report.device,
        "engine": report.engine,
        "summary": report.summary(),
        "notes": list(report.notes),
        "stats": dict(report.stats),
        "findings": [f.to_dict() for f in report.findings],
        **placed,
    }


def run_to_dict(reports: Sequence[Report]) -> dict[str, Any]:
    """The JSON object for a ``--config`` run (any number of models).

    ``models`` holds each model's report object; ``findings`` lists every
    finding of the run, each with the ``target`` of its model, so a consumer of
    the single-model contract (an object with a ``findings`` list) still works.
    """
    return {
        "schema_version": SCHEMA_VERSION,
        "summary": {
            "models": len(reports),
            "models_with_problems": sum(1 for r in reports if r.findings),
            "problems": sum(len(r.findings) for r in reports),
            "instances": sum(r.instances() for r in reports),
        },
        "models": [report_to_dict(r) for r in reports],
        "findings": [{"target": r.target, **f.to_dict()} for r in reports for f in r.findings],
    }


class JsonFormatter(Formatter):
    """Stable, indented JSON; keys in a fixed order."""

    def format(self, report: Report) -> str:
        return json.dumps(report_to_dict(report), indent=2) + "\n"

    def format_reports(self, reports: Sequence[Report]) -> str:
        if len(reports) == 1:
            return self.format(reports[0])
        return self.format_run(reports)

    def format_run(self, reports: Sequence[Report]) -> str:
        # a --config run is always the run object, even with one model
        return json.dumps(run_to_dict(reports), indent=2) + "\n"
