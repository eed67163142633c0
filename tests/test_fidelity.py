"""benchmarks/fidelity.py (``make fidelity``): its comparison and reporting, tested without a GPU.

The real run compares ``--engine real`` on a GPU with the simulations; here the
same code compares two simulations that run on the CPU (``tagged`` as the
reference, ``fake`` against it) on real audits of fixture models, and a
disagreement is made by comparing the audits of two different fixtures.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _fidelity() -> Any:
    spec = importlib.util.spec_from_file_location("_pc_fidelity_script", REPO / "benchmarks" / "fidelity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fidelity = _fidelity()


@functools.cache
def _by_name() -> dict[str, Any]:
    return {t.name: t for t in fidelity.fixture_targets()}


def _fixtures(*names: str) -> list[Any]:
    return [_by_name()[n] for n in names]


@functools.cache
def _audit(name: str, engine: str) -> Any:
    """One real audit per fixture and engine, shared by the tests that only read it."""
    return fidelity.audit(_by_name()[name], engine)


def test_targets_cover_every_fixture_model_and_example() -> None:
    fixtures = {t.name for t in fidelity.fixture_targets()}
    on_disk = {f"{d}/{p.stem}" for d in fidelity.FIXTURE_DIRS
               for p in (REPO / "tests" / "fixtures" / d).glob("*.py") if "class Model" in p.read_text()}
    assert fixtures == on_disk and len(fixtures) > 40
    examples = {t.name for t in fidelity.example_targets()}
    assert {"buggy:BuggyNet", "clean:CleanNet", "many_modules:many_modules"} <= examples
    assert not any(name.endswith(":Block") and "buggy" in name for name in examples)  # needs its width


def test_simulations_compared_on_real_audits_agree_on_fixtures() -> None:
    targets = _fixtures("forward/pc201_plain_attribute", "forward/clean_forward", "walk/cycles")
    lines: list[str] = []
    payload = fidelity.run_targets(targets, "tagged", ("fake",), progress=lines.append)
    assert payload["per_engine"] == {"fake": {"compared": 3, "agree": 3, "disagree": 0, "skipped": 0}}, \
        payload["disagreements"]
    assert payload["disagreements"] == [] and len(lines) == 3
    plain = payload["results"]["forward/pc201_plain_attribute"]
    # the rows compared are the audits' own findings: the plain attribute's PC201 on both engines
    assert plain["tagged"]["rows"] == plain["fake"]["rows"]
    assert any(row[0] == "PC201" for row in plain["fake"]["rows"])
    assert plain["fake"]["engine_name"] == "simulated cuda"


def test_a_difference_in_findings_is_a_disagreement_with_both_sides_rows() -> None:
    buggy, clean = _fixtures("forward/pc201_plain_attribute", "forward/clean_forward")
    reference = _audit(buggy.name, "tagged")
    other = _audit(clean.name, "fake")
    assert reference.rows and not other.rows
    difference = fidelity.compare(buggy.name, reference, other)
    assert difference is not None
    assert difference["only_reference"] == reference.rows and difference["only_engine"] == []
    assert difference["reason"].startswith("unexplained") and not difference["known"]
    assert fidelity.compare(buggy.name, reference, _audit(buggy.name, "fake")) is None


def test_a_failed_audit_is_its_own_row_not_the_runs_end() -> None:
    def broken() -> torch.nn.Module:
        raise RuntimeError("cannot build")

    target = fidelity.Target("fixtures", "broken", broken)
    result = fidelity.audit(target, "fake")
    assert "cannot build" in result.error and result.rows == []
    difference = fidelity.compare("broken", _audit("forward/clean_forward", "tagged"), result)
    assert difference is not None and "fake could not audit it" in difference["failure"]


def test_a_model_whose_weights_do_not_fit_is_skipped_not_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    target = _fixtures("forward/pc201_plain_attribute")[0]
    need = fidelity.state_bytes(target)
    assert need is not None and need > 0  # measured on a meta build
    monkeypatch.setattr(fidelity, "room_for", lambda engine: need - 1 if engine == "tagged" else None)
    payload = fidelity.run_targets([target], "tagged", ("fake",), progress=lambda line: None)
    assert payload["per_engine"]["fake"] == {"compared": 0, "agree": 0, "disagree": 0, "skipped": 1}
    assert "do not fit" in payload["results"][target.name]["tagged"]["skipped"]


def test_markdown_table_lists_agreement_per_engine_and_each_disagreement() -> None:
    buggy, clean = _fixtures("forward/pc201_plain_attribute", "forward/clean_forward")
    difference = fidelity.compare(buggy.name, _audit(buggy.name, "tagged"), _audit(clean.name, "fake"))
    payload = {"reference": "real", "machine": {"gpu": "NVIDIA H100"},
               "per_engine": {"fake": {"compared": 2, "agree": 1, "disagree": 1}},
               "disagreements": [difference]}
    table = fidelity.markdown(payload)
    assert "| fake | 2 | 1 | 1 | 0 |" in table
    row = next(line for line in table.splitlines() if line.startswith(f"| {buggy.name} | fake | "))
    assert "PC201 " in row
    assert row.endswith("unexplained: a bug until shown to be a limit of the simulation |")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine make fidelity really runs")
def test_without_a_gpu_it_says_so_exits_0_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(fidelity, "RESULTS", tmp_path)
    assert fidelity.main([]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_a_simulated_reference_needs_an_explicit_output_file(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        fidelity.main(["--reference", "tagged", "--engines", "fake"])
    assert exit_info.value.code == 2
    out = tmp_path / "f.json"
    assert fidelity.main(["--reference", "tagged", "--engines", "fake", "--only", "fixtures", "--limit", "2",
                          "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["reference"] == "tagged" and written["per_engine"]["fake"]["compared"] == 2


def test_training_scripts_are_found_without_importing_them_and_are_no_model_targets() -> None:
    for name in ("train_buggy", "train_fixed"):
        sys.modules.pop(f"placecheck.examples.{name}", None)
    scripts = {t.name: t for t in fidelity.script_targets()}
    examples = {t.name for t in fidelity.example_targets()}
    assert set(scripts) == {"train_buggy.py", "train_fixed.py"}
    assert not any(name.startswith("train_") for name in examples)
    assert "placecheck.examples.train_buggy" not in sys.modules  # importing it would train
    assert "placecheck.examples.train_fixed" not in sys.modules
    assert not fidelity.is_script(REPO / "placecheck" / "examples" / "buggy.py")


def test_a_script_is_compared_by_the_line_where_it_crashes() -> None:
    scripts = fidelity.script_targets()
    payload = fidelity.run_targets(scripts, "tagged", ("fake",), progress=lambda line: None)
    # a script has one simulation, placecheck run, whatever --engines says
    assert payload["per_engine"] == {"run": {"compared": 2, "agree": 2, "disagree": 0, "skipped": 0}}
    buggy = payload["results"]["train_buggy.py"]["run"]
    source = (REPO / "placecheck" / "examples" / "train_buggy.py").read_text().splitlines()
    loss_line = next(i + 1 for i, line in enumerate(source) if "loss = criterion(" in line)
    assert buggy["rows"] == [["raises", f"train_buggy.py:{loss_line}"]]
    assert payload["results"]["train_fixed.py"]["run"]["rows"] == []


def test_a_real_script_run_gives_its_crash_line(tmp_path: Path) -> None:
    script = tmp_path / "crashes.py"
    script.write_text("import sys\n\nraise RuntimeError('Expected all tensors to be on the same device')\n")
    result = fidelity.run_script(script, "real")
    assert result.rows == [["raises", "crashes.py:3"]] and result.engine_name == "python"
    fine = tmp_path / "fine.py"
    fine.write_text("x = 1\n")
    assert fidelity.run_script(fine, "real").rows == []


def test_a_model_placed_on_more_gpus_than_the_machine_has_is_skipped_with_the_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200 (one GPU) could not run ``pipeline:*Pipeline`` for real ("invalid device ordinal"): the
    reference is skipped there, with how many GPUs the model's own code uses, and compared where it fits."""
    targets = {t.name: t for t in fidelity.example_targets()}
    pipeline, single = targets["pipeline:BuggyPipeline"], _fixtures("forward/pc201_plain_attribute")[0]
    assert fidelity.gpus_needed(pipeline) == fidelity.gpus_needed(targets["pipeline:FixedPipeline"]) == 2
    assert fidelity.gpus_needed(single) == 1
    monkeypatch.setattr(fidelity, "gpus_present", lambda: 1)
    skipped = fidelity.audit(pipeline, "real")
    assert skipped.skipped == "its code places tensors on 2 GPUs (cuda:0 to cuda:1); this machine has 1"
    assert skipped.rows == [] and not skipped.error
    monkeypatch.setattr(fidelity, "gpus_present", lambda: 2)
    monkeypatch.setattr(fidelity, "room_for", lambda engine: None)
    tried = fidelity.audit(pipeline, "real")  # two GPUs: audited (here it fails: this machine has none)
    assert tried.skipped == "" and "no CUDA GPU" in tried.error


