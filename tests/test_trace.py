"""The tracer: provenance, several mismatches in one run, user source lines, simulated torch.cuda.

Models are written here; each audit runs under simulated CUDA (no GPU needed).
"""

from __future__ import annotations

import json
import os
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from cli_runner import CliRunner
from conftest import BUGGY, TESTS, load_file, unwrapped
from forward_helpers import ungrouped  # noqa: F401 (the fixture)

import placecheck
from placecheck.cli import app
from placecheck.engines.sources import display_path

pytestmark = [pytest.mark.usefixtures("ungrouped"), pytest.mark.cpu_build]

HERE = Path(__file__).name


def _line_of(text: str) -> int:
    """The line in this file that contains ``text`` (so the tests survive edits above them)."""
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    matches = [i + 1 for i, line in enumerate(lines) if text in line and "_line_of" not in line]
    assert len(matches) == 1, (text, matches)
    return matches[0]


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 8)
        self.mask = torch.tril(torch.ones(16, 16))  # plain attribute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-2]
        scores = self.qkv(x) @ x.transpose(-1, -2)
        return scores * self.mask[:n, :n]  # MARK view-of-attribute


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Attention(), Attention()])
        self.table = {"pos": torch.zeros(16, 16)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers[0](x)
        y = self.layers[1](x) + y
        return y + self.table["pos"][: y.shape[-2], : y.shape[-1]]  # MARK dict-attribute


def test_attribute_mismatch_names_the_attribute_and_links_the_walk_finding() -> None:
    report = placecheck.audit(Encoder, "cuda", inputs=["float32[2,4,8]"])
    walk = {f.where: f for f in report.findings if f.code == "PC101"}
    mismatches = [f for f in report.findings if f.code == "PC201"]
    by_line = {int(f.source.rpartition(":")[2]): f for f in mismatches}
    view = by_line[_line_of("MARK view-of-attribute")]
    # a view (self.mask[:n, :n]) of the unmoved attribute is traced back to the attribute
    assert view.where == "layers.0" and view.origin == "layers.0.mask" and view.origin in walk
    assert "layers.0.mask" in view.message and view.device == "cpu" and view.expected == "cuda:0"
    assert ("also", "layers.1") in view.details  # the same line in the second layer: one finding
    assert dict(view.details)["op"] == "Tensor.mul"
    assert view.hint == walk["layers.0.mask"].hint
    pos = by_line[_line_of("MARK dict-attribute")]
    assert pos.where == "" and pos.origin == "table['pos']" and pos.origin in walk


def test_several_mismatches_reported_in_one_run() -> None:
    report = placecheck.audit(Encoder, "cuda", inputs=["float32[2,4,8]"], select=["PC201"])
    assert len(report.findings) == 2
    assert len({f.source for f in report.findings}) == 2


class CreatesInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = torch.ones(4) * 0.5  # MARK created
        return self.proj(x) + bias  # MARK fed


def test_created_tensor_provenance_is_its_line_and_the_mismatch_it_feeds_is_the_error() -> None:
    report = placecheck.audit(CreatesInForward, "cuda", inputs=["float32[3,4]"])
    created = f"{_line_of('MARK created')}"
    (mismatch,) = [f for f in report.findings if f.code == "PC201"]
    assert mismatch.source.endswith(f"{HERE}:{_line_of('MARK fed')}")
    assert mismatch.origin.endswith(f"{HERE}:{created}")  # the line that created the tensor
    (creation,) = [f for f in report.findings if f.code == "PC202"]
    # PC202 keeps its rule's severity (the rule table's one truth); the crash it feeds is the PC201 error
    assert creation.source.endswith(f"{HERE}:{created}") and creation.severity == "warning"
    assert mismatch.severity == "error" and "it then fed a device mismatch" in creation.message
    assert "torch.ones" in creation.message


def test_source_is_never_a_torch_or_placecheck_frame() -> None:
    import placecheck as pkg

    torch_dir = os.path.dirname(torch.__file__)
    own_dir = os.path.dirname(pkg.__file__)
    fixtures = sorted((TESTS / "fixtures" / "forward").glob("*.py"))
    models = [Encoder, CreatesInForward, *[load_file(p) for p in fixtures]]
    seen = 0
    for model in models:
        for f in placecheck.audit(model, "cuda", select=["PC2"]).findings:
            if not f.source:
                continue
            seen += 1
            path = os.path.abspath(f.source.rpartition(":")[0])
            assert not path.startswith(torch_dir), f
            assert not path.startswith(own_dir) or "/examples/" in path, f
    assert seen >= 10


class ChoosesDeviceAtRuntime(nn.Module):
    """Picks its device as scripts do; takes the GPU path only when torch.cuda says a GPU exists."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        steps = torch.arange(4, device=device) * torch.cuda.device_count()
        return self.proj(x) + steps


@pytest.mark.parametrize("engine", ["fake", "tagged"])
def test_model_code_sees_the_simulated_gpu_in_forward(engine: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("a real GPU is present: nothing is simulated")
    report = placecheck.audit(ChoosesDeviceAtRuntime, "cuda", engine=engine, inputs=["float32[2,4]"])
    assert report.findings == ()  # the CPU path would have created steps on the CPU: PC201/PC202
    assert not torch.cuda.is_available()  # and nothing leaks out of the audit


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.offset = torch.ones(4)  # plain attribute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)  # MARK proj
        keep = x[x > 0]  # MARK mask: a data-dependent shape, and a host sync
        scale = x.abs().max().item()  # MARK item
        return (x + self.offset) / (scale + keep.numel())  # MARK offset


def test_auto_runs_item_and_boolean_masks_on_fake_tensors() -> None:
    # fake tensors run through data-dependent ops (placecheck.engines.datadep): no fallback to real values;
    # this model's weights are small, so their values are known and nothing had to be assumed
    report = placecheck.audit(DataDependent, "cuda", inputs=["float32[8,4]"])
    assert report.engine == "simulated cuda"
    assert not report.incomplete and not any("fell back" in n for n in report.notes)
    codes = sorted((f.code, int(f.source.rpartition(":")[2]) if f.source else 0) for f in report.findings)
    # boolean-mask indexing is a host sync too: the host reads how many elements the mask selects
    assert codes == [("PC101", _line_of("self.offset = torch.ones(4)  # plain attribute")),
                     ("PC201", _line_of("MARK offset")), ("PC204", _line_of("MARK mask")),
                     ("PC204", _line_of("MARK item"))]


class ReadsHostMemory(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.offset = torch.ones(4)  # a stray, never used

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        values = x.cpu().numpy()  # MARK numpy: fake tensors hold no host memory to read
        return x * float(values.max())


def test_auto_falls_back_to_real_values_where_fake_tensors_cannot_run_and_says_why() -> None:
    report = placecheck.audit(ReadsHostMemory, "cuda", inputs=["float32[8,4]"])
    assert report.engine == "simulated cuda (real values)"
    assert "fell back from fake tensors" in report.notes[0]
    assert f"{HERE}:{_line_of('MARK numpy')}" in report.notes[0]  # the user's line fake tensors could not run


def test_fake_engine_alone_reports_that_it_could_not_run_the_forward() -> None:
    report = placecheck.audit(ReadsHostMemory, "cuda", engine="fake", inputs=["float32[8,4]"])
    assert report.engine == "simulated cuda"
    assert report.incomplete
    assert any("forward: checked only up to" in n and "--engine tagged" in n for n in report.notes)
    # stopped at .numpy(), after the .cpu() it reports as the host sync it is
    assert sorted((f.code, f.source.rpartition("/")[2]) for f in report.findings) == [
        ("PC101", f"{HERE}:{_line_of('self.offset = torch.ones(4)  # a stray, never used')}"),
        ("PC204", f"{HERE}:{_line_of('MARK numpy')}")]


class MismatchThenMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.offset = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x) + self.offset
        return x[x > 0]


def test_what_fake_tensors_found_before_they_stopped_is_kept() -> None:
    report = placecheck.audit(MismatchThenMask, "cuda", engine="fake", inputs=["float32[8,4]"])
    assert sorted(f.code for f in report.findings) == ["PC101", "PC201", "PC204"]  # PC204: the mask


def test_forward_error_keeps_every_other_finding() -> None:
    report = placecheck.audit(DataDependent, "cuda", inputs=["float32[8,5]"])  # wrong width
    codes = {f.code for f in report.findings}
    assert codes == {"PC101", "PC207"}
    (error,) = [f for f in report.findings if f.code == "PC207"]
    assert "[8, 5]" in error.message  # the shapes, as torch's own message gives them
    assert error.source.endswith(f"{HERE}:{_line_of('x = self.proj(x)  # MARK proj')}")


class TrainsBadly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.extra: nn.Parameter | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra is None:
            self.extra = nn.Parameter(torch.ones(4))
        return self.norm(self.proj(x)) * self.extra


def test_train_runs_backward_and_checks_gradients() -> None:
    report = placecheck.audit(TrainsBadly, "cuda", inputs=["float32[8,4]"], train=True)
    assert report.engine == "simulated cuda (real values)"
    grads = [f for f in report.findings if dict(f.details).get("op") == "backward"]
    assert [(g.code, g.module, g.device) for g in grads] == [("PC201", "extra", "cpu")]
    assert {f.code for f in report.findings} == {"PC201", "PC203"}
    clean = placecheck.audit(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), "cuda", train=True)
    assert clean.findings == ()


class _HalveGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad * torch.full(grad.shape, 0.5)  # made on the CPU: a GPU raises here, in the backward


class _HalvesGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _HalveGrad.apply(self.fc(x))


def test_train_runs_a_custom_functions_backward_on_the_device_and_finds_its_cpu_tensor() -> None:
    report = placecheck.audit(_HalvesGrad, "cuda", inputs=["float32[8,4]"], train=True)
    [found] = report.findings
    assert found.code == "PC201" and found.source.endswith(f"test_trace.py:{_HALVE_LINE}")
    assert placecheck.audit(nn.Linear(4, 4), "cuda", train=True).findings == ()


_HALVE_LINE = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                   if "made on the CPU: a GPU raises here" in line)


def test_forward_never_changes_the_callers_model_or_its_mode() -> None:
    model = TrainsBadly().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    placecheck.audit(model, "cuda", inputs=["float32[8,4]"], train=True)
    placecheck.audit(model, "cuda", inputs=["float32[8,4]"])
    assert model.training and model.extra is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_no_forward_and_select_skip_the_forward() -> None:
    report = placecheck.audit(DataDependent, "cuda", forward=False)
    assert not any(n.startswith("forward:") for n in report.notes)
    assert {f.code for f in report.findings} == {"PC101"}


def test_cli_forward_options() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["audit", BUGGY, "--input", "float32[2,16,8]", "--select", "PC2",
                                 "-f", "json"])
    assert result.exit_code == 1, result.stderr
    data = json.loads(result.stdout)
    assert {f["code"] for f in data["findings"]} == {"PC201", "PC202", "PC203"}
    assert any("inputs from --input: float32[2,16,8]" in n for n in data["notes"])
    result = runner.invoke(app, ["audit", BUGGY, "--no-forward", "--select", "PC2"])
    assert result.exit_code == 0
    result = runner.invoke(app, ["audit", BUGGY, "--train", "--select", "PC2", "-f", "json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["engine"] == "simulated cuda (real values)"
    result = runner.invoke(app, ["audit", BUGGY, "--input", "float32[2,16"])
    assert result.exit_code == 2 and "[NAME=]DTYPE[D0,D1,...]" in unwrapped(result.stderr)
    assert unwrapped(result.stderr).count("\n") == 1  # one line, fitted to the width
    result = runner.invoke(app, ["audit", BUGGY, "--train", "--engine", "fake"])
    assert result.exit_code == 2 and "--engine tagged" in unwrapped(result.stderr)


class Attends(nn.Module):
    def __init__(self, stray_mask: bool) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        mask = torch.zeros(4, 4, dtype=torch.bool)
        if stray_mask:
            self.mask = mask  # plain attribute: stays on the CPU
        else:
            self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.attn(x, x, x, attn_mask=self.mask, need_weights=False)  # MARK attention
        return out


@pytest.mark.parametrize("engine", ["fake", "tagged"])
def test_attention_is_traced_and_its_inference_fast_path_kept_when_clean(engine: str) -> None:
    # the fused inference path runs only when everything is on the target; a CPU mask is still caught
    if engine == "fake" and not torch.backends.cuda.is_built():
        pytest.skip("a CPU-only torch build cannot run attention on fake CUDA tensors (auto falls back)")
    assert placecheck.audit(Attends(False), "cuda", engine=engine, inputs=["float32[2,4,8]"]).findings == ()
    report = placecheck.audit(Attends(True), "cuda", engine=engine, inputs=["float32[2,4,8]"], select=["PC2"])
    (mismatch,) = report.findings
    assert mismatch.code == "PC201" and mismatch.origin == "mask"
    assert mismatch.source.endswith(f"{HERE}:{_line_of('MARK attention')}")


# -- where the finding is attributed: no user frame, library code, the running module ---------------


SHOWN = display_path(__file__)
"""This file as ``source`` shows it (relative to the working directory)."""


class ToCpu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.cpu()  # MARK to-cpu


def _no_user_frame_sequential() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), ToCpu(), nn.Linear(4, 4))


def _plain_weight_on_a_torch_module() -> nn.Module:
    lin = nn.Linear(4, 4)
    weight = lin.weight.detach().clone()
    del lin.weight
    lin.weight = weight  # type: ignore[assignment]  # plain tensor attribute: .to() leaves it
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), lin)


@pytest.mark.parametrize("engine", ["auto", "tagged"])
def test_with_no_user_frame_in_forward_the_module_is_named_and_source_stays_inside(engine: str) -> None:
    # the mismatch is raised in torch code called from torch code: no frame of the forward is the
    # user's, and the search must not escape to the caller of audit() (this file's test function)
    report = placecheck.audit(_no_user_frame_sequential, "cuda", engine=engine)
    mismatch = next(f for f in report.findings if f.code == "PC201")
    assert (mismatch.where, mismatch.source) == ("2", "")
    sync = next(f for f in report.findings if f.code == "PC204")
    assert (sync.where, sync.source) == ("1", f"{SHOWN}:{_line_of('MARK to-cpu')}")
    report = placecheck.audit(_plain_weight_on_a_torch_module, "cuda", engine=engine, select=["PC2"])
    rows = [(f.code, f.where, f.source, f.origin) for f in report.findings]
    assert rows == [("PC201", "2", "", "2.weight")]


def test_cli_source_never_points_at_the_cli() -> None:
    result = CliRunner().invoke(app, ["audit", f"{Path(__file__)}:_no_user_frame_sequential", "-f", "json"])
    data = json.loads(result.stdout)
    assert [(f["code"], f["where"], f["source"]) for f in data["findings"] if f["code"] == "PC201"] == [
        ("PC201", "2", "")]


class Postprocess(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.sum().item()  # MARK helper-item


class CallsAHelperMethod(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.post = Postprocess()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post.finish(self.proj(x))


def test_where_is_the_module_whose_forward_runs_not_the_owner_of_a_helper_method() -> None:
    # torchvision's transform.postprocess called from GeneralizedRCNN.forward: the root's forward runs
    report = placecheck.audit(CallsAHelperMethod, "cuda", select=["PC204"])
    assert [(f.where, f.source) for f in report.findings] == [("", f"{SHOWN}:{_line_of('MARK helper-item')}")]


_FAKE_LIBRARY = '''
import torch
import torch.nn as nn


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        n = int(y.argmax())                      # line 13: a host sync inside the library
        idx = torch.arange(2)                    # line 14: a CPU index made by the library
        return y[:, idx] + torch.ones(2) * n     # line 15: a mismatch inside the library


class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.ones(4), persistent=False)
        self.original_inv_freq = self.inv_freq   # an alias .to() leaves behind, unused by forward

    def forward(self, x):
        return x * self.inv_freq
'''


@pytest.fixture
def fake_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``fakelib``, installed in a site-packages directory of its own; yields its file."""
    from placecheck.engines import sources as trace

    site = tmp_path / "site-packages"
    (site / "fakelib").mkdir(parents=True)
    (site / "fakelib" / "__init__.py").write_text(_FAKE_LIBRARY, encoding="utf-8")
    monkeypatch.setattr(trace, "_SITE_DIRS", (str(site) + os.sep,))
    trace._library_of.cache_clear()  # answers cached under the real site-packages
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "fakelib", raising=False)
    yield str(site / "fakelib" / "__init__.py")
    trace._library_of.cache_clear()  # nothing judged under the fake site-packages outlives the test


