"""One rank's process of ``placecheck run --nproc-per-node N`` (:mod:`placecheck.run.ranks` starts it as
``python -m placecheck.run.rank CONFIG OUT`` with torchrun's environment): the script run as that rank,
its report and the GPUs of its collectives written to ``OUT`` as JSON."""

from __future__ import annotations

import json
import os
import sys


def main(config_path: str, out_path: str) -> None:
    """A rank's process: run the script as this rank (torchrun's environment is set), write the report."""
    from placecheck.basics.options import RunOptions
    from placecheck.findings.formats.json import report_to_dict
    from placecheck.run import _simulate
    from placecheck.run.script import Program

    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    options = RunOptions.from_dict(config["options"])
    program = Program(config["target"], tuple(config["args"]), options.module)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    report, uses = _simulate(program, options, frozenset(config["codes"]),
                             rank=(rank, world, int(os.environ["LOCAL_RANK"])))
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump({"report": report_to_dict(report), "uses": uses}, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
