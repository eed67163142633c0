"""Popular models nobody here wrote audit with no error or warning under simulated CUDA.

transformers models from tiny configs (GPT-2, GPT-J, Llama, Mixtral, Qwen2-MoE,
BERT, T5, Whisper, CLIP) and 30 timm architectures. Each must exit 0 at the
default ``--fail-on warning``: what these libraries do on purpose (a 0-dim
scalar attribute, a table their forward moves lazily, a host sync inside their
own attention-mask code) is an ``info`` finding at most. A genuine placement bug
found in one of these libraries is listed in the README, never suppressed here.

Skipped when ``transformers`` or ``timm`` is absent (``make install`` installs both).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

import placecheck
from placecheck.findings.finding import Severity

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _no_warning_or_error(report: placecheck.Report) -> None:
    loud = [(f.code, f.severity.value, f.where, f.message) for f in report.findings
            if f.severity.rank >= Severity.WARNING.rank]
    assert loud == [], report.notes
    assert report.ok
    assert not report.incomplete, report.notes
    assert any(n.startswith("forward: ") for n in report.notes)  # the forward ran


# -- transformers, tiny configs ----------------------------------------------------------------

_LAYERS = dict(num_hidden_layers=2, num_attention_heads=4, vocab_size=1000)
_IDS = "input_ids=int64[1,16]:0..1000"


def _transformers_models() -> dict[str, tuple[Callable[[], Any], list[str]]]:
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    return {
        "gpt2": (lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64)), [_IDS]),
        "gptj": (lambda: tf.GPTJForCausalLM(tf.GPTJConfig(
            n_layer=2, n_embd=64, n_head=4, rotary_dim=8, vocab_size=1000, n_positions=64)), [_IDS]),
        "llama": (lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_key_value_heads=2, **_LAYERS)), [_IDS]),
        "mixtral": (lambda: tf.MixtralForCausalLM(tf.MixtralConfig(
            hidden_size=64, intermediate_size=128, num_key_value_heads=2, num_local_experts=4,
            num_experts_per_tok=2, **_LAYERS)), [_IDS]),
        "qwen2_moe": (lambda: tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
            hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
            num_key_value_heads=2, **_LAYERS)), [_IDS]),
        "bert": (lambda: tf.BertModel(tf.BertConfig(hidden_size=64, intermediate_size=128, **_LAYERS)),
                 [_IDS, "attention_mask=int64[1,16]:1..2"]),
        "t5": (lambda: tf.T5Model(tf.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
                                              vocab_size=1000)),
               [_IDS, "decoder_input_ids=int64[1,8]:0..1000"]),
        "whisper": (lambda: tf.WhisperModel(tf.WhisperConfig(
            d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=80,
            max_source_positions=32, max_target_positions=32, vocab_size=1000, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)),
                    ["input_features=float32[1,80,64]", "decoder_input_ids=int64[1,8]:0..1000"]),
        "clip": (lambda: tf.CLIPModel(tf.CLIPConfig(
            text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, vocab_size=1000, max_position_embeddings=32),
            vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, image_size=32, patch_size=8))),
                 [_IDS, "pixel_values=float32[1,3,32,32]"]),
    }


TRANSFORMERS = ["gpt2", "gptj", "llama", "mixtral", "qwen2_moe", "bert", "t5", "whisper", "clip"]


@pytest.mark.transformers
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformers_tiny_config_has_no_warning(name: str) -> None:
    factory, inputs = _transformers_models()[name]
    report = placecheck.audit(factory, "cuda", inputs=inputs, target=name)
    _no_warning_or_error(report)


@pytest.mark.transformers
def test_gptj_scalar_attribute_is_reported_as_info() -> None:
    """GPT-J keeps ``scale_attn = torch.sqrt(torch.tensor(head_dim))`` as a plain attribute: .to()
    leaves it on the CPU, and its forward uses it only as a scalar, which is legal: info, not hidden."""
    factory, inputs = _transformers_models()["gptj"]
    report = placecheck.audit(factory, "cuda", inputs=inputs, target="gptj")
    scalars = [f for f in report.findings if f.where.endswith("attn.scale_attn")]
    assert scalars, [(f.code, f.where) for f in report.findings]
    assert {f.severity for f in scalars} == {Severity.INFO}


# -- timm ----------------------------------------------------------------------------------------

TIMM = [
    "resnet18", "resnet10t", "resnet50d", "efficientnet_b0", "mobilenetv3_small_100", "mobilenetv2_050",
    "vit_tiny_patch16_224", "deit_tiny_patch16_224", "convnext_atto", "regnetx_002", "densenet121",
    "swin_tiny_patch4_window7_224", "mixer_s32_224", "efficientformer_l1", "levit_128s", "mobilevit_xxs",
    "coat_lite_tiny", "crossvit_tiny_240", "poolformer_s12", "ghostnet_100", "dla34", "dpn68",
    "hrnet_w18_small", "xception41", "res2net50_14w_8s", "resnest14d", "rexnet_100",
    "tf_efficientnetv2_b0", "edgenext_xx_small", "eva02_tiny_patch14_224",
]


def test_thirty_timm_architectures() -> None:
    assert len(set(TIMM)) == 30


@pytest.mark.parametrize("name", TIMM)
def test_timm_architecture_has_no_warning(name: str) -> None:
    timm = pytest.importorskip("timm")
    channels, height, width = timm.create_model(name, pretrained=False).pretrained_cfg["input_size"]
    report = placecheck.audit(lambda: timm.create_model(name, pretrained=False), "cuda",
                              inputs=[f"float32[1,{channels},{height},{width}]"], target=name)
    _no_warning_or_error(report)