class WrapsTheLibrary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import fakelib  # type: ignore[import-not-found]

        self.head = fakelib.Head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)  # MARK calls-library


def _library_alone() -> nn.Module:
    import fakelib

    return typing.cast(nn.Module, fakelib.Head())


def test_performance_findings_inside_installed_packages_are_info_naming_it(fake_library: str) -> None:
    report = placecheck.audit(_library_alone, "cuda", select=["PC2"])
    rows = sorted((f.code, f.severity.value, f.where, f.source) for f in report.findings)
    library_line = os.path.relpath(fake_library) if not os.path.relpath(fake_library).startswith("..") \
        else fake_library
    # the mismatch is an error: always reported, at the library's line (no user frame in the forward),
    # with the creation that fed it at its rule's severity; the performance findings are info
    assert rows == [("PC201", "error", "", f"{library_line}:15"),
                    ("PC202", "info", "", f"{library_line}:14"),
                    ("PC202", "warning", "", f"{library_line}:15"),
                    ("PC204", "info", "", f"{library_line}:13"),
                    ("PC205", "info", "", f"{library_line}:15")]
    infos = [f for f in report.findings if f.severity.value == "info"]
    assert all(f.message.startswith("in fakelib, not your code: ") for f in infos)
    assert all(dict(f.details)["library"] == "fakelib" for f in infos)
    shown = placecheck.audit(_library_alone, "cuda", select=["PC2"], library_findings=True)
    assert sorted((f.code, f.severity.value, f.source) for f in shown.findings
                  if f.code in ("PC202", "PC204", "PC205")) == [
        ("PC202", "warning", f"{library_line}:14"), ("PC202", "warning", f"{library_line}:15"),
        ("PC204", "warning", f"{library_line}:13"), ("PC205", "warning", f"{library_line}:15")]


