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

Evidence is in ``tests/data/mix-table.json`` (NVIDIA H100, torch 2.11.0+cu130, 2026-11-25) and in the
GPU runs that docs/simulation-limits.md cites.
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
_NO_FAKE_MISMATCH_ERROR = (
    "torch 2.11 (the GPU machine's) has no FakeTensorDeviceMismatchError, which placecheck imported; the "
    "fake engine could not audit it there (the import is feature-detected by placecheck.engines.compat "
    "since)")
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

LIMITS: dict[tuple[str, str, str, str], str] = {
    ("mix-table", "add", "all on cuda", "fake"): _FIRST_CUDA_OP,
    ("mix-table", "add", "all on cuda", "tagged"): _FIRST_CUDA_OP,
    ("mix-table", "pack_padded lengths", "cpu: l", "fake"): _SORTED_INDICES_COPY,
    ("mix-table", "pack_padded lengths", "cpu: l", "tagged"): _SORTED_INDICES_COPY,
    ("fidelity", "fasterrcnn_mobilenet_v3_large_fpn", "", "fake"): _ASSUMED_SIZES,
    ("fidelity", "fasterrcnn_resnet50_fpn", "", "fake"): _ASSUMED_SIZES,
    ("fidelity", "fasterrcnn_resnet50_fpn_v2", "", "fake"): _ASSUMED_SIZES,
    ("fidelity", "fcos_resnet50_fpn", "", "fake"): _ASSUMED_SIZES,
    ("fidelity", "retinanet_resnet50_fpn_v2", "", "fake"): _ASSUMED_SIZES,
    ("fidelity", "maskrcnn_resnet50_fpn", "", "fake"): _NO_FAKE_MISMATCH_ERROR,
    ("fidelity", "maskrcnn_resnet50_fpn_v2", "", "fake"): _NO_FAKE_MISMATCH_ERROR,
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