H200 = REPO / "benchmarks" / "results" / "gpu-h200-2026-11-27"


def test_the_h200s_disagreements_are_documented_limits_or_need_a_second_gpu() -> None:
    """The committed H200 run (torch 2.11.0+cu130, 2026-11-27): every disagreement is a documented limit
    (placecheck.basics.limits) or a target whose own code places tensors on more GPUs than the H200 had,
    which the reference now skips; every documented limit of a target it ran still differs there."""
    from placecheck.basics.limits import fidelity_limits

    known = fidelity_limits()
    payloads = [json.loads((H200 / name).read_text(encoding="utf-8"))
                for name in ("fidelity-core.json", "fidelity-zoo.json")]
    examples = {t.name: t for t in fidelity.example_targets()}
    for payload in payloads:
        assert payload["machine"]["gpu"] == "NVIDIA H200" and payload["machine"]["torch"] == "2.11.0+cu130"
        for d in payload["disagreements"]:
            if (d["target"], d["engine"]) not in known:
                assert d["target"] in examples and fidelity.gpus_needed(examples[d["target"]]) > 1, d
    ran = {name for payload in payloads for name in payload["results"]}
    differ = {(d["target"], d["engine"]) for payload in payloads for d in payload["disagreements"]}
    assert {k for k in known if k[0] in ran} <= differ
    assert len([k for k in known if k[0] in ran]) == 7  # the detection models of the torchvision zoo