class HoldsAStrayAndTheLibrary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import fakelib

        self.rotary = fakelib.Rotary()
        self.unused = torch.ones(4)  # the user's own stray, never used: stays an error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rotary(x)


def test_a_stray_inside_a_library_module_the_forward_never_uses_is_info(fake_library: str) -> None:
    report = placecheck.audit(HoldsAStrayAndTheLibrary, "cuda", inputs=["float32[2,4]"])
    rows = {f.where: (f.severity.value, f.message) for f in report.findings if f.code == "PC101"}
    assert rows["unused"][0] == "error"
    severity, message = rows["rotary.original_inv_freq"]
    assert severity == "info" and message.startswith("in fakelib, not your code: ")
    assert message.endswith("; the forward never uses it")
    without_forward = placecheck.audit(HoldsAStrayAndTheLibrary, "cuda", forward=False, select=["PC1"])
    assert {f.severity.value for f in without_forward.findings} == {"error"}


def test_library_code_called_from_the_users_forward_is_attributed_to_their_line(fake_library: str) -> None:
    report = placecheck.audit(WrapsTheLibrary, "cuda", select=["PC2"])
    line = f"{SHOWN}:{_line_of('MARK calls-library')}"
    assert {(f.code, f.where, f.source) for f in report.findings} >= {
        ("PC201", "", line), ("PC204", "", line), ("PC205", "", line)}
    assert not any("performance findings inside" in n for n in report.notes)


