"""``--format junit``: JUnit XML, for CI systems that show test results.

One ``<testsuite>`` for the run, one ``<testcase>`` per model, one
``<failure>`` per problem (type = the code, message = the problem's message,
text = where, instances, source, devices, what it caused and the fix). A model with no findings is a
passing test case. CI tools that accept only one failure per test case show
the first; all of them are in the file.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from placecheck.findings.finding import Finding
from placecheck.findings.formats.base import RunFormatter
from placecheck.findings.problems import where_label
from placecheck.findings.report import Report


def _failure_text(f: Finding) -> str:
    lines = [f"{f.code} {f.kind} ({f.severity.value}) at {where_label(f)}"]
    if len(f.instances) > 1:
        lines.append(f"instances: {', '.join(f.instances)}")
    if f.source:
        lines.append(f"source: {f.source}")
    if f.device or f.expected:
        lines.append(f"device: {f.device or '?'} -> expected {f.expected}")
    if f.origin:
        lines.append(f"from: {f.origin}")
    lines.append(f.message)
    lines += [f"caused {e.code}: {e.summary()}" for e in f.evidence]
    if f.hint:
        lines.append(f"fix: {f.hint}")
    lines += [f"{k}: {v}" for k, v in f.details]
    return "\n".join(lines)


class JunitFormatter(RunFormatter):
    """JUnit XML with a testcase per model and a failure per finding."""

    def format_reports(self, reports: Sequence[Report]) -> str:
        failures = sum(len(r.findings) for r in reports)
        failed_cases = sum(1 for r in reports if r.findings)
        suites = ET.Element("testsuites", name="placecheck", tests=str(len(reports)),
                            failures=str(failed_cases), errors="0")
        suite = ET.SubElement(suites, "testsuite", name="placecheck", tests=str(len(reports)),
                              failures=str(failed_cases), errors="0", skipped="0")
        ET.SubElement(ET.SubElement(suite, "properties"), "property", name="findings",
                      value=str(failures))
        for report in reports:
            case = ET.SubElement(suite, "testcase", classname=f"placecheck.{report.device}",
                                 name=report.target)
            for f in report.findings:
                failure = ET.SubElement(case, "failure", message=f"{f.code} {where_label(f)}: "
                                        f"{f.message}", type=f.code)
                failure.text = _failure_text(f)
            out = [report.summary_line(), *report.notes]
            ET.SubElement(case, "system-out").text = "\n".join(out)
        ET.indent(suites)
        return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
