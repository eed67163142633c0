"""``placecheck.basics.options``: one options object from the CLI, a config entry, a child process and
Python."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from placecheck.basics.errors import UsageError
from placecheck.basics.options import (
    DEFAULT_STEPS,
    AuditOptions,
    CheckpointOptions,
    CommonOptions,
    ExampleInputs,
    FixOptions,
    RunOptions,
    check_value,
)

REPO = Path(__file__).resolve().parent.parent


def test_python_keywords_are_normalised() -> None:
    opts = AuditOptions(select=["PC1,PC204"], ignore="PC205", inputs="float32[2,4]")  # type: ignore[arg-type]
    assert (opts.select, opts.ignore, opts.inputs) == (("PC1", "PC204"), ("PC205",), ("float32[2,4]",))
    assert opts == AuditOptions(select=("PC1", "PC204"), ignore=("PC205",), inputs=("float32[2,4]",))


def test_it_round_trips_through_json_as_is() -> None:
    opts = AuditOptions(device="cuda:1", engine="tagged", gpus=2, select=("PC2",), inputs=("float32[1,3]",),
                        example_inputs=None, train=True, library_findings=True, checkpoint="w.pt",
                        checkpoint_key="model.ema", target="m:Net", copy_model=False)
    assert AuditOptions.from_dict(json.loads(json.dumps(opts.to_dict()))) == opts
    with pytest.raises(UsageError, match="unknown audit option 'colour'"):
        AuditOptions.from_dict({"colour": "red"})


def test_objects_as_inputs_are_carried_but_never_serialised() -> None:
    value = (object(), {"mask": object()})
    opts = AuditOptions(inputs=value)  # type: ignore[arg-type]
    assert opts.inputs == () and isinstance(opts.example_inputs, ExampleInputs)
    assert opts.example_inputs.value is value
    assert AuditOptions(example_inputs=value).example_inputs.value is value  # type: ignore[union-attr,arg-type]
    assert AuditOptions(example_inputs="m:inputs").example_inputs == "m:inputs"
    with pytest.raises(UsageError, match="cannot be sent to another process"):
        opts.to_dict()
    with pytest.raises(UsageError, match="cannot be combined"):
        AuditOptions(inputs=value, example_inputs="m:inputs")  # type: ignore[arg-type]


@pytest.mark.parametrize("options, message", [
    ({"device": "gpu"}, "unknown device 'gpu'"),
    ({"engine": "warp"}, "unknown engine 'warp': use one of auto, real, fake, tagged"),
    ({"init": "disk"}, "unknown --init 'disk': use one of auto, cpu, meta"),
    ({"gpus": 0}, "gpus 0: expected an integer >= 1"),
    ({"select": ("PC9999",)}, "PC9999"),
    ({"inputs": ("float32[1]",), "example_inputs": "m:x"}, "cannot be combined"),
])
def test_check_refuses_bad_values(options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("[", r"\[")):
        AuditOptions(**options).check()  # type: ignore[arg-type]


def test_the_options_module_does_not_import_torch() -> None:
    code = ("import sys\nfrom placecheck import AuditOptions\nAuditOptions(device='cuda:1').check()\n"
            "from placecheck.basics.options import RunOptions, FixOptions, CheckpointOptions\n"
            "RunOptions(select='PC2').check(); FixOptions(run=True, steps=3).check()\n"
            "CheckpointOptions(device='cuda:1').check()\n"
            "import placecheck.basics.config, placecheck.cli.ci, placecheck.commands.runner\n"
            "import placecheck.findings.output\n"
            "placecheck.basics.config.command_options('run', '[run]\\nsteps = 3\\n')\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_audit_takes_the_object_or_the_keywords_not_both() -> None:
    import torch
    import torch.nn as nn

    from placecheck.commands.api import audit

    class Stray(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.scale = torch.ones(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x * self.scale)

    by_keywords = audit(Stray(), "cuda", inputs=torch.randn(2, 4), ignore=["PC205"])
    by_object = audit(Stray(), options=AuditOptions(inputs=torch.randn(2, 4), ignore=("PC205",)))  # type: ignore[arg-type]
    found = [(f.code, f.where) for f in by_object.findings]
    assert ("PC101", "scale") in found and found == [(f.code, f.where) for f in by_keywords.findings]
    assert "forward: inputs given in Python: float32[2,4]" in by_object.notes
    with pytest.raises(UsageError, match="not both"):
        audit(Stray(), "cpu", options=AuditOptions())


# -- run, fix and checkpoint ----------------------------------------------------------------------


def test_every_command_shares_the_common_fields() -> None:
    common = {f.name for f in dataclasses.fields(CommonOptions)}
    assert common == {"gpus", "select", "ignore"}
    for cls in (AuditOptions, RunOptions, FixOptions, CheckpointOptions):
        assert issubclass(cls, CommonOptions) and common <= {f.name for f in dataclasses.fields(cls)}
        assert cls.COMMAND and cls.__doc__
        for f in dataclasses.fields(cls):  # frozen, and every field defaulted
            assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        with pytest.raises(dataclasses.FrozenInstanceError):
            cls().gpus = 2  # type: ignore[misc]


def test_not_given_is_the_default_so_equal_meanings_build_equal_objects() -> None:
    assert RunOptions(gpus=None, steps=None) == RunOptions() == RunOptions(gpus=1, steps=DEFAULT_STEPS)  # type: ignore[arg-type]
    assert RunOptions(select="PC1,PC204", ignore=["PC205"]) == RunOptions(  # type: ignore[arg-type]
        select=("PC1", "PC204"), ignore=("PC205",))
    assert CheckpointOptions(select=["PC3"]).select == ("PC3",)  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [AuditOptions, RunOptions, FixOptions, CheckpointOptions])
def test_each_object_round_trips_through_json(cls: type[CommonOptions]) -> None:
    values = {"gpus": 2, "select": ("PC2",), "ignore": ("PC204",)}
    opts = cls(**values)  # type: ignore[arg-type]
    assert cls.from_dict(json.loads(json.dumps(opts.to_dict()))) == opts
    with pytest.raises(UsageError, match=f"unknown {cls.COMMAND} option 'colour': use one of"):
        cls.from_dict({"colour": "red"})


@pytest.mark.parametrize("cls, options, message", [
    (RunOptions, {"steps": -1}, "--steps -1: expected an integer >= 0 (0: run to the end)"),
    (RunOptions, {"timeout": 0}, "--timeout 0: expected a number of seconds > 0"),
    (RunOptions, {"gpus": 0}, "--gpus 0: expected an integer >= 1"),
    (RunOptions, {"select": ("PC9999",)}, "invalid code selector 'PC9999'"),
    (CheckpointOptions, {"device": "keep"}, "unknown device 'keep': use cuda, cuda:N, cpu, mps or meta"),
    (CheckpointOptions, {"engine": "warp"}, "unknown engine 'warp': use one of auto, real, fake, tagged"),
    (FixOptions, {"steps": 3}, "script arguments, --steps and --timeout go with --run"),
    (FixOptions, {"run": True, "device": "cpu", "init": "meta"}, "--device, --init describe a model TARGET"),
    (FixOptions, {"run": True, "train": True}, "--train describe a model TARGET"),
    (FixOptions, {"gpu_memory": "24GiB"}, "--gpu-memory sizes a device map"),  # audit's own checks
])
def test_each_object_checks_its_values_once(cls: type[CommonOptions], options: dict[str, object],
                                           message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        cls(**options).check()  # type: ignore[arg-type]


def test_check_value_is_the_one_check_of_each_value() -> None:
    for name, good in (("device", "cuda:1"), ("engine", "fake"), ("gpus", 2), ("steps", 0), ("timeout", 0.5),
                       ("select", ("PC1",)), ("init", "meta"), ("wrap", "ddp"), ("gpu_memory", "24GiB"),
                       ("device_map", "auto"), ("world_size", None)):
        check_value(name, good)
    for name, bad in (("gpus", True), ("gpus", 1.5), ("steps", "2"), ("timeout", "5"), ("select", "PC1"),
                      ("device", 5), ("gpu_memory", 24)):
        with pytest.raises(UsageError):
            check_value(name, bad)


def test_fix_takes_audit_options_or_fix_options() -> None:
    fix_options = FixOptions(device="cuda:1", gpus=2, select=("PC1",), unsafe=True)
    assert fix_options.audit_options() == AuditOptions(device="cuda:1", gpus=2, select=("PC1",))
    script = FixOptions(run=True, gpus=2, steps=3, timeout=4.0, select=("PC2",))
    assert script.run_options() == RunOptions(gpus=2, steps=3, timeout=4.0, select=("PC2",))
    assert FixOptions(run=True).run_options() == RunOptions()  # steps not given: run's default


def test_the_python_functions_take_the_object_or_the_keywords_not_both() -> None:
    import placecheck
    from placecheck.checkpoint import check_checkpoint
    from placecheck.fix import fix_run

    script = str(REPO / "tests" / "fixtures" / "run" / "batch_buggy.py")
    by_keywords = placecheck.run(script, steps=1, ignore=["PC205"])
    by_object = placecheck.run(script, options=RunOptions(steps=1, ignore=("PC205",)))
    found = [(f.code, f.source) for f in by_object.findings]
    assert [(code, source.endswith("batch_buggy.py:16")) for code, source in found] == [("PC201", True)]
    assert found == [(f.code, f.source) for f in by_keywords.findings]
    assert dict(by_object.stats)["optimizer_steps"] == 1
    assert placecheck.run(script, options=RunOptions(steps=1, select=("PC1",))).findings == ()
    with pytest.raises(UsageError, match=r"run\(\): pass options= or keyword arguments, not both"):
        placecheck.run(script, steps=3, options=RunOptions())
    with pytest.raises(UsageError, match="invalid code selector 'PC9999'"):
        placecheck.run(script, select=["PC9999"])
    with pytest.raises(UsageError, match="not both"):
        check_checkpoint("w.pt", device="cpu", options=CheckpointOptions())
    with pytest.raises(UsageError, match="not both"):
        fix_run(script, steps=2, options=FixOptions(run=True))