def test_cli_library_findings_flag(fake_library: str) -> None:
    runner = CliRunner()
    target = f"{Path(__file__)}:_library_alone"
    info = json.loads(runner.invoke(app, ["audit", target, "--select", "PC204", "-f", "json"]).stdout)
    assert [(f["code"], f["severity"]) for f in info["findings"]] == [("PC204", "info")]
    shown = json.loads(runner.invoke(app, ["audit", target, "--select", "PC204", "--library-findings",
                                           "-f", "json"]).stdout)
    assert [(f["code"], f["severity"]) for f in shown["findings"]] == [("PC204", "warning")]


# -- several origins on one line; PC207 --------------------------------------------------------------


class SeveralCreationsMeet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        a = torch.full((4,), 2.0)  # MARK first-creation
        b = torch.linspace(0, 1, 4)  # MARK second-creation
        return x + a + b  # MARK creations-meet


def test_a_mismatch_line_lists_every_origin_of_its_offending_tensors() -> None:
    report = placecheck.audit(SeveralCreationsMeet, "cuda", select=["PC201"])
    (finding,) = report.findings
    first, second = (f"{SHOWN}:{_line_of(m)}" for m in ("MARK first-creation", "MARK second-creation"))
    assert finding.source == f"{SHOWN}:{_line_of('MARK creations-meet')}"
    assert finding.origin == first
    assert dict(finding.details)["origins"] == f"{first}, {second}"


