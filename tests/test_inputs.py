"""placecheck.model.inputs: the --input grammar, --example-inputs, input inference and move_inputs.

Needs no torchvision except where marked, so it also runs on the CPU-only torch build.
"""

from __future__ import annotations

import collections
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from conftest import unwrapped

from placecheck.basics.errors import LoadError, UsageError
from placecheck.model.inputs import (
    DEFAULT_INT_RANGE,
    INPUT_GRAMMAR,
    InputSpec,
    describe,
    infer_inputs,
    move_inputs,
    parse_input_spec,
    resolve_inputs,
)

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

# -- grammar -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("float32[8,3,224,224]", InputSpec(None, "float32", (8, 3, 224, 224), None, None)),
    ("input_ids=int64[2,128]:0..32000", InputSpec("input_ids", "int64", (2, 128), 0, 32000)),
    ("bool[2,5]", InputSpec(None, "bool", (2, 5), None, None)),
    ("bfloat16[4,16]:-1..1", InputSpec(None, "bfloat16", (4, 16), -1, 1)),
    ("float32[]", InputSpec(None, "float32", (), None, None)),
    ("x = float[ 2 , 3 ] : -0.5..2.5e1", InputSpec("x", "float32", (2, 3), -0.5, 25.0)),
    ("float64[0,4]", InputSpec(None, "float64", (0, 4), None, None)),
])
def test_spec_parses(text: str, expected: InputSpec) -> None:
    assert parse_input_spec(text) == expected


@pytest.mark.parametrize(("alias", "dtype"), [
    ("float", "float32"), ("half", "float16"), ("double", "float64"), ("long", "int64"),
    ("int", "int32"), ("short", "int16"), ("byte", "uint8"), ("char", "int8"), ("bf16", "bfloat16"),
    ("fp16", "float16"), ("torch.float32", "float32"), ("INT64", "int64"), ("cfloat", "complex64"),
])
def test_dtype_aliases(alias: str, dtype: str) -> None:
    spec = parse_input_spec(f"{alias}[2]")
    assert spec.dtype == dtype
    assert spec.make().dtype == getattr(torch, dtype)


def test_spec_prints_back_as_written() -> None:
    for text in ("float32[8,3,224,224]", "input_ids=int64[2,128]:0..32000", "bfloat16[4,16]:-1..1",
                 "x=float32[2]:-0.5..0.5"):
        assert str(parse_input_spec(text)) == text


