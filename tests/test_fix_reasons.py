"""Where ``placecheck fix`` makes no edit, it says why in one line (issue 43 item 3).

Every code is either rewritten (:data:`~placecheck.fix.codes.AUTOFIX`) or has the reason no edit is
safe (:data:`~placecheck.fix.codes.NEVER`); each rewrite that finds nothing it may change at the
finding's line says what it looked for and what it found instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("libcst")  # the fix extra

from placecheck.basics.codes import Code
from placecheck.fix.codes import AUTOFIX, NEVER, fixable_text
from placecheck.fix.edits import NotFixable, Request, rewrite

pytestmark = pytest.mark.compat

VAGUE = ("not fixable", "not rewritten automatically", "knows how to rewrite", "no rewrite in placecheck fix")


def test_every_code_is_rewritten_or_says_why_not_in_one_line() -> None:
    codes = {c.value for c in Code}
    assert set(AUTOFIX) | set(NEVER) == codes, sorted(codes - set(AUTOFIX) - set(NEVER))
    assert not set(AUTOFIX) & set(NEVER)
    for code, reason in NEVER.items():
        assert "\n" not in reason and len(reason) > 40, code
        assert not any(v in reason for v in VAGUE), (code, reason)
        assert fixable_text(code) == f"not auto-fixable: {reason}."


def _refused(source: str, request: Request) -> str:
    out = rewrite(source, request)
    assert isinstance(out, NotFixable), out
    assert "\n" not in out.reason and not any(v in out.reason for v in VAGUE), out.reason
    return out.reason


MODEL = ("import torch\nimport numpy as np\nfrom torch import nn\nclass M(nn.Module):\n"
         "    def __init__(self):\n        super().__init__()\n        setattr(self, 'mask', torch.ones(2))\n"
         "    def forward(self, x):\n        return x + torch.from_numpy(np.ones(2))\n")


@pytest.mark.parametrize("request_, said", [
    (Request("PC101", 7, where="mask"), "line 7 does not assign `self.mask = ...` by itself (setattr"),
    (Request("PC102", 7, where="heads[0]"), "line 7 does not assign `self.heads = ...` by itself (setattr"),
    (Request("PC202", 9, op="torch.zeros"), "no torch.zeros call at line 9"),
    (Request("PC202", 9, op="torch.from_numpy"), "torch.from_numpy takes no device= and shares the array's"),
    (Request("PC202", 9), "made some other way (torch.from_numpy"),
    (Request("PC301", 9), "no torch.load call at line 9"),
    (Request("PC201", 9, where="y", batch="batch[1]", use=9), "no for loop starts at line 9"),
], ids=["buffer", "container", "factory-named", "from-numpy", "factory", "load", "batch"])
def test_a_rewrite_that_finds_nothing_at_the_line_says_what_it_looked_for(request_: Request,
                                                                          said: str) -> None:
    assert said in _refused(MODEL, request_)


def test_a_code_without_a_rewrite_is_answered_with_its_reason_by_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from placecheck.basics.options import AuditOptions
    from placecheck.fix import fix

    (tmp_path / "sync.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n    def __init__(self) -> None:\n"
        "        super().__init__()\n        self.proj = nn.Linear(4, 4)\n\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        y = self.proj(x)\n"
        "        if y.sum() > 0:\n            return y\n        return -y\n")
    monkeypatch.chdir(tmp_path)
    result = fix("sync.py:Model", AuditOptions())
    assert not result.edits and [u.finding.code for u in result.not_fixable] == ["PC204"], result.summary()
    assert result.not_fixable[0].reason == NEVER[Code.PC204]
    assert f"  not fixed: PC204 sync.py:12: {NEVER[Code.PC204]}" in result.summary()
