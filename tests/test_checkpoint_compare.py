"""A checkpoint against a model: PC302-PC305, and the prefix mismatches reported as one finding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from placecheck.checkpoint import check_checkpoint
from placecheck.checkpoint.compare import PrefixFix, compare_state_dicts, find_prefix_fix


class Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.register_buffer("rope", torch.ones(width), persistent=False)


class Model(nn.Module):
    def __init__(self, width: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 2)


def _rows(path: Path, model: nn.Module) -> list[tuple[str, str]]:
    report = check_checkpoint(str(path), model=model, device="cpu").report
    return [(f.code, f.where) for f in report.findings]


def _save(tmp_path: Path, state: dict[str, torch.Tensor], name: str = "ckpt.pt") -> Path:
    path = tmp_path / name
    torch.save(state, path)
    return path


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "model."])
def test_a_prefixed_checkpoint_is_one_finding_naming_the_prefix_to_strip(tmp_path: Path, prefix: str) -> None:
    state = {prefix + k: v for k, v in Model().state_dict().items()}
    report = check_checkpoint(str(_save(tmp_path, state)), model=Model(), device="cpu").report
    (finding,) = report.findings
    assert (finding.code, finding.where) == ("PC302", f"<prefix {prefix}>")
    assert finding.count == len(state)
    assert dict(finding.details) == {"prefix": prefix, "action": "strip"}
    assert f'k.removeprefix("{prefix}")' in finding.hint


def test_ddp_wrapped_model_and_plain_checkpoint_says_add_the_prefix(tmp_path: Path) -> None:
    class Wrapper(nn.Module):  # what DistributedDataParallel looks like from state_dict()'s side
        def __init__(self) -> None:
            super().__init__()
            self.module = Model()

    report = check_checkpoint(str(_save(tmp_path, Model().state_dict())), model=Wrapper(),
                              device="cpu").report
    (finding,) = report.findings
    assert dict(finding.details) == {"prefix": "module.", "action": "add"}
    assert "model.module" in finding.hint


def test_after_the_prefix_fix_real_differences_are_still_reported(tmp_path: Path) -> None:
    state = {"module." + k: v for k, v in Model().state_dict().items()}
    del state["module.head.bias"]
    state["module.extra.weight"] = torch.zeros(2)
    state["module.head.weight"] = torch.zeros(5, 8)
    assert _rows(_save(tmp_path, state), Model()) == [
        ("PC302", "<prefix module.>"), ("PC302", "head.bias"), ("PC304", "head.weight"),
        ("PC303", "module.extra.weight"),  # a warning: after the errors
    ]


def test_missing_unexpected_shape_and_dtype(tmp_path: Path) -> None:
    state = Model().state_dict()
    state.pop("blocks.0.norm.weight")
    state["blocks.9.proj.weight"] = torch.zeros(8, 8)
    state["head.weight"] = torch.zeros(3, 8)
    state["head.bias"] = state["head.bias"].to(torch.bfloat16)
    report = check_checkpoint(str(_save(tmp_path, state)), model=Model(), device="cpu").report
    rows = {(f.code, f.where): f for f in report.findings}
    assert set(rows) == {("PC302", "blocks.0.norm.weight"), ("PC303", "blocks.9.proj.weight"),
                         ("PC304", "head.weight"), ("PC305", "head.bias")}
    assert "[3, 8]" in rows["PC304", "head.weight"].message
    assert "[2, 8]" in rows["PC304", "head.weight"].message
    assert dict(rows["PC305", "head.bias"].details) == {"checkpoint_dtype": "bfloat16",
                                                        "model_dtype": "float32"}


def test_bf16_checkpoint_into_fp32_model_is_pc305_per_key(tmp_path: Path) -> None:
    state = Model().to(torch.bfloat16).state_dict()
    codes = {code for code, _ in _rows(_save(tmp_path, state), Model())}
    assert codes == {"PC305"}


def test_non_persistent_buffers_are_not_missing(tmp_path: Path) -> None:
    model = Model()
    assert "blocks.0.rope" not in model.state_dict()
    assert _rows(_save(tmp_path, model.state_dict()), model) == []


def test_a_prefix_fix_is_not_invented_for_unrelated_keys() -> None:
    ckpt = {"a.weight": ((1,), "float32"), "b.weight": ((1,), "float32")}
    model = {"c.weight": ((1,), "float32"), "d.weight": ((1,), "float32")}
    assert find_prefix_fix(list(ckpt), list(model)) is None
    comparison = compare_state_dicts(ckpt, model)
    assert [f.code for f in comparison.findings] == ["PC302", "PC302", "PC303", "PC303"]


def test_a_backbone_prefix_nobody_listed_is_found_too() -> None:
    model_keys = ["conv.weight", "fc.weight", "fc.bias"]
    fix = find_prefix_fix([f"backbone.{k}" for k in model_keys], model_keys)
    assert fix == PrefixFix("backbone.", strip=True)


def test_the_model_may_be_a_class_or_factory_built_on_meta(tmp_path: Path) -> None:
    path = _save(tmp_path, Model().state_dict())
    assert check_checkpoint(str(path), model=Model, device="cpu").report.findings == ()
    rows = [(f.code, f.where) for f in
            check_checkpoint(str(path), model=lambda: Model(depth=4), device="cpu").report.findings]
    assert rows == [("PC302", "blocks.3.*")]  # a whole block the checkpoint's model did not have
    [finding] = check_checkpoint(str(path), model=lambda: Model(depth=4), device="cpu",
                                 group=False).report.findings
    assert finding.count == 4 and "4 keys under 'blocks.3' (blocks.3.proj.weight, ...)" in finding.message


def test_keys_of_another_architecture_are_grouped_as_audit_groups_instances(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cli_runner import CliRunner

    from placecheck.cli import app

    path = _save(tmp_path, Model(depth=2).state_dict(), "small.pt")
    (tmp_path / "models.py").write_text(
        "from test_checkpoint_compare import Model\n\ndef deep():\n    return Model(depth=6)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(app, ["checkpoint", str(path), "--model", "models.py:deep", "--device",
                                      "cpu"])
    assert result.exit_code == 1, result.stdout
    out = result.stdout
    assert ("note: state_dict: 16 keys missing, 0 unexpected: the checkpoint is probably of\n"
            "      another architecture (whole modules differ)\n") in out
    assert ("error   PC302 blocks.{2..5}.* (4)\n"
            "              models.py:deep expects 4 keys under 'blocks.2'\n") in out
    assert out.count("PC302 blocks") == 1 and "blocks.2.norm.bias" not in out
    assert out.rstrip().endswith("1 problem (4 instances) in 1 module: 1 error")
    # the checkpoint the model was saved from is still clean
    same = CliRunner().invoke(app, ["checkpoint", str(_save(tmp_path, Model(depth=6).state_dict())),
                                    "--model", "models.py:deep", "--device", "cpu"])
    assert same.exit_code == 0 and "another architecture" not in same.stdout


def test_a_checkpoint_of_a_larger_model_is_grouped_the_same_way(tmp_path: Path) -> None:
    path = _save(tmp_path, Model(depth=5).state_dict())
    result = check_checkpoint(str(path), model=Model(depth=2), device="cpu")
    assert [(f.code, f.where, f.instances, f.count) for f in result.report.findings] == [
        ("PC303", "blocks.2.*", ("blocks.2.*", "blocks.3.*", "blocks.4.*"), 12)]
    assert ("state_dict: 0 keys missing, 12 unexpected: the checkpoint is probably of another architecture "
            "(whole modules differ)") in result.report.notes


def test_the_prefix_finding_counts_keys_and_bytes(tmp_path: Path) -> None:
    state = {"module." + k: v for k, v in Model().to(torch.bfloat16).state_dict().items()}
    (finding,) = [f for f in check_checkpoint(str(_save(tmp_path, state)), model=Model().to(torch.bfloat16),
                                              device="cpu").report.findings]
    assert finding.count == len(state)
    assert finding.nbytes == sum(t.numel() * 2 for t in state.values())
