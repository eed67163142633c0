"""PC203's rewrite (issue 43): a layer or parameter built in forward with constant sizes is built in
``__init__``; one whose size reads the input is refused in one line naming its ``nn.Lazy*`` twin.

The rewrites are read as text here (:func:`placecheck.fix.edits.rewrite`, no torch); the fixture pair
``tests/fixtures/fix/pc203_layer_built_in_forward.py`` is fixed, proven by a re-audit and written by
``tests/test_fix.py`` like every other pair.
"""

from __future__ import annotations

import pytest

pytest.importorskip("libcst")  # the fix extra

from placecheck.fix.edits import NotFixable, Request, Rewrite, rewrite

pytestmark = pytest.mark.compat

GUARDED = '''import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.head = None  # built on the first call

    def forward(self, x):
        x = self.embed(x)
        if self.head is None:
            self.head = nn.Linear(8, 2, device=x.device)
        return self.head(x)
'''

EVERY_CALL = '''import torch.nn as nn

HIDDEN = 8


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, HIDDEN)
        self.classes = 2

    def forward(self, x):
        self.head = nn.Linear(HIDDEN, self.classes, bias=False)  # a new layer on every call
        return self.head(self.embed(x))
'''


def _line(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def _rewritten(source: str, text: str) -> Rewrite:
    out = rewrite(source, Request("PC203", _line(source, text), where="head"))
    assert isinstance(out, Rewrite), out
    return out


def test_a_guarded_layer_replaces_its_placeholder_and_its_device_from_the_input_is_dropped() -> None:
    out = _rewritten(GUARDED, "self.head = nn.Linear(")
    placeholder = _line(GUARDED, "self.head = None")
    assert (out.start, out.end) == (placeholder, placeholder)
    assert out.after == "        self.head = nn.Linear(8, 2)\n"  # .to() moves it with the model
    # the guard stays, never true again: the rest of the file is as it was
    assert out.source == GUARDED.replace(out.before, out.after)
    assert "state_dict()" in out.note


def test_a_layer_built_on_every_call_leaves_forward_for_the_end_of_init() -> None:
    out = _rewritten(EVERY_CALL, "self.head = nn.Linear(")
    assert "        self.classes = 2\n        self.head = nn.Linear(HIDDEN, self.classes, bias=False)\n" \
        in out.source
    forward = out.source.split("def forward", 1)[1]
    assert "nn.Linear" not in forward and "return self.head(self.embed(x))" in forward
    assert (out.start, out.end) == (_line(EVERY_CALL, "self.classes = 2"), _line(EVERY_CALL, "a new layer"))


REFUSED = '''import torch
import torch.nn as nn


class Gate(nn.Module):
    def forward(self, x):
        if not hasattr(self, "scale"):
            self.scale = nn.Parameter(torch.ones(4))
        return x * self.scale


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = None
        self.width = 4

    def forward(self, x):
        if self.head is None:
            self.head = nn.Linear(x.shape[-1], x.shape[-1] // 2)
        if self.tail is None:
            self.tail = nn.Conv1d(self.width, 2, 1)
        setattr(self, "other", nn.Linear(4, 4))
        return self.head(x)


class Wrapper(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn


class Applied(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = None

    def forward(self, x):
        if self.f is None:
            self.f = Wrapper(lambda t: t * 2)
        return self.f.fn(x)
'''


@pytest.mark.parametrize("text, said", [
    ("nn.Linear(x.shape", "a layer built in forward whose arguments read `x` cannot move to __init__ as "
                          "it is: build it there as nn.LazyLinear, which infers the input size on the first "
                          "call"),
    ("nn.Parameter(", "class Gate has no __init__ of its own to build the parameter in"),
    ("setattr(", "does not build it as `self.name = Layer(...)` by itself"),
    ("Wrapper(lambda", "a layer built in forward whose arguments make a function (a lambda) cannot move to "
                       "__init__ as it is"),
], ids=["size-from-the-input", "no-init", "not-an-assignment", "a-lambda"])
def test_where_no_edit_is_safe_the_refusal_says_why_in_one_line(text: str, said: str) -> None:
    out = rewrite(REFUSED, Request("PC203", _line(REFUSED, text), where="head"))
    assert isinstance(out, NotFixable), out
    assert said in out.reason and "\n" not in out.reason


@pytest.mark.parametrize("built, lazy", [
    ("nn.Linear(x.shape[-1], 2)", "nn.LazyLinear(2)"),
    ("nn.Linear(in_features=x.size(-1), out_features=2, bias=False)",
     "nn.LazyLinear(out_features=2, bias=False)"),
    ("nn.Conv2d(x.shape[1], 16, 3, padding=1)", "nn.LazyConv2d(16, 3, padding=1)"),
    ("nn.BatchNorm1d(x.shape[1], momentum=0.01)", "nn.LazyBatchNorm1d(momentum=0.01)"),
], ids=["linear", "keywords", "conv", "norm"])
def test_a_layer_whose_input_size_alone_reads_the_input_is_built_as_its_lazy_twin(built: str,
                                                                                  lazy: str) -> None:
    source = GUARDED.replace("nn.Linear(8, 2, device=x.device)", built)
    out = _rewritten(source, "self.head = nn.")
    assert out.after == f"        self.head = {lazy}\n"
    assert "nn.Lazy" in out.note and "input size" in out.note


@pytest.mark.parametrize("built, said", [
    ("nn.Linear(x.shape[-1], x.shape[-1] // 2)", "read `x`"),  # the output size too: no twin infers it
    ("Linear(x.shape[-1], 2)", "read `x`"),  # a bare name: its twin may not be imported
    ("nn.Dropout(x.shape[-1] / 100)", "build it there from sizes __init__ knows"),  # no twin at all
], ids=["output-size", "bare-name", "no-twin"])
def test_a_size_other_than_the_input_size_read_from_the_input_is_refused(built: str, said: str) -> None:
    source = GUARDED.replace("nn.Linear(8, 2, device=x.device)", built)
    if built.startswith("Linear("):
        source = source.replace("import torch.nn as nn\n",
                                "import torch.nn as nn\nfrom torch.nn import Linear\n")
    out = rewrite(source, Request("PC203", _line(source, f"self.head = {built}"), where="head"))
    assert isinstance(out, NotFixable), out
    assert said in out.reason


def test_an_attribute_init_sets_after_the_placeholder_is_not_read_before_it_is_set() -> None:
    # self.width is set after self.head's placeholder: building the layer there would read it unset
    source = REFUSED.replace("nn.Linear(x.shape[-1], x.shape[-1] // 2)", "nn.Linear(self.width, 2)")
    out = rewrite(source, Request("PC203", _line(source, "nn.Linear(self.width"), where="head"))
    assert isinstance(out, NotFixable) and "`self.width`, which __init__ does not set first" in out.reason
