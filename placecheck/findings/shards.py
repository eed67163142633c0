"""``--shard K/N`` and ``placecheck merge``: one config's models split over N CI jobs, then one report.

A CI system's own parallelism (a GitHub Actions matrix) runs the shards; placecheck
only says which models each shard audits and how to put the shards' JSON reports
back together:

- A model's shard is a stable hash of its name in reports (``name``, else ``target``):
  adding or removing a model never moves another one to a different shard
  (:func:`shard_of`).
- A sharded run's JSON report carries a ``run`` object (:func:`run_info`): the
  placecheck version, a digest of the config's text, the options that change
  findings or their judging, the shard, and each model's position in the config.
- :func:`combine` reads the shard reports and refuses, with one line, reports of
  different placecheck versions, configs or options, a shard given twice, and a
  missing shard; it returns the models' reports in config order. The baseline is
  applied once, by ``placecheck merge``, to the combined run (a shard does not apply
  it: an entry is stale only when no shard found its finding), and ``allow`` entries
  were applied once, in the one shard that audited their model.

torch-free, like the config it reads.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from placecheck.basics.codes import Code
from placecheck.basics.config import RunConfig
from placecheck.basics.errors import UsageError
from placecheck.basics.version import VERSION
from placecheck.findings.formats.json import report_from_dict
from placecheck.findings.report import Report

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """The ``index``-th (from 1) of ``count`` shards."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """``"2/4"`` -> ``Shard(2, 4)``; a :class:`UsageError` for anything but ``K/N`` with 1 <= K <= N."""
    match = _SPEC.match(text)
    if match is None:
        raise UsageError(f"--shard {text!r}: expected K/N, the K-th of N shards, e.g. --shard 1/4")
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 1 <= index <= count:
        raise UsageError(f"--shard {text!r}: K must be between 1 and N (shards are numbered from 1), "
                         f"e.g. --shard 1/{max(count, 1)}")
    return Shard(index, count)


def shard_of(label: str, count: int) -> int:
    """The shard (1..count) of the model named ``label``: a stable hash, the same on every machine."""
    digest = hashlib.sha256(label.encode("utf-8")).digest()
    return 1 + int.from_bytes(digest[:8], "big") % count


def select(config: RunConfig, shard: Shard) -> tuple[RunConfig, list[int]]:
    """The config with only ``shard``'s models, and their positions in the whole config."""
    positions = [i for i, m in enumerate(config.models) if shard_of(m.label, shard.count) == shard.index]
    return replace(config, models=tuple(config.models[i] for i in positions)), positions


def run_info(config: RunConfig, shard: Shard, positions: Sequence[int], options: Mapping[str, Any],
             baseline: str | None) -> dict[str, Any]:
    """The ``run`` object of a shard's JSON report: what :func:`combine` needs and checks.

    ``options``: what changes the findings or their judging (the command line's model
    overrides, ``fail_on``, ``group``, ``hints``); ``baseline``: the file ``placecheck merge``
    applies (the command line's, else the config's).
    """
    return {
        "placecheck_version": VERSION,
        "config": config.path,
        "config_sha256": hashlib.sha256(config.text.encode("utf-8")).hexdigest(),
        "options": dict(options),
        "baseline": baseline,
        "shard": {"index": shard.index, "count": shard.count},
        "positions": list(positions),
    }


@dataclass(frozen=True)
class Combined:
    """The shards put back together: one run's reports, in config order, and how to judge them."""

    reports: tuple[Report, ...]
    options: dict[str, Any]
    """The recorded ``options`` of :func:`run_info` (the same in every shard)."""
    baseline: str | None
    load_errors: tuple[tuple[str, str], ...]
    """``(model, message)`` of each model that did not load: the run exits 2, as one run would."""


_INCOMPLETE = Code.PC901
"""runner.INCOMPLETE, named here without importing the runner (a layer above)."""

_SAME = ("placecheck_version", "config_sha256", "options", "baseline")
"""What every shard of one run shares: a difference means the reports are of different runs."""


def _read(path: str) -> dict[str, Any]:
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path!r} is not JSON (line {exc.lineno}): pass the --format json report "
                         "of a `placecheck audit --config ... --shard K/N` run") from None
    run = data.get("run") if isinstance(data, dict) else None
    if not isinstance(run, dict) or not isinstance(run.get("shard"), dict) \
            or not isinstance(data.get("models"), list):
        raise UsageError(f"{path!r} is not a shard report: pass the --format json output of "
                         "`placecheck audit --config ... --shard K/N`")
    return dict(data)


def _describe(key: str, value: Any) -> str:
    return {"placecheck_version": f"placecheck {value}", "config_sha256": f"config digest {str(value)[:12]}",
            "baseline": f"baseline {value!r}"}.get(key, f"options {json.dumps(value, sort_keys=True)}")


def combine(paths: Sequence[str]) -> Combined:
    """Read the shards' reports (``--format json`` of ``--shard K/N`` runs) into one run."""
    if not paths:
        raise UsageError("no reports given: pass the JSON report of every shard")
    loaded = [(path, _read(path)) for path in paths]
    first_path, first = loaded[0]
    first_run = first["run"]
    count = first_run["shard"].get("count")
    seen: dict[int, str] = {}
    placed: list[tuple[int, Report]] = []
    for path, data in loaded:
        run = data["run"]
        for key in _SAME:
            if run.get(key) != first_run.get(key):
                raise UsageError(f"{path!r} and {first_path!r} are shards of different runs "
                                 f"({_describe(key, run.get(key))} vs {_describe(key, first_run.get(key))}):"
                                 " merge the reports of one run, made with the same placecheck, config "
                                 "and options")
        shard = run["shard"]
        index = shard.get("index")
        if shard.get("count") != count:
            raise UsageError(f"{path!r} is shard {index}/{shard.get('count')}, {first_path!r} is one of "
                             f"{count}: merge the shards of one split")
        if index in seen:
            raise UsageError(f"shard {index}/{count} is given twice ({seen[index]!r} and {path!r}): "
                             "pass each shard's report once")
        seen[index] = path
        positions = run.get("positions", [])
        if len(positions) != len(data["models"]):
            raise UsageError(f"{path!r}: the run object does not match its models (edited by hand?): "
                             "pass the report as `placecheck audit --shard` wrote it")
        placed += [(p, report_from_dict(m)) for p, m in zip(positions, data["models"], strict=True)]
    missing = [str(i) for i in range(1, int(count) + 1) if i not in seen]
    if missing:
        raise UsageError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} of {count} "
                         f"missing: pass every shard's report (got {len(seen)})")
    positions_seen = [p for p, _ in placed]
    if len(set(positions_seen)) != len(positions_seen):
        raise UsageError("two shards audited the same model: merge the shards of one split")
    reports = tuple(r for _, r in sorted(placed, key=lambda pair: pair[0]))
    load_errors = tuple((r.target, f.message) for r in reports for f in r.findings
                        if f.code == _INCOMPLETE and dict(f.details).get("reason") == "load-error")
    return Combined(reports, dict(first_run.get("options", {})), first_run.get("baseline"), load_errors)
