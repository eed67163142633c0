"""The truth table (tests/data/mix-table.json), replayed on the CPU through each simulating engine.

Every row a GPU verified (an NVIDIA H100, torch 2.11.0+cu130, 2026-11-25: the table's provenance)
says what PyTorch did with one op and one placement of its arguments: ``ok`` or ``raises``, and how
many host synchronisations its sync debug mode reported. Each engine must give the same verdict, and
report a host sync (PC204, or PC205's blocking host-to-device copy) where the GPU reported one; every
row where it does not is listed, with its reason, in :data:`placecheck.basics.limits.LIMITS`, and an entry
there that no longer differs fails. ``placecheck run`` simulates with the tagged engine, replayed here.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from placecheck.basics.limits import mix_table_limits

pytestmark = pytest.mark.cpu_build  # runs on the CPU-only torch build too (Makefile: test-cpu-build)

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("fake", "tagged")


def _mix_table() -> Any:
    spec = importlib.util.spec_from_file_location("_pc_mix_table", REPO / "benchmarks" / "mix_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


mix_table = _mix_table()
ROWS = mix_table.verified_rows()


@functools.cache
def _differences(engine: str) -> dict[tuple[str, str], str]:
    """``(case, variant)`` -> what differs, for every verified row ``engine`` does not agree on."""
    out = {}
    for row in ROWS:
        got = mix_table.replay(row["case"], row["variant"], engine)
        if not mix_table.agrees(row, got):
            out[(row["case"], row["variant"])] = (f"GPU {row['outcome']} with {row['syncs']} syncs, {engine} "
                                                  f"{got.verdict} {got.codes}")
    return out


def test_the_table_holds_its_provenance_and_keeps_unverified_rows_apart() -> None:
    table = mix_table.load()
    assert "H100" in table["provenance"]["verified"] and "2.11.0" in table["provenance"]["verified"]
    assert len(ROWS) >= 320
    assert {r["verified_on"] for r in ROWS} == {"NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, 2026-11-25"}
    unverified = [r for r in table["rows"] if not r.get("verified_on")]
    assert all(r["outcome"] is None for r in unverified)  # no verdict without a GPU
    assert len(table["rows"]) >= 600
    # every row names a case the generator still has, with the same arguments on the CPU
    for row in table["rows"]:
        assert list(mix_table.cpu_arguments(row["case"], row["variant"])) == row["cpu"], row


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_agrees_with_the_gpu_on_98_percent_and_documents_the_rest(engine: str) -> None:
    differ = _differences(engine)
    limits = {(case, variant) for case, variant, e in mix_table_limits() if e == engine}
    undocumented = {k: v for k, v in differ.items() if k not in limits}
    assert undocumented == {}, "rows that differ from the GPU, not in placecheck.basics.limits.LIMITS"
    stale = sorted(limits - set(differ))
    assert stale == [], "entries of placecheck.basics.limits.LIMITS whose rows no longer differ: delete them"
    assert len(ROWS) - len(differ) >= 0.98 * len(ROWS), (len(differ), len(ROWS))


def test_a_replay_can_disagree() -> None:
    """The comparison is not vacuous: a row with the GPU's verdict flipped disagrees."""
    row = next(r for r in ROWS if r["case"] == "clamp min 0-dim" and r["variant"] == "cpu: m")
    got = mix_table.replay(row["case"], row["variant"], "fake")
    assert got.verdict == "raises" and "PC201" in got.codes
    assert not mix_table.agrees({**row, "outcome": "ok"}, got)
    synced = next(r for r in ROWS if r["case"] == "item of cuda")
    assert mix_table.agrees(synced, mix_table.replay(synced["case"], synced["variant"], "tagged"))
    assert not mix_table.agrees(synced, mix_table.Replayed("ok", False, ()))
