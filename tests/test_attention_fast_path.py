"""``nn.MultiheadAttention`` keeps its inference fast path under the tracer, and that hides nothing.

The tracer runs an attention whose every tensor is already on the target with
torch functions disabled (the fused kernel a traced ViT would otherwise leave).
Each configuration here is audited with that fast path and with every call of
the attention traced: the findings must be the same, so no host sync and no
device mismatch inside attention goes unseen; configurations that do mix
devices must still be found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
from forward_helpers import ungrouped  # noqa: F401 (the fixture)

import placecheck
from placecheck.checks import trace

pytestmark = [pytest.mark.usefixtures("ungrouped"), pytest.mark.cpu_build]

Call = Callable[[nn.MultiheadAttention, torch.Tensor], torch.Tensor]

CALLS: dict[str, Call] = {
    "plain": lambda m, x: m(x, x, x, need_weights=False)[0],
    "weights": lambda m, x: m(x, x, x)[0],
    "bool key_padding_mask": lambda m, x: m(x, x, x, need_weights=False, key_padding_mask=torch.zeros(
        2, 5, dtype=torch.bool, device=x.device))[0],
    "float key_padding_mask": lambda m, x: m(
        x, x, x, key_padding_mask=torch.zeros(2, 5, device=x.device), need_weights=False)[0],
    "bool attn_mask": lambda m, x: m(
        x, x, x, attn_mask=torch.zeros(5, 5, dtype=torch.bool, device=x.device), need_weights=False)[0],
    "causal": lambda m, x: m(x, x, x, attn_mask=nn.Transformer.generate_square_subsequent_mask(
        5, device=x.device), is_causal=True, need_weights=False)[0],
    # these mix devices: the traced path runs them, and the mismatch is found
    "CPU key_padding_mask": lambda m, x: m(
        x, x, x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool), need_weights=False)[0],
    "CPU attn_mask": lambda m, x: m(x, x, x, attn_mask=torch.zeros(5, 5), need_weights=False)[0],
}
MIXED = {"CPU key_padding_mask", "CPU attn_mask"}


class _Attends(nn.Module):
    def __init__(self, call: Call) -> None:
        super().__init__()
        self.call = call
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.call(self.attn, x)


def _findings(call: Call) -> list[tuple[str, str, str]]:
    report = placecheck.audit(lambda: _Attends(call), "cuda", engine="fake", inputs=["float32[2,5,8]"])
    return sorted((f.code, f.source, f.message) for f in report.findings)


@pytest.mark.parametrize("name", list(CALLS))
def test_the_attention_fast_path_hides_no_finding(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _findings(CALLS[name])
    monkeypatch.setattr(trace, "_attention_fast_path_kept", lambda target: contextlib.nullcontext())
    traced = _findings(CALLS[name])
    assert fast == traced
    assert ("PC201" in {code for code, _, _ in fast}) == (name in MIXED), fast