class NeedsTheDriver(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.mask = torch.ones(4)  # plain attribute: a mismatch before the driver call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x) * self.mask  # MARK before-driver
        graph = torch.cuda.CUDAGraph()  # MARK needs-driver
        return y + 0 * len(str(graph))


@pytest.mark.parametrize("engine", ["auto", "tagged"])
def test_an_unsimulated_cuda_api_is_a_note_not_a_forward_error(engine: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("a real GPU is present: nothing is simulated")
    report = placecheck.audit(NeedsTheDriver, "cuda", engine=engine, select=["PC2"])
    before = f"{SHOWN}:{_line_of('MARK before-driver')}"
    assert [(f.code, f.source) for f in report.findings] == [("PC201", before)]
    assert any(n.startswith(f"forward: stopped at {SHOWN}:{_line_of('MARK needs-driver')}: ")
               for n in report.notes), report.notes


def test_a_stray_the_forward_replaces_is_info_and_without_the_forward_an_error() -> None:
    replaced = load_file(TESTS / "fixtures" / "forward" / "pc101_stray_replaced_in_forward.py")
    report = placecheck.audit(replaced, "cuda")
    (stray,) = [f for f in report.findings if f.code == "PC101"]
    assert stray.where == "anchors.cell_anchors[0]" and stray.severity.value == "info"
    assert stray.message.endswith(
        "; moved lazily by forward: .to() leaves it behind; the first forward copies it")
    assert dict(stray.details)["forward"] == "replaced"
    report = placecheck.audit(replaced, "cuda", forward=False)
    assert [(f.code, f.where, f.severity.value) for f in report.findings] == [
        ("PC101", "anchors.cell_anchors[0]", "error")]


class ReturnsTwoHostCopiesFromOneLine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.proj(x)
        return {"a": y.cpu(), "b": y, "c": y.to("cpu", torch.float16)}  # MARK two-copies


def test_each_output_off_the_device_is_its_own_finding_sourced_to_the_copy() -> None:
    report = placecheck.audit(ReturnsTwoHostCopiesFromOneLine, "cuda", select=["PC206"])
    line = f"{SHOWN}:{_line_of('MARK two-copies')}"
    assert sorted((f.module, f.source, f.origin) for f in report.findings) == [
        ("output['a']", line, line), ("output['c']", line, line)]
    assert all(f"copied to the host at {line}" in f.message for f in report.findings)


def test_an_inferred_input_the_forward_rejects_makes_the_audit_incomplete_not_a_pc207() -> None:
    broken = load_file(TESTS / "fixtures" / "forward" / "pc207_forward_error.py")
    report = placecheck.audit(broken, "cuda")  # no --input: placecheck infers float32[2,4]
    codes = sorted(f.code for f in report.findings)
    assert codes == ["PC101", "PC201"]  # what the forward found before it stopped is kept
    assert report.incomplete and "pass --input" in report.incomplete
    assert any("with the inferred input" in n and "pass --input" in n for n in report.notes)
    given = placecheck.audit(broken, "cuda", inputs=["float32[2,4]"])
    assert "PC207" in {f.code for f in given.findings} and not given.incomplete


def test_a_returned_host_copy_is_a_pc206_and_a_pc204_tied_to_it() -> None:
    report = placecheck.audit(ReturnsTwoHostCopiesFromOneLine, "cuda", select=["PC204", "PC206"])
    line = f"{SHOWN}:{_line_of('MARK two-copies')}"
    (sync,) = [f for f in report.findings if f.code == "PC204"]
    # the copy goes to the host (not "cuda:0 -> cuda:0"); origin and source tie it to the PC206s
    assert (sync.device, sync.expected, sync.source, sync.origin) == ("cuda:0", "cpu", line, line)
    assert {f.origin for f in report.findings if f.code == "PC206"} == {line}
    assert "returned on the host" in sync.message and "return the tensor on the device" in sync.hint


def test_pc205_states_the_true_rule_for_scalars_and_indices() -> None:
    model = load_file(TESTS / "fixtures" / "forward" / "pc205_implicit_transfer.py")
    report = placecheck.audit(model(), device="cuda", inputs=["float32[2,8]"])
    by_line = {f.source.rpartition(":")[2]: f for f in report.findings if f.code == "PC205"}
    scalar, index = by_line["13"], by_line["15"]
    assert scalar.severity.value == "info" and "reads it on the host" in scalar.message
    assert "copied" not in scalar.message.replace("no device copy", "")
    assert index.severity.value == "warning" and "copied to cuda:0 on every call" in index.message


@pytest.mark.parametrize("fixture, severity", [
    ("pc203_layer_in_forward", "error"),             # built on the CPU: a mismatch on the GPU
    ("pc203_layer_on_device_in_forward", "warning"),  # on the target: only the optimizer misses it
])
def test_pc203_severity_says_whether_the_job_crashes(fixture: str, severity: str) -> None:
    model = load_file(TESTS / "fixtures" / "forward" / f"{fixture}.py")
    report = placecheck.audit(model(), device="cuda")
    (pc203,) = [f for f in report.findings if f.code == "PC203"]
    assert pc203.severity.value == severity
    # the hint states the true rule for each case: off the target, where the layer landed
    assert ("lands on the default device" in pc203.hint) == (severity == "error")


def test_numpy_on_a_device_tensor_is_the_crash_a_gpu_gives_not_a_host_sync(tmp_path: Path) -> None:
    source = tmp_path / "np_model.py"
    source.write_text(
        "import torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.proj = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n"
        "        y = self.proj(x)\n"
        "        y.numpy()\n"
        "        return y\n", encoding="utf-8")
    report = placecheck.audit(load_file(source)(), device="cuda", inputs=["float32[2,4]"])
    assert [(f.code, f.source.rpartition(":")[2]) for f in report.findings] == [("PC207", "11")]
    assert "can't convert cuda:0 device type tensor to numpy" in report.findings[0].message


def test_a_forward_stopped_by_the_simulation_is_not_called_clean(tmp_path: Path) -> None:
    """Code that needs a real driver stops the simulated forward: the summary must not claim the
    whole model is clean, and JSON carries why (``summary.incomplete``)."""
    source = tmp_path / "graph_model.py"
    source.write_text(
        "import torch\nimport torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.proj = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n"
        "        torch.cuda.CUDAGraph()\n"
        "        return self.proj(x)\n", encoding="utf-8")
    report = placecheck.audit(load_file(source)(), device="cuda", inputs=["float32[2,4]"])
    assert report.findings == ()
    assert "graph_model.py:11" in report.incomplete
    assert report.summary_line().endswith("the forward pass stopped before its end, the rest is unchecked "
                                          "(see the notes)")
    assert report.summary()["incomplete"] == report.incomplete
    clean = placecheck.audit(load_file(source)(), device="cuda", forward=False)
    assert clean.incomplete == "" and clean.summary_line() == "no placement problems found on cuda:0, " \
        "simulated (fake tensors, no data)"


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.bias = torch.ones(4)  # plain attribute: .to() leaves it behind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + self.bias  # MARK head-mismatch


class HeadsInAPlainList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(4, 4)
        self.heads = [_Head(), _Head()]  # a plain list: unregistered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.trunk(x)
        return self.heads[0](y)


@pytest.mark.parametrize("engine", ["fake", "tagged"])
def test_a_mismatch_in_a_module_held_in_a_plain_list_names_that_module(engine: str) -> None:
    report = placecheck.audit(HeadsInAPlainList, "cuda", engine=engine, inputs=["float32[2,4]"],
                              select=["PC201"])
    line = f"{SHOWN}:{_line_of('MARK head-mismatch')}"
    assert {(f.where, f.source) for f in report.findings} == {("heads[0]", line)}
    assert {f.origin for f in report.findings} == {"heads[0]"}  # the walk's PC102 about the list


class HardCodedCuda(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(4).cuda()  # MARK hard-coded
        return self.proj(x) + noise


def test_hints_for_a_hard_coded_cuda_say_where_it_landed() -> None:
    report = placecheck.audit(HardCodedCuda, "cuda:1", gpus=2, inputs=["float32[2,4]"], select=["PC2"])
    line = f"{SHOWN}:{_line_of('MARK hard-coded')}"
    (created,) = [f for f in report.findings if f.code == "PC202" and f.source == line]
    (mismatch,) = [f for f in report.findings if f.code == "PC201"]
    assert created.device == "cpu" and "put it on cuda:0" in created.hint and "CPU" not in created.hint
    assert "put it on cuda:0" in mismatch.hint and "the CPU" not in mismatch.hint


def test_the_examples_in_placecheck_are_user_code_when_audited() -> None:
    """No folder of placecheck is special-cased: the code under audit is the user's wherever it lives."""
    from placecheck.examples.buggy import BuggyNet

    for model in (BuggyNet, BuggyNet()):  # a factory (the class) and an instance
        report = placecheck.audit(model, "cuda", engine="fake", select=["PC2"])
        sources = {f.source.rpartition(":")[0] for f in report.findings}
        assert sources == {os.path.join("placecheck", "examples", "buggy.py")}, sources
