"""``--format sarif``: SARIF 2.1.0 as GitHub code scanning accepts it.

One run, the tool's rules with their help text (from :mod:`placecheck.findings.rules`),
one result per problem (a grouped finding). A result points at the problem's
source line when it has one (for a walk finding, the line that assigned the
attribute), else at the line of the first finding it caused, else at the file
its model's TARGET names (GitHub needs a physical location for every result).
``relatedLocations`` list the problem's other instances and the findings it
caused (each at its own line). ``partialFingerprints`` keep a result's identity
when lines shift or the instance count changes, so code scanning does not
reopen it as new, and tell distinct results apart (see :func:`fingerprint_key`).
tests/test_formats_ci.py validates the output against the official schema.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from placecheck.basics.version import VERSION
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.formats.base import RunFormatter
from placecheck.findings.formats.location import repo_path, split_source, target_file
from placecheck.findings.problems import identity, where_label
from placecheck.findings.report import Report
from placecheck.findings.rules import RULES, Rule

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"

_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
# GitHub sorts alerts by a 0-10 "security-severity"; placement bugs are not
# vulnerabilities, so none is set and the level alone orders them.


def _rule_descriptor(r: Rule) -> dict[str, Any]:
    help_text = f"{r.explanation}\n\nWrong:\n{r.wrong}\n\nRight:\n{r.right}"
    help_markdown = (f"{r.explanation}\n\n**Wrong**\n\n```python\n{r.wrong}\n```\n\n"
                     f"**Right**\n\n```python\n{r.right}\n```\n\n"
                     f"Run `placecheck explain {r.code}` for this text in a terminal.")
    return {
        "id": r.code,
        "name": r.kind,
        "shortDescription": {"text": r.title},
        "fullDescription": {"text": r.explanation},
        "help": {"text": help_text, "markdown": help_markdown},
        "defaultConfiguration": {"level": _LEVEL[r.severity]},
        "properties": {"tags": ["pytorch", "device-placement", r.phase]},
    }


def _physical(report: Report, source: str) -> dict[str, Any]:
    path, line = split_source(source) if source else ("", None)
    path = repo_path(path) if path else ""
    if not path:
        path, line = target_file(report.target)
    physical: dict[str, Any] = {"artifactLocation": {"uri": path or "placecheck.toml",
                                                     "uriBaseId": "%SRCROOT%"}}
    if line:
        physical["region"] = {"startLine": line}
    return physical


def _logical(report: Report, where: str) -> list[dict[str, str]]:
    return [{"fullyQualifiedName": ".".join(p for p in (report.target, where) if p), "kind": "member"}]


def problem_source(f: Finding) -> str:
    """The line a problem points at: its own source, else the first line where it did harm."""
    return f.source or next((e.source for e in f.evidence if e.source), "")


def _location(report: Report, f: Finding) -> dict[str, Any]:
    return {"physicalLocation": _physical(report, problem_source(f)),
            "logicalLocations": _logical(report, f.where)}


def _related(report: Report, f: Finding) -> list[dict[str, Any]]:
    """The problem's other instances (at its line) and the findings it caused (at theirs)."""
    related = [{"physicalLocation": _physical(report, problem_source(f)),
                "logicalLocations": _logical(report, w),
                "message": {"text": f"also at {w or '<root>'}"}} for w in f.instances[1:]]
    related += [{"physicalLocation": _physical(report, e.source),
                 "logicalLocations": _logical(report, e.where),
                 "message": {"text": f"{e.code}: {e.summary()}"}} for e in f.evidence]
    return [{"id": i, **location} for i, location in enumerate(related, start=1)]


_LINE_NUMBER = re.compile(r"(\.py):\d+\b|\bline \d+\b")


def _without_lines(text: str) -> str:
    return _LINE_NUMBER.sub(lambda m: m.group(1) or "line", text)


def fingerprint_key(report: Report, f: Finding) -> str:
    """What identifies a result across runs: everything but line numbers and instance counts.

    Line numbers are left out so that an edit above the line does not make an
    alert new; the where is taken with its indices collapsed
    (:func:`placecheck.findings.problems.identity`), and the instances and evidence are
    left out, so that a model growing from 12 blocks to 24 keeps its alert; the
    op, the origin and the message are kept so that distinct findings of one
    module's forward (three PC201 on different ops) stay distinct alerts,
    which GitHub would otherwise merge into one.
    """
    path = repo_path(split_source(f.source)[0]) if f.source else ""
    code, where = identity(f)
    parts = (report.target, code, where, path, dict(f.details).get("op", ""),
             _without_lines(f.origin), _without_lines(f.message))
    return "\0".join(parts)


def _fingerprints(reports: Sequence[Report]) -> list[str]:
    """One fingerprint per finding of the run, in order; exact duplicates get an occurrence index."""
    seen: Counter[str] = Counter()
    out = []
    for report in reports:
        for f in report.findings:
            key = fingerprint_key(report, f)
            seen[key] += 1
            occurrence = f"\0{seen[key] - 1}" if seen[key] > 1 else ""
            out.append(hashlib.sha256((key + occurrence).encode()).hexdigest()[:32])
    return out


def _result(report: Report, f: Finding, rule_index: dict[str, int], fingerprint: str) -> dict[str, Any]:
    text = f"{report.target}: {where_label(f)}: {f.message}"
    if f.origin:
        text += f" (from {f.origin})"
    text += "".join(f"; {e.summary()}" for e in f.evidence)
    if f.hint:
        text += f" Fix: {f.hint}"
    properties: dict[str, Any] = {"target": report.target, "where": f.where, "kind": f.kind}
    if f.device or f.expected:
        properties.update(device=f.device, expected=f.expected)
    if f.instances:
        properties["instances"] = list(f.instances)
    result: dict[str, Any] = {
        "ruleId": f.code,
        "level": _LEVEL[f.severity],
        "message": {"text": text},
        "locations": [_location(report, f)],
        "partialFingerprints": {"placecheck/v3": fingerprint},
        "properties": properties,
    }
    related = _related(report, f)
    if related:
        result["relatedLocations"] = related
    if f.code in rule_index:
        result["ruleIndex"] = rule_index[f.code]
    return result


def sarif_log(reports: Sequence[Report]) -> dict[str, Any]:
    """The SARIF log object of a run."""
    rules = list(RULES.values())
    rule_index: dict[str, int] = {r.code: i for i, r in enumerate(rules)}
    pairs = [(report, f) for report in reports for f in report.findings]
    results = [_result(report, f, rule_index, fingerprint)
               for (report, f), fingerprint in zip(pairs, _fingerprints(reports), strict=True)]
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "placecheck",
                "version": VERSION,
                "semanticVersion": VERSION,
                "rules": [_rule_descriptor(r) for r in rules],
            }},
            "automationDetails": {"id": "placecheck/"},
            "originalUriBaseIds": {"%SRCROOT%": {"description": {"text": "The repository root"}}},
            "results": results,
            "properties": {"models": [{"target": r.target, "device": r.device, "engine": r.engine,
                                       "summary": r.summary_line()} for r in reports]},
        }],
    }


class SarifFormatter(RunFormatter):
    """One SARIF 2.1.0 log for the whole run, indented, keys in a fixed order."""

    def format_reports(self, reports: Sequence[Report]) -> str:
        return json.dumps(sarif_log(reports), indent=2) + "\n"