@pytest.mark.parametrize(("text", "why"), [
    ("float32", "not a tensor spec"),
    ("float32[2,3", "not a tensor spec"),
    ("[2,3]", "not a tensor spec"),
    ("1x=float32[2]", "not a tensor spec"),
    ("float32[2,3]:0..", "not a tensor spec"),
    ("float32[2,3]:a..b", "not a tensor spec"),
    ("float32[2,3] junk", "not a tensor spec"),
    ("quux[2,3]", "unknown dtype 'quux'"),
    ("float32[2,-3]", "dimension '-3' is not a non-negative integer"),
    ("float32[2,x]", "dimension 'x' is not a non-negative integer"),
    ("float32[2,]", "dimension '' is not a non-negative integer"),
    ("float32[2]:1..1", "is empty"),
    ("float32[2]:3..1", "is empty"),
    ("float32[2]:-inf..1", "must be finite"),
    ("int64[2]:0.5..3", "needs integer bounds"),
    ("uint8[2]:-1..10", "does not fit uint8"),
    ("int8[2]:0..1000", "does not fit int8"),
    ("bool[2]:0..3", "does not fit bool"),
    ("int64[2]:0..9223372036854775807", "does not fit int64"),
    ("complex64[2]:0..1", "complex inputs take no range"),
])
def test_every_spec_error_shows_the_grammar(text: str, why: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_input_spec(text)
    message = str(info.value)
    assert why in message
    assert INPUT_GRAMMAR in message and "e.g. --input float32[1,3,224,224]" in message
    assert "\n" not in message


def test_an_input_too_big_for_host_memory_is_refused() -> None:
    with pytest.raises(UsageError, match=r"GiB of host memory .* use a smaller shape"):
        parse_input_spec("float32[100000,100000]")
    with pytest.raises(UsageError, match="together take"):
        resolve_inputs(nn.Linear(2, 2), ["float32[300000000]"] * 4, None)


def test_values_follow_the_range_and_the_defaults() -> None:
    ids = parse_input_spec("int64[4096]:5..9").make()
    assert ids.dtype == torch.int64 and ids.min() >= 5 and ids.max() <= 8
    assert set(ids.unique().tolist()) == {5, 6, 7, 8}  # 4096 draws hit every value
    default = parse_input_spec("int32[4096]").make()
    assert set(default.unique().tolist()) == set(range(*DEFAULT_INT_RANGE))
    uniform = parse_input_spec("float64[4096]:-1..1").make()
    assert uniform.min() >= -1 and uniform.max() < 1 and uniform.std() < 0.7
    normal = parse_input_spec("float32[4096]").make()
    assert normal.min() < -1 and normal.max() > 1  # randn, not uniform in [0, 1)
    flags = parse_input_spec("bool[4096]").make()
    assert flags.dtype == torch.bool and set(flags.unique().tolist()) == {False, True}
    assert parse_input_spec("bfloat16[4,16]:-1..1").make().dtype == torch.bfloat16
    assert parse_input_spec("float32[]").make().shape == ()
    big = parse_input_spec(f"int64[64]:{2**53 - 4}..{2**53}").make()
    assert big.min() >= 2**53 - 4 and big.max() < 2**53
    assert parse_input_spec("uint8[8]:250..256").make().min() >= 250
    assert parse_input_spec("float16[8]:2..3").make().min() >= 2
    assert parse_input_spec("float32[2,3]").make().device.type == "cpu"


def test_specs_become_args_and_kwargs_in_order() -> None:
    args, kwargs, text = resolve_inputs(
        nn.Linear(2, 2), ["float32[2,3]", "mask=bool[2]", "int64[5]", "ids=int64[2,4]:0..10"], None)
    assert [a.shape for a in args] == [(2, 3), (5,)]
    assert list(kwargs) == ["mask", "ids"]
    assert kwargs["ids"].shape == (2, 4)
    assert text == "inputs from --input: float32[2,3], mask=bool[2], int64[5], ids=int64[2,4]:0..10"


def test_a_keyword_given_twice_is_an_error() -> None:
    with pytest.raises(UsageError, match="--input names x more than once"):
        resolve_inputs(nn.Linear(2, 2), ["x=float32[2]", "x=float32[3]"], None)


def test_input_and_example_inputs_together_is_an_error() -> None:
    with pytest.raises(UsageError, match="cannot be combined"):
        resolve_inputs(nn.Linear(2, 2), ["float32[2]"], "tests.x:y")


# -- --example-inputs --------------------------------------------------------------------------------

EXAMPLES_SOURCE = '''
import collections
import torch

Pair = collections.namedtuple("Pair", "left right")

def one_tensor():
    return torch.ones(2, 3)

def positional():
    return (torch.ones(2), torch.zeros(3))

def keywords():
    return {"input_ids": torch.ones(1, 4, dtype=torch.int64), "mask": torch.ones(1, 4)}

def both():
    return ((torch.ones(2),), {"scale": torch.ones(())})

def image_list():
    return [torch.rand(3, 8, 8), torch.rand(3, 6, 10)]

def nested():
    return ({"a": [torch.ones(1), (torch.ones(2), 3)], "b": Pair(torch.ones(1), "s")},)

CONSTANT = torch.ones(4)

def needs_argument(x):
    return x

def raises():
    raise ValueError("no data here")

def returns_number():
    return 3

def bad_keys():
    return {1: torch.ones(1)}
'''


@pytest.fixture
def examples_file(tmp_path: Path) -> str:
    path = tmp_path / "my_inputs.py"
    path.write_text(EXAMPLES_SOURCE, encoding="utf-8")
    yield str(path)
    sys.modules.pop("my_inputs", None)


def _example(examples_file: str, name: str) -> tuple[tuple[Any, ...], dict[str, Any], str]:
    return resolve_inputs(nn.Linear(2, 2), [], f"{examples_file}:{name}")


def test_example_tensor_is_one_positional_argument(examples_file: str) -> None:
    args, kwargs, text = _example(examples_file, "one_tensor")
    assert len(args) == 1 and torch.equal(args[0], torch.ones(2, 3)) and kwargs == {}
    assert text == f"inputs from --example-inputs {examples_file}:one_tensor: float32[2,3]"


def test_example_tuple_dict_and_both(examples_file: str) -> None:
    args, kwargs, _ = _example(examples_file, "positional")
    assert [a.shape for a in args] == [(2,), (3,)] and kwargs == {}
    args, kwargs, text = _example(examples_file, "keywords")
    assert args == () and list(kwargs) == ["input_ids", "mask"]
    assert text.endswith("input_ids=int64[1,4], mask=float32[1,4]")
    args, kwargs, _ = _example(examples_file, "both")
    assert [a.shape for a in args] == [(2,)] and list(kwargs) == ["scale"]


def test_example_list_is_one_argument_as_detection_models_take_it(examples_file: str) -> None:
    args, _, text = _example(examples_file, "image_list")
    assert len(args) == 1 and isinstance(args[0], list) and len(args[0]) == 2
    assert text.endswith("[float32[3,8,8], float32[3,6,10]]")


def test_example_value_that_is_not_callable(examples_file: str) -> None:
    args, _, _ = _example(examples_file, "CONSTANT")
    assert torch.equal(args[0], torch.ones(4))


@pytest.mark.parametrize(("name", "error", "message"), [
    ("needs_argument", LoadError, "takes no arguments"),
    ("raises", LoadError, "raised ValueError: no data here"),
    ("returns_number", UsageError, "returned a int: return a tensor, a list"),
    ("bad_keys", UsageError, "dict with key 1"),
    ("missing", LoadError, "has no attribute 'missing'"),
])
def test_example_errors(examples_file: str, name: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        _example(examples_file, name)


def test_nested_inputs_are_moved_recursively(examples_file: str) -> None:
    args, _, _ = _example(examples_file, "nested")
    moved = move_inputs(args, "meta")
    inner = moved[0]
    assert inner["a"][0].device.type == "meta"
    assert inner["a"][1][0].device.type == "meta" and inner["a"][1][1] == 3
    assert type(inner["b"]).__name__ == "Pair" and inner["b"].left.device.type == "meta"
    assert inner["b"].right == "s"
    assert args[0]["a"][0].device.type == "cpu"  # the original is not changed


def test_move_inputs_keeps_container_types() -> None:
    ordered = collections.OrderedDict(x=torch.ones(1))
    moved = move_inputs({"d": ordered, "l": [torch.ones(1)], "t": (torch.ones(1),), "n": None}, "meta")
    assert isinstance(moved["d"], collections.OrderedDict) and moved["d"]["x"].is_meta
    assert isinstance(moved["l"], list) and isinstance(moved["t"], tuple) and moved["n"] is None


def test_move_inputs_to_simulated_cuda() -> None:
    from placecheck.engines.engine import simulated_cuda

    with simulated_cuda(2):
        moved = move_inputs(({"x": torch.ones(2)}, [torch.ones(3)]), "cuda:1")
    assert str(moved[0]["x"].device) == "cuda:1" and str(moved[1][0].device) == "cuda:1"


def test_move_inputs_where_tensor_to_cuda_is_refused() -> None:
    """On the CPU-only torch build ``.to("cuda")`` of these fails under fake tensors; they move anyway."""
    from placecheck.engines.engine import simulated_cuda

    with simulated_cuda():
        moved = move_inputs([torch.ones(2, requires_grad=True), torch.ones(2, 3).t(),
                             torch.ones(2, dtype=torch.bfloat16)], "cuda")
    assert [str(t.device) for t in moved] == ["cuda:0"] * 3
    assert [t.requires_grad for t in moved] == [True, False, False]
    assert moved[1].shape == (3, 2) and moved[2].dtype == torch.bfloat16


# -- inference ---------------------------------------------------------------------------------------


class Convs(nn.Module):
    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.act = nn.ReLU()  # no parameters: passed over
        self.features = nn.Sequential(conv, nn.ReLU())
        self.head = nn.Linear(7, 2)


@pytest.mark.parametrize(("model", "shape", "origin"), [
    (Convs(nn.Conv1d(5, 8, 3)), (2, 5, 64), "features.0 (Conv1d)"),
    (Convs(nn.Conv2d(3, 8, 3)), (2, 3, 224, 224), "features.0 (Conv2d)"),
    (Convs(nn.Conv3d(4, 8, 3)), (2, 4, 16, 112, 112), "features.0 (Conv3d)"),
    (Convs(nn.ConvTranspose2d(6, 8, 3)), (2, 6, 224, 224), "features.0 (ConvTranspose2d)"),
    (nn.Sequential(nn.LayerNorm(12), nn.Linear(12, 4)), (2, 12), "1 (Linear)"),
    (nn.Linear(12, 4), (2, 12), "the model itself (Linear)"),
    (nn.LSTM(10, 20), (8, 2, 10), "the model itself (LSTM)"),
    (nn.GRU(10, 20, batch_first=True), (2, 8, 10), "the model itself (GRU)"),
    (nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2),
     (2, 16, 32), "layers.0 (TransformerEncoderLayer)"),
    (nn.TransformerEncoderLayer(32, 4, 64), (16, 2, 32), "the model itself (TransformerEncoderLayer)"),
])
def test_inference_per_layer_kind(model: nn.Module, shape: tuple[int, ...], origin: str) -> None:
    args, kwargs, text = resolve_inputs(model, [], None)
    assert kwargs == {} and len(args) == 1
    assert args[0].shape == shape and args[0].dtype == torch.float32
    assert text == f"inferred input float32[{','.join(map(str, shape))}] from {origin}"
    model.eval()
    with torch.no_grad():
        first = dict(model.named_modules())[origin.split(" (")[0].replace("the model itself", "")]
        first(args[0])  # the inferred input really fits the layer it was inferred from


def test_inference_for_embedding_uses_the_table_size() -> None:
    model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 2))
    args, _, text = infer_inputs(model)
    assert args[0].dtype == torch.int64 and args[0].shape == (2, 16)
    assert args[0].min() >= 0 and args[0].max() < 50
    assert text == "inferred input int64[2,16]:0..50 from 0 (Embedding)"
    model(*args)


