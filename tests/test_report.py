"""``Report``: summary line, counts, canonical order, ``ok`` and the exit code."""

from __future__ import annotations

import random

import pytest

from placecheck.basics.devices import human_bytes
from placecheck.findings.finding import Finding, Severity
from placecheck.findings.report import EXIT_FINDINGS, EXIT_OK, Report, exit_code

MIB = 1024 * 1024


def make(code: str = "PC101", severity: Severity = Severity.ERROR, where: str = "mask", module: str = "",
         nbytes: int = 0, device: str = "cpu", expected: str = "cuda:0", source: str = "") -> Finding:
    return Finding(code=code, kind="k", severity=severity, where=where, message=f"{code} at {where}",
                   hint="h", module=module, nbytes=nbytes, device=device, expected=expected,
                   source=source)


def test_summary_line_exact() -> None:
    findings = [
        make("PC101", where="enc.mask", module="enc", nbytes=MIB),
        make("PC102", where="heads[0]", module="", nbytes=int(0.2 * MIB)),
        make("PC202", Severity.WARNING, where="enc", module="enc", device="", expected="cuda:0"),
    ]
    report = Report.build("Net", "cuda:0", "simulated cuda", findings)
    assert report.summary_line() == "3 problems in 2 modules: 2 errors, 1 warning; 1.2 MiB not on cuda:0"


def test_summary_line_singular_info_and_no_bytes() -> None:
    report = Report.build("Net", "cuda:0", "cuda", [make(severity=Severity.INFO, device="cuda:0")])
    assert report.summary_line() == "1 problem in 1 module: 1 info"
    two = Report.build("Net", "cuda:1", "cuda", [make(where="a", nbytes=10, expected="cuda:1"),
                                                 make(severity=Severity.INFO, where="b", module="b")])
    assert two.summary_line() == "2 problems in 2 modules: 1 error, 1 info; 10 B not on cuda:1"


def test_summary_line_clean() -> None:
    report = Report.build("Net", "cuda:0", "simulated cuda", [])
    assert report.summary_line() == "no placement problems found on cuda:0, simulated (fake tensors, no data)"
    assert report.summary()["problems"] == 0 and report.ok


def test_summary_dict() -> None:
    report = Report.build("Net", "cuda:0", "cuda", [make(nbytes=5), make(severity=Severity.WARNING,
                                                                         where="x", nbytes=7)])
    assert report.summary() == {"problems": 2, "instances": 2, "modules": 1, "errors": 1, "warnings": 1,
                                "info": 0, "bytes_off_device": 12, "incomplete": "", "unfinished": "",
                                "line": report.summary_line()}


def test_an_incomplete_audit_says_so_in_its_summary() -> None:
    clean = Report.build("Net", "cuda:0", "simulated cuda", [], incomplete="fake tensors stopped (.item())")
    assert clean.summary_line() == ("no placement problems found on cuda:0, simulated (fake tensors, no "
                                    "data); the forward pass stopped before its end, the rest is unchecked "
                                    "(see the notes)")
    found = Report.build("Net", "cuda:0", "cuda", [make(nbytes=5)], incomplete="stopped")
    assert found.summary_line().startswith("1 problem in 1 module: 1 error; 5 B not on cuda:0; the forward")
    assert found.summary()["incomplete"] == "stopped"


def test_bytes_count_only_tensors_off_the_target() -> None:
    report = Report.build("Net", "cuda:0", "cuda", [
        make(where="a", nbytes=100), make(where="b", nbytes=1000, device="cuda:0"),
        make(where="c", nbytes=10000, device=""),
    ])
    assert report.bytes_off_device() == 100


def test_order_is_canonical_whatever_the_input_order() -> None:
    findings = [make("PC101", where=f"m{i}") for i in range(5)]
    findings += [make("PC202", Severity.WARNING, where="", source=f"f.py:{i}") for i in range(3)]
    findings += [make("PC103", where="scales[0]"), make("PC204", Severity.INFO, where="enc")]
    expected = Report.build("Net", "cuda:0", "cuda", findings).findings
    for seed in range(5):
        shuffled = findings[:]
        random.Random(seed).shuffle(shuffled)
        assert Report.build("Net", "cuda:0", "cuda", shuffled).findings == expected
    assert [f.severity for f in expected][:6] == [Severity.ERROR] * 6  # worst first
    assert [f.code for f in expected][:6] == ["PC101"] * 5 + ["PC103"]
    assert expected[-1].severity is Severity.INFO


def test_ok() -> None:
    assert Report.build("N", "cuda:0", "cuda", [make(severity=Severity.INFO)]).ok
    assert not Report.build("N", "cuda:0", "cuda", [make(severity=Severity.WARNING)]).ok
    assert not Report.build("N", "cuda:0", "cuda", [make()]).ok


@pytest.mark.parametrize("severity, fail_on, expected", [
    (Severity.ERROR, "error", EXIT_FINDINGS), (Severity.WARNING, "error", EXIT_OK),
    (Severity.WARNING, "warning", EXIT_FINDINGS), (Severity.INFO, "warning", EXIT_OK),
    (Severity.INFO, "info", EXIT_FINDINGS), (Severity.ERROR, "never", EXIT_OK),
])
def test_exit_code_threshold(severity: Severity, fail_on: str, expected: int) -> None:
    report = Report.build("N", "cuda:0", "cuda", [make(severity=severity)])
    assert exit_code([report], fail_on) == expected


def test_exit_code_exit_zero_and_clean() -> None:
    buggy = Report.build("N", "cuda:0", "cuda", [make()])
    clean = Report.build("N", "cuda:0", "cuda", [])
    assert exit_code([buggy], "warning", exit_zero=True) == EXIT_OK
    assert exit_code([clean], "info") == EXIT_OK
    assert exit_code([clean, buggy]) == EXIT_FINDINGS


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
                                     (int(1.2 * MIB), "1.2 MiB"), (3 * 1024**3, "3.0 GiB"),
                                     (2 * 1024**5, "2048.0 TiB")])
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


def test_finding_is_frozen_and_serialises() -> None:
    finding = make(nbytes=3)
    with pytest.raises(AttributeError):
        finding.code = "PC102"  # type: ignore[misc]
    data = finding.to_dict()
    assert list(data)[:6] == ["code", "kind", "severity", "where", "message", "hint"]
    assert data["severity"] == "error" and data["shape"] is None and data["details"] == {}


def test_where_and_source_sort_naturally() -> None:
    wheres = ["blocks.10.mask", "blocks.2.mask", "blocks.1.mask", "blocks.2.cache['k']", "head", "blocks.2"]
    findings = [Finding(code="PC101", kind="stray-tensor", severity=Severity.ERROR, where=w, message="m",
                        hint="h") for w in wheres]
    # ungrouped: with grouping the three blocks.N.mask are one problem (tests/test_problems.py)
    report = Report.build("t", "cuda:0", "simulated cuda", reversed(findings), group=False)
    assert [f.where for f in report.findings] == [
        "blocks.1.mask", "blocks.2", "blocks.2.cache['k']", "blocks.2.mask", "blocks.10.mask", "head"]
    lines = [Finding(code="PC201", kind="k", severity=Severity.ERROR, where="", source=f"net.py:{n}",
                     message="m", hint="h") for n in (100, 9, 10)]
    assert [f.source for f in Report.build("t", "cuda:0", "e", lines).findings] == [
        "net.py:9", "net.py:10", "net.py:100"]
