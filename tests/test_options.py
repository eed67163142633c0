"""``placecheck.options``: one options object from the CLI, a config entry, a child process and Python."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from placecheck.errors import UsageError
from placecheck.options import AuditOptions, ExampleInputs


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
            "import placecheck.config, placecheck.ci, placecheck.runner, placecheck.output\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_audit_takes_the_object_or_the_keywords_not_both() -> None:
    import torch
    import torch.nn as nn

    from placecheck.api import audit

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