def test_inference_follows_the_parameter_dtype() -> None:
    args, _, text = infer_inputs(nn.Linear(3, 1).to(torch.float64))
    assert args[0].dtype == torch.float64 and text.startswith("inferred input float64[2,3]")


def test_inference_makes_real_tensors_inside_the_fake_mode() -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    from placecheck.engines.engine import simulated_cuda

    with simulated_cuda():
        args, _, _ = infer_inputs(nn.Linear(3, 1))
        parsed, _, _ = resolve_inputs(nn.Linear(3, 1), ["float32[2]"], None)
    assert not isinstance(args[0], FakeTensor) and not isinstance(parsed[0], FakeTensor)


class NoLayers(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_cannot_infer_without_a_known_layer() -> None:
    with pytest.raises(UsageError) as info:
        infer_inputs(nn.Sequential(nn.ReLU(), nn.BatchNorm1d(3)))
    assert str(info.value) == ("cannot infer an input for Sequential: pass --input, "
                               "e.g. --input float32[1,3,224,224]")
    with pytest.raises(UsageError, match="cannot infer an input for NoLayers: pass --input"):
        infer_inputs(NoLayers())


def test_cannot_infer_from_a_lazy_layer() -> None:
    with pytest.raises(UsageError, match=r"its first layer, 0 \(LazyLinear\), does not fix its input"):
        infer_inputs(nn.Sequential(nn.LazyLinear(4), nn.Linear(4, 2)))


def test_cannot_infer_from_attention_and_does_not_mistake_its_projection_for_a_layer() -> None:
    class Attends(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2)
            self.head = nn.Linear(16, 2)

    with pytest.raises(UsageError, match=r"its first layer, attn \(MultiheadAttention\), takes query, key "
                                         r"and value; pass --input"):
        infer_inputs(Attends())


def test_describe_nested() -> None:
    text = describe((torch.ones(2), [torch.ones(1)] * 5), {"d": {"k": torch.ones(3, dtype=torch.int8)}})
    assert text == "float32[2], [float32[1], float32[1], float32[1], ...], d={k: int8[3]}"


# -- torchvision families (needs torchvision) -------------------------------------------------------


def test_torchvision_families_are_inferred() -> None:
    models = pytest.importorskip("torchvision.models")
    from placecheck.model.zoo import torchvision_family

    cases = [
        (models.resnet18(), "classification", [(2, 3, 224, 224)]),
        (models.inception_v3(init_weights=False, aux_logits=False), "classification", [(2, 3, 299, 299)]),
        (models.vit_b_32(image_size=64), "classification", [(2, 3, 64, 64)]),
        (models.video.r3d_18(), "video", [(2, 3, 16, 112, 112)]),
        (models.optical_flow.raft_small(), "optical flow", [(1, 3, 128, 128), (1, 3, 128, 128)]),
        (models.segmentation.lraspp_mobilenet_v3_large(weights_backbone=None), "segmentation",
         [(2, 3, 224, 224)]),
    ]
    for model, family, shapes in cases:
        args, _, text = infer_inputs(model)
        assert [tuple(a.shape) for a in args] == shapes, text
        assert f"for torchvision's {family} models ({type(model).__name__})" in text
        assert torchvision_family(model) is not None
    detector = models.detection.ssdlite320_mobilenet_v3_large(weights_backbone=None)
    args, _, text = infer_inputs(detector)
    assert isinstance(args[0], list) and [tuple(a.shape) for a in args[0]] == [(3, 320, 320), (3, 288, 352)]
    assert text == ("inferred input [float32[3,320,320], float32[3,288,352]] for torchvision's "
                    "detection models (SSD)")


def test_a_subclass_of_a_torchvision_model_is_in_its_family() -> None:
    models = pytest.importorskip("torchvision.models")
    from placecheck.model.zoo import torchvision_family

    class MyResNet(models.ResNet):  # type: ignore[misc]
        pass

    model = MyResNet(models.resnet.BasicBlock, [1, 1, 1, 1])
    assert torchvision_family(model) == ("classification", "ResNet")
    assert torchvision_family(Convs(nn.Conv2d(3, 3, 1))) is None


def test_the_examples_docstring_is_honest() -> None:
    """The module docstring's grammar line is the one error messages show."""
    import placecheck.model.inputs as inputs_module

    assert INPUT_GRAMMAR in textwrap.dedent(inputs_module.__doc__ or "")


# -- through the CLI ---------------------------------------------------------------------------------

CLI_TARGETS = '''
import torch
import torch.nn as nn

class NoLayers(nn.Module):
    def forward(self, x):
        return x * 2

class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 8)
        self.proj = nn.Linear(8, 2)

    def forward(self, ids, *, scale):
        return self.proj(self.embed(ids)) * scale

def two_inputs():
    return ((torch.randint(0, 100, (2, 5)),), {"scale": torch.ones(())})
'''


def _cli(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    from cli_runner import CliRunner

    from placecheck.cli import app

    path = tmp_path / "cli_targets.py"
    path.write_text(CLI_TARGETS, encoding="utf-8")
    try:
        result = CliRunner().invoke(app, ["audit", *(a.replace("@", f"{path}:") for a in args)])
    finally:
        sys.modules.pop("cli_targets", None)
    return result.exit_code, result.stdout, result.stderr


def _one_line_error(code: int, out: str, err: str) -> str:
    assert code == 2 and out == "", err
    lines = unwrapped(err).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_cli_cannot_infer_exits_2_with_one_line(tmp_path: Path) -> None:
    line = _one_line_error(*_cli(tmp_path, "@NoLayers"))
    assert line == ("placecheck: error: cannot infer an input for NoLayers: pass --input, "
                    "e.g. --input float32[1,3,224,224]")


def test_cli_bad_spec_exits_2_with_the_grammar(tmp_path: Path) -> None:
    line = _one_line_error(*_cli(tmp_path, "@NoLayers", "--input", "float32(2,3)"))
    assert f"expected {INPUT_GRAMMAR}" in line and "e.g. --input float32[1,3,224,224]" in line


def test_cli_input_and_example_inputs_together_exit_2(tmp_path: Path) -> None:
    line = _one_line_error(*_cli(tmp_path, "@NoLayers", "--input", "float32[2]",
                                 "--example-inputs", "@two_inputs"))
    assert "cannot be combined" in line


def test_cli_inputs_reach_the_forward_and_the_notes(tmp_path: Path) -> None:
    import json

    code, out, err = _cli(tmp_path, "@NoLayers", "--input", "float32[2,3]", "--format", "json")
    assert code == 0, err
    assert "forward: inputs from --input: float32[2,3]" in json.loads(out)["notes"]
    code, out, err = _cli(tmp_path, "@TwoInputs", "--example-inputs", "@two_inputs", "--format", "json")
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert any(n.startswith("forward: inputs from --example-inputs ") and
               n.endswith(":two_inputs: int64[2,5], scale=float32[]") for n in notes), notes
    code, out, err = _cli(tmp_path, "@TwoInputs", "--input", "int64[2,5]:0..100", "--format", "json")
    findings = json.loads(out)["findings"]  # the keyword-only argument is missing: PC207, not a crash
    assert code == 1 and [f["code"] for f in findings] == ["PC207"], err
    assert "scale" in findings[0]["message"]
