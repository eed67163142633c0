"""``--format json``: the machine-readable contract of docs/contract.md
(its shape: ``placecheck/schema/report.schema.json``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from placecheck.findings.finding import Finding
from placecheck.findings.formats.base import Formatter
from placecheck.findings.report import Coverage, DeviceMap, FileWrite, Report

SCHEMA_VERSION = 1


def report_to_dict(report: Report) -> dict[str, Any]:
    """The JSON object for one report (also used by multi-model formats).

    A report with a device map (``--device keep``) also has ``device_map`` (stages, bytes per
    device, budgets) and ``transfers`` (every cross-device copy of one forward); one of ``placecheck
    run`` has ``coverage`` (the script's lines that ran, and those that did not) and ``writes`` (the
    files the script wrote, each redirected to the scratch area, never to the user's files).
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
        **({"coverage": report.coverage.to_dict()} if report.coverage is not None else {}),
        **({"writes": [w.to_dict() for w in report.writes]} if report.writes is not None else {}),
    }


def finding_from_dict(data: dict[str, Any]) -> Finding:
    """The inverse of :meth:`Finding.to_dict`."""
    return Finding.from_dict(data)


def report_from_dict(data: dict[str, Any]) -> Report:
    """The inverse of :func:`report_to_dict` (what a model's child process sends back, what a
    shard's report holds)."""
    return Report(
        target=data["target"], device=data["device"], engine=data["engine"],
        findings=tuple(finding_from_dict(f) for f in data["findings"]),
        notes=tuple(data.get("notes", ())),
        stats=tuple((str(k), int(v)) for k, v in data.get("stats", {}).items()),
        incomplete=str(data.get("summary", {}).get("incomplete", "")),
        unfinished=str(data.get("summary", {}).get("unfinished", "")),
        device_map=DeviceMap.from_dict(data["device_map"], data.get("transfers"))
        if "device_map" in data else None,
        coverage=Coverage.from_dict(data["coverage"]) if "coverage" in data else None,
        writes=tuple(FileWrite.from_dict(w) for w in data["writes"]) if "writes" in data else None,
    )


def run_to_dict(reports: Sequence[Report], run: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON object for a ``--config`` run (any number of models).

    ``models`` holds each model's report object; ``findings`` lists every
    finding of the run, each with the ``target`` of its model, so a consumer of
    the single-model contract (an object with a ``findings`` list) still works.
    ``run``: a shard's ``run`` object (``--shard K/N``, :func:`placecheck.findings.shards.run_info`),
    which ``placecheck merge`` reads; absent otherwise.
    """
    shard = {"run": dict(run)} if run is not None else {}
    return {
        "schema_version": SCHEMA_VERSION,
        "summary": {
            "models": len(reports),
            "models_with_problems": sum(1 for r in reports if r.findings),
            "problems": sum(len(r.grouped().findings) for r in reports),
            "instances": sum(r.instances() for r in reports),
        },
        "models": [report_to_dict(r) for r in reports],
        "findings": [{"target": r.target, **f.to_dict()} for r in reports for f in r.findings],
        **shard,
    }


class JsonFormatter(Formatter):
    """Stable, indented JSON; keys in a fixed order."""

    def __init__(self, run: Mapping[str, Any] | None = None) -> None:
        self.run = run
        """A shard's ``run`` object, written into the run shape (see :func:`run_to_dict`)."""

    def format(self, report: Report) -> str:
        return json.dumps(report_to_dict(report), indent=2) + "\n"

    def format_reports(self, reports: Sequence[Report]) -> str:
        if len(reports) == 1:
            return self.format(reports[0])
        return self.format_run(reports)

    def format_run(self, reports: Sequence[Report]) -> str:
        # a --config run is always the run object, even with one model
        return json.dumps(run_to_dict(reports, self.run), indent=2) + "\n"
