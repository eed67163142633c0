"""The simulation's known limits: every place where placecheck's simulated CUDA is held to a real GPU and
differs, with the reason. One table, read by ``tests/test_mix_table.py`` (the truth table's replay) and
by ``benchmarks/fidelity.py`` (``make fidelity``'s ``KNOWN_DIFFERENCES``); docs/simulation-limits.md
explains it. An entry that no longer differs fails the test that reads it: fix the simulation, then
delete the entry.

Keys are ``(table, name, variant, engine)``:

- ``("mix-table", case, variant, engine)``: a row of ``tests/data/mix-table.json`` replayed on the CPU
  (``benchmarks/mix_table.py``'s ``replay``) whose verdict or host sync differs from the GPU's;
- ``("fidelity", target, "", engine)``: a model ``benchmarks/fidelity.py`` audited on a GPU (the
  reference, ``--engine real``) whose findings differ from ``engine``'s.

Evidence is in ``tests/data/mix-table.json`` (every row: NVIDIA H200, torch 2.11.0+cu130, 2026-11-27; 320
of them first on an NVIDIA H100, 2026-11-25, with the same verdicts) and in the GPU runs that
docs/simulation-limits.md cites (benchmarks/results/gpu-h100-2026-11-25/, gpu-h200-2026-11-27/). The
replay runs this project's torch (2.14.1); an entry that is a difference of torch versions says so.
"""

from __future__ import annotations

_SORTED_INDICES_COPY = (
    "pack_padded_sequence(enforce_sorted=False) sorts the lengths on the CPU, as its documentation asks, and "
    "copies the sorted indices to the input's device: a blocking host-to-device copy the GPU's sync debug "
    "mode reports. placecheck does not report it: the code is correct and the copy is the API's own, "
    "nothing a user can change")
_FIRST_CUDA_OP = (
    "the first row the GPU ran: its sync debug mode counted one synchronisation in an add of two CUDA "
    "tensors, which synchronises nothing (no other all-CUDA elementwise row syncs): the process's first "
    "CUDA work (context and allocator warm-up), not the op")
_ASSUMED_SIZES = (
    "the fake engine assumes the upper bound of every data-dependent size (placecheck.engines.datadep: every "
    "element of a mask selected), so torchvision's batched_nms sees more boxes than the real run, whose "
    "random weights keep few or none; it takes the branch for many boxes (_batched_nms_vanilla: "
    "torch.unique and torch.where, PC204) or goes past the early return for no boxes to "
    "torch.tensor(1).to(boxes) (PC202). The findings are true of that code, which a GPU runs whenever "
    "detections are many; the real run did not reach it")
_ASSUMED_SIZES_MASKRCNN = (
    _ASSUMED_SIZES + ". On the H100 (2026-11-25) the fake engine could not audit these two at all (torch "
    "2.11 lacks FakeTensorDeviceMismatchError, which placecheck imported then; feature-detected by "
    "placecheck.engines.compat since); on the H200 (2026-11-27) they differ as fasterrcnn does (PC204 at "
    "torchvision/ops/boxes.py:115, 116 and 119 in roi_heads, only simulated), and the fake forward then "
    "stops in the mask head on the assumed sizes (an expand of a 0x0 tensor to 320x320: a note, not a "
    "finding); the tagged engine, which auto falls back to there, agrees with the GPU")
_DATA_FROM_THE_HOST = (
    "torch.tensor(data, device='cuda') (here the row's embedding indices and embedding_bag offsets) copies "
    "its Python data from pageable host memory to the device: a blocking copy the GPU's sync debug mode "
    "counts. placecheck does not report it: data written as Python values must come from the host, and "
    "creating the tensor directly on the device is what PC202's hint recommends (PLACEMENT.md). The "
    "verdict (ok or raises) agrees")
_SYNC_BEFORE_RAISING = (
    "torch.where(mask_cuda, x_cpu, 0.0): both the GPU and the simulation raise (a device mismatch); the GPU "
    "also counted one synchronisation on the way to its error, which no documented behaviour of where "
    "explains and which cannot matter to a program that crashes there. The verdict agrees")
_ADAGRAD_FUSED_BY_VERSION = (
    "a difference of torch versions, not of the simulation: the GPU ran torch 2.11, whose Adagrad calls "
    "_device_dtype_check_for_fused(p, cuda_unsupported=True) and refuses fused=True for CUDA parameters; "
    "torch 2.14.1 (this project's) calls _device_dtype_check_for_fused(p) and accepts them "
    "(torch/optim/adagrad.py), and the simulation runs 2.14.1's code. Re-verify on a GPU with the "
    "project's torch")
