"""Hugging Face ``transformers`` models as placecheck targets, built from configs.

Each function is a zero-argument factory, the way a user's own module would
expose a model to placecheck::

    placecheck audit placecheck.examples.transformers_models:gpt2 \\
        --input input_ids=int64[1,128]:0..50257
    placecheck audit placecheck.examples.transformers_models:llama_70b --init meta \\
        --input input_ids=int64[1,128]:0..128256

No weights are downloaded: every model is built from its config with random
(or, under ``--init meta``, no) weights, and ``HF_HUB_OFFLINE=1`` is set before
``transformers`` is imported so that nothing reaches for the network.
``configs/transformers.toml`` lists these factories with their inputs.

``transformers`` is an optional extra: ``pip install 'placecheck[transformers]'``.
"""

from __future__ import annotations

import os
from typing import Any

import torch.nn as nn

# Set before transformers is imported: the configs below are complete, and a
# closed network must not turn a config lookup into a long timeout.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

GPT2_VOCAB = 50257
BERT_VOCAB = 30522
T5_VOCAB = 32128
LLAMA2_VOCAB = 32000
LLAMA3_VOCAB = 128256


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # the optional extra is not installed
        raise ImportError("these examples need the transformers extra: "
                          "pip install 'placecheck[transformers]'") from exc
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    return transformers


def _eval(model: nn.Module) -> nn.Module:
    # transformers attaches its own config object; eval() keeps dropout out of the forward.
    return model.eval()


def gpt2() -> nn.Module:
    """GPT-2 small (124M parameters): 12 layers, 768 wide, 1024 positions."""
    tf = _transformers()
    return _eval(tf.GPT2LMHeadModel(tf.GPT2Config()))


def bert(attention: str = "eager") -> nn.Module:
    """BERT base (110M parameters), the encoder with its pooler.

    Eager attention by default: transformers' SDPA path checks
    ``torch.all(mask == 1)`` on the host in every forward
    (``_prepare_4d_attention_mask_for_sdpa``), a real device-to-host sync
    that placecheck reports as PC204; ``--arg attention=sdpa`` shows it.
    """
    tf = _transformers()
    return _eval(tf.BertModel(tf.BertConfig(attn_implementation=attention)))


def t5() -> nn.Module:
    """T5 small (60M parameters), encoder-decoder with a language-model head."""
    tf = _transformers()
    return _eval(tf.T5ForConditionalGeneration(tf.T5Config()))


def _llama(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
           vocab: int) -> nn.Module:
    tf = _transformers()
    config = tf.LlamaConfig(
        hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
        max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False,
    )
    return _eval(tf.LlamaForCausalLM(config))


def llama_7b() -> nn.Module:
    """A Llama-shaped 7B model (Llama 2 7B's layout): 32 layers, 4096 wide, 32 heads.

    About 6.7e9 parameters, 27 GB in float32: more than this 24 GiB machine
    holds, so ``--init auto`` builds it on the meta device.
    """
    return _llama(hidden=4096, intermediate=11008, layers=32, heads=32, kv_heads=32, vocab=LLAMA2_VOCAB)


def llama_8b() -> nn.Module:
    """A Llama-shaped 8B model (Llama 3 8B's layout): 32 layers, 4096 wide, GQA with 8 KV heads.

    About 8.0e9 parameters, 32 GB in float32: the size that needs several 24 GiB GPUs, as in
    ``--init meta --device-map auto --gpus 4 --gpu-memory 24GiB``.
    """
    return _llama(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=LLAMA3_VOCAB)


def llama_70b() -> nn.Module:
    """A Llama-shaped 70B model (Llama 3 70B's layout): 80 layers, 8192 wide, GQA with 8 KV heads.

    About 7.1e10 parameters, 282 GB in float32: audited with ``--init meta``
    it needs well under 2 GiB of host memory.
    """
    return _llama(hidden=8192, intermediate=28672, layers=80, heads=64, kv_heads=8, vocab=LLAMA3_VOCAB)


def llama_tiny() -> nn.Module:
    """The same architecture at toy size (2 layers, 64 wide), for quick tests."""
    return _llama(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=LLAMA2_VOCAB)
