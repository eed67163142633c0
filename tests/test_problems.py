"""``placecheck.findings.problems``: findings sharing a root cause become one problem (hand-made findings)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from placecheck.findings.finding import Evidence, Finding, Severity
from placecheck.findings.formats import OutputFormat, formatter_for
from placecheck.findings.problems import collapse_indices, group, identity, where_label
from placecheck.findings.report import Report, exit_code


def _stray(index: int, attribute: str = "mask", source: str = "",
           severity: Severity = Severity.ERROR) -> Finding:
    return Finding(code="PC101", kind="stray-tensor", severity=severity, where=f"blocks.{index}.{attribute}",
                   message=f"tensor attribute {attribute!r} float32[16, 16] stays on cpu",
                   hint="register_buffer",
                   source=source, device="cpu", expected="cuda:0", nbytes=1024, count=1,
                   module=f"blocks.{index}")


def _mismatch(origin: str, source: str = "model.py:33", where: str = "blocks.0",
              op: str = "Tensor.mul") -> Finding:
    return Finding(code="PC201", kind="device-mismatch", severity=Severity.ERROR, where=where,
                   message=f"{op} mixed cpu and cuda:0: its float32[2, 2] argument is on cpu",
                   hint="h", source=source, device="cpu", expected="cuda:0", origin=origin,
                   module=where, details=(("op", op), ("devices", "cpu, cuda:0")))


def test_24_module_instances_of_one_attribute_are_one_problem() -> None:
    (problem,) = group(_stray(i) for i in reversed(range(24)))
    assert problem.instances == tuple(f"blocks.{i}.mask" for i in range(24))
    assert (problem.where, problem.code) == ("blocks.0.mask", "PC101")  # the first instance's fields
    assert (problem.nbytes, problem.count) == (24 * 1024, 24)  # totals over the instances
    assert where_label(problem) == "blocks.{0..23}.mask (24)"
    report = Report.build("Net", "cuda:0", "simulated cuda", [_stray(i) for i in range(24)], group=True)
    assert report.summary()["problems"] == 1 and report.summary()["instances"] == 24
    assert report.summary_line().startswith("1 problem (24 instances) in 24 modules")
    assert report.bytes_off_device() == 24 * 1024


def test_other_attributes_and_rules_stay_apart() -> None:
    findings = [_stray(0), _stray(1), _stray(0, "bias_table"), replace(_stray(0), code="PC105", kind="k")]
    assert sorted(where_label(p) for p in group(findings)) == [
        "blocks.0.bias_table", "blocks.0.mask", "blocks.{0,1}.mask (2)"]


def test_the_assignment_line_is_the_key_when_walk_findings_have_one() -> None:
    # two attribute names from one line are one problem; one name from two lines is two
    one_line = [_stray(0, "mask", "model.py:14"), _stray(1, "causal", "model.py:14")]
    assert len(group(one_line)) == 1
    two_lines = [_stray(0, "mask", "model.py:14"), _stray(1, "mask", "model.py:20")]
    assert len(group(two_lines)) == 2


def test_a_stray_tensor_and_the_mismatch_it_causes_are_one_problem() -> None:
    stray = [_stray(i, severity=Severity.WARNING) for i in range(2)]
    problems = group([*stray, _mismatch("blocks.0.mask")])
    (problem,) = problems
    assert problem.code == "PC101" and problem.instances == ("blocks.0.mask", "blocks.1.mask")
    assert problem.severity is Severity.ERROR  # the crash it causes makes it an error
    (evidence,) = problem.evidence
    assert (evidence.code, evidence.op, evidence.where, evidence.source) == (
        "PC201", "Tensor.mul", "blocks.0", "model.py:33")
    assert evidence.summary() == ("crashes on a GPU at model.py:33 in blocks.0: "
                                  "Tensor.mul mixed cpu and cuda:0")


def test_a_mismatch_through_a_tensor_inside_an_unregistered_module_links_to_it() -> None:
    module = Finding(code="PC102", kind="unregistered-module", severity=Severity.ERROR, where="heads[0]",
                     message="m", hint="h")
    (problem,) = group([module, replace(module, where="heads[1]"), _mismatch("heads[0].weight", where="")])
    assert [e.code for e in problem.evidence] == ["PC201"] and where_label(problem) == "heads[{0,1}] (2)"


def test_a_created_tensor_and_the_mismatch_it_feeds_are_one_problem() -> None:
    created = Finding(code="PC202", kind="created-off-device", severity=Severity.WARNING, where="",
                      message="torch.randn in forward creates float32[2, 32] on cpu", hint="h",
                      source="model.py:54", origin="model.py:54", details=(("op", "torch.randn"),))
    (problem,) = group([_mismatch("model.py:54", "model.py:55", "", "Tensor.add"), created])
    assert problem.code == "PC202" and problem.severity is Severity.ERROR
    assert [(e.code, e.source) for e in problem.evidence] == [("PC201", "model.py:55")]


def test_a_layer_built_in_forward_and_the_mismatch_through_its_weight_are_one_problem() -> None:
    lazy = Finding(code="PC203", kind="lazy-module", severity=Severity.ERROR, where="gate", module="gate",
                   message="module 'gate' (Linear) is created during forward", hint="h", source="model.py:60")
    (problem,) = group([lazy, _mismatch("gate.weight", "model.py:61", "", "torch.linear")])
    assert problem.code == "PC203" and [e.source for e in problem.evidence] == ["model.py:61"]


def test_an_output_moved_to_the_host_and_its_sync_are_one_problem() -> None:
    output = Finding(code="PC206", kind="output-off-device", severity=Severity.ERROR, where="",
                     message="output is on cpu", hint="h", source="model.py:6", origin="model.py:6")
    sync = Finding(code="PC204", kind="host-sync", severity=Severity.WARNING, where="",
                   message=".cpu() on a cuda:0 tensor in forward waits", hint="h", source="model.py:6",
                   details=(("op", ".cpu()"),))
    (problem,) = group([sync, output])
    assert problem.code == "PC206" and [e.code for e in problem.evidence] == ["PC204"]


def test_a_mismatch_from_nowhere_known_stays_its_own_problem() -> None:
    problems = group([_stray(0), _mismatch("blocks.0.other"), _mismatch("", "model.py:40")])
    assert sorted(p.code for p in problems) == ["PC101", "PC201", "PC201"]
    assert all(p.evidence == () for p in problems)


def test_checkpoint_shape_mismatches_are_one_problem() -> None:
    shapes = [Finding(code="PC304", kind="shape-mismatch", severity=Severity.ERROR, where=key,
                      message=f"checkpoint shape [8] for {key!r}, the model has [4]", hint="h")
              for key in [f"layers.{i}.{p}" for i in range(5) for p in ("weight", "bias")] + ["head.weight"]]
    (problem,) = group(shapes)
    assert len(problem.instances) == 11 and where_label(problem) == "head.weight ... (11)"


def test_no_group_gives_one_finding_per_instance() -> None:
    findings = [_stray(0), _stray(1), _mismatch("blocks.0.mask")]
    report = Report.build("Net", "cuda:0", "simulated cuda", findings, group=False)
    assert [(f.code, f.where) for f in report.findings] == [
        ("PC101", "blocks.0.mask"), ("PC101", "blocks.1.mask"), ("PC201", "blocks.0")]
    assert all(f.instances == () and f.evidence == () for f in report.findings)
    # one count everywhere: the rows are instances, the problems are counted grouped
    assert report.summary()["problems"] == 1 and report.summary()["instances"] == 3
    assert report.summary_line().startswith("1 problem (3 instances) in ")
    grouped = Report.build("Net", "cuda:0", "simulated cuda", findings, group=True)
    assert grouped.summary()["problems"] == 1 and grouped.summary()["instances"] == 3


@pytest.mark.parametrize("fail_on", ["error", "warning", "info"])
def test_exit_codes_mean_the_same_grouped_or_not(fail_on: str) -> None:
    findings = [_stray(0, severity=Severity.INFO), _mismatch("blocks.0.mask")]
    grouped = Report.build("N", "cuda:0", "x", findings, group=True)
    ungrouped = Report.build("N", "cuda:0", "x", findings, group=False)
    assert exit_code([grouped], fail_on) == exit_code([ungrouped], fail_on) == 1


def test_problems_survive_the_json_a_child_process_sends_back() -> None:
    report = Report.build("N", "cuda:0", "x", [_stray(0), _stray(1), _mismatch("blocks.0.mask")], group=True)
    data = json.loads(formatter_for(OutputFormat.JSON).format(report))
    (finding,) = data["findings"]
    assert finding["instances"] == ["blocks.0.mask", "blocks.1.mask"]
    assert finding["evidence"][0]["code"] == "PC201" and finding["evidence"][0]["op"] == "Tensor.mul"
    assert Finding.from_dict(finding) == report.findings[0]
    assert isinstance(Finding.from_dict(finding).evidence[0], Evidence)


def test_identity_ignores_indices_and_instance_count() -> None:
    assert collapse_indices("blocks.12.attn.cache['k']") == "blocks.*.attn.cache['k']"
    assert collapse_indices("heads[3].weight") == "heads[*].weight"
    assert collapse_indices("layer1.conv2") == "layer1.conv2"  # digits inside a name are kept
    small = group(_stray(i) for i in range(2))[0]
    large = group(_stray(i) for i in range(24))[0]
    assert identity(small) == identity(large) == ("PC101", "blocks.*.mask")


@pytest.mark.parametrize("wheres, label", [
    (["blocks.0.cache['k']", "blocks.0.cache['v']", "blocks.1.cache['k']", "blocks.1.cache['v']"],
     "blocks.{0,1}.cache['{k,v}'] (4)"),
    (["rope.cos", "rope.sin"], "rope.{cos,sin} (2)"),
    (["a.0.m", "a.2.m", "a.5.m"], "a.{0,2,5}.m (3)"),
    (["blocks.0.cache['k']", "blocks.1.cache['v']"], "blocks.0.cache['k'] ... (2)"),  # not every combination
])
def test_where_label_writes_one_pattern_only_when_it_is_exact(wheres: list[str], label: str) -> None:
    problem = replace(_stray(0), instances=tuple(wheres))
    assert where_label(problem) == label


def test_a_chain_of_causes_ends_at_the_first() -> None:
    # a stray tensor returned through .cpu(): the output and its sync are both evidence of the stray
    output = Finding(code="PC206", kind="output-off-device", severity=Severity.ERROR, where="",
                     message="output is on cpu", hint="h", source="model.py:6", origin="blocks.0.mask")
    sync = Finding(code="PC204", kind="host-sync", severity=Severity.WARNING, where="",
                   message=".cpu() waits", hint="h", source="model.py:6", details=(("op", ".cpu()"),))
    (problem,) = group([_stray(0), output, sync])
    assert problem.code == "PC101" and sorted(e.code for e in problem.evidence) == ["PC204", "PC206"]


def test_a_forward_line_run_by_several_modules_lists_them_as_instances() -> None:
    crash = replace(_mismatch("", "model.py:40"), details=(("op", "Tensor.mul"), ("also", "blocks.1, ''")))
    (problem,) = group([crash])
    assert problem.instances == ("blocks.0", "blocks.1", "")


def test_grouping_twice_changes_nothing() -> None:
    findings = [*(_stray(i) for i in range(3)), _mismatch("blocks.0.mask"), _mismatch("", "model.py:40")]
    once = Report.build("N", "cuda:0", "x", findings, group=True)
    assert once.grouped() == once


def test_evidence_in_the_problems_own_file_is_named_by_its_line() -> None:
    evidence = Evidence.of(_mismatch("blocks.0.mask", "pkg/model.py:33"))
    assert evidence.summary("pkg/model.py").startswith("crashes on a GPU at line 33 in blocks.0: ")
    assert evidence.summary("pkg/other.py").startswith("crashes on a GPU at pkg/model.py:33 in blocks.0")


def test_a_problem_counts_the_modules_of_all_its_instances() -> None:
    findings = [*(_stray(i) for i in range(3)), *(_stray(i, "cache['k']") for i in range(2))]
    grouped = Report.build("N", "cuda:0", "x", findings, group=True)
    ungrouped = Report.build("N", "cuda:0", "x", findings)
    assert grouped.modules() == ungrouped.modules() == ["blocks.0", "blocks.1", "blocks.2"]
    assert grouped.summary_line().startswith("2 problems (5 instances) in 3 modules")