_LAYER_BUILT_IN_FORWARD_TAGGED = (
    "nn.LSTM(4, 4).to(x.device) / nn.GRU built in forward: the GPU counted 4 synchronisations, the blocking "
    "copies of the new layer's 4 parameters from the host. The fake engine reports them (PC202, a host "
    "allocation and a blocking copy on every call); the tagged engine moves a module's parameters in its own "
    "Module._apply handling, which the tracer does not see as a copy of tensors created in forward, so it "
    "reports nothing for a layer built in forward and moved. The verdicts (the hidden state's mismatch) "
    "agree")
_LIBRARY_SEES_FAKE_TENSORS = (
    "transformers 5 skips its value-reading checks when a tensor is a FakeTensor "
    "(transformers.utils.import_utils.is_tracing: isinstance(x, torch._subclasses.FakeTensor) counts as "
    "tracing): masking_utils' fast_all(padding_mask) (opt in 5.17, which still built an all-ones mask) and "
    "warn_if_padding_and_no_attention_mask's `pad_token_id in input_ids[:, [-1, 0]]` (deberta-v2) read "
    "values on a GPU (a host sync, info) and are skipped under fake tensors. Reproduced on the CPU with "
    "transformers 5.18.0 and torch 2.14.1: deberta-v2 fake reports nothing, tagged reports the `in` sync "
    "at modeling_utils.py:4592 (the GPU's 4566 in 5.17); with 4.57.6 (no such check) both engines report "
    "it. Not fixable without lying to the library about what a tensor is; the tagged engine (real values, "
    "no FakeTensor) sees these syncs")

_BOTH = ("fake", "tagged")

LIMITS: dict[tuple[str, str, str, str], str] = {
    **{("mix-table", "add", "all on cuda", e): _FIRST_CUDA_OP for e in _BOTH},
    **{("mix-table", case, "cpu: l", e): _SORTED_INDICES_COPY
       for case in ("pack_padded lengths", "grown host argument pack_padded unsorted") for e in _BOTH},
    **{("mix-table", "grown layer embedding weight", variant, e): _DATA_FROM_THE_HOST
       for variant in ("all on cuda", "cpu: w", "cpu: b", "cpu: w, b") for e in _BOTH},
    **{("mix-table", "grown host argument embedding_bag offsets", variant, e): _DATA_FROM_THE_HOST
       for variant in ("all on cuda", "cpu: x") for e in _BOTH},
    **{("mix-table", "grown index where mask", "cpu: x", e): _SYNC_BEFORE_RAISING for e in _BOTH},
    ("mix-table", "grown optim Adagrad fused", "all on cuda", "fake"): _ADAGRAD_FUSED_BY_VERSION,
    ("mix-table", "grown optim Adagrad fused", "cpu: s", "fake"): _ADAGRAD_FUSED_BY_VERSION,
    ("mix-table", "grown optim Adagrad fused", "all on cuda", "tagged"): _ADAGRAD_FUSED_BY_VERSION,
    **{("mix-table", f"grown layer {layer} h0", variant, "tagged"): _LAYER_BUILT_IN_FORWARD_TAGGED
       for layer in ("lstm", "gru") for variant in ("all on cuda", "cpu: w", "cpu: b", "cpu: w, b")},
    ("fidelity", "fasterrcnn_mobilenet_v3_large_fpn", "", "fake"): _ASSUMED_SIZES,
    ("fidelity", "fasterrcnn_resnet50_fpn", "", "fake"): _ASSUMED_SIZES,
    ("fidelity", "fasterrcnn_resnet50_fpn_v2", "", "fake"): _ASSUMED_SIZES,
    ("fidelity", "fcos_resnet50_fpn", "", "fake"): _ASSUMED_SIZES,
    ("fidelity", "retinanet_resnet50_fpn_v2", "", "fake"): _ASSUMED_SIZES,
    ("fidelity", "maskrcnn_resnet50_fpn", "", "fake"): _ASSUMED_SIZES_MASKRCNN,
    ("fidelity", "maskrcnn_resnet50_fpn_v2", "", "fake"): _ASSUMED_SIZES_MASKRCNN,
    ("fidelity", "transformers:opt", "", "fake"): _LIBRARY_SEES_FAKE_TENSORS,
    ("fidelity", "transformers:deberta-v2", "", "fake"): _LIBRARY_SEES_FAKE_TENSORS,
}
"""``(table, name, variant, engine)`` -> why the simulation differs there from a real GPU."""


def mix_table_limits() -> dict[tuple[str, str, str], str]:
    """The truth table's documented differences: ``(case, variant, engine)`` -> why."""
    return {(name, variant, engine): why for (table, name, variant, engine), why in LIMITS.items()
            if table == "mix-table"}


def fidelity_limits() -> dict[tuple[str, str], str]:
    """``make fidelity``'s known differences: ``(target, engine)`` -> why."""
    return {(name, engine): why for (table, name, _, engine), why in LIMITS.items() if table == "fidelity"}
